"""Per-round figures of a `scripts/partition-reads-rows.py --peer` log: each way's seconds in every round and their
median, and for each load DCP's seconds over the load's in the same round (above 1.0: the load was faster), against
each of DCP's two shardings, with their range and median. Best against best (the script's own table) favours the
way with the luckiest launch; a ratio per round compares launches minutes apart. It reads the lines that script
prints for DCP (`_peer`) and for each load (`_said_load`): a change to those lines changes these patterns.

    python3 scripts/rows-per-round.py build/rows.log
"""

import re
import statistics
import sys
from collections import defaultdict


_PEER = re.compile(
    r"(\S+) (\d+) (\d+) DCP HuggingFaceStorageReader(, experts whole on their rank)? \(peer\): ([\d.]+) s"
)
_LOAD = re.compile(r"(\S+) (\d+) (.+?) (\d+): ([\d.]+) s \(reading")


def _parse(lines: list[str]) -> dict[tuple[str, str], dict[str, dict[int, float]]]:
    runs: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for line in lines:
        if found := _PEER.match(line):
            way = "DCP, experts whole" if found[4] else "DCP, rows"
            runs[found[1], found[2]][way][int(found[3])] = float(found[5])
        elif found := _LOAD.match(line):
            runs[found[1], found[2]][found[3]][int(found[4])] = float(found[5])
    return runs


def _over(peer: dict[int, float], load: dict[int, float]) -> str:
    ratios = [peer[index] / seconds for index, seconds in load.items() if index in peer]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f})"


def main(path: str) -> None:
    with open(path, encoding="utf-8") as log:
        runs = _parse(log.readlines())
    print("| shape | ranks | way | seconds per round | median | DCP experts whole / load | DCP rows / load |")
    print("|---|---:|---|---|---:|---|---|")
    for (shape, ranks), ways in runs.items():
        for way, by_round in ways.items():
            seconds = " ".join(f"{by_round[index]:.2f}" for index in sorted(by_round))
            ratios = "- | -"
            if not way.startswith("DCP"):
                ratios = f"{_over(ways['DCP, experts whole'], by_round)} | {_over(ways['DCP, rows'], by_round)}"
            print(f"| {shape} | {ranks} | {way} | {seconds} | {statistics.median(by_round.values()):.2f} | {ratios} |")


if __name__ == "__main__":
    main(sys.argv[1])
