"""The GPU check's judge, placement check and no-GPU answer, without a GPU or a launch."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from loadpolicy_lab.gpu import run
from loadpolicy_lab.gpu.cases import CASES, CASES_BY_NAME, Kind
from loadpolicy_lab.gpu.judge import judge


EP_CASE = CASES_BY_NAME["epmeta-w2-shared"]
READ_CASE = CASES_BY_NAME["read"]


def _passing(ranks: int = 2) -> list[dict[str, Any]]:
    return [
        {
            "rank": rank,
            "policy": "EPMeta",
            "misplaced": [],
            "placed": 40,
            "saved_unequal": [] if rank == 0 else None,
            "compared": 30 if rank == 0 else 0,
            "trained_max_diff": 3e-7 if rank == 0 else None,
            "bound": 1e-5,
            "moved": 30 if rank == 0 else 0,
        }
        for rank in range(ranks)
    ]


def test_a_passing_case_passes() -> None:
    assert judge(EP_CASE, _passing()) == []


@pytest.mark.parametrize(
    ("rank", "key", "value", "expected"),
    [
        (1, "policy", "Zero3Init", "rank 1 loaded as Zero3Init, expected EPMeta"),
        (1, "misplaced", ["model.layers.0.mlp.gate.e_score_correction_bias: buffer on cpu"], "rank 1: 1 misplaced"),
        (0, "placed", 0, "rank 0: nothing's placement was checked"),
        (0, "saved_unequal", ["lm_head.weight"], "differs from the checkpoint: ['lm_head.weight']"),
        (0, "saved_unequal", None, "was not compared with the checkpoint"),
        (0, "compared", 0, "was not compared with the checkpoint"),
        (0, "trained_max_diff", 2e-5, "differ from the one-device reference by 2e-05"),
        (0, "trained_max_diff", math.nan, "differ from the one-device reference by nan"),
        (0, "trained_max_diff", None, "differ from the one-device reference by None"),
        (0, "moved", 0, "the steps trained nothing"),
    ],
)
def test_each_check_fails_its_case(rank: int, key: str, value: object, expected: str) -> None:
    results = _passing()
    results[rank][key] = value
    assert any(expected in problem for problem in judge(EP_CASE, results)), judge(EP_CASE, results)


@pytest.mark.parametrize("key", ["misplaced", "placed", "compared", "trained_max_diff", "bound", "moved", "policy"])
def test_a_missing_field_fails(key: str) -> None:
    results = _passing()
    for result in results:
        del result[key]
    assert judge(EP_CASE, results)


def test_a_missing_rank_fails() -> None:
    assert judge(EP_CASE, _passing(1)) == ["1 results for 2 ranks"]


def _read_result() -> dict[str, Any]:
    return {
        "rank": 0,
        "bytes": 10**9,
        "seconds": {"pipeline": 0.5, "preadv + copy": 1.0, "copy alone": 0.1},
        "unequal": [],
    }


def test_the_read_case_fails_on_other_bytes_or_a_missing_time() -> None:
    assert judge(READ_CASE, [_read_result()]) == []
    other = _read_result() | {"unequal": ["model.embed_tokens.weight"]}
    assert "other bytes than the checkpoint's" in judge(READ_CASE, [other])[0]
    untimed = copy.deepcopy(_read_result())
    del untimed["seconds"]["pipeline"]
    assert judge(READ_CASE, [untimed]) == ["no time for pipeline"]
    assert judge(READ_CASE, [_read_result() | {"bytes": 0}]) == ["nothing was read"]


def test_every_case_runs_on_one_gpu_or_says_how_many_it_needs() -> None:
    # a one-GPU machine runs every case that is not about several GPUs
    one_gpu = {case.name for case in CASES if case.gpus == 1}
    assert {"dense-w1", "dense-offload-w1", "epmeta-w2-shared", "epmeta-w4-shared", "read"} <= one_gpu
    assert all(case.device == "cuda-shared" for case in CASES if case.ranks > case.gpus)
    assert [case.kind for case in CASES].count(Kind.READ) == 1


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from loadpolicy.cli import main

    monkeypatch.setattr(run, "visible_gpus", lambda: 0)
    monkeypatch.setattr(run, "gpu_check", lambda *_: pytest.fail("launched cases without a GPU"))
    assert main(["dev", "gpu"]) == 0
    assert capsys.readouterr().out.strip() == run.NO_GPU


def test_placement_names_every_partition_placeholder_and_buffer_off_the_device() -> None:
    torch = pytest.importorskip("torch")
    from loadpolicy_lab.gpu.worker import _misplaced
    from loadpolicy_lab.harness.device import RankDevice

    # the rank's device is `meta` here, standing for cuda:N: only what is on it counts as placed
    meta = RankDevice(torch.device("meta"), "gloo")
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.empty(0, device="meta"))
    model.weight.ds_tensor = torch.empty(4, device="meta")
    model.bias = torch.nn.Parameter(torch.empty(0))  # a placeholder left on the CPU
    model.bias.ds_tensor = torch.empty(2)  # and its partition
    model.register_buffer("e_score_correction_bias", torch.empty(4))
    model.register_buffer("inv_freq", torch.empty(2, device="meta"))
    problems, checked = _misplaced(model, CASES_BY_NAME["dense-w1"], meta)
    assert checked == 4
    assert problems == [
        "bias: partition on cpu, expected meta",
        "bias: placeholder on cpu, expected meta",
        "e_score_correction_bias: buffer on cpu, expected meta",
    ]
    # under offload the partitions belong on the host, the placeholders still on the device
    problems, _ = _misplaced(model, CASES_BY_NAME["dense-offload-w1"], meta)
    assert "weight: partition on meta, expected cpu" in problems
    assert "bias: partition on cpu, expected cpu" not in " ".join(problems)
