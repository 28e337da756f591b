"""The parity comparison and the bad-input judge, on synthetic rank results (the real runs are `tox -e multigpu`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loadpolicy_lab.faults.cases import FAULT_CASES, FaultCase
from loadpolicy_lab.faults.judge import describe, judge, launcher_signal
from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.harness.rank import RankFailure, parse, read_raw
from loadpolicy_lab.matrix.cases import STOCK_DEVICE_MAP_ERROR
from loadpolicy_lab.parity.cases import ParityCase, Trainer
from loadpolicy_lab.parity.contract import Reloaded, TrainedRank
from loadpolicy_lab.parity.judge import checkpoint_problems, compare_export, compare_resumed, compare_training
from loadpolicy_lab.parity.run import _outcome, _stock_outcome
from loadpolicy_lab.training.contract import SingleRun


EXPERT = "model.layers.0.mlp.experts.down_proj"


def single() -> dict[str, Any]:
    weights = {"model.embed_tokens.weight": torch.arange(6.0).reshape(2, 3), EXPERT: torch.arange(8.0).reshape(4, 2)}
    return {"losses": [4.0, 3.5, 3.0], "weights": weights}


def rank_result(rank: int, ranks: int = 2) -> dict[str, Any]:
    reference = single()
    n = 4 // ranks
    weights = dict(reference["weights"])
    weights[EXPERT] = weights[EXPERT][rank * n : (rank + 1) * n].clone()
    return {
        "policy": "EPMeta",
        "experts": [EXPERT],
        "expert_group_ranks": [[rank]],  # ep = world: no other rank holds this rank's experts
        "unchanged": {EXPERT: True},
        "losses": list(reference["losses"]),
        "weights": weights,
    }


def test_parity_passes_equal_results_and_compares_experts_as_the_rank_slice() -> None:
    problems, loss_rel, weight_rel = compare_training(single(), [rank_result(0), rank_result(1)])
    assert problems == []
    assert loss_rel == weight_rel == 0.0


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r.update(policy="MetaShardOnRead"), "policy MetaShardOnRead"),
        (lambda r: r.update(experts=[], unchanged={}), "no parameter was handed"),
        (lambda r: r["unchanged"].update({EXPERT: False}), "expert shards changed"),
        (lambda r: r["losses"].__setitem__(1, 3.5001), "losses differ by"),
        (lambda r: r["weights"][EXPERT].add_(1e-3), "final weights differ by"),
        (lambda r: r["losses"].pop(), "2 steps, expected 3"),
    ],
)
def test_parity_names_the_rank_and_what_differs(change: Any, needle: str) -> None:
    broken = rank_result(1)
    change(broken)
    problems, _, _ = compare_training(single(), [rank_result(0), broken])
    assert any(needle in problem for problem in problems), problems


def saved_checkpoint() -> dict[str, Any]:
    """A rank's record of save_checkpoint and reload that passes: the frozen patterns matched, the extra step equal,
    and `zero_to_fp32` refusing by name."""
    return {
        "loaded": True,
        "frozen": [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.experts.down_proj",
        ],
        "restored_equal": True,
        "loss_continued": 3.0,
        "loss_resumed": 3.0,
        "weights_continued": {"w": torch.ones(2)},
        "weights_resumed": {"w": torch.ones(2)},
        "zero_to_fp32_error": REFUSAL,
        "zero_to_fp32_state": {},
    }


def test_a_reload_that_changes_the_next_step_fails() -> None:
    saved = saved_checkpoint()
    assert checkpoint_problems([{"checkpoint": saved, "experts": [EXPERT]}]) == []
    # the expert pattern matched nothing (a rename): the frozen-expert path was not exercised
    drifted = dict(saved, weights_resumed={"w": torch.tensor([1.0, 1.5])}, frozen=saved["frozen"][:2])
    problems = checkpoint_problems([{"checkpoint": drifted, "experts": [EXPERT]}])
    assert any("matched no parameter: ['layers.0.mlp.experts.down_proj']" in p for p in problems)
    assert any("changed weights differently" in p for p in problems)


def test_a_stock_case_passes_only_by_failing_with_the_known_bug_on_every_rank() -> None:
    stock = ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, tree=Tree.STOCK)
    bug = {"error": f"ValueError: {STOCK_DEVICE_MAP_ERROR}."}
    assert _stock_outcome(stock, 0.0, [bug, bug]).passed
    # a crash of the worker (stock has no `_load_policy`), a rank with no result, or training through: not the bug
    for other in ({"error": "AttributeError: 'Qwen3MoeForCausalLM' has no attribute '_load_policy'"}, {}):
        outcome = _stock_outcome(stock, 0.0, [bug, other])
        assert not outcome.passed
        assert "ranks [1] did not fail with" in outcome.detail
    # a timeout or a failed reference never reaches the stock ranks: it fails
    assert not _outcome(stock, 0.0, ["deepspeed: timed out after 180s"]).passed
    assert not _outcome(stock, 0.0, []).passed


def test_parity_compares_key_sets_both_ways() -> None:
    short = rank_result(1)
    del short["weights"]["model.embed_tokens.weight"]
    problems, _, _ = compare_training(single(), [rank_result(0), short])
    assert any("rank 1: final weights: extra [], missing ['model.embed_tokens.weight']" in p for p in problems)


TORCHRUN_SUMMARY = """
Failures:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 19543)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 19543
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 19544)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 19544
"""


def test_the_killed_rank_and_the_stopped_ones_are_read_from_torchrun() -> None:
    assert launcher_signal(1, TORCHRUN_SUMMARY) == "SIGKILL"
    assert launcher_signal(0, TORCHRUN_SUMMARY) == "SIGTERM"
    assert describe(None, 1, TORCHRUN_SUMMARY).startswith("killed (SIGKILL)")
    killed = next(case for case in FAULT_CASES if case.killed)
    named = {
        "error": "RuntimeError: Ranks [1] did not finish loading in `from_pretrained` within 8s of this rank",
        "warnings": [],
        "seconds": 16.0,
    }
    assert judge(killed, 1, [named, None], TORCHRUN_SUMMARY) == []
    survivor = {"error": None, "warnings": [], "seconds": 1.0}
    assert "a rank finished loading although another was killed" in judge(
        killed, 1, [survivor, None], TORCHRUN_SUMMARY
    )
    # a survivor stopped without a result (torchrun's SIGTERM) has learnt nothing
    assert judge(killed, 1, [None, None], TORCHRUN_SUMMARY) == ["rank 0: no result"]


def test_a_rank_that_ends_with_its_backends_error_fails_the_case() -> None:
    killed = next(case for case in FAULT_CASES if case.killed)
    closed = {
        "error": "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:51329",
        "warnings": [],
        "seconds": 1.0,
    }
    problems = judge(killed, 1, [closed, None], TORCHRUN_SUMMARY)
    assert problems[0].startswith("rank 0 ended with its backend's error, not the failing rank's: RuntimeError")
    one_view = next(case for case in FAULT_CASES if case.bad_rank == "1" and not case.killed)
    own = {"error": "OSError: model.safetensors is truncated: its header describes 10 bytes", "seconds": 1.0}
    assert judge(one_view, 1, [closed, own], TORCHRUN_SUMMARY)[0].startswith("rank 0 ended with its backend")


def test_every_rank_must_raise_and_the_bad_rank_its_own_error() -> None:
    case = FaultCase("one rank", bad_rank="1", error="failed on rank(s) [{bad}]", bad_rank_error="SafetensorError")
    good = [
        {"error": "RuntimeError: `from_pretrained` failed on rank(s) [1]: rank 1: SafetensorError", "seconds": 1.0},
        {"error": "SafetensorError: incomplete metadata", "seconds": 1.0},
    ]
    assert judge(case, 1, good, "") == []
    silent = [{"error": None, "warnings": [], "seconds": 1.0}, good[1]]
    assert judge(case, 1, silent, "")[0].startswith("rank 0: expected an error")


def test_a_warning_case_needs_the_warning_on_every_rank() -> None:
    case = FaultCase("warns", warning="resolves to ep_size=1")
    warned = {"error": None, "warnings": ["... resolves to ep_size=1 ..."], "seconds": 1.0}
    assert judge(case, None, [warned, warned], "") == []
    quiet = {"error": None, "warnings": [], "seconds": 1.0}
    assert judge(case, None, [warned, quiet], "")[0].startswith("rank 1: expected the warning")


def reloaded_export() -> dict[str, Any]:
    """What the stock tree's one-process reload of a correct export reports."""
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.experts.0.down_proj.weight"]
    return {
        "weights": {n: w.clone() for n, w in single()["weights"].items()},
        "loading_info": {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []},
        "keys_on_disk": list(names),
        "keys_in_checkpoint": list(names),
    }


def saved_ranks() -> list[dict[str, Any]]:
    return [rank_result(rank) | {"export": {"save_peak_rise_mib": 1.0, "wrote_partitions": True}} for rank in range(2)]


def test_export_passes_a_reload_equal_to_one_process() -> None:
    assert compare_export(single(), reloaded_export(), saved_ranks()) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        # The saving bug: one rank's experts under the full tensor's name, or missing experts filled at random
        (lambda r: r["weights"].update({EXPERT: r["weights"][EXPERT][:2].clone()}), "has shape (2, 2)"),
        (lambda r: r["weights"][EXPERT][2:].normal_(), "differs from one process"),
        (lambda r: r["loading_info"].update(missing_keys=["model.layers.0.mlp.experts.down_proj"]), "missing_keys"),
        (lambda r: r["weights"][EXPERT].__setitem__((0, 0), float("nan")), "differs from one process by nan"),
        (lambda r: r["keys_on_disk"].pop(), "saved tensor names"),
        (lambda r: r["keys_on_disk"].append("model.layers.0.mlp.experts.down_proj"), "saved tensor names"),
        (lambda r: r["weights"].pop("model.embed_tokens.weight"), "reloaded parameters"),
    ],
)
def test_export_names_what_the_reload_got_wrong(change: Any, needle: str) -> None:
    reload = reloaded_export()
    change(reload)
    problems = compare_export(single(), reload, saved_ranks())
    assert any(needle in problem for problem in problems), problems


@pytest.mark.parametrize("wrote", [False, None])
def test_export_fails_a_rank_that_gathered_instead_of_writing_its_partitions(wrote: bool | None) -> None:
    ranks = saved_ranks()
    if wrote is None:
        del ranks[0]["export"]["wrote_partitions"]
    else:
        ranks[0]["export"]["wrote_partitions"] = wrote
    problems = compare_export(single(), reloaded_export(), ranks)
    assert problems == ["rank 0: saved by gathering, not by writing its own partitions"]


@pytest.mark.parametrize("wrote", [True, None])
def test_an_unshared_export_fails_a_rank_that_did_not_gather(wrote: bool | None) -> None:
    """Ranks that save into directories of their own cannot write partitions into one set of files: every one must
    have gathered (the gathered save is what `save-repeats-own-shard` breaks)."""
    ranks = saved_ranks()
    for rank in ranks:
        rank["export"]["wrote_partitions"] = False
    if wrote is None:
        del ranks[1]["export"]["wrote_partitions"]
    else:
        ranks[1]["export"]["wrote_partitions"] = wrote
    problems = compare_export(single(), reloaded_export(), ranks, gathered=True)
    assert problems == ["rank 1: wrote partitions, though each rank saved into a directory of its own"]


def test_an_unshared_export_that_gathered_passes_and_is_still_judged_by_its_reload() -> None:
    ranks = saved_ranks()
    for rank in ranks:
        rank["export"]["wrote_partitions"] = False
    assert compare_export(single(), reloaded_export(), ranks, gathered=True) == []
    reload = reloaded_export()
    reload["weights"][EXPERT][2:] = reload["weights"][EXPERT][:2]  # rank 0's experts repeated where rank 1's belong
    problems = compare_export(single(), reload, ranks, gathered=True)
    assert problems == [f"reloaded {EXPERT} differs from one process by 5.71e-01 (relative)"], problems


def test_an_unshared_export_is_a_case_only_input_with_its_own_label(tmp_path: Path) -> None:
    from loadpolicy_lab.parity.run import _CASE_ONLY, _worker_spec

    case = ParityCase("mixtral", 2, Trainer.DEEPSPEED, export=True, export_unshared=True)
    assert _worker_spec(case, tmp_path, tmp_path)["export_unshared"] is True
    assert (
        _worker_spec(ParityCase("mixtral", 2, Trainer.DEEPSPEED, export=True), tmp_path, tmp_path)["export_unshared"]
        is False
    )
    assert "export_unshared" in _CASE_ONLY
    assert "gathered to rank 0" in case.label


def test_export_fails_a_rank_without_a_record_of_saving() -> None:
    ranks = saved_ranks()
    del ranks[1]["export"]
    assert compare_export(single(), reloaded_export(), ranks) == ["rank 1: no record of saving"]


def test_resume_passes_the_uninterrupted_run_s_last_steps() -> None:
    full = [rank_result(rank) | {"losses": [4.0, 3.5, 3.0, 2.5]} for rank in range(2)]
    resumed = [rank_result(rank) | {"losses": [3.0, 2.5]} for rank in range(2)]
    assert compare_resumed(full, resumed) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r["losses"].__setitem__(1, float("nan")), "losses"),
        (lambda r: r["losses"].__setitem__(0, 3.01), "losses"),
        (lambda r: r["losses"].pop(), "1 steps, expected 2"),
        (lambda r: r["weights"][EXPERT].add_(1e-3), "final weights differ"),
        (lambda r: r["weights"][EXPERT].fill_(float("nan")), "by nan"),
        (lambda r: r["weights"].pop(EXPERT), "weights: extra [], missing"),
    ],
)
def test_resume_names_what_differs(change: Any, needle: str) -> None:
    full = [rank_result(rank) | {"losses": [4.0, 3.5, 3.0, 2.5]} for rank in range(2)]
    resumed = [rank_result(rank) | {"losses": [3.0, 2.5]} for rank in range(2)]
    change(resumed[1])
    problems = compare_resumed(full, resumed)
    assert any(needle in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("groups", "needle"),
    [
        ([[0, 1]], "partitioned over ranks [[0, 1]], expected [1]"),  # across the EP group: the #45548 bug
        ([[1], [0, 1]], "expected [1]"),  # shards of one rank in two groups
        ([], "expected [1]"),  # no group recorded
    ],
)
def test_parity_fails_expert_shards_outside_their_efsdp_group(groups: list[list[int]], needle: str) -> None:
    broken = rank_result(1) | {"expert_group_ranks": groups}
    problems, _, _ = compare_training(single(), [rank_result(0), broken])
    assert any(needle in p for p in problems), problems


def test_the_efsdp_group_is_strided_over_ep_groups() -> None:
    from loadpolicy_lab.parity.judge import expert_group_problems

    # world 4 = 2 EP groups of 2 consecutive ranks: rank 1 shares its experts with rank 3
    assert expert_group_problems(1, [[1, 3]], ep=2, world=4) == []
    assert expert_group_problems(1, [[0, 1]], ep=2, world=4) != []


def test_resume_names_a_resumed_rank_that_failed() -> None:
    full = [rank_result(rank) | {"losses": [4.0, 3.5, 3.0, 2.5]} for rank in range(2)]
    resumed: list[Any] = [rank_result(0) | {"losses": [3.0, 2.5]}, RankFailure("RuntimeError: no checkpoint")]
    assert compare_resumed(full, resumed) == ["resumed rank 1: RuntimeError: no checkpoint"]


@pytest.mark.parametrize("contract", [SingleRun, TrainedRank, Reloaded])
def test_a_result_missing_a_required_field_is_a_failure_naming_it(contract: Any, tmp_path: Path) -> None:
    """Before the contract a judge read such a result with `[...]` and the whole validation died on a KeyError (or,
    with `.get`, a missing record read as empty)."""
    complete = {"policy": "EPMeta", "experts": [], "unchanged": {}, "losses": [], "weights": {}, "loading_info": {}}
    complete |= {"expert_group_ranks": []}
    complete |= {"keys_on_disk": [], "keys_in_checkpoint": []}
    raw = {k: v for k, v in complete.items() if k in vars(contract)["__required_keys__"]}
    assert parse(raw, contract) is raw
    dropped = min(raw)
    del raw[dropped]
    failure = parse(raw, contract)
    assert isinstance(failure, RankFailure)
    assert repr(dropped) in failure.error
    assert contract.__name__ in failure.error


def test_a_missing_file_or_a_rank_s_own_error_is_a_failure(tmp_path: Path) -> None:
    missing = parse(read_raw(tmp_path / "rank3.pt"), TrainedRank)
    assert isinstance(missing, RankFailure)
    assert "rank3.pt: no result" in missing.error
    torch.save({"error": "OSError: no file named model.safetensors", "stage": "from_pretrained"}, tmp_path / "r.pt")
    failed = parse(read_raw(tmp_path / "r.pt"), Reloaded)
    assert failed == RankFailure("OSError: no file named model.safetensors", "from_pretrained")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r["weights"][EXPERT].fill_(float("nan")), "differs by nan"),
        (lambda r: r["losses"].__setitem__(0, float("nan")), "losses differ by nan"),
    ],
)
def test_parity_fails_a_nan(change: Any, needle: str) -> None:
    broken = rank_result(1)
    change(broken)
    problems, _, _ = compare_training(single(), [rank_result(0), broken])
    assert any(needle in problem for problem in problems), problems


def test_autoep_comparison_fails_a_nan_weight() -> None:
    from loadpolicy_lab.autoep.cases import Way
    from loadpolicy_lab.autoep.judge import judge as judge_autoep

    reference = {"losses": [4.0, 3.5], "initial": single()["weights"], "weights": single()["weights"]}
    ranks = []
    for rank in range(2):
        result = rank_result(rank)
        ranks.append(
            result
            | {"losses": [4.0, 3.5], "initial": result["weights"], "expert_rows": {EXPERT: [2 * rank, 2 * rank + 2]}}
        )
    assert judge_autoep(reference, ranks, Way.EPMETA).problems == []
    ranks[0]["weights"] = {n: w.clone() for n, w in ranks[0]["weights"].items()}
    ranks[0]["weights"]["model.embed_tokens.weight"][0, 0] = float("nan")
    problems = judge_autoep(reference, ranks, Way.EPMETA).problems
    assert any("final weights differ by nan" in p for p in problems), problems


def test_a_failed_parity_case_or_bad_input_fails_the_whole_validation() -> None:
    from loadpolicy_lab.parity.run import ParityOutcome
    from loadpolicy_lab.validate.report import ValidationResults

    case = ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED)
    passed, failed = ParityOutcome(case, 1.0, True, "ok"), ParityOutcome(case, 1.0, False, "losses differ")
    assert ValidationResults([], [passed]).unexpected() == []
    assert ValidationResults([], [passed, failed]).unexpected() == [failed]


def test_the_trl_recipe_is_judged_against_stock_dense_zero3_on_as_many_ranks(tmp_path: Path) -> None:
    """TRL's load-balancing loss is per micro-batch: one process on the global batch is not its reference."""
    from loadpolicy_lab.parity.run import _worker_spec

    trl = ParityCase("qwen3_moe", 2, Trainer.TRL_SFT, clip=0.0, optimizer="sgd", dispatch=True)
    assert _worker_spec(trl, tmp_path, tmp_path)["distributed_reference"] is True
    for way in (Trainer.DEEPSPEED, Trainer.ACCELERATE, Trainer.HF_TRAINER):
        assert _worker_spec(ParityCase("qwen3_moe", 2, way), tmp_path, tmp_path)["distributed_reference"] is False


def test_offload_is_a_case_only_input_the_one_process_reference_ignores(tmp_path: Path) -> None:
    from loadpolicy_lab.parity.run import _CASE_ONLY, _worker_spec

    spec = _worker_spec(ParityCase("mixtral", 2, Trainer.DEEPSPEED, offload=True), tmp_path, tmp_path)
    assert spec["offload"] is True
    assert "offload" in _CASE_ONLY


def checkpointed_ranks(error: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Two EP ranks after save_checkpoint, rank 0 with `zero_to_fp32`'s outcome (the others record none)."""
    ranks = [rank_result(rank) for rank in range(2)]
    for rank, result in enumerate(ranks):
        result["checkpoint"] = saved_checkpoint() | {
            "zero_to_fp32_error": error if rank == 0 else "",
            "zero_to_fp32_state": state if rank == 0 else {},
        }
    return ranks


REFUSAL = (
    "NotImplementedError: zero_to_fp32 cannot consolidate ...: ZeRO-3 partitioned 1 expert parameters "
    f"({EXPERT}) within their expert data-parallel groups, ..."
)


@pytest.mark.parametrize(
    ("error", "state", "needle"),
    [
        (REFUSAL, {}, None),
        ("", single()["weights"], None),  # a DeepSpeed that consolidates experts: every tensor whole
        # stock 0.19.8 on a trainable expert
        ("ValueError: consumed 2424 numels out of 2936 - something is wrong", {}, "without the refusal"),
        (REFUSAL.replace("1 expert", "2 expert"), {}, "counts 1 expert"),  # an expert left out of the count
        # stock 0.19.8 with only frozen experts placed: rank 0's experts under the full tensor's name
        ("", single()["weights"] | {EXPERT: single()["weights"][EXPERT][:2]}, "other than the trained ones"),
        ("", {"model.embed_tokens.weight": torch.arange(6.0).reshape(2, 3)}, "missing"),
        ("", single()["weights"] | {EXPERT: single()["weights"][EXPERT] * float("nan")}, "other than the trained"),
    ],
)
def test_zero_to_fp32_must_give_the_trained_tensors_or_refuse_by_name(
    error: str, state: dict[str, Any], needle: str | None
) -> None:
    problems = checkpoint_problems(checkpointed_ranks(error, state))
    if needle is None:
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


def test_an_expert_adapter_is_compared_as_the_blocks_of_the_rank_s_experts() -> None:
    from loadpolicy_lab.parity.judge import expert_slice

    experts, rank, out = 4, 2, 3
    # PEFT's layout for an adapter of stacked experts: lora_A rows expert-major, lora_B columns rank-major
    lora_a = torch.arange(experts * rank * 5.0).reshape(experts * rank, 5)
    lora_b = torch.arange(out * rank * experts * 1.0).reshape(out, rank, experts).reshape(out, rank * experts)
    assert torch.equal(expert_slice("x.lora_A.default.weight", lora_a, 1, 2, experts), lora_a[4:8])
    columns = lora_b.reshape(out, rank, experts)[:, :, 2:4].reshape(out, rank * 2)
    assert torch.equal(expert_slice("x.lora_B.default.weight", lora_b, 1, 2, experts), columns)
    # taken as rows, lora_B's second half would be other experts' columns (the slice a dense expert weight gets)
    assert not torch.equal(expert_slice("x.weight", lora_b.T, 1, 2, experts).T, columns)


def test_an_adapter_averaged_over_ranks_that_hold_other_experts_fails() -> None:
    name = "model.layers.0.mlp.experts.lora_B.default.weight"
    reference = single()
    reference["weights"][name] = torch.arange(8.0).reshape(2, 4)  # 2 out x (rank 1 x 4 experts)
    ranks = [rank_result(rank) for rank in range(2)]
    for rank, result in enumerate(ranks):
        result["experts"] = [EXPERT, name]
        result["unchanged"][name] = True
        result["weights"][name] = reference["weights"][name][:, rank * 2 : (rank + 1) * 2].clone()
    assert compare_training(reference, ranks)[0] == []
    averaged = (ranks[0]["weights"][name] + ranks[1]["weights"][name]) / 2
    for result in ranks:
        result["weights"][name] = averaged.clone()
    problems, _, _ = compare_training(reference, ranks)
    assert any(f"final {name} differs" in p for p in problems), problems


def test_a_resumed_case_hands_the_new_topology_to_its_launch_and_to_the_one_process_reference(tmp_path: Path) -> None:
    """The resumed launch gets the resumed topology's distributed config; the reference trains the same steps (its key
    differs from the case's without resuming, so a reference that did not continue is never reused for it)."""
    from loadpolicy_lab.parity.run import _CASE_ONLY, RESUMED_STEPS, _worker_spec

    resumed = _worker_spec(
        ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, dp=2, dispatch=True, resumed_ranks=2),
        tmp_path,
        tmp_path,
    )
    plain = _worker_spec(
        ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, dp=2, dispatch=True), tmp_path, tmp_path
    )
    assert resumed["distributed"] == {"fsdp_size": 4, "ep_size": 2}
    assert resumed["resumed_distributed"] == {"fsdp_size": 2, "ep_size": 2}
    assert (resumed["resumed_steps"], plain["resumed_steps"], plain["resumed_distributed"]) == (RESUMED_STEPS, 0, {})
    assert resumed["checkpoint_dir"]
    assert not plain["checkpoint_dir"]
    assert not {"resumed_distributed", "resumed_steps"} & set(_CASE_ONLY)


def test_fixed_batches_go_on_from_a_step_with_the_topology_they_are_given() -> None:
    """Step s's global batch comes from step s's seed whichever run asks for it; its rows are the topology's
    replicas' micro-batches."""
    import torch

    from loadpolicy_lab.parity.worker import MICRO_BATCH, fixed_batches

    spec: Any = {"distributed": {"fsdp_size": 4, "ep_size": 2}}
    first, then = fixed_batches(spec, 5), fixed_batches(spec | {"distributed": {"fsdp_size": 2, "ep_size": 2}}, 3, 5)
    assert [b.shape[0] for b in first + then] == [4 * MICRO_BATCH] * 5 + [2 * MICRO_BATCH] * 3
    assert torch.equal(fixed_batches(spec, 8)[5][: 2 * MICRO_BATCH], then[0])
