"""Where workers run: Ray start-up and the two backends a WorkerGroup runs its workers on.

    init_ray(address, num_cpus)                        # the one way Ray is joined or started
    backend = backend_for(use_ray, address)            # the one in-process / Ray decision
    backend.start(WorkerSpec(Cls, args, kwargs, resources, bundle))
    future = backend.submit(worker, "verb", *args); backend.get([future])
    backend.where(workers)                             # node, placement group, bundle

A backend starts workers and runs verbs on them as futures. `InProcess` builds the worker
objects here and runs a verb at once (its future is already done); `RayActors` starts each
worker as a Ray actor. trainers.distributed.WorkerGroup is written once against this
interface, so Ray stays at this edge.

Placement groups: `RayActors(placement=[PlacementGroupSpec("run", bundles, "STRICT_PACK")])`
reserves the bundles before any actor starts; a `WorkerSpec(..., bundle=Bundle("run", i))`
starts in bundle i (a replacement too), and `backend.close()` removes the groups.

Independent calls in processes of this machine, without Ray (the learning checks' arms side
by side, the paired evaluation's shards):

    results = run_in_processes([(play, (tasks_a,), {}), (play, (tasks_b,), {})])

Why processes and not threads: the project's policies are small, so one process with two
torch intra-op threads leaves a core idle for much of each short matrix product, while two
processes keep both busy (benchmarks/parallel_checks.py measures it). They start with
`spawn`: a forked child would inherit the parent's torch thread pool and its locks.
Everything a call takes and returns is pickled, so it must be plain data (configs, paths,
trajectories), not open handles, lambdas or live clients.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# How long a placement group may take to be reserved before the run gives up: long enough
# for a cluster's nodes to free a finished job's resources, short enough to fail visibly.
PLACEMENT_TIMEOUT_S = 120.0


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


# --- workers and backends ---------------------------------------------------------------------
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

    def node_left(self, node: str | None) -> str | None:
        """In-process workers run on this process's node, which cannot leave alone."""
        return None

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
        from ray.exceptions import ObjectLostError, RayActorError, RayError

        if not ray.is_initialized():
            init_ray(address, num_cpus=num_cpus or os.cpu_count())
        self._ray = ray
        # A dead actor (killed, OOM, node lost) raises RayActorError; a result that died
        # with its node's object store before it was fetched raises ObjectLostError (its
        # worker is dead too). A replacement that cannot start may fail with any Ray error.
        self.dead_errors = (RayActorError, ObjectLostError)
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

    def node_left(self, node: str | None) -> str | None:
        """"node <address> (<id>)" when Ray lists `node` as dead (it left the cluster),
        else None."""
        if node is None:
            return None
        for entry in self._ray.nodes():
            if entry.get("NodeID") == node and not entry.get("Alive", True):
                return f"node {entry.get('NodeManagerAddress', '?')} ({node[:12]})"
        return None

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
