"""Does a page cache that fills memory slow the loads (and the kept limit) but not the plain limit? Interleaved.

For each round, in alternating order: the page cache filled with the checkpoints under FILLERS (each directory read
whole) or those evicted; then the in-flight limit into memory kept, the in-flight limit and an EPMeta partition load
of SHAPE at RANKS, each launch from a cold page cache for its own checkpoint and judged as `loadpolicy dev widths`
judges its rows. Needs `build/widths-all/trees` and the checkpoint (`loadpolicy dev widths` builds both).

    PYTHONPATH=src OMP_NUM_THREADS=1 .tox/widths/bin/python scripts/page-cache-ab.py deepseek-v2-lite 2 2 FILLERS
"""

import argparse
from pathlib import Path

from loadpolicy_lab.harness.procfs import evict_from_page_cache
from loadpolicy_lab.widths.cases import LOADS, Reader
from loadpolicy_lab.widths.run import load_once, prepare_checkpoint, read_once
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


TREE, STOCK = Path("build/widths-all/trees/patched"), Path("build/widths-all/trees/stock")


def mem_free_gib() -> float:
    with Path("/proc/meminfo").open(encoding="utf-8") as meminfo:
        line = next(line for line in meminfo if line.startswith("MemFree:"))
    return int(line.split()[1]) / 2**20


def fill(fillers: list[Path], full: bool) -> None:
    """Read every filler file whole (full) or drop them from the page cache."""
    for directory in fillers:
        if not full:
            evict_from_page_cache(directory)
            continue
        for file in sorted(p for p in directory.iterdir() if p.is_file()):
            with file.open("rb") as handle:
                while handle.read(64 << 20):
                    pass


def main(args: argparse.Namespace) -> None:
    out = Path(f"/tmp/page-cache-ab/{args.shape}-{args.ranks}")
    checkpoint = prepare_checkpoint(SHAPES_BY_NAME[args.shape], Path("build/widths/checkpoints"), STOCK, 40.0, 1800)
    case = next(c for c in LOADS if c.label == "EPMeta: partition reads")
    fillers = sorted(p for p in args.fillers.iterdir() if p.is_dir())
    for index in range(args.rounds):
        for full in (False, True) if index % 2 == 0 else (True, False):
            tag = f"{'full' if full else 'free'}-{index}"
            fill(fillers, full)
            free = mem_free_gib()
            kept = read_once(checkpoint, args.ranks, TREE, out / f"kept-{tag}", reader=Reader.PREAD_KEPT)
            fill(fillers, full)
            plain = read_once(checkpoint, args.ranks, TREE, out / f"plain-{tag}")
            fill(fillers, full)
            load = load_once(checkpoint, case, args.ranks, TREE, out / f"load-{tag}", 900)
            print(
                f"round {index} page cache {'full' if full else 'free'} (MemFree {free:.1f} GiB): in flight "
                f"{plain.seconds} s, kept {kept.seconds} s, EPMeta {load.seconds} s (error {load.error}, logits "
                f"{load.logits_error})",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES_BY_NAME))
    parser.add_argument("ranks", type=int)
    parser.add_argument("rounds", type=int)
    parser.add_argument("fillers", type=Path, help="a directory of directories whose files fill the page cache")
    main(parser.parse_args())
