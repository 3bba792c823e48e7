"""Co-location in one process: with env.backend=warp the per-step path never leaves the env's device.

On Warp's CPU device "the device" is host memory, so a device check alone could not fail; these
tests watch the conversions instead. A spy makes every device -> host conversion (``Tensor.cpu``,
``.numpy``, ``.tolist``, ``__array__``, ``torch.from_numpy``, ``torch.as_tensor``) raise while the
collection loop runs, outside the env's own ``step_td``/``reset_td`` (sims keeps its episode
bookkeeping on the host, as documented); the action the env receives must be the memory the policy's
action was written to, and the PPO update must read the collected buffer's storage (no copy between).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.rollout import Timer, buffer_device, collect_episodes, collect_steps
from vla_rl.trainer import Trainer

NUM_ENVS, STEPS = 4, 6


class HostConversion(AssertionError):
    """A device -> host conversion on the per-step path."""


class HostSpy:
    """Patches the host conversions of torch to raise while armed; :meth:`paused` lets the env use them."""

    WATCHED = ("cpu", "numpy", "tolist", "__array__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        for name in self.WATCHED:
            monkeypatch.setattr(torch.Tensor, name, self._guard(getattr(torch.Tensor, name), f"Tensor.{name}"))
        monkeypatch.setattr(torch, "from_numpy", self._guard(torch.from_numpy, "torch.from_numpy"))
        monkeypatch.setattr(torch, "as_tensor", self._guard(torch.as_tensor, "torch.as_tensor"))

    def _guard(self, original, label: str):
        def guarded(*args, **kwargs):
            if self.armed:
                raise HostConversion(f"{label} on the per-step path")
            return original(*args, **kwargs)

        return guarded

    @contextlib.contextmanager
    def paused(self):
        armed, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = armed


class WatchedEnv:
    """The env with the spy paused inside its own calls, recording the actions it was handed."""

    def __init__(self, env, spy: HostSpy) -> None:
        self.env, self.spy, self.actions = env, spy, []
        self.num_envs, self.device = env.num_envs, env.device

    def step_td(self, action):
        self.actions.append(action)
        with self.spy.paused():
            return self.env.step_td(action)

    def reset_td(self, seed=None):
        with self.spy.paused():
            return self.env.reset_td(seed=seed)

    def deferred_checks(self):
        """The env's deferred validity checks: their one read, at the rollout's end, is the env's own."""
        return self._block(self.env.deferred_checks)

    def deferred_restarts(self):
        """The env's deferred restarts: their reads, a few per rollout (counted in test_host_syncs), are the env's."""
        return self._block(self.env.deferred_restarts)

    def request_restarts(self):
        with self.spy.paused():
            self.env.request_restarts()

    @contextlib.contextmanager
    def _block(self, make):
        with self.spy.paused():
            block = make()
            block.__enter__()
        try:
            yield
        finally:
            with self.spy.paused():
                block.__exit__(None, None, None)

    def __getattr__(self, name):  # everything else (snapshots, instructions) is the env's
        return getattr(self.env, name)


class RecordingPolicy(torch.nn.Module):
    """The policy, remembering every action tensor ``act`` returned."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy, self.actions = policy, []

    def act(self, obs, deterministic=False):
        out = self.policy.act(obs, deterministic)
        self.actions.append(out["action"])
        return out

    def value(self, obs):
        return self.policy.value(obs)


@pytest.fixture(scope="module")
def warp_env():
    import sims

    env = sims.make_vec_env("reach", NUM_ENVS, seed=3, backend="warp", warp_device="cpu")
    yield env
    env.close()


@pytest.fixture(scope="module")
def warp_camera_env():
    import sims

    env = sims.make_vec_env("reach", NUM_ENVS, seed=3, backend="warp", warp_device="cpu", render=True)
    yield env
    env.close()


def _policy(env, name: str = "mlp"):
    obs = env.reset_td(seed=3)
    cfg = MLPPolicyConfig(obs_keys=("proprio", "state")) if name == "mlp" else load_config(
        CONFIG_DIR / "default.yaml").policy  # the default VLA: frames, instruction, proprioception
    policy = make_policy(cfg, obs, 4)
    policy.set_instructions(list(env.instructions))
    return policy, obs


def test_the_spy_catches_each_host_conversion(monkeypatch):
    spy = HostSpy(monkeypatch)
    x = torch.ones(3)
    spy.armed = True
    for convert in (x.cpu, x.numpy, x.tolist, lambda: np.asarray(x), lambda: torch.from_numpy(np.ones(2)),
                    lambda: torch.as_tensor(np.ones(2))):
        with pytest.raises(HostConversion):
            convert()
    with spy.paused():
        assert x.cpu() is x


@pytest.mark.parametrize("name", ["mlp", "vla"])
def test_ppo_collection_on_the_warp_device_never_converts_to_the_host(name, request, monkeypatch):
    warp_env = request.getfixturevalue("warp_env" if name == "mlp" else "warp_camera_env")
    policy, obs = _policy(warp_env, name)
    policy = RecordingPolicy(policy)
    spy = HostSpy(monkeypatch)
    env = WatchedEnv(warp_env, spy)
    spy.armed = True
    batch, next_obs = collect_steps(env, policy, obs, STEPS, Timer(), warp_env.device)
    spy.armed = False
    assert batch.batch_size == (STEPS, NUM_ENVS)
    # Zero-copy hand-over: the env stepped with the policy's own action tensors, which the buffer holds.
    assert len(env.actions) == STEPS
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(env.actions, policy.actions))
    assert all(torch.equal(batch["action"][t], a) for t, a in enumerate(policy.actions))
    here = buffer_device(warp_env)
    assert here == warp_env.device == torch.device("cpu")
    assert {leaf.device for leaf in batch.values(include_nested=True, leaves_only=True)} == {here}
    assert torch.isfinite(batch["next_value"]).all() and next_obs["state"].shape == (NUM_ENVS, 42)
    if name == "vla":  # the device renderer's frames went into the buffer as they came
        assert batch["obs", "rgb"].shape == (STEPS, NUM_ENVS, 1, 3, 64, 64) and batch["obs", "rgb"].float().std() > 0


def test_episode_collection_on_the_warp_device_never_converts_to_the_host(warp_env, monkeypatch):
    policy, _ = _policy(warp_env)
    spy = HostSpy(monkeypatch)
    env = WatchedEnv(warp_env, spy)
    spy.armed = True
    batch, returns, success = collect_episodes(env, policy, 3, 5, Timer(), warp_env.device)
    spy.armed = False
    assert batch.batch_size == (5, NUM_ENVS) and returns.shape == success.shape == (NUM_ENVS,)
    assert batch["alive"][0].all()


def test_ppo_iteration_on_warp_collects_without_host_copies_and_updates_from_the_buffer(tmp_path, monkeypatch):
    cfg = load_config(CONFIG_DIR / "reach_state_ppo.yaml", [
        f"out_dir={tmp_path}", "name=colocated", "env.backend=warp", "env.warp_device=cpu", "device=cpu",
        f"env.num_envs={NUM_ENVS}", f"ppo.rollout_steps={STEPS}", f"total_env_steps={2 * NUM_ENVS * STEPS}",
        "ppo.normalize_reward=true",  # account() scales the device batch's rewards on the host and back
        "eval.every=0", "log.wandb=disabled", "log.progress=false", "log.video=false",
    ])
    trainer = Trainer(cfg)
    spy = HostSpy(monkeypatch)
    trainer.collector.env = WatchedEnv(trainer.collector.env, spy)
    collected, updated = [], []
    collect, update = trainer.collector.collect, trainer.algorithm.update

    def watched_collect(policy, steps, timer):
        spy.armed = True
        try:
            collected.append(collect(policy, steps, timer))
        finally:
            spy.armed = False
        return collected[-1]

    def recorded_update(batch):
        updated.append(batch)
        return update(batch)

    monkeypatch.setattr(trainer.collector, "collect", watched_collect)
    monkeypatch.setattr(trainer.algorithm, "update", recorded_update)
    summary = trainer.train()
    trainer.close()
    assert summary["env_steps"] == 2 * NUM_ENVS * STEPS and len(collected) == len(updated) == 2
    for buffer, flat in zip(collected, updated):
        assert flat.batch_size == (NUM_ENVS * STEPS,)
        for key in (("obs", "state"), "action", "log_prob", "value"):
            # The update's tensors are views of the collection buffer: GAE and PPO read it where it was written.
            assert flat[key].data_ptr() == buffer[key].data_ptr(), key
    assert np.isfinite(trainer.log.rows[-1]["policy_loss"])
