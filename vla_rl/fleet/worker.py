"""A simulator shard: a slice of the job's environments that runs rollouts against the inference server.

Shard ``k`` of ``S`` holds environments ``[k n, (k + 1) n)`` of the job's ``N = S n``, as ``P``
vector environments of ``n / P`` each (its pipeline stages; ``P = 1`` unless pipelined). Each
vector env is built with its ``env_offset``, so it samples exactly the episodes those
environments would sample in one in-process vector env of N.

A rollout of T decisions keeps one inference request in flight per stage: while the server
answers stage ``s``, the shard steps (simulates and renders) the other stages, so with ``P >= 2``
inference hides behind simulation. Observations, actions and the reply's weights version are
recorded per step; the result is the ``[T, n]`` batch of :mod:`vla_rl.rollout` (raw rewards,
``next_value`` from the server's values and bootstrap values), plus ``version``, and the shard's
state at its end (:meth:`RolloutWorker.get_state`), from which the collector rolls the shard back
if the next rollout is lost. ``sims`` environments, and gymnasium MuJoCo or array-state tasks in a
``SyncVectorEnv``, snapshot exactly; a gymnasium ``AsyncVectorEnv`` (``env.vectorization=async``)
cannot, and is reset instead.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from vla_rl.config import TrainEnvConfig
from vla_rl.envs import make_env
from vla_rl.fleet.channel import connect
from vla_rl.fleet.wire import Reply, Request, Wire, as_tensor, to_wire
from vla_rl.rollout import Decision, Timer, collect_first_episodes, collect_stages


class ShardNotStarted(RuntimeError):
    """A rollout was asked of a shard whose environments were never started: a shard process that
    Ray restarted between two rollouts (its state is lost; the collector restores it)."""


def _env_state(env: Any) -> Any:
    """The env's snapshot, or ``None`` if it cannot take one (a gymnasium ``AsyncVectorEnv``)."""
    try:
        return env.get_state()
    except (AttributeError, NotImplementedError):
        return None


class _ServerLink:
    """The inference server as the collection loop's policy (:class:`vla_rl.rollout.PolicyLink`):
    requests go out as wire arrays, replies come back as tensors."""

    timer_key = "wait"  # blocked on the server: inference not hidden by simulation, plus transport

    def __init__(self, shard: int, channel: Any, min_version: int) -> None:
        self.shard, self.channel, self.min_version = shard, channel, min_version

    def ask(self, stage: int, obs: TensorDict, bootstrap_obs: TensorDict | None, value_only: bool) -> Any:
        """Send stage ``stage``'s request; returns the channel's handle."""
        request = Request((self.shard, stage), to_wire(obs), None if bootstrap_obs is None else to_wire(bootstrap_obs),
                          value_only, self.min_version)
        return self.channel.ask(request)

    def wait(self, handle: Any) -> Decision:
        """The server's reply to ``handle`` as tensors."""
        reply: Reply = self.channel.wait(handle)
        return Decision(
            None if reply.action is None else as_tensor(reply.action),
            None if reply.log_prob is None else as_tensor(reply.log_prob),
            as_tensor(reply.value), as_tensor(reply.bootstrap_value), reply.version,
        )


class RolloutWorker:
    """Simulator shard ``shard``: environments ``[offset, offset + num_envs)`` in ``stages`` stages.

    Args:
        env_cfg: the run's environment section.
        shard: this shard's index (orders its requests in the server's batches).
        offset: global index of its first environment.
        num_envs: environments of this shard (a multiple of ``stages``).
        stages: pipeline stages P.
        seed: the run's seed (environments are built with it, as in-process).
        server: inference server handle with ``infer.remote(Request)``, or the name of the server's Ray
            actor. The job passes the name: Ray flags an actor handle among the constructor arguments
            of a restartable actor as unsafe to restart with (ray-project/ray#53727).
        threads: torch threads, physics threads and GL contexts of this process (the CPUs it reserved).
        transport: how requests reach the server (:func:`vla_rl.fleet.channel.connect`): ``"socket"``
            (its Unix socket when on this node, else Ray calls) or ``"ray"``.
        group_size: G, consecutive environments sharing each episode's initial state (GRPO); groups
            never straddle shards (the config checks that G divides a shard's environments).
    """

    def __init__(
        self, env_cfg: TrainEnvConfig, shard: int, offset: int, num_envs: int, stages: int, seed: int, server: Any,
        threads: int = 1, transport: str = "socket", group_size: int = 1,
    ) -> None:
        if stages < 1 or num_envs % stages:
            raise ValueError(f"stages={stages} must be >= 1 and divide the shard's num_envs={num_envs}")
        torch.set_num_threads(threads)
        self.shard = shard
        if isinstance(server, str):
            import ray

            server = ray.get_actor(server)
        self.link = connect(server, transport)
        per = num_envs // stages
        self.envs = [
            make_env(env_cfg, seed=seed, num_envs=per, env_offset=offset + s * per, num_threads=threads,
                     group_size=group_size)
            for s in range(stages)
        ]
        self.obs: list[TensorDict | None] = [None] * stages

    def describe(self) -> dict[str, Any]:
        """What the trainer needs to know of the environments (same for every shard)."""
        env = self.envs[0]
        return {
            "instructions": list(env.instructions),
            "task_names": list(env.task_names),
            "single_action_space": env.single_action_space,
            "max_episode_steps": getattr(env, "max_episode_steps", None),
        }

    def ping(self) -> int:
        """Liveness check; returns the shard index."""
        return self.shard

    def reset(self, seed: int) -> TensorDict:
        """Reset every environment with ``seed``; returns the shard's observation ``[n]``."""
        self.obs = [env.reset_td(seed=seed) for env in self.envs]
        return torch.cat(self.obs)

    def get_state(self) -> dict[str, Any]:
        """Everything that determines the next rollout: each stage's env state (``None`` for an env that
        cannot snapshot) and carried observation."""
        return {"envs": [_env_state(env) for env in self.envs], "obs": [o.to_dict() for o in self.obs]}

    def set_state(self, state: dict[str, Any], reset_seed: int) -> bool:
        """Restore what :meth:`get_state` returned (also into a freshly restarted shard).

        A stage whose env could not snapshot is reset with ``reset_seed`` instead.

        Returns:
            True if every stage was restored exactly.
        """
        if any(o is None for o in self.obs):
            self.reset(seed=None)  # environments of a new process must be started before being overwritten
        exact = True
        for s, (env, env_state) in enumerate(zip(self.envs, state["envs"])):
            if env_state is None:
                self.obs[s] = env.reset_td(seed=reset_seed)
                exact = False
            else:
                env.set_state(env_state)
                self.obs[s] = TensorDict.from_dict(state["obs"][s], batch_size=[env.num_envs])
        return exact

    def rollout(self, steps: int, min_version: int) -> tuple[Wire, dict[str, float], dict[str, Any]]:
        """Run ``steps`` decisions of every environment with the server's policy.

        Args:
            steps: decisions T.
            min_version: the oldest weights version the server may answer with.

        Returns:
            The ``[T, n]`` batch (:func:`~vla_rl.fleet.wire.to_wire`), this shard's seconds ``simulate``,
            ``render`` and ``wait`` (blocked on the server: inference not hidden by simulation, plus
            transport), and its state after the rollout (:meth:`get_state`).

        Raises:
            ShardNotStarted: neither :meth:`reset` nor :meth:`set_state` ran in this process.
        """
        if any(o is None for o in self.obs):
            raise ShardNotStarted(f"shard {self.shard}: call reset() (or set_state) before rollout()")
        self.link.forget()  # replies still due to an aborted rollout
        timer = Timer()
        batch, self.obs = collect_stages(self.envs, _ServerLink(self.shard, self.link, min_version), self.obs, steps, timer)
        return to_wire(batch), dict(timer.seconds), self.get_state()

    def rollout_episodes(
        self, seed: int | None, decisions: int, min_version: int
    ) -> tuple[Wire, dict[str, float], dict[str, Any]]:
        """Reset every environment and run ``decisions`` decisions with the server's policy (GRPO).

        Every shard runs all ``decisions`` (the episode limit), since the server batches every shard's
        requests together; ``alive`` marks the steps of each environment's first episode.

        Args:
            seed: seed of this reset, or ``None`` to continue the environments' RNG.
            decisions: decisions T (the episode limit).
            min_version: the oldest weights version the server may answer with.

        Returns:
            The ``[T, n]`` episode batch (:func:`vla_rl.rollout.collect_first_episodes`), this shard's
            seconds, and its state after the rollout.
        """
        if len(self.envs) != 1:
            raise ValueError(f"shard {self.shard}: episode rollouts run one stage, not {len(self.envs)}")
        self.link.forget()
        timer = Timer()
        env = self.envs[0]
        link = _ServerLink(self.shard, self.link, min_version)
        batch, last = collect_first_episodes(env, link, env.reset_td(seed=seed), decisions, timer, stop_when_ended=False)
        self.obs = [last]
        return to_wire(batch), dict(timer.seconds), self.get_state()

    def close(self) -> None:
        """Close the environments and the link to the server."""
        self.link.close()
        for env in self.envs:
            env.close()
