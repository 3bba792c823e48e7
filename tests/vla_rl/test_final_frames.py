"""The collectors ask a ``sims`` env for the frames of its final observations only where a critic may read
them (``vla_rl.rollout.frames_for_critic``): PPO with a critic over state keys and GRPO render each world once
per step; a critic that shares the actor's images keeps the frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies import ActionHeadConfig, SentenceCache, VLAConfig, VLAPolicy, make_policy
from policies.mlp import MLPPolicyConfig
from sims.render import RenderConfig
from sims.vec_env import make_vec_env
from vla_rl import rollout
from vla_rl.rollout import Timer, collect_steps, frames_for_critic

N, STEPS = 3, 4
RENDER = RenderConfig(width=16, height=16, cameras=("front",), num_contexts=1)


def _sentences() -> SentenceCache:
    def encode(strings: list[str]) -> torch.Tensor:
        return F.normalize(torch.ones(len(strings), 384), dim=-1)
    return SentenceCache(encode)


def _vla(obs, critic_obs_keys: tuple[str, ...]) -> VLAPolicy:
    cfg = VLAConfig(image_size=16, conv_channels=(8,), width=16, trunk_sizes=(16,), critic_obs_keys=critic_obs_keys)
    return VLAPolicy(cfg, obs, action_dim=4, sentences=_sentences())


def test_final_frames_follow_what_the_critic_reads():
    env = make_vec_env("reach", N, seed=0, render=RENDER, num_threads=1)
    try:
        obs = env.reset_td(seed=0)
        mlp = make_policy(MLPPolicyConfig(obs_keys=("proprio", "state")), obs, 4)
        for policy, wanted in ((mlp, False), (_vla(obs, ("proprio", "state")), False), (_vla(obs, ()), True),
                               (None, False)):
            env.final_frames = not wanted
            frames_for_critic(env, policy)
            assert env.final_frames is wanted, policy
    finally:
        env.close()


@pytest.mark.parametrize("chunk", [1, 2])
def test_ppo_collection_with_a_state_critic_renders_once_per_decision(chunk):
    env = make_vec_env("reach", N, seed=0, render=RENDER, num_threads=1)
    try:
        obs = env.reset_td(seed=0)
        head = ActionHeadConfig(chunk=chunk)
        policy = make_policy(MLPPolicyConfig(obs_keys=("proprio", "state"), head=head), obs, 4)
        drawn: list[int] = []
        egl_render = env._renderer.render
        env._renderer.render = lambda qpos, *a, **k: drawn.append(len(qpos)) or egl_render(qpos, *a, **k)
        # Environment 1 truncates at the first decision (with chunks: at its last control step, after one without).
        env._steps[1] = env._max_steps[env._task[1]] - chunk
        batch, _ = collect_steps(env, policy, obs, STEPS, Timer(), torch.device("cpu"))
        assert batch["truncated"][:, 1].tolist() == [True, False, False, False]
        # One render of every world per decision, the reset step's included: a chunk's inner steps draw nothing.
        assert drawn == [N] * STEPS
        # The truncated episode was bootstrapped from its final observation's value (which holds no frames).
        assert not np.isclose(batch["next_value"][0, 1].item(), batch["value"][1, 1].item())
    finally:
        env.close()


def test_skipping_a_chunks_inner_frames_collects_the_same_batch(monkeypatch):
    """The frames a decision reads are drawn at its state whether or not the chunk's inner steps were drawn."""
    batches = []
    for draw_inner in (False, True):
        if draw_inner:  # every step drawn, as before the skip
            monkeypatch.setattr(rollout, "step_frames", lambda env, action, frames: env.step_td(action))
        env = make_vec_env("reach", N, seed=0, render=RENDER, num_threads=1)
        try:
            obs = env.reset_td(seed=0)
            torch.manual_seed(0)
            policy = make_policy(MLPPolicyConfig(obs_keys=("proprio", "state"), head=ActionHeadConfig(chunk=3)), obs, 4)
            env._steps[1] = env._max_steps[env._task[1]] - 2  # an episode ends inside the first chunk
            batch, _ = collect_steps(env, policy, obs, STEPS, Timer(), torch.device("cpu"))
            batches.append(batch)
        finally:
            env.close()
    skipped, drawn = batches
    assert torch.equal(skipped["obs", "rgb"], drawn["obs", "rgb"])
    assert torch.equal(skipped["reward"], drawn["reward"]) and torch.equal(skipped["truncated"], drawn["truncated"])
