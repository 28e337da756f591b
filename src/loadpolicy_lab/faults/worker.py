"""One rank of a bad-input case: load the way the case says, record what happened and when.

`python -m loadpolicy_lab.faults.worker SPEC OUT` under torchrun. Writes OUT/rank<R>.json: the error (type and
message) or None, the warnings raised while loading, and the seconds from the start of `from_pretrained` to its
outcome; OUT/rank<R>.stage says where the rank is.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from loadpolicy_lab.faults.contract import FaultSpec
from loadpolicy_lab.harness.device import rank_device, start_process_group, training_args_device_kwargs
from loadpolicy_lab.harness.rank import Rank
from loadpolicy_lab.harness.setup import show_zero3, zero3_config


def _kill_this_rank_after_its_reads() -> None:
    """SIGKILL this process once it has read its weights and before anything that follows them (the outcome's
    exchange, the tie check), as an OOM killer or a lost node would."""
    from transformers import modeling_utils  # noqa: PLC0415

    read = modeling_utils.PreTrainedModel._load_pretrained_model

    def read_then_killed(*args: Any, **kwargs: Any) -> None:
        read(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    modeling_utils.PreTrainedModel._load_pretrained_model = staticmethod(read_then_killed)


def _model_class(spec: FaultSpec) -> Any:
    """The model class, imported with torch, transformers and what `_load` uses: not part of the time to the error."""
    import transformers  # noqa: PLC0415
    import transformers.integrations.deepspeed  # noqa: PLC0415

    return getattr(transformers, spec["model_class"])


def _load(spec: FaultSpec, model_class: Any, rank: int, world: int, out: str) -> None:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import DistributedConfig  # noqa: PLC0415

    zero3 = zero3_config(world)
    device = rank_device()
    if spec["process_group"]:
        start_process_group(device)  # as deepspeed.init_distributed() or Accelerator() would
    zero3_here = spec["zero3"] == "before" or (spec["zero3"] == "rank 0 only" and rank == 0)
    keep_alive = show_zero3(zero3) if zero3_here else None  # noqa: F841  # held while loading
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if spec["distributed"] is not None:
        kwargs["distributed_config"] = DistributedConfig(**spec["distributed"])
    if spec["device_map"] is not None:
        kwargs["device_map"] = spec["device_map"]
    checkpoint = spec["checkpoints"].get(str(rank), spec["checkpoints"]["*"])
    if spec["kill_rank"] == rank:
        _kill_this_rank_after_its_reads()
    model = model_class.from_pretrained(checkpoint, **kwargs)
    if spec["then_collective"]:
        # What a script does next (deepspeed.initialize, a training step): its first collective after loading
        if not torch.distributed.is_initialized():
            start_process_group(device)
        torch.distributed.barrier()
    if spec["zero3"] == "after":
        # The DeepSpeed config appears only now, with the TrainingArguments, as when they are built after loading.
        args = transformers.TrainingArguments(
            out, deepspeed=zero3, report_to="none", **training_args_device_kwargs(device)
        )
        transformers.Trainer(model=model, args=args)


def main(spec_path: str, out_dir: str) -> None:
    """Not `run_rank`: the error is the outcome under test, recorded with its time, then raised as a script would."""
    out = Path(out_dir)
    this = Rank(out)
    rank, world = this.rank, this.world_size
    spec: FaultSpec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    this.stage("import")
    model_class = _model_class(spec)
    this.stage("from_pretrained")
    start = time.monotonic()
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _load(spec, model_class, rank, world, out_dir)
        except Exception as exc:  # the outcome under test
            error = f"{type(exc).__name__}: {exc}"
    result = {
        "error": error,
        "warnings": sorted({str(w.message) for w in caught if spec["warning"] and spec["warning"] in str(w.message)}),
        "seconds": time.monotonic() - start,
    }
    this.write(result)
    this.stage("done")
    # torchrun stops every rank as soon as one exits with an error: give the others a bounded moment to record
    # their own outcome first (the outcome and its time are already written; this only delays the exit).
    # (Not when the others only end once this rank has exited: they wait in a collective for it.)
    deadline = time.monotonic() + (0 if spec["others_end"] else 20)
    expected = [r for r in range(world) if r != spec["kill_rank"]]  # a killed rank writes nothing
    while time.monotonic() < deadline and not all((out / f"rank{r}.json").exists() for r in expected):
        time.sleep(0.2)
    # Exit like a user script that does not catch the error, so the launcher sees the failure.
    sys.exit(1 if error else 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
