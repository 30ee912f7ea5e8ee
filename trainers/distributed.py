"""Worker groups and the gradient sum: how the RL run and data-parallel SFT spread work.

    group = WorkerGroup(backend, [WorkerSpec(Cls, args, kwargs, resources), ...])
    group.call(Cls.save, path)                         every worker, same arguments
    group.call_each(Cls.update, [(part0,), (part1,)])  worker i gets its own arguments
    group.call_first(Cls.weights)
    group.map(Cls.rollout, jobs, on_result)            each job once, on whichever worker is idle
    group.map(Cls.rollout, jobs, need=6, cancel=Cls.cancel)   stop once 6 are done
    group.call_sticky(Cls.set_weights, ref, version)   every worker now, every replacement later
    group.placements()                                 where each worker runs (Ray)
    all_reduce_gradients(model.parameters())           data-parallel SFT workers and RL learners

Verbs are the worker class's methods (`Learner.update`), not their names, so a reader and
an editor go from a call to the code it runs; the group checks that its workers have the
verb. The backend (trainers.backends: in this process, or Ray actors) runs them.

Fault tolerance, written once (`map` and `call_sticky`): a worker that dies (the errors the
backend names in `dead_errors`: a Ray actor error, or a result lost with its node; in-process,
none) is dropped; its item goes back to the front of the queue and runs on another worker; a
replacement starts while `max_restarts` allow. The replacement first replays the sticky calls
(the current weights), so it runs the same policy; one that fails to start uses up a restart
too. `call`, `call_first` and `call_each` replace no one: a worker that dies during them
raises `WorkerDied` as soon as its death is seen, without waiting for the other workers'
results (learners blocked in a collective with a dead peer would never return them); when
its node left the cluster, the error names the node.

The gradient sum: every replica computes the gradient of its share of a global batch,
already scaled by that share, so the replicas' gradients are summed (not averaged): the sum
is the gradient of the whole batch, the same as one replica computes alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainers.backends import Backend, Placement, WorkerSpec

# How long the other workers of a failed call get to show that a dead peer caused it.
DEAD_PEER_GRACE_S = 10.0
# A worker class's method: what a WorkerGroup runs on its workers (e.g. Learner.update).
Verb = Callable[..., Any]


# --- the gradient sum -------------------------------------------------------------------------
def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Sum the gradients of the trainable `parameters` over the process group, in place.

    One flat all-reduce instead of one per tensor (a small model has hundreds of tensors and
    each collective has a fixed cost). A replica that got no rows this step (its gradients
    are None) still joins, with zeros, so every rank runs the same collective.
    """
    trainable = [p for p in parameters if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    flat = torch.cat([p.grad.reshape(-1) for p in trainable])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for parameter in trainable:
        n = parameter.numel()
        parameter.grad.copy_(flat[offset:offset + n].view_as(parameter.grad))
        offset += n


# --- worker groups --------------------------------------------------------------------------
class WorkerDied(RuntimeError):
    """A worker of `group` died during a call that cannot be retried elsewhere.
    lost_node: "node <address> (<id>)" when it died because its node left the cluster."""

    def __init__(self, message: str, group: WorkerGroup, index: int,
                 lost_node: str | None = None):
        super().__init__(message)
        self.group, self.index, self.lost_node = group, index, lost_node


class WorkerGroup:
    """Workers started from `specs` on `backend`, called by verb (a method of their class).

    max_restarts: replacements this group may start for workers that died.
    role, restarts_field: name the workers and the setting in error messages.
    `workers` and `names` (worker -> what its `ping` verb answers, for workers that have
    one) list the live workers; `restarts` and `retried` count replacements and re-run items.
    """

    def __init__(self, backend: Backend, specs: Sequence[WorkerSpec], max_restarts: int = 0,
                 role: str = "worker", restarts_field: str = "max_restarts"):
        self.backend = backend
        self.max_restarts, self.role, self.restarts_field = max_restarts, role, restarts_field
        self.restarts = 0
        self.retried = 0
        self.cut = 0  # items map() cut (need < len(items)), over the group's life
        self.dead: list[str] = []  # workers that died in a call (see WorkerDied)
        # A call raised: some workers may still be inside it (e.g. learners waiting in a
        # collective for a peer that failed), so the group is stopped without more calls.
        self.broken = False
        self._sticky: dict[str, tuple[Any, ...]] = {}
        self._lazy_sticky: dict[str, Callable[[], tuple[Any, ...]]] = {}
        self._classes = {spec.cls for spec in specs}
        self.workers = [backend.start(spec) for spec in specs]
        self._specs = dict(zip(self.workers, specs))
        self.names: dict[Any, str] = {}
        pingable = [w for w in self.workers if hasattr(self._specs[w].cls, "ping")]
        self.names = dict(zip(pingable, self.backend.get(
            [self.backend.submit(w, "ping") for w in pingable])))
        # Each worker's node, to say so when a worker died because its node left.
        self.nodes = {worker: placement.node for worker, placement
                      in zip(self.workers, self.backend.where(self.workers))}

    @property
    def size(self) -> int:
        return len(self.workers)

    # --- calls ----------------------------------------------------------------------------
    def verb_name(self, verb: Verb) -> str:
        """The name a backend dispatches `verb` by, once it is known to be a method every
        worker class of this group has."""
        if isinstance(verb, str) or not callable(verb) or not hasattr(verb, "__name__"):
            raise TypeError(f"a {self.role} verb is a method of the worker class (e.g. "
                            f"Learner.update), not {verb!r}")
        name = verb.__name__
        missing = sorted(cls.__name__ for cls in self._classes if not callable(
            getattr(cls, name, None)))
        if missing:
            raise AttributeError(f"{', '.join(missing)} has no verb {name!r} "
                                 f"({getattr(verb, '__qualname__', name)} was called on "
                                 f"its {self.role}s)")
        return name

    def submit(self, worker: Any, verb: Verb, *args: Any) -> Any:
        """verb(*args) on one worker, as a future (backend.get collects it)."""
        return self.backend.submit(worker, self.verb_name(verb), *args)

    def call(self, verb: Verb, *args: Any) -> list[Any]:
        """verb(*args) on every worker; results in worker order."""
        return self.call_on(self.workers, verb, *args)

    def call_on(self, workers: Sequence[Any], verb: Verb, *args: Any) -> list[Any]:
        name = self.verb_name(verb)
        return self._collect([(w, self.backend.submit(w, name, *args)) for w in workers])

    def call_first(self, verb: Verb, *args: Any) -> Any:
        return self.call_on(self.workers[:1], verb, *args)[0]

    def call_each(self, verb: Verb, args_per_worker: Sequence[tuple[Any, ...] | None]
                  ) -> list[Any]:
        """Worker i runs verb(*args_per_worker[i]); None skips it (its result is None)."""
        if len(args_per_worker) != self.size:
            raise ValueError(f"{len(args_per_worker)} argument lists for {self.size} workers")
        name = self.verb_name(verb)
        calls = [(i, w, self.backend.submit(w, name, *args))
                 for i, (w, args) in enumerate(zip(self.workers, args_per_worker))
                 if args is not None]
        results: list[Any] = [None] * self.size
        for (i, _, _), value in zip(calls, self._collect([(w, f) for _, w, f in calls])):
            results[i] = value
        return results

    def _collect(self, calls: Sequence[tuple[Any, Any]]) -> list[Any]:
        """The results of (worker, future) pairs in order; raises WorkerDied as soon as
        any of the workers is seen dead, and a worker's error as soon as it is raised (the
        rest may never finish)."""
        try:
            return self._collect_or_raise(calls)
        except Exception:
            self.broken = True
            raise

    def _collect_or_raise(self, calls: Sequence[tuple[Any, Any]]) -> list[Any]:
        pending = {future: worker for worker, future in calls}
        while pending and self.backend.dead_errors:
            future = self.backend.wait_any(list(pending))
            worker = pending.pop(future)
            try:
                self.backend.get([future])
            except self.backend.dead_errors as error:
                raise self._died(worker, error) from error
            except Exception as error:
                # A collective fails on the survivors when a peer dies (gloo: connection
                # closed): name the dead peer rather than the survivor's symptom.
                for other in self.backend.ready(list(pending), DEAD_PEER_GRACE_S):
                    try:
                        self.backend.get([other])
                    except self.backend.dead_errors as death:
                        raise self._died(pending[other], death) from error
                    except Exception:
                        pass
                raise
        return self.backend.get([future for _, future in calls])

    def _died(self, worker: Any, error: BaseException) -> WorkerDied:
        index = self.workers.index(worker)
        name = self.names.get(worker)
        label = f"{self.role} {index}" + (f" ({name})" if name else "")
        self.dead.append(label)
        lost_node = self.backend.node_left(self.nodes.get(worker))
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        cause = f"its {lost_node} left the cluster" if lost_node else \
            f"{type(error).__name__}: {reason}"
        return WorkerDied(f"{label} died ({cause})", self, index, lost_node)

    def call_sticky(self, verb: Verb, *args: Any) -> None:
        """verb(*args) on every worker, remembered: a replacement started later runs it
        first. A worker that died meanwhile is replaced."""
        name = self.verb_name(verb)
        self._sticky[name] = args
        self._lazy_sticky.pop(name, None)
        for worker, future in [(w, self.backend.submit(w, name, *args))
                               for w in list(self.workers)]:
            try:
                self.backend.get([future])
            except self.backend.dead_errors:
                self._replace(worker)

    def remember(self, verb: Verb, arguments: Callable[[], tuple[Any, ...]]) -> None:
        """Like call_sticky, but only for replacements started later, and with the
        arguments `arguments()` gives at that moment (the live workers got the same state
        another way, e.g. the weight broadcast)."""
        name = self.verb_name(verb)
        self._sticky.pop(name, None)
        self._lazy_sticky[name] = arguments

    def replace(self, dead: Any) -> Any:
        """Replace a worker found dead outside map / call_sticky (see _replace)."""
        return self._replace(dead) if dead in self.workers else None

    def map(self, verb: Verb, items: Sequence[Any],
            on_result: Callable[[Any, WorkerGroup], None] | None = None,
            need: int | None = None, cancel: Verb | None = None) -> list[Any]:
        """verb(item) exactly once per item, each on whichever worker is idle; results in
        item order. on_result(result, group) runs after each finished item.

        need: return once this many items have finished (None: all). The other items are
        cut: queued ones never start, running ones get `cancel(item)` (a verb that makes the
        worker give up early; without one they run to the end) and are waited for, so no
        worker is still busy with a cut item when the next call reaches it. A cut item's
        result is None whatever it returned: exactly `need` results are kept, and `cut`
        counts the others.
        """
        name = self.verb_name(verb)
        need = len(items) if need is None else max(0, min(need, len(items)))
        queue = deque(enumerate(items))
        results: dict[int, Any] = {}
        in_flight: dict[Any, tuple[int, Any, Any]] = {}
        idle = list(self.workers)
        while (queue or in_flight) and len(results) < need:
            while queue and idle:
                worker, (index, item) = idle.pop(0), queue.popleft()
                in_flight[self.backend.submit(worker, name, item)] = (index, item, worker)
            future = self.backend.wait_any(list(in_flight))
            index, item, worker = in_flight.pop(future)
            try:
                result = self.backend.get([future])[0]
            except self.backend.dead_errors:
                # The worker died (killed, OOM, node lost): its item runs again elsewhere.
                self.retried += 1
                queue.appendleft((index, item))
                replacement = self._replace(worker)
                if replacement is not None:
                    idle.append(replacement)
                continue
            if index in results:
                raise RuntimeError(f"{self.role} item {index} finished twice")
            results[index] = result
            idle.append(worker)
            if on_result:
                on_result(result, self)
        self._cut(in_flight, None if cancel is None else self.verb_name(cancel))
        self.cut += len(items) - len(results)
        return [results.get(index) for index in range(len(items))]

    def _cut(self, in_flight: dict[Any, tuple[int, Any, Any]], cancel: str | None) -> None:
        """Cancel the running items of a map that has enough results and wait until their
        workers are free (their results are dropped; a worker that died meanwhile is
        replaced)."""
        if not in_flight:
            return
        cancels = {} if cancel is None else {
            self.backend.submit(worker, cancel, item): worker
            for index, item, worker in in_flight.values()}
        waits = {**{future: worker for future, (_, _, worker) in in_flight.items()}, **cancels}
        for future, worker in waits.items():
            try:
                self.backend.get([future])
            except self.backend.dead_errors:
                if worker in self.workers:
                    self._replace(worker)

    def put(self, value: Any) -> Any:
        """`value` as an argument for many calls (shared, not copied per call, on Ray)."""
        return self.backend.put(value)

    def placements(self) -> list[Placement]:
        """Where each live worker runs (node, placement group, bundle), in worker order."""
        return self.backend.where(self.workers)

    def shutdown(self) -> None:
        """Stop every worker (in-process: its `close`; Ray: the actor is killed)."""
        for worker in self.workers:
            self.backend.stop(worker)

    # --- faults ---------------------------------------------------------------------------
    def _replace(self, dead: Any) -> Any:
        """Drop a dead worker; start a replacement (replaying the sticky calls) while
        restarts are left. Returns the replacement, or None."""
        spec = self._specs.pop(dead)
        self.workers.remove(dead)
        self.names.pop(dead, None)
        self.nodes.pop(dead, None)
        self.backend.stop(dead)
        replacement = None
        while replacement is None and self.restarts < self.max_restarts:
            self.restarts += 1
            candidate = self.backend.start(spec)
            try:
                sticky = {**self._sticky, **{verb: make() for verb, make
                                             in self._lazy_sticky.items()}}
                for verb, args in sticky.items():
                    self.backend.get([self.backend.submit(candidate, verb, *args)])
                if hasattr(spec.cls, "ping"):
                    self.names[candidate] = self.backend.get(
                        [self.backend.submit(candidate, "ping")])[0]
                self.nodes[candidate] = self.backend.where([candidate])[0].node
                replacement = candidate
            except self.backend.start_errors:
                self.backend.stop(candidate)
        if replacement is not None:
            self.workers.append(replacement)
            self._specs[replacement] = spec
        if not self.workers:
            raise RuntimeError(f"every {self.role} died and no restarts are left "
                               f"({self.restarts_field})")
        return replacement
