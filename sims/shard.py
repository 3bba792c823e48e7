"""A simulator shard: N environments (optionally with their own renderer) as a Ray actor.

A fleet is several shards, each made with ``env_offset`` so that together they step exactly the
environments one large :class:`~sims.vec_env.SimVectorEnv` would::

    shards = make_shards(EnvConfig(task="suite", num_envs=64, seed=0), num_shards=4)
    obs = gather([s.reset.remote() for s in shards])          # TensorDicts [16] each
    out = gather([s.step.remote(a) for s, a in zip(shards, actions.split(16))])

Ray is imported here only; the rest of ``sims`` does not need it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ray

from sims.vec_env import EnvConfig, SimVectorEnv


class SimShard:
    """N environments behind Ray calls; every method returns plain data or TensorDicts."""

    def __init__(self, config: EnvConfig):
        """Build the environments (and renderer) described by ``config`` in this process."""
        self.env = SimVectorEnv(config)

    def spec(self) -> dict[str, Any]:
        """What a trainer needs to know: sizes, spaces, instruction strings, task names."""
        return {
            "num_envs": self.env.num_envs,
            "env_offset": self.env.config.env_offset,
            "instructions": list(self.env.instructions),
            "task_names": list(self.env.task_names),
            "single_observation_space": self.env.single_observation_space,
            "single_action_space": self.env.single_action_space,
        }

    def reset(self, seed: int | None = None, mask: Any = None):
        """Reset (all, or where ``mask``); the observation TensorDict [N]."""
        return self.env.reset_td(seed=seed, mask=mask)

    def step(self, action: Any):
        """Step with actions [N, A] (torch or numpy); the step TensorDict [N]."""
        return self.env.step_td(action)

    def rollout(self, actions: Any):
        """Step through a sequence of actions [T, N, A]; the step TensorDicts stacked to [T, N]."""
        import torch

        return torch.stack([self.env.step_td(a) for a in actions])

    def close(self) -> None:
        """Release the renderer."""
        self.env.close()


RaySimShard = ray.remote(SimShard)


def make_shards(config: EnvConfig, num_shards: int, *, num_cpus: float = 1.0,
                **actor_options: Any) -> list[Any]:
    """Split ``config.num_envs`` environments over ``num_shards`` Ray actors.

    Args:
        config: the whole set; each shard gets ``num_envs / num_shards`` of it at its offset.
        num_shards: how many actors.
        num_cpus: CPUs each actor reserves (also its physics and render threads).
        actor_options: more ``.options(...)`` for the actors (e.g. a scheduling strategy).

    Raises:
        ValueError: the environments (or GRPO groups) do not split evenly.
    """
    per, rest = divmod(config.num_envs, num_shards)
    if num_shards < 1 or rest or per % config.group_size:
        raise ValueError(f"num_envs={config.num_envs} must split into {num_shards} shards of whole "
                         f"groups of {config.group_size}")
    threads = max(1, int(num_cpus))
    render = config.render
    if render is not None and render.num_contexts is None:
        render = replace(render, num_contexts=threads)
    return [
        RaySimShard.options(num_cpus=num_cpus, **actor_options).remote(
            replace(config, num_envs=per, env_offset=config.env_offset + k * per, num_threads=threads,
                    render=render))
        for k in range(num_shards)
    ]
