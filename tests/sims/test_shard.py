"""Ray simulator shards on a local loopback cluster equal one in-process environment set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sims.render import RenderConfig
from sims.vec_env import ACTION_DIM, EnvConfig, SimVectorEnv

ray = pytest.importorskip("ray")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.mark.slow
def test_shards_step_like_one_environment_set(local_ray) -> None:
    from sims.shard import make_shards

    config = EnvConfig(task="suite", num_envs=8, seed=6, group_size=2,
                       render=RenderConfig(width=32, height=32, num_contexts=1))
    shards = make_shards(config, num_shards=2, num_cpus=1)
    try:
        specs = ray.get([s.spec.remote() for s in shards], timeout=TIMEOUT_S)
        assert [sp["env_offset"] for sp in specs] == [0, 4]
        local = SimVectorEnv(config)
        expected = local.reset_td()
        got = torch.cat(ray.get([s.reset.remote() for s in shards], timeout=TIMEOUT_S))
        assert torch.equal(got["state"], expected["state"]) and torch.equal(got["rgb"], expected["rgb"])
        actions = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (3, 8, ACTION_DIM)).astype(np.float32))
        want = torch.stack([local.step_td(a) for a in actions])
        parts = ray.get([s.rollout.remote(actions[:, 4 * k:4 * k + 4]) for k, s in enumerate(shards)],
                        timeout=TIMEOUT_S)
        got = torch.cat(parts, dim=1)
        assert got.batch_size == torch.Size([3, 8])
        assert torch.equal(got["observation", "state"], want["observation", "state"])
        assert torch.equal(got["reward"], want["reward"])
        with pytest.raises(ray.exceptions.RayTaskError, match="NaN"):
            ray.get(shards[0].step.remote(torch.full((4, ACTION_DIM), float("nan"))), timeout=TIMEOUT_S)
        local.close()
    finally:
        ray.get([s.close.remote() for s in shards], timeout=TIMEOUT_S)
        for s in shards:
            ray.kill(s)


def test_uneven_split_is_refused() -> None:
    from sims.shard import make_shards

    with pytest.raises(ValueError, match="split into 3 shards"):
        make_shards(EnvConfig(task="reach", num_envs=8), num_shards=3)
