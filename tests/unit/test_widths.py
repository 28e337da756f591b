"""The real-widths suite's pure parts: each rank's share of a safetensors file, the reader rows' judges and the goals
(real runs: `loadpolicy dev perf widths`)."""

from __future__ import annotations

import itertools
import json
import math
import mmap
import struct
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from loadpolicy_lab.models.published import SHAPES, SHAPES_BY_NAME, with_layers
from loadpolicy_lab.perf.cases import LOADS, PARTITION_READS, Reader
from loadpolicy_lab.perf.contract import LoadMeasurement, ReaderMeasurement
from loadpolicy_lab.perf.ranges import TensorSpan, expert_owners, partition_range, read_spans, share, whole_owners
from loadpolicy_lab.perf.report import goals, render_markdown
from loadpolicy_lab.perf.rows import (
    LIMIT,
    LIMIT_IN_FLIGHT,
    LIMIT_KEPT,
    PEER,
    PEER_EXPERTS,
    Row,
    load_row,
    reader_row,
)


def _safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], int]]) -> None:
    """A safetensors file of zero bytes per tensor: name -> (dtype, shape, element size)."""
    header, offset = {}, 0
    for name, (dtype, shape, size) in tensors.items():
        nbytes = math.prod(shape) * size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


@pytest.mark.parametrize(("numel", "world"), [(10, 4), (8, 4), (3, 4), (1, 2), (7, 1)])
def test_partitions_cover_every_element_once_in_order(numel: int, world: int) -> None:
    span = TensorSpan(Path("f"), "t", "BF16", (numel,), 100, 100 + 2 * numel)
    ranges = [partition_range(span, rank, world) for rank in range(world)]
    assert ranges[0][0] == span.start
    assert ranges[-1][1] == span.end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    per = -(-numel // world)  # ZeRO-3's partition: ceil(numel / world) elements, the last rank's cut
    assert [(end - start) // 2 for start, end in ranges] == [max(0, min(per, numel - r * per)) for r in range(world)]


def test_shares_of_a_file_add_up_to_its_tensors_and_merge_adjacent_ranges(tmp_path: Path) -> None:
    _safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", (6, 4), 2), "b": ("F32", (5,), 4)})
    _safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": ("BF16", (3, 3), 2)})
    spans = read_spans(tmp_path)
    assert [s.name for s in spans] == ["a", "b", "c"]
    total = sum(s.end - s.start for s in spans)
    assert total == 6 * 4 * 2 + 5 * 4 + 9 * 2
    for world in (1, 2, 4):
        shares = [share(spans, rank, world) for rank in range(world)]
        assert sum(end - start for ranges in shares for _, start, end in ranges) == total
        covered = sorted((str(f), s, e) for ranges in shares for f, s, e in ranges)
        assert all(a[2] <= b[1] for a, b in itertools.pairwise(covered) if a[0] == b[0])  # no overlap
    assert len(share(spans, 0, 1)) == 2  # one world: each file one range


def test_a_rank_s_share_holds_its_experts_whole_and_a_partition_of_every_other_tensor(tmp_path: Path) -> None:
    per_expert = {f"model.layers.0.mlp.experts.{e}.{w}.weight": ("BF16", (4, 2), 2) for e in range(4) for w in "ab"}
    merged = {"model.layers.0.mlp.experts.gate_up_proj": ("BF16", (4, 2, 2), 2)}  # stored stacked: partitioned
    _safetensors(tmp_path / "model.safetensors", {"model.norm.weight": ("F32", (6,), 4), **per_expert, **merged})
    spans = read_spans(tmp_path)
    by_name = {span.name: span for span in spans}
    assert expert_owners(spans, 2) == {name: int(name.split(".")[5]) // 2 for name in per_expert}
    assert expert_owners(spans, 3) == {}  # 4 experts over 3 ranks: partitions cut through an expert
    gap = [span for span in spans if ".experts.3." not in span.name]
    renamed = [replace(span, name=span.name.replace(".experts.2.", ".experts.4.")) for span in gap]
    assert expert_owners(renamed, 1) == {}  # numbered 0, 1, 4: whose block each is cannot be told
    for world in (1, 2, 4):
        shares = [share(spans, rank, world) for rank in range(world)]
        assert sum(end - start for ranges in shares for _, start, end in ranges) == spans[-1].end - spans[0].start
        for rank, ranges in enumerate(shares):
            held = {name for name in per_expert if any(s <= by_name[name].start < e for _, s, e in ranges)}
            first = rank * 4 // world
            assert held == {
                f"model.layers.0.mlp.experts.{e}.{w}.weight" for e in range(first, first + 4 // world) for w in "ab"
            }
    stacked = by_name["model.layers.0.mlp.experts.gate_up_proj"]
    halves = [partition_range(stacked, rank, 2) for rank in range(2)]
    assert all(
        any(s <= start and end <= e for _, s, e in share(spans, rank, 2)) for rank, (start, end) in enumerate(halves)
    )


def _measurement(
    rank: int, share_bytes: int, *, checked: int = 0, problems: list[str] | None = None
) -> ReaderMeasurement:
    return {
        "rank": rank,
        "reader": "dcp",
        "seconds": 1.0 + rank,
        "cpu_seconds": 0.5,
        "share_bytes": share_bytes,
        "read_bytes": share_bytes,
        "rss_before": 1 << 30,
        "peak_anon": 1 << 30,
        "peak_file": 0,
        "peak_total": (1 << 30) + share_bytes,
        "checked": checked,
        "value_problems": problems or [],
    }


def test_a_reader_that_missed_bytes_or_tensors_fails_its_row() -> None:
    whole = reader_row("s", Reader.PREAD, 2, 100, 3, [_measurement(0, 50), _measurement(1, 50)])
    assert whole.error is None
    assert whole.seconds == 2.0
    assert whole.way == LIMIT
    assert whole.cpu_seconds == 1.0  # every rank's CPU together
    older = _measurement(1, 50)
    del older["cpu_seconds"]  # a result written before readers measured it: rejudged, not failed
    assert reader_row("s", Reader.PREAD, 2, 100, 3, [_measurement(0, 50), older]).cpu_seconds is None
    short = reader_row("s", Reader.PREAD, 2, 100, 3, [_measurement(0, 50), _measurement(1, 49)])
    assert short.error is not None
    assert "99 bytes of the checkpoint's 100" in short.error
    unchecked = reader_row(
        "s", Reader.DCP, 2, 100, 3, [_measurement(0, 50, checked=3), _measurement(1, 50, checked=2)]
    )
    assert unchecked.error is not None
    assert "rank 1 compared 2 of 3" in unchecked.error
    unequal = [_measurement(0, 50, checked=3), _measurement(1, 50, checked=3, problems=["x: rows from 2 differ"])]
    assert "rows from 2 differ" in (reader_row("s", Reader.DCP, 2, 100, 3, unequal).error or "")
    failed = reader_row("s", Reader.DCP, 2, 100, 3, "rank 1 timed out in read (dcp)")
    assert failed.error == "rank 1 timed out in read (dcp)"
    assert failed.way == PEER


def test_goals_are_missed_where_a_figure_is_missing() -> None:
    load = Row("s", 2, "EPMeta: partition reads", 1.0, seconds=3.0, peak_gib=1.0, ideal_gib=1.0)
    limit = Row("s", 2, LIMIT, 1.0, seconds=2.5)
    peer = Row("s", 2, PEER, 1.0, seconds=6.0)
    met = goals([limit, load, peer])
    assert met == [
        "- s x2, EPMeta: partition reads: 1.20x the limit (met); -x the limit with 4 in flight; -x the limit into "
        "memory kept; peak 1.000x ideal (met); 2.00x faster than DCP; -x faster than DCP into the same sharding; -x "
        "faster than stock zero.Init"
    ]
    same_sharding = Row("s", 2, PEER_EXPERTS, 1.0, seconds=2.4)
    assert "; 0.80x faster than DCP into the same sharding;" in goals([limit, load, peer, same_sharding])[0]
    missing = goals([load, Row("s", 2, "Zero3Init: partition reads", 1.0, seconds=3.0)])
    assert missing[0].startswith("- s x2, EPMeta: partition reads: -x the limit (missed); -x the limit with 4")
    assert "peak -x ideal (missed)" in missing[1]
    assert "FAILED: boom" in render_markdown([Row("s", 2, PEER, 1.0, error="boom")], "cmd")
    in_flight = Row("s", 2, LIMIT_IN_FLIGHT, 1.0, seconds=1.5)
    assert "; 2.00x the limit with 4 in flight;" in goals([limit, in_flight, load, peer])[0]
    assert "| 1.20 | 2.00 | - |" in render_markdown([limit, in_flight, load])
    kept = Row("s", 2, LIMIT_KEPT, 1.0, seconds=2.0)
    assert "; 1.50x the limit into memory kept;" in goals([limit, kept, load])[0]
    assert "| 1.20 | - | 1.50 |" in render_markdown([limit, kept, load])


def test_the_limit_in_flight_reads_a_share_of_many_chunks_and_names_a_short_file(tmp_path: Path) -> None:
    from loadpolicy_lab.perf import reader_worker as worker

    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    ranges = [(path, 3, 700_001), (path, 700_001, 1 << 20)]
    with mock.patch.object(worker, "CHUNK", 4096):
        assert worker._pread_in_flight(ranges) == (1 << 20) - 3
        kept: list[mmap.mmap] = []
        assert worker._pread_in_flight(ranges, kept) == (1 << 20) - 3
        # each chunk in its own mapping (in the order the threads took them), holding the file's bytes
        data = path.read_bytes()
        chunks = [data[at : min(at + 4096, end)] for _, start, end in ranges for at in range(start, end, 4096)]
        assert sorted(bytes(mapping) for mapping in kept) == sorted(chunks)
        with pytest.raises(OSError, match=r"model.safetensors: nothing read at byte 1048576 of \[1048000, 1048577\)"):
            worker._pread_in_flight([(path, 1_048_000, (1 << 20) + 1)])


def test_every_partition_reading_load_is_held_to_the_goals() -> None:
    assert {c.label for c in LOADS if c.branch is not None} == PARTITION_READS
    assert {"Zero3Init: partition reads", "EPMeta: partition reads", "EPMeta: token dispatch"} <= PARTITION_READS


def test_shapes_keep_the_published_widths() -> None:
    by_name = {s.name: s.architecture.config for s in SHAPES}
    assert by_name["qwen3-30b-a3b"]["num_experts"] == 128
    assert by_name["qwen3-30b-a3b"]["moe_intermediate_size"] == 768
    assert by_name["mixtral-8x7b"]["hidden_size"] == 4096
    assert by_name["mixtral-8x7b"]["intermediate_size"] == 14336
    assert by_name["deepseek-v2-lite"]["n_routed_experts"] == 64
    assert by_name["deepseek-v2-lite"]["num_hidden_layers"] > 1
    assert by_name["gpt-oss-20b"]["vocab_size"] == 201088
    assert len({s.identity() for s in SHAPES}) == len(SHAPES)


def test_a_shape_cut_to_fewer_layers_keeps_its_widths_and_is_named_and_built_apart() -> None:
    deepseek = SHAPES_BY_NAME["deepseek-v2-lite"]
    cut = with_layers(deepseek, 2)
    assert cut.name == "deepseek-v2-lite-2l"
    assert cut.architecture.config == deepseek.architecture.config | {"num_hidden_layers": 2}
    assert cut.identity() != deepseek.identity()
    wide = SHAPES_BY_NAME["gpt-oss-20b"].architecture.config | {"num_hidden_layers": 2}
    wide["layer_types"] = ["sliding_attention", "full_attention"]
    gpt_oss = SHAPES_BY_NAME["gpt-oss-20b"]
    two = type(gpt_oss)(type(gpt_oss.architecture)(**{**asdict(gpt_oss.architecture), "config": wide}), "x", 24)
    assert with_layers(two, 1).architecture.config["layer_types"] == ["sliding_attention"]
    assert with_layers(deepseek, 3) is deepseek  # no more layers than it has: as it is
    assert with_layers(SHAPES_BY_NAME["mixtral-8x7b"], 2) is SHAPES_BY_NAME["mixtral-8x7b"]


EXPERT = "model.layers.0.mlp.experts.0.w1.weight"


def _two_file_checkpoint(torch: Any, directory: Path) -> dict[str, Any]:
    """A checkpoint of two safetensors files (an expert's tensor among them) written to `directory`: its tensors."""
    from safetensors.torch import save_file

    tensors = {"a": torch.randn(5, 3).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.float32)}
    tensors[EXPERT] = torch.randn(4, 2).to(torch.bfloat16)
    save_file({"a": tensors["a"], EXPERT: tensors[EXPERT]}, str(directory / "model-00001-of-00002.safetensors"))
    save_file({"b": tensors["b"]}, str(directory / "model-00002-of-00002.safetensors"))
    return tensors


def test_the_readers_read_every_byte_and_dcp_blocks_are_checked_against_the_file(tmp_path: Path) -> None:
    """One process, real torch DCP: the pread limit reads the whole share; DCP's row-sharded load equals the files,
    and a changed block is reported."""
    torch = pytest.importorskip("torch")

    from loadpolicy_lab.perf import reader_worker as worker

    tensors = _two_file_checkpoint(torch, tmp_path)
    spans = read_spans(tmp_path)
    assert worker._pread(share(spans, 0, 1)) == sum(s.end - s.start for s in spans)
    assert worker._pread_in_flight(share(spans, 0, 1)) == sum(s.end - s.start for s in spans)
    assert worker._pread_kept(share(spans, 0, 1)) == sum(s.end - s.start for s in spans)
    worker._KEPT.clear()
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        import torch.distributed.checkpoint as dcp

        state, _ = worker._dcp_destination(spans, 1)
        dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(tmp_path)))
        assert torch.equal(state["a"].to_local(), tensors["a"])
        assert worker._compare_with_file(state, spans) == (3, [])
        state["b"].to_local()[3] += 1
        assert worker._compare_with_file(state, spans) == (3, ["b: rows from 0 differ from the file's"])
        # the loads' sharding: the expert's tensor whole, a plain tensor on the rank that holds the expert
        state, _ = worker._dcp_destination(spans, 1, experts_whole_on=0)
        assert not hasattr(state[EXPERT], "to_local")
        dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(tmp_path)))
        assert torch.equal(state[EXPERT], tensors[EXPERT])
        assert worker._compare_with_file(state, spans) == (3, [])
        state[EXPERT][1, 1] += 1
        assert worker._compare_with_file(state, spans) == (3, [f"{EXPERT}: differs from the file's"])
        assert worker._dcp_destination(spans, 1, experts_whole_on=1)[0].keys() == {"a", "b"}  # another rank's
    finally:
        torch.distributed.destroy_process_group()


def test_the_cost_model_is_scored_on_every_passing_load_and_on_nothing_else() -> None:
    pytest.importorskip("transformers")
    from loadpolicy_lab.perf.calibrate import calibrate_widths

    gib = 3.48
    load = Row("qwen3-30b-a3b", 2, "EPMeta: token dispatch", gib, seconds=3.0, peak_gib=2.11, ideal_gib=gib / 2 + 0.36)
    rows = [
        asdict(r)
        for r in (
            load,
            Row("qwen3-30b-a3b", 2, LIMIT, gib, seconds=2.0, peak_gib=0.3, ideal_gib=2.1),
            Row("qwen3-30b-a3b", 2, "Zero3Init (stock)", gib, error="rank 0 timed out"),
        )
    ]
    (scored,) = calibrate_widths(rows)
    assert (scored.model, scored.case, scored.ranks, scored.held_out) == ("qwen3-30b-a3b", load.way, 2, True)
    assert scored.measured_gib == pytest.approx(2.11 - 0.36)
    # the whole share of a 3.48 GiB checkpoint over 2 ranks, nothing else held: what EPMeta's partitions are
    assert scored.predicted_gib == pytest.approx(gib / 2, rel=0.02)


def test_the_limit_is_the_faster_of_its_two_reads_and_fails_with_either() -> None:
    from loadpolicy_lab.perf.widths_run import faster

    slow, quick = Row("s", 2, LIMIT, 1.0, seconds=3.1), Row("s", 2, LIMIT, 1.0, seconds=1.3)
    assert faster(slow, quick) is quick
    assert faster(quick, slow) is quick
    broken = Row("s", 2, LIMIT, 1.0, error="rank 1 timed out")
    assert faster(quick, broken) is broken
    assert faster(broken, quick) is broken


def test_rounds_alternate_forward_and_reverse_so_drift_falls_on_every_way() -> None:
    from loadpolicy_lab.perf.rounds import default_ways, round_order, ways_for

    ways = ways_for(default_ways("EPMeta: partition reads"), ["patched"])
    assert [w.label for w in ways] == ["EPMeta: partition reads, one read at a time", "EPMeta: partition reads", "DCP"]
    assert round_order(ways, 0) == ways
    assert round_order(ways, 1) == ways[::-1]
    # over any two rounds, every way has the same mean position
    positions = {way: [round_order(ways, i).index(way) for i in range(2)] for way in ways}
    assert len({sum(p) for p in positions.values()}) == 1


def test_a_patched_load_runs_on_every_tree_given_and_a_stock_load_on_stock() -> None:
    from loadpolicy_lab.perf.cases import Reader
    from loadpolicy_lab.perf.rounds import ways_for

    ways = ways_for(["EPMeta: token dispatch", "Zero3Init (stock)", "limit, kept"], ["old", "new"])
    assert [(w.label, w.tree) for w in ways] == [
        ("EPMeta: token dispatch @ old", "old"),
        ("EPMeta: token dispatch @ new", "new"),
        ("Zero3Init (stock)", "stock"),
        ("limit, kept", "old"),
    ]
    assert ways[-1].reader is Reader.PREAD_KEPT
    sequential = ways_for(["Zero3Init: partition reads, one read at a time"], ["patched"])
    assert sequential[0].sequential
    assert sequential[0].case is not None
    assert sequential[0].case.label == "Zero3Init: partition reads"


def test_an_unknown_way_is_refused_naming_it_and_the_accepted_ones() -> None:
    from loadpolicy.errors import CommandError
    from loadpolicy_lab.perf.rounds import ways_for

    with pytest.raises(CommandError, match=r"unknown way 'EPMeta: fast'; accepted: limit, limit, in flight, .*DCP"):
        ways_for(["EPMeta: fast"], ["patched"])


def test_rounds_report_each_way_over_the_first_and_name_a_failed_launch() -> None:
    from loadpolicy_lab.perf.rounds import render_rounds

    def row(number: int, way: str, seconds: float | None, error: str | None = None, ranks: int = 2) -> Row:
        return Row("mixtral-8x7b", ranks, way, 3.19, round=number, error=error, seconds=seconds)

    one, flight, peer = "EPMeta: partition reads, one read at a time", "EPMeta: partition reads", "DCP"
    found = [
        row(0, one, 3.0),
        row(0, flight, 1.5),
        row(0, peer, 2.0),
        row(1, peer, None, "rank 1: values differ"),
        row(1, flight, 2.0),
        row(1, one, 4.0),
        row(0, one, 9.0, ranks=4),
    ]
    text = render_rounds(found, "cmd")
    assert "## mixtral-8x7b, 2 ranks" in text
    assert "## mixtral-8x7b, 4 ranks" in text
    assert f"| round | {one} | {flight} | {peer} | {flight} / {one} | {peer} / {one} |" in text
    assert "| 0 | 3.00 | 1.50 | 2.00 | 0.50x | 0.67x |" in text
    assert "| 1 | 4.00 | 2.00 | FAILED | 0.50x | - |" in text
    assert f"- {flight}: 1.50-2.00 s, median 1.75 s; over {one} in the same round: 0.50-0.50x, median 0.50x" in text
    assert "- FAILED DCP (round 1): rank 1: values differ" in text
    assert "| 0 | 9.00 |" in text


def _load(rank: int, deviation: float | None, logits_problems: list[str] | None = None) -> LoadMeasurement:
    return {  # type: ignore[typeddict-item]
        **dict.fromkeys(("rss_before", "peak_total", "held_total", "read_bytes"), 1 << 30),
        **dict.fromkeys(("anon_before", "file_before", "peak_anon", "peak_file", "held_anon", "held_file"), 1 << 29),
        **dict.fromkeys(("rchar", "owned_bytes"), 1 << 30),
        "rank": rank,
        "policy": "EPMeta",
        "loading_branch": "zero3_read_partitions",
        "transformers_file": "/t/src/transformers/__init__.py",
        "unpartitioned": 0,
        "seconds": 1.0,
        "touch_seconds": 0.0,
        "cpu_seconds": 1.0,
        "reading_seconds": 0.5 + rank,
        "initialize_seconds": None,
        "initialize_peak_total": None,
        "fingerprinted": 3,
        "value_problems": [],
        "logits_error": deviation,
        "logits_bound": None if deviation is None else 0.25,
        "logits_from_one_process": None if deviation is None else 0.5,
        "logits_from_rank0": None if deviation is None else 0.0,
        "logits_half_the_experts": None if deviation is None else 2.0,
        "logits_problems": logits_problems or [],
        "logits_not_judged": None,
    }


def test_a_load_row_carries_its_worst_rank_s_logits_and_fails_with_their_judge() -> None:
    epmeta = next(case for case in LOADS if case.label == "EPMeta: partition reads")
    row = load_row("s", epmeta, 2, 100, [_load(0, 0.0), _load(1, 0.125)], tree=Path("/t"), parameters=3)
    assert row.error is None
    assert (row.logits_error, row.logits_bound, row.logits_from_one_process) == (0.125, 0.25, 0.5)
    assert row.cpu_seconds == 2.0  # every rank's CPU together
    older = _load(1, 0.125)
    del older["cpu_seconds"]  # a result written before ranks measured it: rejudged, not failed
    assert load_row("s", epmeta, 2, 100, [_load(0, 0.0), older], tree=Path("/t"), parameters=3).cpu_seconds is None
    assert row.reading_seconds == 1.5  # the slowest rank's partition reads
    unread = _load(1, 0.125)
    unread["reading_seconds"] = None  # a rank that read no partitions: no figure for the row
    assert (
        load_row("s", epmeta, 2, 100, [_load(0, 0.0), unread], tree=Path("/t"), parameters=3).reading_seconds is None
    )
    assert "equal (3); logits 0.1250 <= 0.2500 (stock bf16 +- 0.5000; half the experts: 2.0000) |" in render_markdown(
        [row]
    )
    nan = load_row("s", epmeta, 2, 100, [_load(0, math.nan), _load(1, 0.0)], tree=Path("/t"), parameters=3)
    assert nan.logits_error is not None
    assert math.isnan(nan.logits_error)
    judged = [_load(0, 0.5, ["logits 0.5 (root mean square) from the float32 forward's"]), _load(1, 0.5)]
    failed = load_row("s", epmeta, 2, 100, judged, tree=Path("/t"), parameters=3)
    assert failed.error is not None
    assert "rank 0: logits 0.5 (root mean square) from the float32" in failed.error
    assert "values differ" not in failed.error
    unjudged = load_row("s", epmeta, 2, 100, [_load(0, None), _load(1, None)], tree=Path("/t"), parameters=3)
    assert "logits" not in render_markdown([unjudged], header=False)


def test_a_zero3_load_row_says_when_training_can_start_and_the_peak_through_initialize() -> None:
    epmeta = next(case for case in LOADS if case.label == "EPMeta: partition reads")
    ranks = [
        _load(0, None) | {"seconds": 1.0, "touch_seconds": 0.5, "initialize_seconds": 2.0},
        _load(1, None) | {"seconds": 1.5, "touch_seconds": 0.0, "initialize_seconds": 1.0},
    ]
    ranks[0]["initialize_peak_total"] = 3 << 30  # AutoEP gathers a layer's experts in initialize
    ranks[1]["initialize_peak_total"] = 1 << 30
    row = load_row("s", epmeta, 2, 100, ranks, tree=Path("/t"), parameters=3)
    assert (row.trainable_seconds, row.trainable_peak_gib) == (3.5, 3.0)
    assert "| s | 2 | EPMeta: partition reads | 3.50 | 3.00 |" in render_markdown([row])
    row = load_row("s", epmeta, 2, 100, [_load(0, None), _load(1, None)], tree=Path("/t"), parameters=3)
    assert (row.trainable_seconds, row.trainable_peak_gib) == (None, None)
    assert "Until training can start" not in render_markdown([row])


def test_deepspeed_autoep_is_a_stock_zero3_load_and_runs_where_it_has_a_preset() -> None:
    pytest.importorskip("deepspeed")
    from loadpolicy_lab.harness.launch import Tree
    from loadpolicy_lab.perf.cases import has_autoep_preset

    autoep = next(case for case in LOADS if case.autoep)
    assert (autoep.tree, autoep.zero3, autoep.moe_only) == (Tree.STOCK, True, True)
    assert autoep.spec(2, Path("c"), "MixtralForCausalLM", Path("f"))["autoep"] is True
    assert not any(case.spec(2, Path("c"), "M", Path("f"))["autoep"] for case in LOADS if not case.autoep)
    assert [has_autoep_preset(t) for t in ("mixtral", "qwen3_moe", "deepseek_v2", "gpt_oss")] == [1, 1, 1, 0]


def test_an_autoep_row_whose_regrouped_experts_were_not_judged_fails() -> None:
    # the fingerprints are taken before deepspeed.initialize; only the logits see the experts AutoEP regrouped
    autoep = next(case for case in LOADS if case.autoep)
    ranks = [_load(rank, None) | {"policy": None, "loading_branch": None} for rank in (0, 1)]  # the stock tree
    assert load_row("s", autoep, 2, 100, ranks, tree=Path("/t"), parameters=3).error is None
    for rank in ranks:
        rank["logits_not_judged"] = "the forward needs 9 GiB, 4 available"
    row = load_row("s", autoep, 2, 100, ranks, tree=Path("/t"), parameters=3)
    assert row.error == "AutoEP's regrouped experts not judged: the forward needs 9 GiB, 4 available"
    epmeta = next(case for case in LOADS if case.label == "EPMeta: partition reads")
    assert load_row("s", epmeta, 2, 100, [_load(0, None), _load(1, None)], tree=Path("/t"), parameters=3).error is None


@pytest.mark.parametrize("reader", ["dcp-4-threads", "dcp"])
def test_dcp_with_more_threads_reads_every_block_of_every_tensor_at_two_ranks(tmp_path: Path, reader: str) -> None:
    """Two real ranks of the reader worker: DCP in its row sharding, with its reading threads as the way says, every
    block judged against the file's bytes."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from loadpolicy_lab.harness.launch import launch, read_results
    from loadpolicy_lab.perf.cases import Reader
    from loadpolicy_lab.perf.contract import ReaderMeasurement
    from loadpolicy_lab.perf.judge import judge_reader

    checkpoint, tree = tmp_path / "checkpoint", tmp_path / "tree"
    checkpoint.mkdir()
    (tree / "src" / "transformers").mkdir(parents=True)  # the tree a launch runs on: none is imported here
    (tree / "src" / "transformers" / "__init__.py").write_text("", encoding="utf-8")
    save_file(
        {"a": torch.randn(6, 3).to(torch.bfloat16), "b": torch.arange(8, dtype=torch.float32)},
        str(checkpoint / "model.safetensors"),
    )
    spans = read_spans(checkpoint)
    results = read_results(
        launch(
            "loadpolicy_lab.perf.reader_worker",
            {"reader": reader, "checkpoint": str(checkpoint)},
            tree,
            tmp_path / "out",
            2,
            120.0,
        ),
        ReaderMeasurement,
    )
    assert not isinstance(results, str), results
    assert judge_reader(Reader(reader), results, sum(s.end - s.start for s in spans), len(spans)) == []
    assert [r["checked"] for r in results] == [2, 2]


def test_whole_tensors_go_to_the_expert_owner_and_the_rest_balance_the_bytes() -> None:
    def span(name: str, size: int, at: int) -> TensorSpan:
        return TensorSpan(Path("m.safetensors"), name, "BF16", (size // 2,), at, at + size)

    experts = [span(f"model.layers.0.mlp.experts.{e}.w1.weight", 100, 100 * e) for e in range(4)]
    rest = [span("embed", 300, 400), span("head", 250, 700), span("norm", 10, 950), span("q", 60, 960)]
    owners = whole_owners(experts + rest, 2)
    assert {name: owners[name] for name in [s.name for s in experts]} == expert_owners(experts, 2)
    assert set(owners) == {s.name for s in experts + rest}  # every tensor read once over the ranks
    load = [sum(s.end - s.start for s in experts + rest if owners[s.name] == r) for r in (0, 1)]
    assert abs(load[0] - load[1]) <= 60  # largest first to the lighter rank: within the smallest tensor's bytes
    assert whole_owners(experts + rest, 1) == dict.fromkeys(owners, 0)


def test_files_whole_go_largest_first_to_the_lighter_rank() -> None:
    from loadpolicy_lab.perf.ranges import file_owners

    def span(file: str, size: int) -> TensorSpan:
        return TensorSpan(Path(file), f"{file}.t", "BF16", (size // 2,), 0, size)

    spans = [span("a", 500), span("b", 300), span("c", 250), span("d", 100)]
    assert file_owners(spans, 2) == {Path("a"): 0, Path("b"): 1, Path("c"): 1, Path("d"): 0}
    assert file_owners(spans, 8) == {Path("a"): 0, Path("b"): 1, Path("c"): 2, Path("d"): 3}  # four ranks read none


@pytest.mark.parametrize(
    ("module", "read"), [("runai_model_streamer", "_stream_whole"), ("fastsafetensors", "_read_files")]
)
def test_a_whole_reader_gives_each_rank_its_tensors_and_they_are_checked_against_the_file(
    tmp_path: Path, module: str, read: str
) -> None:
    """Run:ai Model Streamer (tensors whole) and fastsafetensors (files whole) for real on a two-file checkpoint:
    over two ranks every tensor once, equal to the file, and a changed tensor reported."""
    torch = pytest.importorskip("torch")
    pytest.importorskip(module)

    from loadpolicy_lab.perf import reader_worker as worker

    tensors = _two_file_checkpoint(torch, tmp_path)
    spans = read_spans(tmp_path)
    try:
        held = [getattr(worker, read)(spans, rank, 2) for rank in (0, 1)]
        assert all(held), "each rank reads part of the checkpoint"
        assert sorted(name for state in held for name in state) == sorted(tensors)
        for state in held:
            assert all(torch.equal(tensor, tensors[name]) for name, tensor in state.items())
            assert worker._compare_with_file(state, spans) == (len(state), [])
        rank = next(r for r, state in enumerate(held) if "b" in state)
        held[rank]["b"][2] += 1
        assert worker._compare_with_file(held[rank], spans)[1] == ["b: differs from the file's"]
    finally:
        for buffer, loader in worker._OPEN:  # fastsafetensors' buffers, kept until compared
            buffer.close()
            loader.close()
        worker._OPEN.clear()


def test_a_whole_tensor_reader_must_compare_every_tensor_it_holds() -> None:
    from loadpolicy_lab.perf.judge import judge_reader

    def measured(rank: int, share: int, held: int, checked: int) -> ReaderMeasurement:
        return {
            "rank": rank,
            "reader": "runai",
            "seconds": 1.0,
            "share_bytes": share,
            "read_bytes": share,
            "rss_before": 0,
            "peak_anon": 0,
            "peak_file": 0,
            "peak_total": 0,
            "checked": checked,
            "value_problems": [],
            "held": held,
        }

    assert judge_reader(Reader.RUNAI, [measured(0, 60, 2, 2), measured(1, 40, 1, 1)], 100, 3) == []
    assert judge_reader(Reader.RUNAI, [measured(0, 60, 2, 1), measured(1, 40, 1, 1)], 100, 3) == [
        "rank 0 compared 1 of 2 tensors"
    ]
    assert judge_reader(Reader.RUNAI, [measured(0, 60, 2, 2), measured(1, 30, 1, 1)], 100, 3) == [
        "the ranks read 90 bytes of the checkpoint's 100"
    ]
