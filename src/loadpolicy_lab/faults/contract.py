"""What a fault rank is handed: the contract between `run` (writes OUT/spec.json) and `worker` (reads it).

A rank's result is its error (type and message), the warnings the case names and the seconds to them, read by `run`'s
judges as a plain dict: every field there is judged as text.
"""

from __future__ import annotations

from typing import TypedDict


class FaultSpec(TypedDict):
    model_class: str
    checkpoints: dict[str, str]  # rank (as text) -> checkpoint; "*" for every other rank
    distributed: dict[str, int | bool] | None
    zero3: str  # "before", "after" or "rank 0 only": when the ZeRO-3 config exists
    device_map: str | None
    kill_rank: int | None  # the rank SIGKILLed once it has read its weights
    warning: str | None  # the warning to record, when the case only warns
    process_group: bool  # initialized before from_pretrained
    then_collective: bool  # a barrier after loading
    others_end: bool  # only rank 0 raises: the others wait for its end
