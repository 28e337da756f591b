"""What a rank of the performance suite reports: for one `from_pretrained` (`LoadMeasurement`, between `worker` and
`run`), for a reader launch (`ReaderMeasurement`, between `reader_worker` and `widths_run`) and for a save
(`SaveMeasurement`, between `save_worker` and `save_run`).

Read back with `parity.contract.parse`: a result lacking a field is a failure naming it, never a zero.
"""

from typing import NotRequired, TypedDict


class LogitsFigures(TypedDict):
    """Where the spec names a logits reference (`perf.logits`), after `deepspeed.initialize`; None where it names
    none."""

    logits_error: float | None  # root mean square of (logits - the float32 one-process logits)
    logits_bound: float | None  # from the bf16 one-process forward's
    logits_from_one_process: float | None  # max |logits - the bf16 one-process logits|: 0, the stock forward exactly
    logits_from_rank0: float | None  # root mean square of (logits - rank 0's logits)
    logits_half_the_experts: float | None  # the error of a forward missing half of every layer's experts (reference)
    logits_problems: list[str]  # the judges' (`perf.logits`): against the reference, against rank 0
    logits_not_judged: str | None  # why the forward did not run (`perf.logits_rank`): the ranks here lack the memory


class LoadMeasurement(LogitsFigures):
    """Bytes are of this rank's process; `*_before` just before `from_pretrained`, `peak_*` during it, `held_*` after
    every tensor was touched."""

    rank: int
    policy: str | None  # stock transformers has no `_load_policy`
    loading_branch: str | None  # the policy's loader (gate 3), None on stock
    transformers_file: str
    unpartitioned: int  # parameters without a ZeRO-3 `ds_id`
    seconds: float
    touch_seconds: float  # touching every loaded tensor once afterwards: the reads a memory-mapped load deferred
    # of `seconds`, those in the patched tree's partition reads (files opened to the last byte in place, conversions
    # included; not building the model): None on stock or where none ran (absent from older runs' results)
    reading_seconds: NotRequired[float | None]
    # user + system CPU of this rank's process (all its threads) during `from_pretrained`: over the ranks, against
    # the cores times the seconds, whether a load was bound by this machine's cores (absent from older runs' results)
    cpu_seconds: NotRequired[float]
    # `deepspeed.initialize(model)` after touching, ZeRO-3 launches only (None otherwise): what is left to do before
    # training, e.g. partitioning (and broadcasting) a model loaded whole
    initialize_seconds: float | None
    initialize_peak_total: int | None  # peak RSS during that `deepspeed.initialize` (None where it did not run)
    rss_before: int
    anon_before: int
    file_before: int
    peak_anon: int
    peak_file: int
    peak_total: int
    # the most GPU memory torch's allocator held during `from_pretrained`; None on the CPU (absent from older runs')
    device_peak_bytes: NotRequired[int | None]
    held_anon: int
    held_total: int
    held_file: int
    read_bytes: int  # read from storage, loading and touching together
    read_bytes_loading: int
    rchar: int  # bytes this rank's read calls returned while loading (`pread` counts, memory-mapped pages do not)
    owned_bytes: int  # bytes of the parameters and buffers this rank holds
    fingerprinted: int  # parameters whose held values were compared with the checkpoint's (`perf.fingerprint`)
    value_problems: list[str]  # those that differ, or that the model and the reference do not share (and the logits)


class BenchSpec(TypedDict):
    """What `run` hands every rank of a load (OUT/spec.json)."""

    policy: str  # the policy the case expects (judged by `run`, recorded here)
    zero3: bool
    distributed: dict[str, int | bool] | None
    requested: str | None  # an explicit `load_policy=`
    checkpoint: str
    model_class: str
    fingerprints: str  # the stock one-process load's fingerprints of the checkpoint (`perf.fingerprint`)
    logits: str | None  # the stock one-process forwards' logits (`perf.logits`): judged after loading where given
    # DeepSpeed AutoEP regroups the experts over every rank in `deepspeed.initialize` (its `expert_parallel` section,
    # the preset named like the checkpoint's model type; stock tree, with `autoep.worker`'s registry shim)
    autoep: bool


class ReaderSpec(TypedDict):
    reader: str  # a `cases.Reader`
    checkpoint: str


class ReaderMeasurement(TypedDict):
    rank: int
    reader: str
    seconds: float  # the read alone, every rank starting together; the slowest rank counts
    cpu_seconds: NotRequired[float]  # this process's, every thread's, user + system, over the read (not in older runs)
    share_bytes: int  # bytes of the tensor ranges this rank reads (its ZeRO-3 partition of every tensor)
    read_bytes: int  # read from storage (/proc/self/io) during the read
    rss_before: int
    peak_anon: int
    peak_file: int
    peak_total: int
    # tensors whose bytes this rank compared with a plain read of the file (0 for the pread limit, which keeps none)
    checked: int
    value_problems: list[str]
    held: NotRequired[int]  # DCP: the tensors in this rank's state dict (every one, unless experts are held whole)


class SaveSpec(TypedDict):
    way: str  # a `cases.SaveWay`
    model_class: str
    checkpoint: str
    distributed: dict[str, int | bool] | None
    directory: str  # where the save writes (emptied before the launch)


class SaveMeasurement(TypedDict):
    rank: int
    policy: str | None
    transformers_file: str
    seconds: float  # the save alone, every rank starting together; the slowest rank counts
    held_total: int  # resident bytes once loaded, just before saving
    peak_total: int  # the largest resident bytes while saving
    # the most GPU memory torch's allocator held while saving; None on the CPU (absent from older runs' results)
    device_peak_bytes: NotRequired[int | None]
    partition_bytes: int  # the bytes of this rank's partitions
    # rank 0, for ways whose files are checked: names whose saved tensor differs from the checkpoint's, or is missing
    # or extra; None elsewhere
    saved_unequal: list[str] | None
    compared: int  # tensors compared with the checkpoint (0 where nothing is checked)
