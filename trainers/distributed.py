"""How work is spread over processes: Ray start-up, worker groups and the gradient sum.

    init_ray(address, num_cpus)                        # the one way Ray is joined or started
    backend = backend_for(use_ray, address)            # the one in-process / Ray decision
    group = WorkerGroup(backend, [WorkerSpec(Cls, args, kwargs, resources), ...])
    group.call("save", path)                           every worker, same arguments
    group.call_each("update", [(part0,), (part1,)])    worker i gets its own arguments
    group.call_first("weights")
    group.map("rollout", jobs, on_result)              each job once, on whichever worker is idle
    group.map("rollout", jobs, need=6, cancel="cancel")   stop once 6 are done (stragglers cut)
    group.call_sticky("set_weights", ref, version)     every worker now, every replacement later
    group.placements()                                 where each worker runs (Ray)
    all_reduce_gradients(model.parameters())           data-parallel SFT workers and RL learners

Placement groups: `RayActors(placement=[PlacementGroupSpec("run", bundles, "STRICT_PACK")])`
reserves the bundles before any actor starts; a `WorkerSpec(..., bundle=Bundle("run", i))`
starts in bundle i (a replacement too), and `backend.close()` removes the groups.

A backend starts workers and runs verbs on them as futures. `InProcess` builds the worker
objects here and runs a verb at once (its future is already done); `RayActors` starts each
worker as a Ray actor. The RL driver, the RL learner group and SFT's data-parallel workers
are written once against that interface, so Ray stays at this edge.

Fault tolerance, written once (`map` and `call_sticky`): a worker that dies (the errors the
backend names in `dead_errors`: a Ray actor error; in-process, none) is dropped; its item
goes back to the front of the queue and runs on another worker; a replacement starts while
`max_restarts` allow. The replacement first replays the sticky calls (the current weights),
so it runs the same policy; one that fails to start uses up a restart too.
`call`, `call_first` and `call_each` replace no one: a worker that dies during them raises
`WorkerDied` as soon as its death is seen, without waiting for the other workers' results
(learners blocked in a collective with a dead peer would never return them).

The gradient sum: every replica computes the gradient of its share of a global batch,
already scaled by that share, so the replicas' gradients are summed (not averaged): the sum
is the gradient of the whole batch, the same as one replica computes alone.
"""

from __future__ import annotations

import os
import re
import socket
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


# --- Ray and addresses ----------------------------------------------------------------------
def init_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Connect to a Ray cluster, or start a local one with `num_cpus`.

    A cluster is joined when `address` is given ("auto", "ray://...", "host:port") or when
    RAY_ADDRESS is set (what `ray job submit` does for the driver it starts). Resources may
    only be declared when starting a local Ray: Ray refuses num_cpus when connecting to an
    existing cluster, whose nodes declared theirs when they started. Without either, a
    local Ray is started even when `ray start` left a cluster on this machine (Ray itself
    would join that one): an empty address means a local Ray.
    """
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or None, include_dashboard=False)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)


def node_address() -> str:
    """This process's node address: Ray's node IP when Ray runs here, else 127.0.0.1."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def free_address(host: str = "127.0.0.1") -> str:
    """"host:port" with a port free on this node (for a process group's TCP store)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return f"{host}:{sock.getsockname()[1]}"


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
# How long the other workers of a failed call get to show that a dead peer caused it.
DEAD_PEER_GRACE_S = 10.0
# How long a placement group may take to be reserved before the run gives up: long enough
# for a cluster's nodes to free a finished job's resources, short enough to fail visibly.
PLACEMENT_TIMEOUT_S = 120.0


class WorkerDied(RuntimeError):
    """A worker of `group` died during a call that cannot be retried elsewhere."""

    def __init__(self, message: str, group: WorkerGroup, index: int):
        super().__init__(message)
        self.group, self.index = group, index


@dataclass(frozen=True)
class Bundle:
    """A seat for one worker: bundle `index` of the backend's placement group `group`."""

    group: str
    index: int


@dataclass
class WorkerSpec:
    """How to start one worker: `cls(*args, **kwargs)` with `resources` (Ray's
    `ray.remote` options: num_cpus, num_gpus, max_restarts; ignored in-process), in
    `bundle` of a placement group the backend reserved (None: Ray's default scheduling)."""

    cls: type
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    bundle: Bundle | None = None


@dataclass(frozen=True)
class PlacementGroupSpec:
    """A Ray placement group to reserve before any worker starts: one resource dict per
    bundle (e.g. {"CPU": 1, "GPU": 1}; Ray refuses an empty one) and Ray's strategy:
    STRICT_PACK (one node), PACK (as few nodes as possible), SPREAD (as many as possible) or
    STRICT_SPREAD (one node per bundle)."""

    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str


@dataclass(frozen=True)
class Placement:
    """Where a worker process runs: Ray's node id, the placement group id it was scheduled
    into and the bundle it holds (None outside a placement group or outside Ray)."""

    node: str | None
    placement_group: str | None
    bundle_index: int | None


def current_placement() -> Placement:
    """This process's Placement (in a Ray actor: what Ray actually granted it)."""
    try:
        import ray
    except ImportError:
        return Placement(None, None, None)
    if not ray.is_initialized():
        return Placement(None, None, None)
    context = ray.get_runtime_context()
    group = context.get_placement_group_id()
    index = None
    if group is not None:
        # Ray exposes no public bundle index; a process scheduled into bundle i holds the
        # resource "bundle_group_<i>_<group id>" (Ray adds it to every request in a bundle,
        # also to an actor that reserves nothing else), so the index is read from its name.
        held = context.worker.core_worker.resource_ids()
        pattern = re.compile(rf"bundle_group_(\d+)_{group}")
        index = next((int(m.group(1)) for name in held if (m := pattern.fullmatch(name))),
                     None)
    return Placement(context.get_node_id(), group, index)


class _Done:
    """An in-process call's future: it ran when submitted."""

    def __init__(self, call: Callable[[], Any]):
        self.error: BaseException | None = None
        try:
            self.value = call()
        except Exception as error:  # raised again where the caller collects the result
            self.error = error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class InProcess:
    """Workers are objects in this process; a verb runs when it is submitted."""

    dead_errors: tuple[type[BaseException], ...] = ()  # an in-process worker cannot die alone
    # A verb runs when it is submitted: overlapping two calls would only run them in turn.
    concurrent = False
    start_errors: tuple[type[BaseException], ...] = ()

    def start(self, spec: WorkerSpec) -> Any:
        if spec.bundle is not None:
            raise ValueError(f"{spec.cls.__name__} asks for a placement group bundle; "
                             "placement groups need Ray actors")
        return spec.cls(*spec.args, **spec.kwargs)

    def submit(self, worker: Any, verb: str, *args: Any) -> _Done:
        return _Done(lambda: getattr(worker, verb)(*args))

    def wait_any(self, futures: Sequence[_Done]) -> _Done:
        return futures[0]

    def ready(self, futures: Sequence[_Done], timeout: float) -> list[_Done]:
        return list(futures)

    def get(self, futures: Sequence[_Done]) -> list[Any]:
        return [future.result() for future in futures]

    def put(self, value: Any) -> Any:
        return value

    def stop(self, worker: Any) -> None:
        close = getattr(worker, "close", None)
        if close is not None:
            close()

    def where(self, workers: Sequence[Any]) -> list[Placement]:
        """Every in-process worker runs in this process."""
        return [current_placement() for _ in workers]

    def close(self) -> None:
        """Nothing was reserved."""

    def uses_gpu(self, reserved_gpus: float) -> bool:
        """In-process workers may use this machine's GPU."""
        return True


class RayActors:
    """Each worker is a Ray actor (a local Ray with `num_cpus` (default: every core) is
    started unless one is running, `address` names a cluster or RAY_ADDRESS is set:
    `init_ray`).

    placement: placement groups reserved here, before any actor starts, so that a layout
    the cluster cannot hold fails at once with its reason (after `placement_timeout_s`)
    instead of leaving actors pending; workers whose spec names a `bundle` start in it.
    `close()` removes the groups.
    """

    # Calls run in other processes: a caller may overlap them (asynchronous rollouts).
    concurrent = True

    def __init__(self, address: str = "", num_cpus: int | None = None,
                 placement: Sequence[PlacementGroupSpec] = (),
                 placement_timeout_s: float = PLACEMENT_TIMEOUT_S):
        import ray
        from ray.exceptions import RayActorError, RayError

        if not ray.is_initialized():
            init_ray(address, num_cpus=num_cpus or os.cpu_count())
        self._ray = ray
        # A dead actor (killed, OOM, node lost) raises RayActorError; a replacement that
        # cannot start may fail with any Ray error.
        self.dead_errors = (RayActorError,)
        self.start_errors = (RayError,)
        self.groups: dict[str, Any] = {}
        try:
            for request in placement:
                self._reserve(request, placement_timeout_s)
        except BaseException:
            self.close()
            raise

    def _reserve(self, request: PlacementGroupSpec, timeout_s: float) -> None:
        from ray.util.placement_group import placement_group

        if request.name in self.groups:
            raise ValueError(f"two placement groups named {request.name!r}")
        group = placement_group([dict(b) for b in request.bundles], strategy=request.strategy)
        self.groups[request.name] = group
        if not group.wait(timeout_s):
            raise RuntimeError(
                f"placement group {request.name!r} ({request.strategy}, bundles "
                f"{list(request.bundles)}) could not be reserved in {timeout_s:.0f} s: the "
                f"cluster has {self._ray.available_resources()} free of "
                f"{self._ray.cluster_resources()}. Reserve less per worker or add nodes "
                f"(STRICT_PACK needs one node that holds every bundle)")

    def start(self, spec: WorkerSpec) -> Any:
        options = dict(spec.resources)
        if spec.bundle is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            if spec.bundle.group not in self.groups:
                raise ValueError(f"{spec.cls.__name__} asks for placement group "
                                 f"{spec.bundle.group!r}, which this backend did not reserve "
                                 f"(it has {sorted(self.groups)})")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.groups[spec.bundle.group], spec.bundle.index)
        return self._ray.remote(**options)(spec.cls).remote(*spec.args, **spec.kwargs)

    def submit(self, worker: Any, verb: str, *args: Any) -> Any:
        return getattr(worker, verb).remote(*args)

    def wait_any(self, futures: Sequence[Any]) -> Any:
        ready, _ = self._ray.wait(list(futures), num_returns=1)
        return ready[0]

    def ready(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        """The futures that finish within `timeout` seconds."""
        ready, _ = self._ray.wait(list(futures), num_returns=len(futures), timeout=timeout)
        return ready

    def get(self, futures: Sequence[Any]) -> list[Any]:
        return self._ray.get(list(futures))

    def put(self, value: Any) -> Any:
        """Into the object store once, so that N workers do not each get a copy sent."""
        return self._ray.put(value)

    def stop(self, worker: Any) -> None:
        self._ray.kill(worker)  # an unreachable (not dead) worker would keep its resources

    def where(self, workers: Sequence[Any]) -> list[Placement]:
        """Where each actor runs, as the actor itself sees it (Ray's `__ray_call__` runs the
        function in the actor, so worker classes need no verb for it)."""
        return self._ray.get([w.__ray_call__.remote(_placement_of_actor) for w in workers])

    def close(self) -> None:
        """Remove the placement groups (Ray also kills any actor still in one)."""
        from ray.util.placement_group import remove_placement_group

        for group in self.groups.values():
            remove_placement_group(group)
        self.groups.clear()

    def uses_gpu(self, reserved_gpus: float) -> bool:
        """An actor uses a GPU only when it reserved one (it sees no other)."""
        return reserved_gpus > 0


def _placement_of_actor(_actor: Any) -> Placement:
    return current_placement()


Backend = InProcess | RayActors


def backend_for(use_ray: bool, address: str = "", num_cpus: int | None = None,
                placement: Sequence[PlacementGroupSpec] = ()) -> Backend:
    """The one in-process / Ray decision: Ray actors (joining `address` or starting a local
    Ray with `num_cpus`, reserving the `placement` groups) when `use_ray`, else objects in
    this process (which cannot be placed)."""
    if use_ray:
        return RayActors(address, num_cpus, placement)
    if placement:
        raise ValueError("placement groups need Ray actors (use_ray)")
    return InProcess()


class WorkerGroup:
    """Workers started from `specs` on `backend`, called by verb name.

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
        self.workers = [backend.start(spec) for spec in specs]
        self._specs = dict(zip(self.workers, specs))
        self.names: dict[Any, str] = {}
        pingable = [w for w in self.workers if hasattr(self._specs[w].cls, "ping")]
        self.names = dict(zip(pingable, self.backend.get(
            [self.backend.submit(w, "ping") for w in pingable])))

    @property
    def size(self) -> int:
        return len(self.workers)

    # --- calls ----------------------------------------------------------------------------
    def call(self, verb: str, *args: Any) -> list[Any]:
        """verb(*args) on every worker; results in worker order."""
        return self.call_on(self.workers, verb, *args)

    def call_on(self, workers: Sequence[Any], verb: str, *args: Any) -> list[Any]:
        return self._collect([(w, self.backend.submit(w, verb, *args)) for w in workers])

    def call_first(self, verb: str, *args: Any) -> Any:
        return self.call_on(self.workers[:1], verb, *args)[0]

    def call_each(self, verb: str, args_per_worker: Sequence[tuple[Any, ...] | None]
                  ) -> list[Any]:
        """Worker i runs verb(*args_per_worker[i]); None skips it (its result is None)."""
        if len(args_per_worker) != self.size:
            raise ValueError(f"{len(args_per_worker)} argument lists for {self.size} workers")
        calls = [(i, w, self.backend.submit(w, verb, *args))
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
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return WorkerDied(f"{label} died ({type(error).__name__}: {reason})", self, index)

    def call_sticky(self, verb: str, *args: Any) -> None:
        """verb(*args) on every worker, remembered: a replacement started later runs it
        first. A worker that died meanwhile is replaced."""
        self._sticky[verb] = args
        self._lazy_sticky.pop(verb, None)
        for worker, future in [(w, self.backend.submit(w, verb, *args))
                               for w in list(self.workers)]:
            try:
                self.backend.get([future])
            except self.backend.dead_errors:
                self._replace(worker)

    def remember(self, verb: str, arguments: Callable[[], tuple[Any, ...]]) -> None:
        """Like call_sticky, but only for replacements started later, and with the
        arguments `arguments()` gives at that moment (the live workers got the same state
        another way, e.g. the weight broadcast)."""
        self._sticky.pop(verb, None)
        self._lazy_sticky[verb] = arguments

    def replace(self, dead: Any) -> Any:
        """Replace a worker found dead outside map / call_sticky (see _replace)."""
        return self._replace(dead) if dead in self.workers else None

    def map(self, verb: str, items: Sequence[Any],
            on_result: Callable[[Any, WorkerGroup], None] | None = None,
            need: int | None = None, cancel: str | None = None) -> list[Any]:
        """verb(item) exactly once per item, each on whichever worker is idle; results in
        item order. on_result(result, group) runs after each finished item.

        need: return once this many items have finished (None: all). The other items are
        cut: queued ones never start, running ones get `cancel(item)` (a verb that makes the
        worker give up early; without one they run to the end) and are waited for, so no
        worker is still busy with a cut item when the next call reaches it. A cut item's
        result is None whatever it returned: exactly `need` results are kept, and `cut`
        counts the others.
        """
        need = len(items) if need is None else max(0, min(need, len(items)))
        queue = deque(enumerate(items))
        results: dict[int, Any] = {}
        in_flight: dict[Any, tuple[int, Any, Any]] = {}
        idle = list(self.workers)
        while (queue or in_flight) and len(results) < need:
            while queue and idle:
                worker, (index, item) = idle.pop(0), queue.popleft()
                in_flight[self.backend.submit(worker, verb, item)] = (index, item, worker)
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
        self._cut(in_flight, cancel)
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
