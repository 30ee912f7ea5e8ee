"""Independent calls in separate processes on one machine (the checks' arms side by side,
the paired evaluation's shards).

    results = run_in_processes([(play, (tasks_a,), {}), (play, (tasks_b,), {})])

Why processes and not threads: the project's policies are small, so one process with two
torch intra-op threads leaves a core idle for much of each short matrix product, while two
processes keep both busy (benchmarks/parallel_checks.py measures it). Processes are started
with `spawn`: a forked child would inherit the parent's torch thread pool and its locks.
Everything a call takes and returns is pickled, so it must be plain data (configs, paths,
trajectories), not open handles, lambdas or live clients.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def threads_per_process(threads: int, processes: int) -> int:
    """Torch threads for each of `processes` sharing `threads` (0 = the usable cores)."""
    return max(1, (threads or usable_cores()) // max(1, processes))


def run_in_processes(calls: Sequence[Call], processes: int | None = None) -> list[Any]:
    """Run each (function, args, kwargs) in a spawned process, at most `processes` at once
    (default: one per call); return their results in the calls' order.

    The first call to fail stops the others (their processes are terminated rather than left
    to finish work nobody will read) and its exception is raised here.
    """
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    if not calls:
        return []
    pool = ProcessPoolExecutor(max_workers=processes or len(calls),
                               mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(function, *args, **kwargs) for function, args, kwargs in calls]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:  # a failure first, before waiting on calls still running
            if future in done and future.exception() is not None:
                raise future.exception()
        return [future.result() for future in futures]
    except BaseException:
        # The executor has no public way to stop a call that is running: end its processes.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["run_in_processes", "threads_per_process", "usable_cores"]
