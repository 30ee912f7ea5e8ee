"""trainers.backends.run_in_processes: calls in spawned processes come back in order, and
the first failure stops the rest instead of waiting for them."""

from __future__ import annotations

import os
import time

import pytest

from trainers.backends import run_in_processes, threads_per_process, usable_cores


def _pid_after(seconds: float, value: int) -> tuple[int, int]:
    time.sleep(seconds)
    return os.getpid(), value


def _fail(message: str) -> None:
    raise RuntimeError(message)


def test_calls_run_in_their_own_processes_and_return_in_order():
    results = run_in_processes([(_pid_after, (0.5, 1), {}), (_pid_after, (0.0, 2), {})])
    assert [value for _, value in results] == [1, 2]
    pids = {pid for pid, _ in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert run_in_processes([]) == []


def test_the_first_failure_is_raised_without_waiting_for_the_other_calls():
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="arm 2 broke"):
        run_in_processes([(_pid_after, (120.0, 1), {}), (_fail, ("arm 2 broke",), {})])
    assert time.perf_counter() - started < 60  # the 120 s call was stopped, not awaited


def test_threads_are_shared_out_and_never_zero():
    assert threads_per_process(4, 2) == 2
    assert threads_per_process(1, 2) == 1
    assert threads_per_process(0, 1) == usable_cores()
