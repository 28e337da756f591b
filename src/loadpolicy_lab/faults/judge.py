"""The bad-input and failure cases' judge: what every rank ended with, against what the case expects of it.

Pure: the ranks' results and the launcher's output in, the problems out. A rank that ends with its backend's error
("Connection closed by peer") learnt nothing of why, and fails the case as much as a rank that loaded.
"""

from __future__ import annotations

import re
from typing import Any

from loadpolicy_lab.faults.cases import FaultCase


def launcher_signal(rank: int, log: str) -> str | None:
    """The signal that ended `rank`, from torchrun's failure summary in the launcher's `log` (e.g. SIGKILL, SIGTERM),
    if it names one."""
    found = re.search(rf"rank\s*:\s*{rank} \(local_rank.*?\n\s*exitcode\s*:\s*-\d+ \(pid: \d+\)\s*\((SIG\w+)\)", log)
    return found.group(1) if found else None


def describe(result: dict[str, Any] | None, rank: int, log: str) -> str:
    """What `rank` ended with: its error, its warnings, or what torchrun's summary in `log` says of it."""
    if result is None:
        match launcher_signal(rank, log):
            case "SIGKILL":
                return "killed (SIGKILL) while loading; torchrun reports it"
            case "SIGTERM":
                return "stopped by torchrun (SIGTERM) once another rank died"
            case other:
                return f"no result; torchrun reports {other}"
    if result["error"]:
        return str(result["error"])[:240]
    return "warned: " + "; ".join(result["warnings"])[:240] if result["warnings"] else "loaded, no warning"


def judge(case: FaultCase, bad: int | None, results: list[dict[str, Any] | None], log: str) -> list[str]:
    """Why the ranks' `results` (None: a rank wrote none) are not what `case` expects, `bad` its failing rank and
    `log` the launcher's output: every rank the failing rank's error (never its backend's), or the warning."""
    problems = [
        f"rank {rank} ended with its backend's error, not the failing rank's: {str(result['error'])[:160]}"
        for rank, result in enumerate(results)
        if result is not None and _backend_error(str(result["error"])) and not (case.others_end and rank)
    ]
    if case.killed:
        problems += _killed_problems(bad, results, log)
    for rank, result in enumerate(results):
        if case.killed and rank == bad:
            continue
        if rank != 0 and case.others_end:
            problems += _ended_problems(rank, result, log)
            continue
        if result is None:
            problems.append(f"rank {rank}: no result")
            continue
        expected = case.bad_rank_error if rank == bad and case.bad_rank_error else case.error
        if expected is None:
            if result["error"] or not result["warnings"]:
                problems.append(
                    f"rank {rank}: expected the warning {case.warning!r}, got {describe(result, rank, log)}"
                )
        elif expected.format(bad=bad) not in str(result["error"]):
            problems.append(f"rank {rank}: expected an error with {expected.format(bad=bad)!r}, got {result['error']}")
    return problems


def _killed_problems(bad: int | None, results: list[dict[str, Any] | None], log: str) -> list[str]:
    problems = []
    if launcher_signal(bad or 0, log) != "SIGKILL":
        problems.append(f"torchrun did not report rank {bad} as killed")
    if any(rank != bad and r is not None and not r["error"] for rank, r in enumerate(results)):
        problems.append("a rank finished loading although another was killed")
    return problems


# What a collective reports when a peer has gone: gloo at once, NCCL only at its timeout. A rank that ends with one of
# these learnt nothing of why
BACKEND_ERRORS = re.compile(
    r"Connection closed by peer|Connection reset by peer|NCCL (error|communicator)|Watchdog caught"
)


def _backend_error(error: str) -> bool:
    return bool(BACKEND_ERRORS.search(error))


def _ended_problems(rank: int, result: dict[str, Any] | None, log: str) -> list[str]:
    """A rank with no error of its own must still end: by an error in its next collective, or stopped by torchrun."""
    if result is None and launcher_signal(rank, log) != "SIGTERM":
        return [f"rank {rank}: no result, and torchrun did not stop it"]
    if result is not None and not result["error"]:
        return [f"rank {rank}: finished without an error although the others failed"]
    return []
