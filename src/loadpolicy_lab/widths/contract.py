"""The real-widths readers' contract: what `run` hands every rank of a reader launch (ReaderSpec), what a rank
reports (ReaderMeasurement). The transformers loads use the load benchmark's (`bench.contract`)."""

from typing import NotRequired, TypedDict


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
