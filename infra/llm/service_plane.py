"""Placing the LLM services on the cluster through the scheduler, and keeping them alive.

A *GPU group* is one gang request: a rollout bundle and a trainer bundle sharing the same GPU
(``SameGPU``, affinity: a job's trainer and rollout on the same GPU) — or the same node on a
cluster without GPUs. The reward service is a CPU-only gang. The gangs go to the cluster's
scheduler service (``infra.service``, shared with the embodied jobs), which decides where; each
service then runs as a Ray actor in its bundle's placement group (``infra.service.client.GangBackend``).

:class:`ResilientService` is the handle the job loop uses for a placed service: when the actor
dies (node failure, OOM, ``ray.kill``) it starts a new one on the same placement, re-registers
every job (the rollout gets the reference of the job's latest weights again, the trainer restores
each job from its checkpoint), and re-sends the call that was in flight. :class:`RolloutPool` spreads a generation batch over several rollout
instances with a router (:mod:`infra.llm.router`) and re-sends a dead instance's share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.common.supervisor import Supervisor
from infra.llm.gpu_group import BYTES_PER_PARAM_WEIGHTS, GPUGroup
from infra.llm.handles import JobServices
from infra.llm.model import ModelConfig
from infra.llm.router import InstanceLoad, RoundRobin, Router
from infra.llm.service_actors import RewardService, RolloutService, TrainerService

_PLANES = itertools.count()
"""Numbers the service planes of this process, so that their gang names never collide."""

TRAINER_REPLAY = {"register_job": {"resume": True}}
"""``replay_kwargs`` of a trainer's :class:`ResilientService`: a restarted trainer restores its jobs
from their checkpoints (and fails a job whose checkpoint is missing), never from their seeds."""


@dataclass(frozen=True)
class ServiceSizes:
    """Resources asked for each service (CPU in milli-cores, memory in MiB, GPU share in milli-GPU)."""

    rollout_cpu_milli: int = 500
    trainer_cpu_milli: int = 500
    reward_cpu_milli: int = 250
    rollout_memory_mib: int = 1024
    trainer_memory_mib: int = 2048
    reward_memory_mib: int = 256
    gpu_share_milli: int = 500
    """Share of the group's GPU each of rollout and trainer declares (they time-slice it)."""


def group_request(name: str, sizes: ServiceSizes, *, gpu: bool, weights_mib: int = 0, rollout_instances: int = 1) -> Any:
    """The gang of one GPU group: bundles ``0..k-1`` rollout instances, bundle ``k`` the trainer, all on
    one GPU (``SameGPU``; ``SameNode`` on a cluster without GPUs). ``weights_mib`` is the GPU memory the
    largest model of the group needs: the scheduler refuses the gang when no GPU has that much."""
    from infra.scheduler import Bundle, GangRequest, SameGPU, SameNode

    k = rollout_instances
    share = sizes.gpu_share_milli // k if gpu else 0
    mem = weights_mib if gpu else 0
    rollouts = tuple(
        Bundle(sizes.rollout_cpu_milli, sizes.rollout_memory_mib, gpu_fraction=share, gpu_memory_mib=mem, name=f"rollout{i}")
        for i in range(k)
    )
    trainer = Bundle(sizes.trainer_cpu_milli, sizes.trainer_memory_mib, gpu_fraction=sizes.gpu_share_milli if gpu else 0,
                     gpu_memory_mib=mem, name="trainer")
    together = tuple(range(k + 1))
    return GangRequest(name, (*rollouts, trainer), (SameGPU(together) if gpu else SameNode(together),))


class ResilientService:
    """A service actor that is restarted on the same placement when it dies.

    Calls that carry job state (``register_job``, then the latest ``update_weights`` per job) are
    kept on the driver and replayed onto a new actor, with ``replay_kwargs[method]`` added (the
    trainer replays ``register_job`` with ``resume=True``: its jobs continue from their
    checkpoints); ``unregister_job`` drops them. The weights in a kept ``update_weights`` are an
    object reference, not tensors. A job whose replay fails (its checkpoint is missing or broken)
    gets that error on each of its later calls; the other jobs of the service carry on.

    Its restarts go through ``supervisor`` (an ``infra.common.supervisor.Supervisor``): at most
    ``max_restarts`` in the handle's life, the replay as the recovery hook, each call answered within
    ``timeout_s`` (else ``AttemptTimedOut``, a ``TimeoutError``, naming the setting).
    """

    REPLAY = frozenset({"register_job", "update_weights"})
    FORGET = frozenset({"unregister_job"})

    def __init__(self, start: Callable[[], Any], *, timeout_s: float = 120.0, max_restarts: int = 3,
                 replay_kwargs: Mapping[str, Mapping[str, Any]] | None = None, name: str = "service") -> None:
        self._start = start
        self.timeout_s = timeout_s
        self.replay_kwargs = dict(replay_kwargs or {})
        self.supervisor = Supervisor(f"the {name} actor", max_restarts, "ResilientService(max_restarts=)",
                                     timeout_s=timeout_s, timeout_setting="ResilientService(timeout_s=)")
        self.actor = start()
        self._state: dict[str, list[tuple[str, tuple, dict]]] = {}
        self._lost: dict[str, BaseException] = {}
        self._lock = threading.RLock()

    @property
    def restarts(self) -> int:
        """How many times the actor was started again."""
        return self.supervisor.restarts

    def _remember(self, job: Any, method: str, args: tuple, kwargs: dict) -> None:
        if method == "register_job":
            self._state[job] = [(method, args, kwargs)]
            self._lost.pop(job, None)
        elif method == "update_weights":
            calls = [c for c in self._state.get(job, []) if c[0] != "update_weights"]
            self._state[job] = [*calls, (method, args, kwargs)]
        elif method in self.FORGET:
            self._state.pop(job, None)
            self._lost.pop(job, None)

    def restart(self, dead: Any, cause: BaseException | str = "the actor died") -> None:
        """Replace the actor ``dead`` by a fresh one on the same placement and replay every job's state
        onto it (a no-op when another caller already replaced it).

        Raises:
            RestartsExhausted: it died more than ``max_restarts`` times.
        """
        with self._lock:
            if self.actor is not dead:
                return
            self.supervisor.restart(cause, lambda: self._replace(dead))

    def _replace(self, dead: Any) -> None:
        """The recovery hook: a new actor in place of ``dead``, with every job's kept calls replayed."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(dead)
        self.actor = self._start()
        for job, calls in list(self._state.items()):
            try:
                for method, args, kwargs in calls:
                    extra = self.replay_kwargs.get(method, {})
                    ray.get(getattr(self.actor, method).remote(*args, **{**kwargs, **extra}), timeout=self.timeout_s)
            except ray.exceptions.RayTaskError as e:  # this job's state is lost; say why on its next call
                self._lost[job] = e.cause if isinstance(e.cause, BaseException) else e

    def submit(self, method: str, *args: Any, num_returns: int = 1, **kwargs: Any) -> tuple[Any, Any]:
        """Start ``method`` on the actor; returns (object ref, or ``num_returns`` of them; the actor it went to).

        Raises:
            Exception: the error that lost the calling job's state in a restart.
        """
        job = args[0] if args else kwargs.get("job")
        with self._lock:
            if method in self.REPLAY or method in self.FORGET:
                self._remember(job, method, args, kwargs)
            elif job in self._lost:
                raise self._lost[job]
            actor = self.actor
        remote = getattr(actor, method)
        return (remote.options(num_returns=num_returns) if num_returns != 1 else remote).remote(*args, **kwargs), actor

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method``; if the actor died meanwhile, restart it and re-send the call."""
        import ray

        return self._resend(method, args, kwargs, 1, lambda ref, timeout_s: ray.get(ref, timeout=timeout_s))

    def call_ref(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Run ``method``, which returns ``(payload, meta)``, as a call with two results; fetch ``meta``
        and return ``(payload's object ref, meta)``. The payload stays in the object store, owned by
        this process (so it outlives the actor that made it); a service that gets the ref as an
        argument receives the payload. Restarts and re-sends like :meth:`call`."""
        import ray

        return self._resend(method, args, kwargs, 2, lambda refs, timeout_s: (refs[0], ray.get(refs[1], timeout=timeout_s)))

    def _resend(self, method: str, args: tuple, kwargs: dict, num_returns: int,
                fetch: Callable[[Any, float | None], Any]) -> Any:
        """Submit the call and ``fetch(refs, timeout_s)`` its result; while the actor it went to died,
        restart that actor (once, whichever caller sees it first) and submit again."""
        import ray

        while True:
            refs, actor = self.submit(method, *args, num_returns=num_returns, **kwargs)
            try:
                return self.supervisor.attempt(functools.partial(fetch, refs))
            except ray.exceptions.RayActorError as exc:
                self.restart(actor, exc)


class RolloutPool:
    """Several rollout instances behind a router; speaks the rollout service's ``call`` interface.

    ``generate`` splits the batch into chunks of ``chunk`` prompts, routes each chunk with the
    router (loads: outstanding chunks, queued prompt tokens, sequences decoding), gathers the
    results in order, and re-sends the chunks of an instance that died to its restarted actor.
    """

    def __init__(self, instances: list[ResilientService], router: Router | None = None, chunk: int = 32) -> None:
        if not instances:
            raise ValueError("RolloutPool needs at least one rollout instance.")
        self.instances = instances
        self.router = router or RoundRobin()
        self.chunk = chunk
        self.resent = 0

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "generate":
            return self._generate(*args, **kwargs)
        results = [inst.call(method, *args, **kwargs) for inst in self.instances]
        return results[0]

    def _generate(self, job: str, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, seed: int = 0) -> tuple[list[list[int]], int]:
        import ray

        chunks = [prompts[i : i + self.chunk] for i in range(0, len(prompts), self.chunk)]
        loads = [[0, 0, 0] for _ in self.instances]  # outstanding, queued prompt tokens, decoding sequences
        pending: dict[Any, tuple[int, int, Any]] = {}  # ref -> (chunk index, instance, actor)

        def send(c: int, k: int) -> None:
            ref, actor = self.instances[k].submit("generate", job, chunks[c], max_new_tokens, temperature, seed * 1009 + c)
            pending[ref] = (c, k, actor)
            loads[k][0] += 1
            loads[k][1] += sum(map(len, chunks[c]))
            loads[k][2] += len(chunks[c])

        for c, chunk in enumerate(chunks):
            k = self.router.choose(sum(map(len, chunk)), [InstanceLoad(*load) for load in loads])
            send(c, k)
        out: list[list[list[int]] | None] = [None] * len(chunks)
        versions = set()
        timeout = self.instances[0].timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                raise TimeoutError(f"no rollout chunk finished within {timeout} s ({len(pending)} outstanding).")
            ref = ready[0]
            c, k, actor = pending.pop(ref)
            loads[k][0] -= 1
            loads[k][1] -= sum(map(len, chunks[c]))
            loads[k][2] -= len(chunks[c])
            try:
                out[c], version = ray.get(ref)
                versions.add(version)
            except ray.exceptions.RayActorError:
                dead = [(r, ck) for r, ck in pending.items() if ck[2] is actor]
                for r, _ in dead:
                    pending.pop(r)
                self.instances[k].restart(actor)
                for cc in [c, *[ck[0] for _, ck in dead]]:
                    self.resent += 1
                    send(cc, k)
        if len(versions) != 1:
            raise RuntimeError(f"rollout instances served different weight versions {sorted(versions)} for job {job!r}.")
        return [row for part in out for row in part], versions.pop()


@dataclass
class ServicePlane:
    """The LLM services placed on a cluster: GPU groups, a reward service, and their gangs."""

    client: Any
    model: ModelConfig
    sizes: ServiceSizes
    gangs: list[Any]
    groups: list[GPUGroup]
    reward: ResilientService

    def close(self) -> None:
        """Release the gangs (their actors stop with their placement groups)."""
        _release(self.gangs)


def _release(gangs: list[Any]) -> None:
    for gang in gangs:
        with contextlib.suppress(Exception):
            gang.release()


def _placed(client: Any, req: Any, wait_s: float | None) -> tuple[Any, Any]:
    """Submit ``req`` to the service and wait until it is placed; (handle, backend)."""
    from infra.service.client import GangBackend

    gang = client.submit(req)
    try:
        gang.wait(timeout_s=wait_s)
    except BaseException:
        gang.release()
        raise
    return gang, GangBackend(gang, restart=False)


def place_services(
    client: Any, model: ModelConfig, *, groups: int = 1, rollout_instances: int = 1,
    sizes: ServiceSizes | None = None, router: Router | None = None, chunk: int = 32, engine: str | None = None,
    timeout_s: float = 120.0, priority: int = 0, tenant: str = "default", wait_s: float | None = None,
) -> ServicePlane:
    """Submit ``groups`` GPU groups (each with ``rollout_instances`` rollout actors behind ``router``, fed
    chunks of ``chunk`` prompts, and one trainer) and a reward service to the cluster's scheduler
    service (``client``: ``infra.service.client.connect()``), wait until they are placed (``wait_s``; they
    may preempt lower priorities), start their actors, return the plane.

    Raises the scheduler's ``RequestError`` when a group can never be placed (the reason names the
    resource that is missing), ``TimeoutError``/``GangFailed`` when it is not placed in time; what
    was placed is released first. A service preempted later is started again where its gang is
    placed next, with its jobs' state replayed (``ResilientService``).
    """
    import ray

    from infra.scheduler.requests import Bundle, GangRequest

    model.validate()
    if rollout_instances < 1:
        raise ValueError(f"rollout_instances={rollout_instances}; a GPU group needs at least one rollout instance.")
    sizes = sizes or ServiceSizes()
    nodes = client.status().nodes
    has_gpu = any(n.gpu_free for n in nodes if n.alive)
    weights_mib = math.ceil(model.num_params() * BYTES_PER_PARAM_WEIGHTS / 2**20)
    gangs: list[Any] = []
    out: list[GPUGroup] = []
    prefix = f"llm{os.getpid()}-{next(_PLANES)}"

    def start(gang: Any, backend: Any, bundle: int, cls: type, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        remote = ray.remote(cls)

        def launch() -> Any:
            # After a preemption: where the gang is placed next. The handle's cached status may still
            # show the old placement (its group is gone), so ask the service first.
            gang.refresh()
            gang.wait(timeout_s=wait_s)
            return backend.start_actor(bundle, remote, *args, **kwargs)

        return launch

    try:
        for g in range(groups):
            req = dataclasses.replace(group_request(f"{prefix}-group{g}", sizes, gpu=has_gpu, weights_mib=weights_mib,
                                                    rollout_instances=rollout_instances), priority=priority, tenant=tenant)
            gang, backend = _placed(client, req, wait_s)
            gangs.append(gang)
            placement = gang.status.placement
            device = "auto" if has_gpu else "cpu"  # auto: CUDA where the GPU is real
            rollouts = [ResilientService(start(gang, backend, i, RolloutService, model, engine=engine, device=device),
                                         timeout_s=timeout_s, name=f"rollout{i}") for i in range(rollout_instances)]
            trainer = ResilientService(start(gang, backend, rollout_instances, TrainerService, device=device),
                                       timeout_s=timeout_s, replay_kwargs=TRAINER_REPLAY, name="trainer")
            first = placement.assignments[0]
            spec = next(n for n in nodes if n.name == first.node)
            out.append(GPUGroup(  # without a GPU the "device" is host memory: the node's memory bounds a model
                req.name, first.node, gpu_memory_mib=(spec.gpu_memory_mib if first.gpus else 0) or spec.memory_mib,
                num_gpus=max(1, len(first.gpus)), host_memory_mib=sizes.rollout_memory_mib + sizes.trainer_memory_mib,
                rollout=RolloutPool(rollouts, router, chunk) if rollout_instances > 1 else rollouts[0], trainer=trainer,
            ))
        reward_req = GangRequest(f"{prefix}-reward", (Bundle(sizes.reward_cpu_milli, sizes.reward_memory_mib, name="reward"),),
                                 priority=priority, tenant=tenant)
        gang, backend = _placed(client, reward_req, wait_s)
        gangs.append(gang)
        reward = ResilientService(start(gang, backend, 0, RewardService), timeout_s=timeout_s, name="reward")
    except BaseException:
        _release(gangs)
        raise
    return ServicePlane(client, model, sizes, gangs, out, reward)


@contextlib.contextmanager
def ray_job_services(model: ModelConfig, *, address: str = "local", num_cpus: int = 2, priority: int = 0,
                     tenant: str = "default") -> Iterator[JobServices]:
    """The three services of one job placed by the cluster's scheduler service (``llm_rlvr.py ray=...``).

    ``address`` ``local`` starts a one-node Ray cluster here when this process is not connected;
    any other value (``auto``, ``HOST:PORT``) connects to that cluster, whose service is shared
    with every other job there.
    """
    import ray

    from infra.ray_cluster.realize import LOOPBACK, node_labels, secure_local_ray
    from infra.scheduler import Node
    from infra.service.client import connect

    started = not ray.is_initialized()
    if started and address == "local":
        secure_local_ray()
        node = Node("local", cpu_milli=num_cpus * 1000, memory_mib=8192)
        ray.init(address="local", num_cpus=num_cpus, labels=node_labels(node), include_dashboard=False, log_to_driver=False,
                 _node_ip_address=LOOPBACK)
    elif started:
        ray.init(address=address, log_to_driver=False)
    plane = place_services(connect(), model, priority=priority, tenant=tenant)
    try:
        g = plane.groups[0]
        yield JobServices(rollout=g.rollout, reward=plane.reward, trainer=g.trainer)
    finally:
        plane.close()
        if started:
            ray.shutdown()
