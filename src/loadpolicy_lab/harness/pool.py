"""Independent launches a few at a time: each is a bounded subprocess session, so threads only wait on them.

On a CPU machine a launch leaves part of the cores idle (process start-up, rendezvous, a rank waiting on a peer's
error); a second launch beside it fills them. With GPUs each launch takes one per rank, so they run one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar


Result = TypeVar("Result")


def run_all(
    jobs: Sequence[Callable[[], Result]],
    workers: int,
    done: Callable[[int, Result], None],
    stop: Callable[[], None] = lambda: None,
    waiting: Collection[int] = (),
) -> list[Result]:
    """Run every job, at most `workers` at once, in the order given; `done(index, result)` is called in this thread
    as each one ends (so in the order they end). Returns the results in the order of `jobs`. An exception of a job
    (a bug of the harness, not a failed run: runs report their own failures) is raised once the running jobs end.
    Interrupted (Ctrl-C), `stop()` ends the running jobs (their launches killed) and no other job starts.

    `waiting`: the indices of jobs that spend most of their time waiting on a bound (a rank killed, a peer that never
    arrives), not computing. With `workers` > 1 (the CPU) they run one at a time in a lane of their own, from the
    start, beside the others, so their waits overlap computation instead of holding a core idle; with one worker
    (a GPU per rank) every job waits its turn."""
    if workers < 1:
        raise ValueError(f"workers={workers}: at least 1 launch must run at a time")
    lane = set(waiting) if workers > 1 else set()
    results: dict[int, Result] = {}
    errors: list[BaseException] = []
    pending = [(i, job) for i, job in reversed(list(enumerate(jobs))) if i not in lane]
    pending_waits = [(i, job) for i, job in reversed(list(enumerate(jobs))) if i in lane]
    with ThreadPoolExecutor(workers + 1) as pool:
        running: dict[Future[Result], int] = {}
        try:
            while pending or pending_waits or running:
                while pending and sum(i not in lane for i in running.values()) < workers:
                    index, job = pending.pop()
                    running[pool.submit(job)] = index
                if pending_waits and not any(i in lane for i in running.values()):
                    index, job = pending_waits.pop()
                    running[pool.submit(job)] = index
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = running.pop(future)
                    if (error := future.exception()) is not None:
                        errors.append(error)
                        # start nothing new; the launches running end at their own bound
                        pending.clear()
                        pending_waits.clear()
                        continue
                    results[index] = future.result()
                    done(index, results[index])
        except BaseException:
            stop()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if errors:
        raise errors[0]
    return [results[index] for index in range(len(jobs))]
