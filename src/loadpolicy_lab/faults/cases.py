"""The bad-input cases: what each breaks, on which rank, and the error (or warning) every rank must end with."""

from __future__ import annotations

from dataclasses import dataclass

from loadpolicy.shape import EPLayout
from loadpolicy_lab.harness.launch import Launcher


@dataclass(frozen=True, slots=True)
class FaultCase:
    name: str
    checkpoint: str = "qwen3_moe"  # a variant from `build_fault_checkpoints`
    layout: EPLayout = EPLayout.TP_EQUALS_EP  # how the DistributedConfig spells EP, over every rank
    # the DeepSpeed ZeRO-3 config exists "before" or only "after" from_pretrained, or on "rank 0 only"
    zero3: str = "before"
    process_group: bool = False  # initialized before from_pretrained, as deepspeed.init_distributed() would
    then_collective: bool = False  # the script's next collective after loading (a barrier)
    device_map: str | None = None
    bad_rank: str | None = None  # "1" or "last": the one rank whose view differs (checkpoint or kill)
    # The bad rank is SIGKILLed once it has read its weights, before anything that follows. Such a case runs one agent
    # per rank (`Launcher.NODES`, as on separate nodes): torchrun would stop the survivors, whose errors are judged
    killed: bool = False
    # What every rank must raise (a substring), or for the bad rank and the others when they differ
    error: str | None = None
    bad_rank_error: str | None = None
    warning: str | None = None  # expected on every rank when the case only warns (error None)
    # Only rank 0 raises `error`: the others loaded without ZeRO-3 (no error of their own) and must only end, by an
    # error in their next collective once rank 0 has failed, or stopped by torchrun
    others_end: bool = False
    # environment of the launch: a short bound on waiting for peers turns a rank left waiting into an error that
    # names the ranks it waited for, within the launch's bound
    env: tuple[tuple[str, str], ...] = ()
    # The error comes from the configuration or the file alone, the same on every rank whatever their number: the
    # main job runs it at 2 ranks, the sweep at 4 too
    same_at_any_world_size: bool = False

    def launcher(self) -> Launcher:
        return Launcher.NODES if self.killed else Launcher.TORCHRUN

    @property
    def waits_on_a_bound(self) -> bool:
        """Its ranks spend most of the launch waiting (on a killed peer, or on rank 0's failure), not computing."""
        return self.killed or self.others_end


def _cases() -> tuple[FaultCase, ...]:
    return (
        FaultCase(
            "ZeRO-3 with fsdp_size > 1",
            layout=EPLayout.FSDP_WITHOUT_EP,
            error="cannot be combined with FSDP2 data parallelism (fsdp_size=",
            same_at_any_world_size=True,
        ),
        FaultCase(
            "num_experts (5) not divisible by ep_size",
            checkpoint="five_experts",
            error="Cannot evenly shard 5 experts",
            same_at_any_world_size=True,  # 5 experts over any ep_size > 1 the ranks can make
        ),
        FaultCase(
            "enable_expert_parallel=True alone",
            layout=EPLayout.DEPRECATED_FLAG,
            warning="resolves to ep_size=1: the experts are not sharded",
        ),
        FaultCase(
            "user device_map='auto' with EP",
            device_map="auto",
            error="`device_map` are mutually exclusive",
            same_at_any_world_size=True,
        ),
        FaultCase(
            "EP + ZeRO-3 + quantized model (BitNet)",
            checkpoint="quantized",
            error="Expert parallelism (ep_size=",
            same_at_any_world_size=True,
        ),
        FaultCase(
            "truncated safetensors, one rank's view",
            bad_rank="1",
            # partition reads check the file's size against its header before reading a range
            error="`from_pretrained` failed on rank(s) [1]: rank 1: OSError",
            bad_rank_error="model.safetensors is truncated: its header describes",
        ),
        FaultCase(
            "truncated safetensors, every rank",
            checkpoint="truncated",
            error="model.safetensors is truncated",
            same_at_any_world_size=True,
        ),
        FaultCase(
            "checkpoint missing expert 3's weights",
            checkpoint="missing_expert",
            # Partition reads check the whole merged tensor on every rank: every rank names the missing tensors (not
            # the merged tensor's size mismatch), not only the one that owns expert 3
            error="ValueError: The checkpoint lacks 3 tensor(s) that ['model.layers.0.mlp.experts.down_proj', 'model"
            ".layers.0.mlp.experts.gate_up_proj'] are built from: model.layers.0.mlp.experts.3.down_proj.weight, model"
            ".layers.0.mlp.experts.3.gate_proj",
        ),
    )


def _cases_of_a_rank_that_dies_or_differs() -> tuple[FaultCase, ...]:
    """The cases where one rank is killed, or holds ZeRO-3 alone, or the config comes only after loading."""
    return (
        FaultCase(
            "a rank SIGKILLed between its reads and the tie check, one agent per rank",
            # config.json ties the embeddings and the head that the checkpoint stores apart: the first collective
            # after the reads is the tie check's all-reduce
            checkpoint="tied_pair",
            bad_rank="last",
            killed=True,
            error="Ranks [{bad}] did not finish loading in `from_pretrained` within 8s",
            env=(("TRANSFORMERS_LOAD_OUTCOME_TIMEOUT", "8"),),
        ),
        *(
            FaultCase(
                f"plain load, ZeRO-3 config on rank 0 only, {where}",
                layout=EPLayout.NONE,
                zero3="rank 0 only",
                process_group=process_group,
                then_collective=True,
                error="Ranks disagree on how to load (zero3_enabled: rank 0=True, ",
                others_end=True,
                env=(("TRANSFORMERS_LOAD_OUTCOME_TIMEOUT", "30"),),
            )
            for where, process_group in (("process group up", True), ("no process group yet", False))
        ),
        FaultCase(
            "ZeRO-3 config created after from_pretrained (Trainer)",
            zero3="after",
            error="before the DeepSpeed ZeRO-3 config existed",
            same_at_any_world_size=True,  # every rank checks its own model against the config the Trainer makes
        ),
    )


FAULT_CASES = (*_cases(), *_cases_of_a_rank_that_dies_or_differs())


def fault_runs(*, fast: bool, sweep: bool) -> list[tuple[FaultCase, int]]:
    """The (case, ranks) launches of a validation: every case at 2 ranks; at 4 as well in the main job where the
    outcome can depend on the world size, and for every case in the sweep; `fast` (CI) at 2 only."""
    return [
        (case, ranks)
        for case in FAULT_CASES
        for ranks in (2, 4)
        if ranks == 2 or not (fast or (case.same_at_any_world_size and not sweep))
    ]
