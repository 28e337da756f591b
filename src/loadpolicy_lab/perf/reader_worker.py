"""One rank of a reader launch beside the real-width loads: `python -m loadpolicy_lab.perf.reader_worker SPEC OUT`.

`pread` reads exactly this rank's share (the experts it holds whole, its ZeRO-3 partition of every other tensor:
`ranges.share`) with plain `preadv`
into one reused buffer: the cold-read limit a partition load is measured against. `pread-in-flight` reads the same
share in chunks, several `preadv` in flight, as the patched partition reads do: the limit of this disk for a reader
that keeps that many requests in flight. `pread-kept` reads them so into fresh anonymous memory, one mapping per
chunk, all kept until the share is read: what any load pays at least, the disk and the pages it fills. `dcp` is the
peer: torch DCP's `HuggingFaceStorageReader` (torchtitan's path) loading every tensor into a DTensor sharded by rows
over the world, its bytes then compared with a plain read of the file; `runai`, Run:ai Model Streamer, reads whole
tensors only: each rank the ones `ranges.whole_owners` gives it, compared alike; `fastsafetensors` reads whole files:
each rank the ones `ranges.file_owners` gives it. Writes OUT/rank<R>.json (`contract.ReaderMeasurement`).
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.device import host_rank_device, start_process_group
from loadpolicy_lab.harness.procfs import PeakSampler, io_counters, memory_status, reset_resident_peak
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.perf.cases import DCP_ANY, DCP_THREADS, Reader
from loadpolicy_lab.perf.contract import ReaderMeasurement, ReaderSpec
from loadpolicy_lab.perf.ranges import TensorSpan, expert_owners, file_owners, read_spans, share, whole_owners


BUFFER = 64 << 20
# as the patched partition reads (`READ_CHUNK_BYTES`, `READS_IN_FLIGHT` of `deepspeed_partition_reads`)
CHUNK = 16 << 20
IN_FLIGHT = 4
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64", "I32": "int32"}


def _read_range(fd: int, view: memoryview, file: Path, start: int, end: int) -> int:
    """Bytes `[start, end)` of `fd` through `view`, reused; the bytes read."""
    position = start
    while position < end:
        count = os.preadv(fd, [view[: min(len(view), end - position)]], position)
        if count <= 0:
            raise OSError(f"{file}: nothing read at byte {position} of [{start}, {end})")
        position += count
    return end - start


def _pread(ranges: list[tuple[Path, int, int]]) -> int:
    view = memoryview(bytearray(BUFFER))
    fds = {file: os.open(file, os.O_RDONLY) for file in dict.fromkeys(file for file, _, _ in ranges)}
    try:
        return sum(_read_range(fds[file], view, file, start, end) for file, start, end in ranges)
    finally:
        for fd in fds.values():
            os.close(fd)


def _pread_in_flight(ranges: list[tuple[Path, int, int]], kept: list[mmap.mmap] | None = None) -> int:
    """The same ranges in `CHUNK` pieces, `IN_FLIGHT` at a time, each thread through its own reused buffer, or
    (`kept` given) each chunk into a fresh anonymous mapping of its size, appended to `kept` for the caller to free
    after its clock stops (a load frees nothing)."""
    chunks = [(file, at, min(at + CHUNK, end)) for file, start, end in ranges for at in range(start, end, CHUNK)]
    fds = {file: os.open(file, os.O_RDONLY) for file in dict.fromkeys(file for file, _, _ in ranges)}
    buffers = threading.local()

    def read(chunk: tuple[Path, int, int]) -> int:
        file, start, end = chunk
        if kept is not None:
            mapping = mmap.mmap(-1, end - start)
            kept.append(mapping)
            return _read_range(fds[file], memoryview(mapping), file, start, end)
        if not hasattr(buffers, "view"):
            buffers.view = memoryview(bytearray(CHUNK))
        return _read_range(fds[file], buffers.view, file, start, end)

    try:
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            return sum(pool.map(read, chunks))
    finally:
        for fd in fds.values():
            os.close(fd)


# what `pread-kept` read, held until its rank's clock stopped
_KEPT: list[mmap.mmap] = []


def _pread_kept(ranges: list[tuple[Path, int, int]]) -> int:
    return _pread_in_flight(ranges, _KEPT)


def _dcp_destination(
    spans: list[TensorSpan], world: int, experts_whole_on: int | None = None
) -> tuple[dict[str, Any], Any]:
    """Empty DTensors sharded by rows over the world, one per tensor of the checkpoint (0-d ones replicated). With
    `experts_whole_on` (this rank), a tensor stored per expert is instead a plain tensor of its whole shape in the
    state of the rank that holds the expert (`ranges.expert_owners`), and absent from the others'."""
    import torch  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: PLC0415
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    # in host memory on any machine, as every reader reads (the process group is the CPU's: `host_rank_device`)
    mesh = init_device_mesh("cpu", (world,))
    owners = {} if experts_whole_on is None else expert_owners(spans, world)
    state: dict[str, Any] = {}
    for span in spans:
        if span.dtype not in _DTYPES:
            raise ValueError(f"{span.name}: dtype {span.dtype} is not one of {sorted(_DTYPES)}")
        if span.name in owners:
            if owners[span.name] == experts_whole_on:
                state[span.name] = torch.empty(span.shape, dtype=getattr(torch, _DTYPES[span.dtype]))
            continue
        placements = [Shard(0)] if span.shape else [Replicate()]
        local_shape, _ = compute_local_shape_and_global_offset(span.shape, mesh, placements)
        local = torch.empty(local_shape, dtype=getattr(torch, _DTYPES[span.dtype]))
        whole = torch.Size(span.shape)
        state[span.name] = DTensor.from_local(
            local, mesh, placements, run_check=False, shape=whole, stride=torch.empty(whole, device="meta").stride()
        )
    return state, mesh


def _compare_with_file(state: dict[str, Any], spans: list[TensorSpan]) -> tuple[int, list[str]]:
    """Each local block's bytes against the same rows read from the file with `pread` (untimed)."""
    import torch  # noqa: PLC0415
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    problems = []
    held = [span for span in spans if span.name in state]
    for span in held:
        tensor = state[span.name]
        if not hasattr(tensor, "to_local"):  # an expert's tensor held whole
            expected = torch.frombuffer(
                bytearray(_read(span.file, span.start, span.end - span.start)), dtype=torch.uint8
            )
            if not torch.equal(tensor.contiguous().reshape(-1).view(torch.uint8), expected):
                problems.append(f"{span.name}: differs from the file's")
            continue
        local = tensor.to_local().contiguous()
        _, offset = compute_local_shape_and_global_offset(span.shape, tensor.device_mesh, tensor.placements)
        row = (span.end - span.start) // span.shape[0] if span.shape else span.end - span.start
        first = span.start + (offset[0] * row if span.shape else 0)
        expected = torch.frombuffer(
            bytearray(_read(span.file, first, local.numel() * local.element_size())), dtype=torch.uint8
        )
        if not torch.equal(local.reshape(-1).view(torch.uint8), expected):
            problems.append(f"{span.name}: rows from {offset[0] if span.shape else 0} differ from the file's")
    return len(held), problems


def _read(file: Path, start: int, size: int) -> bytes:
    with file.open("rb") as handle:
        handle.seek(start)
        data = handle.read(size)
    if len(data) != size:
        raise OSError(f"{file}: {len(data)} of {size} bytes at {start}")
    return data


def _stream_whole(spans: list[TensorSpan], rank: int, world: int) -> dict[str, Any]:
    """The tensors `ranges.whole_owners` gives this rank, read whole by Run:ai Model Streamer into tensors it owns
    (kept, as a load keeps what it reads)."""
    try:
        from runai_model_streamer import SafetensorsStreamer  # noqa: PLC0415  # optional: a peer reader
    except ImportError as error:
        raise RuntimeError(
            "the runai reader needs runai-model-streamer (pip install runai-model-streamer==0.17.1; tox -e lab has it)"
        ) from error
    owners = whole_owners(spans, world)
    mine = [span for span in spans if owners[span.name] == rank]
    if not mine:
        return {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(
            sorted({str(span.file) for span in mine}), tensor_names=[span.name for span in mine], owned=True
        )
        return dict(streamer.get_tensors())


def _read_files(spans: list[TensorSpan], rank: int, world: int) -> dict[str, Any]:
    """The files `ranges.file_owners` gives this rank, read whole by fastsafetensors into its host buffer (kept until
    the comparison, as a load keeps what it reads); no GPUDirect Storage on this CPU."""
    try:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup  # noqa: PLC0415  # optional: a peer reader
    except ImportError as error:
        raise RuntimeError(
            "the fastsafetensors reader needs fastsafetensors (pip install fastsafetensors==0.5.0; tox -e lab has it)"
        ) from error
    import torch  # noqa: PLC0415

    owners = file_owners(spans, world)
    mine = sorted(str(file) for file, owner in owners.items() if owner == rank)
    if not mine:
        return {}
    # a group of its own: its broadcast of files to other ranks is what fails on gloo, and not what is measured
    loader = SafeTensorsFileLoader(SingleGroup(), torch.device("cpu"), nogds=True)
    loader.add_filenames({0: mine})
    buffer = loader.copy_files_to_device()
    _OPEN.append((buffer, loader))
    return {span.name: buffer.get_tensor(span.name) for span in spans if str(span.file) in mine}


# the fastsafetensors buffers and loaders a read keeps, closed once its tensors were compared
_OPEN: list[Any] = []


# keyed by the readers (string enums): a spec's plain string finds its entry
_PREADS = {Reader.PREAD: _pread, Reader.PREAD_IN_FLIGHT: _pread_in_flight, Reader.PREAD_KEPT: _pread_kept}
_WHOLE = {Reader.RUNAI: _stream_whole, Reader.FASTSAFETENSORS: _read_files}


def _local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _release() -> None:
    """What a read kept until its values were compared: the kept chunks, fastsafetensors' buffers."""
    for mapping in _KEPT:
        mapping.close()
    _KEPT.clear()
    for buffer, loader in _OPEN:
        buffer.close()
        loader.close()
    _OPEN.clear()


def _measure(this: Rank, spec: ReaderSpec) -> ReaderMeasurement:
    import torch  # noqa: PLC0415
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    # no transformers here, but the launch's environment is the tree's: which transformers it would import
    this.facts["transformers_file"] = getattr(importlib.util.find_spec("transformers"), "origin", None)
    checkpoint = Path(spec["checkpoint"])
    spans = read_spans(checkpoint)
    ranges = share(spans, this.rank, this.world_size)
    this.stage("init_distributed")
    # every reader reads into host memory (the limit a load is measured against, and DCP beside it): the CPU's
    # backend on any machine
    start_process_group(host_rank_device())
    state: dict[str, Any] = {}
    if spec["reader"] in DCP_ANY:
        whole_on = this.rank if spec["reader"] == Reader.DCP_EXPERTS else None
        state, _ = _dcp_destination(spans, this.world_size, whole_on)
    elif spec["reader"] not in (*_PREADS, *_WHOLE):
        accepted = sorted(map(str, [*DCP_ANY, *_PREADS, *_WHOLE]))
        raise ValueError(f"reader {spec['reader']!r} is not one of {accepted}")
    torch.distributed.barrier()
    reset_resident_peak()
    before, io_before = memory_status(), io_counters()
    this.stage(f"read ({spec['reader']})")
    start, cpu_start = time.perf_counter(), time.process_time()
    with PeakSampler() as sampler:
        if spec["reader"] in DCP_ANY:
            threads = DCP_THREADS.get(Reader(spec["reader"]), 1)
            dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint), thread_count=threads))
            share_bytes = sum(_local(t).numel() * _local(t).element_size() for t in state.values())
        elif spec["reader"] in _WHOLE:
            state = _WHOLE[Reader(spec["reader"])](spans, this.rank, this.world_size)
            share_bytes = sum(t.numel() * t.element_size() for t in state.values())
        else:
            share_bytes = _PREADS[Reader(spec["reader"])](ranges)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    io_after = io_counters()
    peak_hwm = memory_status()["VmHWM"]
    this.stage("compare")
    checked, problems = _compare_with_file(state, spans) if state else (0, [])
    held = len(state)
    state.clear()
    _release()
    torch.distributed.barrier()
    return {
        "rank": this.rank,
        "reader": spec["reader"],
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "share_bytes": share_bytes,
        "read_bytes": io_after["read_bytes"] - io_before["read_bytes"],
        "rss_before": before["RssAnon"] + before["RssFile"] + before["RssShmem"],
        "peak_anon": sampler.peak["anon"],
        "peak_file": sampler.peak["file"],
        "peak_total": max(sampler.peak["total"], peak_hwm),
        "checked": checked,
        "value_problems": problems,
        "held": held,
    }


if __name__ == "__main__":
    run_rank(_measure, ReaderSpec)
