"""The performance suite's one row: one launch of one way (a load, a reader, a save, a training step) of one model
at one rank count, in one round, made from its ranks' measurements and judged. Every command of `dev perf` writes
its rows through `perf.writer` (table, JSON, plot); repeats and rounds are rows with their `round`, summed up there.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

from loadpolicy.units import GIB
from loadpolicy_lab.perf.cases import HOLDING_READERS, Case, Reader
from loadpolicy_lab.perf.contract import LoadMeasurement, ReaderMeasurement
from loadpolicy_lab.perf.judge import judge_load, judge_reader
from loadpolicy_lab.perf.step import StepVerdict


LIMIT = "limit: pread of each rank's share"
LIMIT_IN_FLIGHT = "limit: pread of each rank's share, 4 in flight"
LIMIT_KEPT = "limit: pread of each rank's share, 4 in flight, into memory it keeps"
PEER = "DCP HuggingFaceStorageReader (peer)"
PEER_EXPERTS = "DCP HuggingFaceStorageReader, experts whole on their rank (peer)"
WAY_OF_READER = {
    Reader.PREAD: LIMIT,
    Reader.PREAD_IN_FLIGHT: LIMIT_IN_FLIGHT,
    Reader.PREAD_KEPT: LIMIT_KEPT,
    Reader.DCP: PEER,
    Reader.DCP_EXPERTS: PEER_EXPERTS,
    Reader.DCP_4_THREADS: "DCP HuggingFaceStorageReader, 4 threads (peer)",
    Reader.DCP_8_THREADS: "DCP HuggingFaceStorageReader, 8 threads (peer)",
    Reader.RUNAI: "Run:ai Model Streamer, tensors whole (peer)",
    Reader.FASTSAFETENSORS: "fastsafetensors, files whole (peer)",
}
LIMITS = (LIMIT, LIMIT_IN_FLIGHT, LIMIT_KEPT)


class Kind(enum.StrEnum):
    """What a row's launch did."""

    LOAD = "load"  # `from_pretrained` (`perf.worker`)
    READ = "read"  # a reader without transformers: a limit or a peer (`perf.reader_worker`)
    SAVE = "save"  # a loaded model saved (`perf.save_worker`)
    STEP = "step"  # one training step against one process (`perf.step_worker`)


@dataclass(frozen=True, slots=True)
class Memory:
    """A load's memory by kind, the largest rank's of each (GiB): what the cost model is calibrated against."""

    peak_gib: float  # loading or touched, anonymous + file-backed
    peak_anon_gib: float
    peak_file_gib: float
    load_peak_gib: float  # during `from_pretrained` alone
    held_gib: float  # resident once every loaded tensor was touched
    baseline_anon_gib: float  # before `from_pretrained`, on the rank with the largest RSS then
    baseline_file_gib: float
    owned_gib: float  # bytes of the parameters and buffers the rank holds
    read_gib: float  # read from storage, summed over the ranks
    rchar_rank_gib: float  # the most one rank's read calls returned while loading


@dataclass(frozen=True, slots=True)
class Row:
    shape: str  # a bench model's name or a published shape's
    ranks: int
    way: str
    checkpoint_gib: float = 0.0
    kind: Kind = Kind.LOAD
    round: int = 0  # the repeat (bench) or round (`perf.rounds`) of this launch
    error: str | None = None
    seconds: float | None = None  # the slowest rank
    peak_gib: float | None = None  # the largest per-rank peak RSS
    ideal_gib: float | None = None  # on that rank: T/W + its RSS before reading
    read_rank_gib: float | None = None  # the most one rank read from storage
    checked: int = 0  # parameters (loads) or tensors (DCP) whose values were compared
    # loads, the largest rank's: logits' root mean square from the float32 one-process forward's, and its bound
    # (`perf.logits`); max |logits - the bf16 one-process logits|
    logits_error: float | None = None
    logits_bound: float | None = None
    logits_from_one_process: float | None = None
    logits_half_the_experts: float | None = None  # the reference's: a forward missing half the experts lands there
    logits_not_judged: str | None = None  # why a load's forward did not run (the same on every rank)
    # ZeRO-3 loads: the slowest rank's load, touch and `deepspeed.initialize` (until training can start), and the
    # largest per-rank peak RSS over all three
    trainable_seconds: float | None = None
    trainable_peak_gib: float | None = None
    # CPU of every rank together (user + system): a load's over `from_pretrained`, a reader's over its read
    cpu_seconds: float | None = None
    # patched loads: the slowest rank's seconds in partition reads alone (files opened to the last byte in place),
    # what a reader such as DCP does into tensors allocated beforehand; None where a rank read none
    reading_seconds: float | None = None
    load_seconds: float | None = None  # loads: the slowest rank's `from_pretrained` alone
    memory: Memory | None = None  # loads
    # saves, per rank: peak while saving over, and minus, what it held before
    peaks_over_held: tuple[float, ...] = field(default_factory=tuple)
    peak_rises_gib: tuple[float, ...] = field(default_factory=tuple)
    verdict: StepVerdict | None = None  # steps: against the one-process step

    @property
    def failed(self) -> bool:
        """An error, or a step without a passing verdict."""
        if self.kind is Kind.STEP:
            return self.error is not None or self.verdict is None or bool(self.verdict.problems)
        return self.error is not None

    @property
    def peak_over_ideal(self) -> float | None:
        return None if self.peak_gib is None or not self.ideal_gib else self.peak_gib / self.ideal_gib


def _worst(per_rank: list[tuple[float, float]]) -> tuple[float, float]:
    """(peak, ideal) of the rank whose peak is the largest multiple of its ideal."""
    return max(per_rank, key=lambda pair: pair[0] / pair[1])


def load_row(
    shape: str, case: Case, ranks: int, total: int, results: list[LoadMeasurement] | str, **judged: Any
) -> Row:
    """A transformers load's row: its problems (another policy, values not the checkpoint's) fail it."""
    base = Row(shape, ranks, case.label, total / GIB)
    if isinstance(results, str):
        return replace(base, error=results)
    if problems := judge_load(case, results, judged["tree"], judged["parameters"]):
        return replace(base, error="; ".join(problems)[:400])
    peak, ideal = _worst([(max(r["peak_total"], r["held_total"]), total / ranks + r["rss_before"]) for r in results])
    trainable = _until_trainable(results)
    return replace(
        base,
        # until every byte is in memory: a load that maps files reads its pages at first touch
        seconds=max(r["seconds"] + r["touch_seconds"] for r in results),
        peak_gib=peak / GIB,
        ideal_gib=ideal / GIB,
        read_rank_gib=max(r["read_bytes"] for r in results) / GIB,
        checked=min(r["fingerprinted"] for r in results),
        cpu_seconds=_total([r.get("cpu_seconds") for r in results]),
        reading_seconds=_slowest_reading(results),
        logits_error=_largest([r["logits_error"] for r in results]),
        logits_bound=_largest([r["logits_bound"] for r in results]),
        logits_from_one_process=_largest([r["logits_from_one_process"] for r in results]),
        logits_half_the_experts=_largest([r["logits_half_the_experts"] for r in results]),
        logits_not_judged=results[0]["logits_not_judged"],
        trainable_seconds=trainable[0],
        trainable_peak_gib=trainable[1],
        load_seconds=max(r["seconds"] for r in results),
        memory=_memory(results),
    )


def _memory(results: list[LoadMeasurement]) -> Memory:
    def peak(r: LoadMeasurement, kind: str) -> int:  # during loading, or once every loaded tensor was touched
        return max(int(r[f"peak_{kind}"]), int(r[f"held_{kind}"]))  # type: ignore[literal-required]

    before = max(results, key=lambda r: r["rss_before"])
    return Memory(
        peak_gib=max(peak(r, "total") for r in results) / GIB,
        peak_anon_gib=max(peak(r, "anon") for r in results) / GIB,
        peak_file_gib=max(peak(r, "file") for r in results) / GIB,
        load_peak_gib=max(r["peak_total"] for r in results) / GIB,
        held_gib=max(r["held_total"] for r in results) / GIB,
        baseline_anon_gib=before["anon_before"] / GIB,
        baseline_file_gib=before["file_before"] / GIB,
        owned_gib=max(r["owned_bytes"] for r in results) / GIB,
        read_gib=sum(r["read_bytes"] for r in results) / GIB,
        rchar_rank_gib=max(r["rchar"] for r in results) / GIB,
    )


def _until_trainable(results: list[LoadMeasurement]) -> tuple[float | None, float | None]:
    """Where every rank ran `deepspeed.initialize`: until training can start, and the peak over loading and it."""
    seconds, peak = 0.0, 0
    for r in results:
        initialize_seconds, initialize_peak = r["initialize_seconds"], r["initialize_peak_total"]
        if initialize_seconds is None or initialize_peak is None:
            return None, None
        seconds = max(seconds, r["seconds"] + r["touch_seconds"] + initialize_seconds)
        peak = max(peak, r["peak_total"], r["held_total"], initialize_peak)
    return seconds, peak / GIB


def _total(values: list[float | None]) -> float | None:
    """The sum, or None where a rank did not measure it (a result written before it was)."""
    return None if any(value is None for value in values) else sum(value or 0.0 for value in values)


def _slowest_reading(results: list[LoadMeasurement]) -> float | None:
    """The slowest rank's partition reads; None unless every rank read partitions."""
    reading = [r.get("reading_seconds") for r in results]
    return None if any(seconds is None for seconds in reading) else _largest(reading)


def _largest(values: list[float | None]) -> float | None:
    """The largest; NaN where a rank has NaN, None where no rank has a figure."""
    present = [value for value in values if value is not None]
    if any(math.isnan(value) for value in present):
        return math.nan
    return max(present, default=None)


def reader_row(
    shape: str, reader: Reader, ranks: int, total: int, tensors: int, results: list[ReaderMeasurement] | str
) -> Row:
    """A reader's row: every byte of the checkpoint read exactly once over the ranks; DCP's blocks equal the file's."""
    base = Row(shape, ranks, WAY_OF_READER[reader], total / GIB, kind=Kind.READ)
    if isinstance(results, str):
        return replace(base, error=results)
    problems = judge_reader(reader, results, total, tensors)
    if problems:
        return replace(base, error="; ".join(problems)[:400])
    peak, ideal = _worst([(r["peak_total"], total / ranks + r["rss_before"]) for r in results])
    return replace(
        base,
        seconds=max(r["seconds"] for r in results),
        peak_gib=peak / GIB,
        ideal_gib=ideal / GIB,
        read_rank_gib=max(r["read_bytes"] for r in results) / GIB,
        checked=min(r["checked"] for r in results) if reader in HOLDING_READERS else 0,
        cpu_seconds=_total([r.get("cpu_seconds") for r in results]),
    )
