"""What a process reads about itself from /proc: resident memory by kind, I/O counters, a peak sampler; and the page
cache eviction that makes a launch read from storage."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def memory_status() -> dict[str, int]:
    """Resident memory of this process in bytes: anonymous, file-backed, shared, and the kernel's peak."""
    fields = {}
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def io_counters() -> dict[str, int]:
    pairs = (line.split(":") for line in Path("/proc/self/io").read_text(encoding="utf-8").splitlines())
    return {key: int(value) for key, value in pairs}


def reset_resident_peak() -> None:
    """This process's resident peak (VmHWM) back to its resident size now: the next phase's peak is its own."""
    Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")


class PeakSampler:
    """Track the largest anonymous, file-backed and total RSS seen while running."""

    def __init__(self, interval: float = 0.005) -> None:
        self.peak = {"anon": 0, "file": 0, "total": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(interval)

    def sample(self) -> None:
        status = memory_status()
        anon, file = status["RssAnon"], status["RssFile"] + status["RssShmem"]
        self.peak = {
            "anon": max(self.peak["anon"], anon),
            "file": max(self.peak["file"], file),
            "total": max(self.peak["total"], anon + file),
        }

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def evict_from_page_cache(path: Path) -> None:
    """Drop the checkpoint's pages from the page cache, so every launch reads from storage (cold start), with no
    write-back of earlier launches' files left to compete with its reads."""
    os.sync()
    for file in path.iterdir():
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
