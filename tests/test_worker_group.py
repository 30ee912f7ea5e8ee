"""Worker groups (trainers.distributed) without Ray: verbs on every worker, per-worker
arguments, and the fault handling of `map` / `call_sticky` driven by a backend whose
workers can die (tests/test_rl_driver.py kills a real Ray actor)."""

from __future__ import annotations

import pytest

from trainers.backends import InProcess, WorkerSpec
from trainers.distributed import WorkerGroup


class Died(Exception):
    """Stands for a dead worker (Ray's actor error)."""


class MortalBackend(InProcess):
    dead_errors = (Died,)
    start_errors = (Died,)


class Worker:
    started = 0

    def __init__(self, doomed: list[int]):
        Worker.started += 1
        self.number = Worker.started
        self.doomed = doomed  # the numbers of workers that die on their next call
        self.weights = None
        self.log: list[int] = []

    def ping(self) -> str:
        return f"w{self.number}"

    def set_weights(self, weights: str) -> None:
        self._maybe_die()
        self.weights = weights

    def square(self, item: int) -> tuple[int, str, str | None]:
        self._maybe_die()
        self.log.append(item)
        return item * item, self.ping(), self.weights

    def add(self, a: int, b: int) -> int:
        return a + b

    def _maybe_die(self) -> None:
        if self.number in self.doomed:
            self.doomed.remove(self.number)
            raise Died(f"worker {self.number}")


def group_of(size: int, doomed: list[int], max_restarts: int) -> WorkerGroup:
    Worker.started = 0
    return WorkerGroup(MortalBackend(), [WorkerSpec(Worker, (doomed,))] * size,
                       max_restarts=max_restarts, role="square worker",
                       restarts_field="squares.max_restarts")


def test_calls_reach_every_worker_with_shared_or_own_arguments():
    group = group_of(3, [], 0)
    assert group.names == {w: f"w{i + 1}" for i, w in enumerate(group.workers)}
    assert group.call(Worker.add, 1, 2) == [3, 3, 3]
    assert group.call_each(Worker.add, [(1, 1), None, (3, 3)]) == [2, None, 6]
    assert group.call_first(Worker.ping) == "w1"
    with pytest.raises(ValueError, match="2 argument lists for 3 workers"):
        group.call_each(Worker.add, [(1, 1), (2, 2)])


def test_map_runs_every_item_once_in_item_order():
    group = group_of(1, [], 0)
    seen = []
    results = group.map(Worker.square, [3, 1, 2], on_result=lambda result, g: seen.append(result))
    assert [value for value, _, _ in results] == [9, 1, 4]
    assert seen == results  # the hook sees each result as it finishes
    assert group.workers[0].log == [3, 1, 2]


def test_a_dead_workers_item_runs_again_on_a_replacement_with_the_current_weights():
    group = group_of(1, [], max_restarts=1)
    group.call_sticky(Worker.set_weights, "v0")
    group.workers[0].doomed.append(1)  # worker 1 dies on its first item
    results = group.map(Worker.square, [5, 6])
    assert [value for value, _, _ in results] == [25, 36]  # nothing lost, nothing twice
    assert {name for _, name, _ in results} == {"w2"}  # the replacement ran them
    assert {weights for _, _, weights in results} == {"v0"}  # after the sticky call
    assert (group.restarts, group.retried) == (1, 1)
    assert list(group.names.values()) == ["w2"]


def test_a_worker_dying_during_a_sticky_call_is_replaced_and_gets_the_call():
    group = group_of(2, [], max_restarts=2)
    group.workers[1].doomed.append(2)
    group.call_sticky(Worker.set_weights, "v1")
    assert [w.weights for w in group.workers] == ["v1", "v1"]
    assert group.names[group.workers[1]] == "w3" and group.restarts == 1


def test_no_restarts_left_and_no_worker_alive_fails_naming_the_setting():
    group = group_of(1, [1], max_restarts=0)
    with pytest.raises(RuntimeError, match="every square worker died.*squares.max_restarts"):
        group.map(Worker.square, [1])


def test_a_replacement_that_fails_to_start_uses_up_a_restart():
    group = group_of(1, [], max_restarts=2)
    group.call_sticky(Worker.set_weights, "v0")
    group.workers[0].doomed.extend([1, 2])  # worker 2 (the first replacement) dies at once
    assert [value for value, _, _ in group.map(Worker.square, [4])] == [16]
    assert group.restarts == 2 and list(group.names.values()) == ["w3"]


def test_in_process_errors_are_not_taken_for_dead_workers():
    Worker.started = 0
    group = WorkerGroup(InProcess(), [WorkerSpec(Worker, ([1],))], max_restarts=3)
    with pytest.raises(Died):
        group.map(Worker.square, [1])
    assert group.restarts == 0


# --- straggler cutoff: map(need=..., cancel=...) ------------------------------------------
class Threads(InProcess):
    """Each call runs on its own thread, so a slow worker does not hold the others (as on
    Ray) and its `cancel` can reach it while it runs."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(16)

    def submit(self, worker, verb, *args):
        return self.pool.submit(getattr(worker, verb), *args)

    def wait_any(self, futures):
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        return next(iter(done))

    def get(self, futures):
        return [future.result() for future in futures]


class GroupWorker:
    """Rolls out a 'group' of 3 members; the groups in `slow` never finish on their own: they
    wait (between turns) until cancelled, then give up (a straggler)."""

    def __init__(self, slow: set[int], started: list[int]):
        import threading

        self.slow, self.started = slow, started
        self.cancelled: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def rollout(self, group: int):
        import threading

        with self.lock:
            event = self.cancelled.setdefault(group, threading.Event())
        self.started.append(group)
        if group in self.slow:
            if not event.wait(timeout=60):  # a safety net only: the test cancels it
                raise AssertionError(f"group {group} was never cancelled")
            return ("cancelled", group)
        return [f"g{group}/{member}" for member in range(3)]

    def cancel(self, group: int) -> None:
        import threading

        with self.lock:
            self.cancelled.setdefault(group, threading.Event()).set()


def test_cutoff_keeps_whole_finished_groups_and_cuts_the_stragglers():
    started: list[int] = []
    group = WorkerGroup(Threads(), [WorkerSpec(GroupWorker, ({1, 4}, started))] * 3,
                        role="rollout worker")
    done: list[object] = []
    results = group.map(GroupWorker.rollout, list(range(6)), lambda result, _: done.append(result),
                        need=4, cancel=GroupWorker.cancel)
    kept = {i: r for i, r in enumerate(results) if r is not None}
    assert sorted(kept) == [0, 2, 3, 5]  # the four fast groups, whatever their order
    assert all(r == [f"g{i}/{m}" for m in range(3)] for i, r in kept.items())  # whole
    assert results[1] is None and results[4] is None  # a cut group never reaches the batch
    assert sorted(done, key=str) == sorted(kept.values(), key=str)  # hooks: kept ones only
    assert group.cut == 2 and len(kept) + group.cut == 6
    assert sorted(started) == list(range(6))  # every group ran once, none twice
    # The cut workers are free again: a full map reaches every worker and runs every group.
    started.clear()
    again = group.map(GroupWorker.rollout, [10, 11, 12, 13])
    assert [r[0] for r in again] == ["g10/0", "g11/0", "g12/0", "g13/0"]
    assert sorted(started) == [10, 11, 12, 13] and group.cut == 2


def test_cutoff_in_process_starts_only_the_groups_it_needs():
    started: list[int] = []
    group = WorkerGroup(InProcess(), [WorkerSpec(GroupWorker, (set(), started))],
                        role="rollout worker")
    results = group.map(GroupWorker.rollout, list(range(5)), need=3, cancel=GroupWorker.cancel)
    assert [r is not None for r in results] == [True, True, True, False, False]
    assert started == [0, 1, 2] and group.cut == 2


def test_remembered_arguments_are_computed_when_a_replacement_starts():
    group = group_of(2, [1], max_restarts=1)
    calls: list[int] = []
    group.remember(Worker.set_weights, lambda: (calls.append(1) or "lazy weights",))
    assert calls == []  # nothing sent to the live workers
    results = group.map(Worker.square, [1, 2])
    assert [r[0] for r in results] == [1, 4]
    assert calls == [1] and results[0][2] == "lazy weights"  # the replacement got them


def test_verbs_are_methods_of_the_worker_class_not_names():
    """A verb is the worker class's method (go-to-definition reaches it); a name, or a
    method the workers' class lacks, is refused before anything runs."""
    group = group_of(2, doomed=[], max_restarts=0)
    with pytest.raises(TypeError, match=r"a square worker verb is a method of the worker class "
                                        r"\(e\.g\. Learner\.update\), not 'square'"):
        group.call("square", 2)
    with pytest.raises(AttributeError, match=r"Worker has no verb 'rollout' "
                                             r"\(GroupWorker\.rollout was called on its "
                                             r"square workers\)"):
        group.map(GroupWorker.rollout, [1])
    assert group.call(Worker.square, 3) == [(9, "w1", None), (9, "w2", None)]
