"""The partition-read rows of the real-width table on one tree, at the rank counts given, judged.

For each shape and rank count: the in-flight read limit (into reused buffers, and into memory kept as a load keeps
it), then the loads that read partitions ("Zero3Init: partition reads", "EPMeta: partition reads", "EPMeta: token
dispatch") launched in turn, `--repeats` rounds, each from a cold page cache and judged as `loadpolicy dev widths`
judges its rows (every parameter against the stock one-process load's fingerprints, logits within their bound), then
both limits again (the faster read of each counts). With `--peer`, torch DCP's `HuggingFaceStorageReader` too, once a
round in each of two shardings (rows of every tensor over the ranks, DCP's own; and the loads', each expert's tensors
whole on the rank that holds it), its blocks compared with the file's bytes, and each load's best beside DCP's. The
ways of a round run in forward then reverse order (DCP first in even rounds, last in odd ones). A row that fails its
judge prints its error and counts for nothing; the exit status is 1 if any did.

    PYTHONPATH=src OMP_NUM_THREADS=1 .tox/widths/bin/python scripts/partition-reads-rows.py \\
        TREE STOCK_TREE build/widths/checkpoints --ranks 2 4 --shapes qwen3-30b-a3b deepseek-v2-lite

Needs the checkpoints, fingerprints and logits of a `loadpolicy dev widths` run (`--checkpoints`), or builds them.
"""

import argparse
import math
import os
import sys
from pathlib import Path

from loadpolicy_lab.widths.cases import DCP_READERS, LOADS, PARTITION_READS, Reader
from loadpolicy_lab.widths.run import Checkpoint, Row, faster, load_once, prepare_checkpoint, read_once
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


OUT = Path("/tmp/partition-reads-rows")


def _figure(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _peer(checkpoint: Checkpoint, ranks: int, tree: Path, where: Path, said: str, reader: Reader) -> Row | None:
    """torch DCP's reader, judged by its blocks against the file's bytes; None (said) if it failed."""
    peer = read_once(checkpoint, ranks, tree, where, 900, reader)
    if peer.error or peer.seconds is None:
        print(f"{said} {peer.way}: FAILED {peer.error}", flush=True)
        return None
    print(
        f"{said} {peer.way}: {peer.seconds:.2f} s, CPU {_figure(peer.cpu_seconds)} s, peak "
        f"{_figure(peer.peak_over_ideal)}x T/W + baseline, {peer.checked} tensors equal to the file's",
        flush=True,
    )
    return peer


def _said_load(name: str, ranks: int, label: str, repeat: int, row: Row) -> None:
    print(
        f"{name} {ranks} {label} {repeat}: {row.seconds:.2f} s (reading {_figure(row.reading_seconds)} s), CPU "
        f"{_figure(row.cpu_seconds)} s (all ranks; {os.cpu_count()} cores), peak {row.peak_gib:.2f} GiB "
        f"({row.peak_over_ideal:.3f}x T/W + baseline), logits {row.logits_error} <= {row.logits_bound}",
        flush=True,
    )


def main(args: argparse.Namespace) -> int:
    cases = [case for case in LOADS if case.label in PARTITION_READS]
    failed = 0
    for name in args.shapes:
        checkpoint = prepare_checkpoint(SHAPES_BY_NAME[name], args.checkpoints, args.stock, 40.0, 900)
        for ranks in args.ranks:
            where = OUT / name / str(ranks)
            kinds = (Reader.PREAD_IN_FLIGHT, Reader.PREAD_KEPT)
            first = [read_once(checkpoint, ranks, args.tree, where / kind, reader=kind) for kind in kinds]
            rows: dict[str, list[Row]] = {case.label: [] for case in cases}
            peers: dict[Reader, list[Row]] = {reader: [] for reader in DCP_READERS}
            for repeat in range(args.repeats):
                # forward in even rounds, reversed in odd ones: in a fixed order a way cannot be told from its place
                # (gpt-oss's two DCP shardings are one launch, and the first took 1.28-1.33x the second in 3 of 4)
                ways = [*(DCP_READERS if args.peer else ()), *cases]
                for way in ways if repeat % 2 == 0 else ways[::-1]:
                    if isinstance(way, Reader):
                        said = f"{name} {ranks} {repeat}"
                        peer = _peer(checkpoint, ranks, args.tree, where / f"{way}-{repeat}", said, way)
                        failed += peer is None
                        peers[way] += [peer] if peer else []
                        continue
                    row = load_once(checkpoint, way, ranks, args.tree, where / f"{way.label}-{repeat}", 900)
                    if row.error or row.seconds is None or row.peak_over_ideal is None:
                        failed += 1
                        print(f"{name} {ranks} {way.label} {repeat}: FAILED {row.error}", flush=True)
                        continue
                    rows[way.label].append(row)
                    _said_load(name, ranks, way.label, repeat, row)
            # after the loads in the reverse order, so that both limits sit alike around them; the faster counts
            again = [
                read_once(checkpoint, ranks, args.tree, where / f"{kind}-again", reader=kind)
                for kind in reversed(kinds)
            ][::-1]
            limits = [faster(before, after) for before, after in zip(first, again, strict=True)]
            for limit in limits:
                if limit.error or not limit.seconds:
                    failed += 1
                    print(f"{name} {ranks} {limit.way}: FAILED {limit.error}", flush=True)
                else:
                    print(f"{name} {ranks} {limit.way}: {limit.seconds:.2f} s, CPU {_figure(limit.cpu_seconds)} s")
            limit, kept = (row.seconds if not row.error else None for row in limits)
            dcp, dcp_experts = (
                min((row.seconds or math.nan for row in peers[r]), default=math.nan) for r in DCP_READERS
            )
            for label, done in rows.items():
                best = min((row.seconds or math.nan for row in done), default=math.nan)
                peak = max((row.peak_over_ideal or math.nan for row in done), default=math.nan)
                reading = min((row.reading_seconds or math.nan for row in done), default=math.nan)
                ahead = (
                    f" | DCP {dcp:.2f} s: {dcp / best:.2f}x as long as the load, {dcp / reading:.2f}x as its reads"
                    f" | DCP, experts whole {dcp_experts:.2f} s: {dcp_experts / best:.2f}x, "
                    f"{dcp_experts / reading:.2f}x"
                    if args.peer
                    else ""
                )
                print(
                    f"| {name} | {ranks} | {label} | {_figure(limit)} | {_figure(kept)} | {best:.2f} "
                    f"({_figure(best / limit if limit else None)}x / {_figure(best / kept if kept else None)}x) "
                    f"| {peak:.3f} | {len(done)}/{args.repeats}{ahead} |",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", type=Path)
    parser.add_argument("stock", type=Path)
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--shapes", nargs="+", default=sorted(SHAPES_BY_NAME))
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--peer", action="store_true", help="also torch DCP's reader, once a round, before the loads")
    parsed = parser.parse_args()
    for attr in ("tree", "stock", "checkpoints"):
        setattr(parsed, attr, getattr(parsed, attr).resolve())
    sys.exit(main(parsed))
