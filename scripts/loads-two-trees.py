"""The same partition loads on two patched trees, in alternating order, each launch from a cold page cache and judged.

For a change to the series measured against the series before it: check the old series out beside the new one (a git
worktree of the patched tree at the old commit) and give both. Each round runs every load on the first tree then the
second, the next round the other way round; a row that fails its judge prints its error, and the exit status is 1.

    PYTHONPATH=src OMP_NUM_THREADS=1 .tox/widths/bin/python scripts/loads-two-trees.py \\
        OLD_TREE NEW_TREE build/widths-all/trees/stock build/widths/checkpoints \\
        --shapes qwen3-30b-a3b --ranks 4 --repeats 4 --loads "EPMeta: token dispatch" "EPMeta: partition reads"
"""

import argparse
import sys
from pathlib import Path

from loadpolicy_lab.widths.cases import LOADS, PARTITION_READS
from loadpolicy_lab.widths.run import load_once, prepare_checkpoint
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


OUT = Path("/tmp/loads-two-trees")


def main(args: argparse.Namespace) -> int:
    cases = [case for case in LOADS if case.label in args.loads]
    trees = {"old": args.old, "new": args.new}
    failed = 0
    for name in args.shapes:
        checkpoint = prepare_checkpoint(SHAPES_BY_NAME[name], args.checkpoints, args.stock, 40.0, 900)
        for repeat in range(args.repeats):
            for case in cases:
                for way in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
                    where = OUT / name / f"{case.label}-{way}-{repeat}"
                    row = load_once(checkpoint, case, args.ranks, trees[way], where, 900)
                    if row.error or row.seconds is None:
                        failed += 1
                        print(f"{name} {args.ranks} {case.label} {repeat} {way}: FAILED {row.error}", flush=True)
                        continue
                    print(
                        f"{name} {args.ranks} {case.label} {repeat} {way}: {row.seconds:.2f} s (reading "
                        f"{row.reading_seconds:.2f} s), CPU {row.cpu_seconds:.2f} s (all ranks), peak "
                        f"{row.peak_over_ideal:.3f}x T/W + baseline, judged",
                        flush=True,
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("stock", type=Path)
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--shapes", nargs="+", default=sorted(SHAPES_BY_NAME))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--loads", nargs="+", default=list(PARTITION_READS), choices=list(PARTITION_READS))
    parsed = parser.parse_args()
    for attr in ("old", "new", "stock", "checkpoints"):
        setattr(parsed, attr, getattr(parsed, attr).resolve())
    sys.exit(main(parsed))
