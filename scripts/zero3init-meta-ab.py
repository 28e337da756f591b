"""A/B: dense ZeRO-3 partition reads built on the meta device against the same loads built under `zero.Init`.

Two trees of the series, one before the patch that builds dense ZeRO-3 on meta where partitions are read and one
with it, load each real-width checkpoint as `loadpolicy dev widths` loads its "Zero3Init: partition reads" row:
launches interleaved (before, after, before, after, ...), each from a cold page cache and judged as the widths run
judges its rows (every parameter against the stock one-process load's fingerprints, logits within their bound); the
in-flight read limit is read before and after the loads, the faster counts. A row that fails its judge prints its
error and counts for nothing.

    PYTHONPATH=src OMP_NUM_THREADS=1 .tox/widths/bin/python scripts/zero3init-meta-ab.py \\
        BEFORE_TREE AFTER_TREE STOCK_TREE build/widths/checkpoints qwen3-30b-a3b mixtral-8x7b

Needs the checkpoints, fingerprints and logits of a `loadpolicy dev widths` run (`--checkpoints`), or builds them.
"""

import sys
from pathlib import Path

from loadpolicy_lab.widths.cases import LOADS
from loadpolicy_lab.widths.run import faster, load_once, prepare_checkpoint, read_once
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


CASE = next(case for case in LOADS if case.label == "Zero3Init: partition reads")
OUT = Path("/tmp/zero3init-meta-ab")


def main(trees: dict[str, Path], stock: Path, checkpoints: Path, shapes: list[str], repeats: int = 2) -> int:
    ranks, failed = 2, 0
    for name in shapes:
        checkpoint = prepare_checkpoint(SHAPES_BY_NAME[name], checkpoints, stock, 40.0, 900)
        limit = read_once(checkpoint, ranks, trees["after"], OUT / name / "limit")
        seconds: dict[str, list[float]] = {label: [] for label in trees}
        peaks: dict[str, list[float]] = {label: [] for label in trees}
        for repeat in range(repeats):
            for label, tree in trees.items():
                row = load_once(checkpoint, CASE, ranks, tree, OUT / name / f"{label}-{repeat}", 900)
                if row.error or row.seconds is None or row.peak_over_ideal is None:
                    failed += 1
                    print(f"{name} {label} {repeat}: FAILED {row.error}", flush=True)
                    continue
                seconds[label].append(row.seconds)
                peaks[label].append(row.peak_over_ideal)
                print(
                    f"{name} {label} {repeat}: {row.seconds:.2f} s, peak {row.peak_gib:.2f} GiB "
                    f"({row.peak_over_ideal:.3f}x T/W + baseline), logits {row.logits_error} <= {row.logits_bound}",
                    flush=True,
                )
        limit = faster(limit, read_once(checkpoint, ranks, trees["after"], OUT / name / "limit-again"))
        if limit.error or not limit.seconds:
            failed += 1
            print(f"{name} limit: FAILED {limit.error}", flush=True)
            continue
        for label in trees:
            best = min(seconds[label], default=float("nan"))
            print(
                f"{name} {label}: best {best:.2f} s = {best / limit.seconds:.2f}x the in-flight limit "
                f"{limit.seconds:.2f} s; peak {max(peaks[label], default=float('nan')):.3f}x",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    before, after, stock_tree, checkpoint_dir = (Path(arg).resolve() for arg in sys.argv[1:5])
    sys.exit(main({"before": before, "after": after}, stock_tree, checkpoint_dir, sys.argv[5:]))
