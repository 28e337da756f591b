"""The launch description every feature shares, and the per-rank protocol every worker speaks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import pytest

from loadpolicy.policy import LoadPolicyError, ParallelSizes, PolicyName
from loadpolicy.shape import EPLayout, LaunchShape
from loadpolicy_lab.harness.rank import Rank, run_rank


@pytest.mark.parametrize(
    ("shape", "config", "sizes"),
    [
        (LaunchShape(4, True), None, ParallelSizes()),
        (LaunchShape(4, True, EPLayout.TP_EQUALS_EP), {"tp_size": 4, "ep_size": 4}, ParallelSizes(tp=4, ep=4)),
        (
            LaunchShape(4, True, EPLayout.TP_EQUALS_EP, group=2),
            {"tp_size": 2, "ep_size": 2, "dp_replicate_size": 2},
            ParallelSizes(tp=2, ep=2, dp_replicate=2),
        ),
        (LaunchShape(2, True, EPLayout.TOKEN_DISPATCH), {"fsdp_size": 2, "ep_size": 2}, ParallelSizes(fsdp=2, ep=2)),
        (
            LaunchShape.dispatching(4, 2, zero3=True),
            {"fsdp_size": 4, "ep_size": 2},
            ParallelSizes(fsdp=4, ep=2),
        ),
        (LaunchShape(2, True, EPLayout.FSDP_WITHOUT_EP), {"fsdp_size": 2}, ParallelSizes(fsdp=2)),
        (LaunchShape(2, True, EPLayout.DEPRECATED_FLAG), {"enable_expert_parallel": True}, ParallelSizes()),
    ],
)
def test_each_layout_spells_one_distributed_config(
    shape: LaunchShape, config: dict[str, Any] | None, sizes: ParallelSizes
) -> None:
    assert shape.distributed_config() == config
    assert shape.parallel_sizes() == sizes
    assert shape.dp * shape.ep == shape.ranks


def test_the_selector_decides_the_policy_of_a_shape() -> None:
    assert LaunchShape(4, True).selected().name is PolicyName.ZERO3_INIT
    assert LaunchShape(4, False, EPLayout.TP_EQUALS_EP).selected().name is PolicyName.META_SHARD_ON_READ
    assert LaunchShape(4, True, EPLayout.TP_EQUALS_EP, group=2).selected().name is PolicyName.EP_META
    assert LaunchShape.dispatching(4, 2, zero3=True).selected().name is PolicyName.EP_META
    with pytest.raises(LoadPolicyError, match="fsdp_size=2"):
        LaunchShape(2, True, EPLayout.FSDP_WITHOUT_EP).selected()


def test_each_rank_trains_its_own_batch_only_with_token_dispatch() -> None:
    assert LaunchShape.dispatching(4, 2, zero3=True).batches == 4
    assert LaunchShape.experts_over(4, 2, zero3=True).batches == 2
    assert LaunchShape.experts_over(4, 4, zero3=True).batches == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": 0, "zero3": True}, "ranks must be >= 1, got 0"),
        ({"ranks": 4, "zero3": True, "layout": EPLayout.TP_EQUALS_EP, "group": 3}, "ep=3 must divide ranks=4"),
        ({"ranks": 4, "zero3": True, "group": 2}, "needs EP; the layout is none"),
    ],
)
def test_impossible_shapes_name_the_value(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LoadPolicyError, match=message):
        LaunchShape(**kwargs)


def test_a_group_of_every_rank_is_the_default_spelling() -> None:
    assert LaunchShape(4, True, EPLayout.TP_EQUALS_EP, group=4) == LaunchShape(4, True, EPLayout.TP_EQUALS_EP)


def test_experts_over_spells_ep_as_transformers_does() -> None:
    assert LaunchShape.experts_over(4, 2, zero3=True) == LaunchShape(4, True, EPLayout.TP_EQUALS_EP, group=2)
    assert LaunchShape.experts_over(4, 4, zero3=False) == LaunchShape(4, False, EPLayout.TP_EQUALS_EP)
    assert LaunchShape.experts_over(4, 1, zero3=True) == LaunchShape(4, True)


def _spec(tmp_path: Path) -> list[str]:
    (tmp_path / "spec.json").write_text(json.dumps({"steps": 2}), encoding="utf-8")
    return [str(tmp_path / "spec.json"), str(tmp_path)]


def test_a_rank_writes_its_result_with_its_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def body(rank: Rank, spec: dict[str, Any]) -> dict[str, Any]:
        rank.facts["tree"] = "patched"
        rank.stage("training")
        return {"steps": spec["steps"], "world": rank.world_size}

    run_rank(body, dict, argv=_spec(tmp_path))
    assert json.loads((tmp_path / "rank1.json").read_text()) == {"steps": 2, "world": 2, "tree": "patched"}
    assert (tmp_path / "rank1.stage").read_text() == "done"


def test_a_result_appears_only_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers exit once every result file exists, and the launcher may then kill this rank: a result file must never
    exist before its contents do."""
    monkeypatch.setenv("RANK", "0")
    rank = Rank(tmp_path)
    written: list[Path] = []
    real_write_text = Path.write_text

    def observed(path: Path, *args: Any, **kwargs: Any) -> int:
        written.append(path)
        return real_write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", observed)
    rank.write({"error": None})
    # the bytes go elsewhere first: under the result's own name they would be seen half-written
    assert written
    assert tmp_path / "rank0.json" not in written
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"error": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json"]


def test_a_failing_rank_says_where_and_why_then_exits_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")

    def body(rank: Rank, spec: dict[str, Any]) -> dict[str, Any]:
        rank.facts["transformers_file"] = "/tree/src/transformers/__init__.py"
        rank.stage("deepspeed.initialize")
        raise RuntimeError("no expert groups")

    with pytest.raises(RuntimeError, match="no expert groups"):
        run_rank(body, dict, argv=_spec(tmp_path))
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["error"] == "RuntimeError: no expert groups"
    assert result["stage"] == "deepspeed.initialize"
    assert "raise RuntimeError" in result["traceback"]
    assert result["transformers_file"].endswith("__init__.py")  # facts survive a failure


def test_without_exit_on_error_the_failure_is_recorded_and_the_rank_ends_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")

    def body(rank: Rank, spec: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("DeepSpeed Zero-3 is not compatible with passing a `device_map`")

    run_rank(body, dict, exit_on_error=False, argv=_spec(tmp_path))
    assert "device_map" in json.loads((tmp_path / "rank0.json").read_text())["error"]


class _StepsAndLr(TypedDict):
    steps: int
    lr: float


def test_a_spec_lacking_a_key_of_its_contract_fails_the_rank_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    called = []

    def body(rank: Rank, spec: _StepsAndLr) -> dict[str, Any]:
        called.append(spec)
        return {}

    with pytest.raises(KeyError, match=r"lacks \['lr'\] \(a _StepsAndLr\)"):
        run_rank(body, _StepsAndLr, argv=_spec(tmp_path))
    assert not called
    assert "lacks ['lr']" in json.loads((tmp_path / "rank0.json").read_text())["error"]
