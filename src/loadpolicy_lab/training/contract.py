"""The training every suite that trains shares: what a run is given (`TrainingSpec`) and the one-process reference.

No `from __future__ import annotations`: TypedDict reads `NotRequired` off evaluated annotations only, and
`harness.rank.parse` relies on `__required_keys__`.
"""

from typing import Any, TypedDict


Tensor = Any  # torch.Tensor: torch is Any to mypy in this project (pyproject.toml)


class SingleRun(TypedDict):
    """The one-process reference: its loss per step and its final weights."""

    losses: list[float]
    weights: dict[str, Tensor]


class TrainingSpec(TypedDict):
    """A training run: the model and checkpoint, the steps on fixed data, the optimizer and the launch's layout."""

    model_class: str
    checkpoint: str
    steps: int
    lr: float
    optimizer: str  # adamw or sgd
    distributed: dict[str, int | bool]  # EP: every parity launch has one
    clip: float
    frozen: list[str]  # parameter names kept frozen
    offload: bool  # ZeRO-3 offloads parameters and optimizer states to the CPU
    # resuming at another topology: after `steps`, DeepSpeed's checkpoint is converted to a Universal Checkpoint and a
    # new launch with this distributed config ({} for none) loads it and trains `resumed_steps` more steps; the one
    # process trains the same steps on that topology's global batches
    resumed_distributed: dict[str, int | bool]
    resumed_steps: int
