"""The trainer's view of the fleet: a collector (see :class:`vla_rl.rollout.LocalCollector`) over Ray
simulator shards and the batching inference server.

One synchronous ``collect(policy, T)`` (``fleet.sync.mode=sync``):

1. pushes the policy's weights to the server as version ``v`` (the module itself the first time and
   after a server restart), with the trainer's torch RNG state;
2. asks every shard for a T-step rollout that may be answered only by version ``v`` or newer; each
   shard returns its ``[T, n]`` batch and its state at the end of the rollout, which the collector
   keeps: it is the shards' state at the start of the next rollout;
3. watches them: if a shard dies or the server restarts, the attempt is aborted — the server's
   waiting requests are cancelled until every rollout has stopped, every shard is rolled back to the
   kept state (a shard that died between iterations too), the weights are pushed again, and the
   iteration is collected again, so the batch is complete and the same as without the fault;
4. concatenates the shards' ``[T, n]`` batches into ``[T, N]`` and takes the server's RNG state
   back, so the trainer continues exactly as in process.

Asynchronous mode (``fleet.sync.mode=async``) keeps up to ``S = fleet.sync.max_staleness`` rollouts
submitted ahead of the trainer: a shard actor runs its calls in order, so the queued rollouts run
back to back while the trainer updates, each with the newest weights the server holds when it
steps. ``collect`` hands over the oldest, pushes the new weights, and submits one more. A batch
submitted after version ``v`` was pushed, behind ``q <= S - 1`` others, is handed over at version
``v + q + 1`` at the latest, so its staleness (``fleet/staleness``, the mean over its steps of the
current version minus the version that acted; ``fleet/staleness_max``) never exceeds ``S``:
collection waits instead of running ahead, and no simulated batch is ever dropped. A fault
discards the queue and re-collects from the kept state. Checkpoints (:meth:`FleetCollector.get_state`)
hold the shards' state at the end of the last batch handed over, not the queued batches: a
resumed run collects them again with its own weights.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError
from tensordict import TensorDict
from torch import nn

from infra.common.supervisor import Supervisor
from vla_rl.fleet.inference import NoPolicyError
from vla_rl.fleet.section import FleetConfig
from vla_rl.fleet.wire import from_wire
from vla_rl.fleet.worker import ShardNotStarted
from vla_rl.rollout import Timer, episode_outcome

POLL_S = 0.5
"""Seconds between health checks of the server while shards collect."""


class FleetError(RuntimeError):
    """The fleet cannot go on (a component died more often than ``fleet.max_restarts``, or hung)."""


class FleetCollector:
    """Collect PPO experience (and GRPO episodes) with Ray shards and an inference server.

    Args:
        fleet: the run's ``fleet`` section.
        workers: :class:`~vla_rl.fleet.worker.RolloutWorker` actor handles, in shard order
            (restartable: ``max_restarts > 0``, ``max_task_retries = 0``).
        server: :class:`~vla_rl.fleet.inference.InferenceServer` actor handle (restartable with
            ``max_task_retries = -1`` so requests in flight survive its restart).
        num_envs: N, the environments of all shards.
    """

    def __init__(self, fleet: FleetConfig, workers: list[Any], server: Any, num_envs: int) -> None:
        self.fleet = fleet
        self.workers = workers
        self.server = server
        self.num_envs = num_envs
        info = ray.get(workers[0].describe.remote(), timeout=fleet.collect_timeout_s)
        self.instructions = info["instructions"]
        self.task_names = info["task_names"]
        self.single_action_space = info["single_action_space"]
        self.max_episode_steps = info["max_episode_steps"]
        self.synchronous = fleet.sync.mode == "sync"
        # Versions only grow: a resumed trainer continues after whatever the server already holds.
        self.version = max(0, int(self._get(server.status.remote())["version"]))
        self._server_version = self.version  # the last version pushed: the server holds less only after a restart
        self._server_has_module = False
        self._queue: deque[_Attempt] = deque()  # async: rollouts submitted ahead of the trainer, oldest first
        self._state: list[Any] | None = None  # every shard's state at the start of the oldest rollout not handed over
        self._metrics: dict[str, float] = {}
        self.restarts = {"shard": 0, "server": 0}

    # ------------------------------------------------------------------------------ collector API
    def reset(self, seed: int | None) -> TensorDict:
        """Reset every shard's environments (queued rollouts are discarded); returns the first observation ``[N]``."""
        self._discard_queue()
        self._state = None
        return torch.cat(self._get([w.reset.remote(seed) for w in self.workers]))

    def collect(self, policy: nn.Module, steps: int, timer: Timer) -> TensorDict:
        """``steps`` decisions of every environment (see the module docstring); adds ``version`` ``[T, N]``."""
        self.version += 1
        start = time.perf_counter()
        batch, seconds = self._collect_sync(policy, steps) if self.synchronous else self._collect_async(policy, steps)
        if self.fleet.offload:
            self._get(self.server.offload.remote())
        wall = time.perf_counter() - start
        counters = self._add_seconds(seconds, timer)
        staleness = (self.version - batch["version"]).float()
        self._metrics = {
            "fleet/staleness": float(staleness.mean()),
            "fleet/staleness_max": float(staleness.max()),
            "fleet/version": float(self.version),
            "fleet/batch_envs": counters["envs"] / max(counters["batches"], 1.0),
            "fleet/collect_s": wall,
            "fleet/shard_restarts": float(self.restarts["shard"]),
            "fleet/server_restarts": float(self.restarts["server"]),
        }
        return batch

    def collect_episodes(
        self, policy: nn.Module, seed: int | None, max_decisions: int | None, timer: Timer
    ) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
        """GRPO experience (synchronous): every environment reset with ``seed`` and run for
        ``max_decisions`` decisions (see :meth:`RolloutWorker.rollout_episodes`); a fault rolls the shards
        back and collects the iteration again, as :meth:`collect` does.

        Returns:
            The batch ``[T, N]`` with ``alive`` and ``version``, the first-episode return ``[N]`` and success ``[N]``.
        """
        if max_decisions is None:
            raise ValueError("fleet episode collection needs the environments' episode limit (max_episode_steps)")
        self.version += 1
        rng = torch.get_rng_state()
        self._push(policy, rng)
        attempt = self._submit(max_decisions, self.version, episodes=True, seed=seed)
        batch, seconds = self._complete(attempt, policy, rng)
        torch.set_rng_state(self._get(self.server.rng_state.remote()))
        self._add_seconds(seconds, timer)
        self._metrics = {"fleet/version": float(self.version), "fleet/shard_restarts": float(self.restarts["shard"]),
                         "fleet/server_restarts": float(self.restarts["server"])}
        return (batch, *episode_outcome(batch))

    def get_state(self) -> dict[str, Any]:
        """Every shard's environments and carried observation at the end of the last batch handed over, and
        the weights version. Rollouts queued in asynchronous mode go on; they are not part of the state."""
        if self._state is None:  # nothing collected since a reset: the shards are idle
            self._state = self._snapshot()
        return {"shards": self._state, "version": self.version}

    def set_state(self, state: dict[str, Any], reset_seed: int) -> None:
        """Restore :meth:`get_state`'s result; environments that could not snapshot are reset with ``reset_seed``."""
        self._discard_queue()
        if len(state["shards"]) != len(self.workers):
            raise ValueError(
                f"the checkpoint holds {len(state['shards'])} shards but fleet.shards={len(self.workers)}; "
                "resume with the run's original fleet.shards"
            )
        self._restore(state["shards"], reset_seed)
        self.version = max(self.version, int(state["version"]))

    def metrics(self) -> dict[str, float]:
        """The last collection's fleet metrics (staleness, batch size, restarts)."""
        return dict(self._metrics)

    def close(self) -> None:
        """Stop waiting for queued rollouts (the job owns the actors and kills them)."""
        self._queue.clear()

    # ------------------------------------------------------------------------------ internals
    def _get(self, refs: Any) -> Any:
        """``ray.get`` bounded by ``fleet.collect_timeout_s``."""
        return ray.get(refs, timeout=self.fleet.collect_timeout_s)

    def _collect_sync(self, policy: nn.Module, steps: int) -> tuple[TensorDict, dict[str, float]]:
        """Collect with the newest weights and the trainer's RNG state; hand the server's RNG state back."""
        rng = torch.get_rng_state()
        self._push(policy, rng)
        batch, seconds = self._complete(self._submit(steps, self.version), policy, rng)
        torch.set_rng_state(self._get(self.server.rng_state.remote()))
        return batch, seconds

    def _collect_async(self, policy: nn.Module, steps: int) -> tuple[TensorDict, dict[str, float]]:
        """Hand over the oldest queued batch; push the newest weights; queue up to ``max_staleness`` rollouts."""
        if not self._queue:  # the first collection, or the first after a reset or restore
            self._push(policy, None)
            self._queue.append(self._submit(steps, self.version))
        if self._queue[0].steps != steps:
            raise ValueError(
                f"asynchronous collection queued {self._queue[0].steps}-step rollouts but was asked for {steps} steps; "
                "collect the same number of steps every iteration, or reset() first"
            )
        batch, seconds = self._complete(self._queue.popleft(), policy, None)
        self._push(policy, None)
        while len(self._queue) < self.fleet.sync.max_staleness:
            self._queue.append(self._submit(steps, self.version))
        return batch, seconds

    def _push(self, policy: nn.Module, rng_state: torch.Tensor | None) -> None:
        """Send weights ``self.version`` (and the module when the server has none)."""
        state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
        module = None if self._server_has_module else _cpu_copy(policy)
        try:
            self._get(self.server.set_weights.remote(state, self.version, rng_state, module))
        except NoPolicyError:  # the server restarted while no collection was watching it
            self.restarts["server"] += 1
            self._get(self.server.set_weights.remote(state, self.version, rng_state, _cpu_copy(policy)))
        self._server_has_module = True
        self._server_version = self.version

    def _add_seconds(self, seconds: dict[str, float], timer: Timer) -> dict[str, float]:
        """Add the shards' seconds and the server's inference time to ``timer``; returns the server's counters."""
        counters = self._get(self.server.pop_counters.remote())
        for key in ("simulate", "render", "wait"):
            timer.add(key, seconds.get(key, 0.0))
        timer.add("infer", counters["infer_s"])
        return counters

    def _snapshot(self) -> list[Any]:
        """Every idle shard's state, asked for now."""
        return self._get([w.get_state.remote() for w in self.workers])

    def _submit(self, steps: int, version: int, episodes: bool = False, seed: int | None = None) -> _Attempt:
        """Start every shard's next rollout (queued behind its running one), answered by ``version`` or newer."""
        if self._state is None:  # idle shards after a reset or an inexact restore: the rollback point
            self._state = self._snapshot()
        if episodes:
            refs = [w.rollout_episodes.remote(seed, steps, version) for w in self.workers]
        else:
            refs = [w.rollout.remote(steps, version) for w in self.workers]
        return _Attempt(refs, steps, version, episodes, seed)

    def _complete(self, attempt: _Attempt, policy: nn.Module, rng: torch.Tensor | None) -> tuple[TensorDict, dict[str, float]]:
        """Wait for ``attempt`` (the oldest); if a shard or the server dies, roll back and collect it again
        (up to ``fleet.max_restarts`` times in one iteration, each attempt within ``fleet.collect_timeout_s``)."""
        current = attempt

        def recover(exc: BaseException) -> None:
            nonlocal current
            if isinstance(exc, _ServerRestarted):
                self.restarts["server"] += 1
                self._server_has_module = False
            else:  # a shard died during this rollout, or since the last one
                self.restarts["shard"] += 1
            current = self._recover(current, policy, rng)

        supervisor = Supervisor(
            "the fleet's shards and inference server (in one iteration)", self.fleet.max_restarts, "fleet.max_restarts",
            timeout_s=self.fleet.collect_timeout_s, timeout_setting="fleet.collect_timeout_s",
            error=FleetError, timeout_error=FleetError,
        )
        batch, seconds, self._state = supervisor.run(
            lambda timeout_s: self._finish(current.refs, timeout_s), (RayActorError, ShardNotStarted, _ServerRestarted),
            recover,
        )
        return batch, seconds

    def _finish(self, refs: list[Any], timeout_s: float) -> tuple[TensorDict, dict[str, float], list[Any]]:
        """Wait for rollouts, watching the server; concatenate shards; also return their states at the end.

        Raises:
            TimeoutError: the rollouts did not all end within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} of {len(refs)} shard rollouts still running")
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                ray.get(ref)  # raises RayActorError if that shard died
            if pending:
                self._check_server()
        results = ray.get(refs)
        batch = torch.cat([from_wire(r[0], batch_dims=2) for r in results], dim=1)
        seconds: dict[str, float] = {}
        for _, shard_seconds, _ in results:
            for key, value in shard_seconds.items():
                seconds[key] = seconds.get(key, 0.0) + value / len(results)
        return batch, seconds, [r[2] for r in results]

    def _check_server(self) -> None:
        """Raise :class:`_ServerRestarted` if the server came back (without weights).

        The requests in flight are sent to it again and would wait for weights, but the replies the
        dead server wrote may have reached only some shards, which would then ask one step ahead of
        the others; so the iteration is collected again instead, exactly.
        """
        try:
            status = ray.get(self.server.status.remote(), timeout=POLL_S)
        except GetTimeoutError:
            return  # restarting, or busy with a batch: look again at the next poll
        if status["version"] < self._server_version:
            raise _ServerRestarted

    def _recover(self, attempt: _Attempt, policy: nn.Module, rng: torch.Tensor | None) -> _Attempt:
        """After a shard or the server died: end ``attempt`` and the queue behind it, wait for restarts, roll
        every shard back to the start of ``attempt``; returns the attempt collected again."""
        self._queue.appendleft(attempt)
        self._discard_queue()
        await_shards(self.workers, self.fleet.collect_timeout_s)
        recoveries = self.restarts["shard"] + self.restarts["server"]
        self._restore(self._state, reset_seed=1_000_003 * self.version + recoveries)
        self._get(self.server.cancel_pending.remote())
        if rng is not None or not self._server_has_module:
            self._push(policy, rng)  # in sync mode the server's sampling restarts from the iteration's RNG state
        return self._submit(attempt.steps, attempt.version, attempt.episodes, attempt.seed)

    def _discard_queue(self) -> None:
        """End every queued rollout (cancelling the server's waiting requests); their batches are dropped."""
        refs = [ref for attempt in self._queue for ref in attempt.refs]
        self._queue.clear()
        if refs:
            self._abort(refs)

    def _abort(self, refs: list[Any]) -> None:
        """Cancel the server's waiting requests until every rollout of ``refs`` has ended.

        Cancelled once is not enough: a shard that reconnects to a restarted server sends its
        unanswered requests again, and a shard starts its next queued rollout.
        """
        deadline = time.monotonic() + self.fleet.collect_timeout_s
        pending = list(refs)
        while pending:
            if time.monotonic() > deadline:
                raise FleetError(f"rollouts did not stop within fleet.collect_timeout_s={self.fleet.collect_timeout_s}")
            self._get(self.server.cancel_pending.remote())
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                with contextlib.suppress(RayActorError, RayTaskError):
                    ray.get(ref)  # the dead shard, and the others whose requests were cancelled

    def _restore(self, states: list[Any], reset_seed: int) -> None:
        """Put every shard back into ``states``; warn when some environments had to be reset instead."""
        exact = self._get([w.set_state.remote(s, reset_seed) for w, s in zip(self.workers, states)])
        self._state = list(states) if all(exact) else None  # None: snapshot the reset shards before the next rollout
        if not all(exact):
            warnings.warn(
                "some shard environments cannot snapshot their state and were reset instead: the continuation "
                "is complete but not identical to an uninterrupted run",
                stacklevel=3,
            )



def await_shards(workers: list[Any], timeout_s: float) -> None:
    """Block until every shard answers: Ray restarts a killed one in the background, and a call to one
    still restarting fails at once (shards do not retry tasks).

    Raises:
        FleetError: a shard did not come back within ``timeout_s`` (``fleet.collect_timeout_s``).
    """
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        while True:
            try:
                ray.get(worker.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
                break
            except ActorUnavailableError as exc:
                if time.monotonic() > deadline:
                    raise FleetError(f"a restarted shard did not come back within fleet.collect_timeout_s={timeout_s:g} s; "
                                     "check the raylet logs for why it fails to start") from exc
                time.sleep(POLL_S / 5)


class _ServerRestarted(Exception):
    """The inference server restarted during a collection."""


@dataclass
class _Attempt:
    """One rollout of every shard, in flight or queued: ``steps`` decisions, or (``episodes``) a reset
    with ``seed`` and ``steps`` decisions of first episodes."""

    refs: list[Any]
    steps: int
    version: int
    episodes: bool = False
    seed: int | None = None


def _cpu_copy(policy: nn.Module) -> nn.Module:
    """A CPU copy of the policy module to ship to the server (the trainer's copy stays where it is)."""
    return copy.deepcopy(policy).cpu()
