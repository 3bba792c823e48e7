"""Every task is solvable through the action interface, and its dense reward tracks progress."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sims import tasks as T
from sims.experts import ScriptedExpert, run_expert
from sims.scene import MAX_TIMESTEP, SceneConfig, build_model
from sims.vec_env import make_vec_env

# Pushing is the least reliable skill of the scripted experts (a block can spin away).
MIN_SUCCESS = {"reach": 0.9, "push": 0.6, "lift": 0.75, "stack": 0.75, "press": 0.9, "drawer": 0.75}


@pytest.mark.parametrize("task", T.TASK_NAMES)
def test_scripted_expert_solves_task(task: str) -> None:
    env = make_vec_env(task, 8, seed=31, num_threads=1)
    success = run_expert(env)
    assert success.mean() >= MIN_SUCCESS[task], (task, success.ravel())


def test_bench_experts_writes_each_tasks_success_with_an_interval(tmp_path) -> None:
    out = tmp_path / "experts.json"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "scripts" / "bench_experts.py"), "--tasks", "reach", "lift",
           "--episodes", "16", "--num-envs", "8", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"reach", "lift"}
    for r in results.values():
        assert r["episodes"] == 16 and r["ci95"][0] <= r["success"] <= r["ci95"][1]
        assert r["success"] >= MIN_SUCCESS["reach"]  # reach and lift: the experts' easiest tasks
    bad = subprocess.run([*cmd[:-2], "--episodes", "12"], capture_output=True, text=True, cwd=root, timeout=120)
    assert bad.returncode != 0 and "multiple of --num-envs" in bad.stderr


def test_expert_solves_the_suite_and_reward_rises_to_success() -> None:
    env = make_vec_env("suite", 12, seed=5, num_threads=1, terminate_on_success=False)
    expert = ScriptedExpert(env)
    obs = env.reset_arrays()
    first = None
    for _ in range(60):
        out = env.step_arrays(expert.act(obs))
        obs = out["observation"]
        first = out["reward"] if first is None else first
        if out["success"].sum() >= 6:
            break
    succeeded = out["success"]
    assert succeeded.sum() >= 6
    assert (out["reward"][succeeded] > first[succeeded]).all()


def test_evaluate_agrees_between_numpy_and_jax() -> None:
    jnp = pytest.importorskip("jax.numpy")
    env = make_vec_env("suite", 6, seed=8, num_threads=1)
    env.reset()
    for _ in range(5):
        env.step(np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float32))
    b = env._backend
    args = (b.qpos, b.qvel, b.mocap_pos, env._task, env._a, env._b)
    ref = T.task_signals(np, *args, env.task_names, env.layout)
    got = T.task_signals(jnp, *(jnp.asarray(x) for x in args), env.task_names, env.layout)
    for key, value in ref.items():
        np.testing.assert_allclose(np.asarray(got[key]), value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_success_bonus_pays_exactly_at_the_steps_that_succeed() -> None:
    rewards, successes = [], []
    for bonus in (0.0, 2.5):
        env = make_vec_env("stack", 8, seed=3, num_threads=1, terminate_on_success=False, success_bonus=bonus)
        expert = ScriptedExpert(env)
        obs = env.reset_arrays(seed=3)
        r, s = [], []
        for _ in range(T.TASKS["stack"].max_steps):
            out = env.step_arrays(expert.act(obs))
            obs = out["observation"]
            r.append(out["reward"])
            s.append(out["success"])
        rewards.append(np.stack(r))
        successes.append(np.stack(s))
    assert successes[1].any() and np.array_equal(successes[0], successes[1])
    np.testing.assert_allclose(rewards[1] - rewards[0], 2.5 * successes[0], atol=1e-5)
    with pytest.raises(ValueError, match="success_bonus"):
        make_vec_env("stack", 2, success_bonus=-1.0)


def _shaped_now(env) -> np.ndarray:
    """The dense (shaped) reward at each environment's current state."""
    b = env._backend
    return T.task_signals(np, b.qpos, b.qvel, b.mocap_pos, env._task, env._a, env._b, env.task_names, env.layout)["reward"]


def test_progress_reward_is_the_change_of_the_shaped_reward_and_success_reward_the_indicator() -> None:
    envs = {mode: make_vec_env("suite", 12, seed=5, num_threads=1, reward=mode) for mode in ("dense", "progress", "success")}
    expert = ScriptedExpert(envs["dense"])  # its actions drive all three: their states stay equal
    obs = {mode: env.reset_arrays(seed=5) for mode, env in envs.items()}["dense"]
    before = _shaped_now(envs["progress"])
    ended = 0
    for step in range(120):
        if step == 60:  # a snapshot restored into a fresh env continues the progress reward exactly
            fresh = make_vec_env("suite", 12, seed=5, num_threads=1, reward="progress")
            fresh.set_state(envs["progress"].get_state())
            envs["progress"] = fresh
        action = expert.act(obs)
        out = {mode: env.step_arrays(action) for mode, env in envs.items()}
        obs = out["dense"]["observation"]
        dense, done = out["dense"]["reward"], out["dense"]["terminated"] | out["dense"]["truncated"]
        np.testing.assert_array_equal(out["success"]["success"], out["dense"]["success"])
        np.testing.assert_allclose(out["progress"]["reward"], dense - before, atol=1e-5)
        np.testing.assert_array_equal(out["success"]["reward"], out["dense"]["success"].astype(np.float32))
        before = np.where(done, _shaped_now(envs["progress"]), dense)  # a new episode's baseline is its start
        ended += int(out["dense"]["success"].sum())
    assert ended > 0
    with pytest.raises(ValueError, match="reward='sparse'; valid rewards: dense, progress, success"):
        make_vec_env("reach", 2, reward="sparse")


def test_instruction_groups_say_one_thing_with_each_template_of_the_split() -> None:
    for split in T.SPLITS:
        groups = T.instruction_groups(T.TASK_NAMES, split)
        strings = [s for g in groups for s in g]
        assert sorted(set(strings)) == T.instruction_table(T.TASK_NAMES, split)
    groups = T.instruction_groups(("lift",), "train")
    assert ("pick up the red block", "lift the red block", "grab the red block and raise it",
            "raise the red block off the table") in groups
    assert all(len(g) == len(T.TASKS["lift"].train) for g in groups)


def test_task_weights_shape_the_train_split_only() -> None:
    weights = {"push": 3.0, "stack": 3.0, "reach": 0.0}  # the others weigh 1
    counts = {}
    for split in ("train", "validation"):
        env = make_vec_env("suite", 64, seed=4, split=split, num_threads=1, task_weights=weights)
        seen = [env.task_names[i] for i in np.asarray(env.reset_arrays()["task"])]
        counts[split] = {name: seen.count(name) for name in T.TASK_NAMES}
        env.close()
    assert counts["train"]["reach"] == 0
    assert counts["train"]["push"] + counts["train"]["stack"] > 64 * 0.5  # expected 6/10 of 64
    assert counts["validation"]["reach"] > 0  # evaluation splits stay uniform
    with pytest.raises(ValueError, match=r"^task_weights=\{'pull': 1.0\}: task weights name \['pull'\], not tasks of"):
        make_vec_env("suite", 4, task_weights={"pull": 1.0})
    with pytest.raises(ValueError, match=r"^task_weights=.*each weight must be a number >= 0"):
        make_vec_env("suite", 4, task_weights={"push": -1.0})


@pytest.mark.parametrize("timestep", [0.0, -0.01, float("nan"), MAX_TIMESTEP * 2])
def test_a_scene_config_refuses_a_timestep_outside_its_range(timestep: float) -> None:
    with pytest.raises(ValueError, match=rf"^timestep={timestep!r} must be in \(0, {MAX_TIMESTEP}\] seconds"):
        SceneConfig(timestep=timestep).validate()
    with pytest.raises(ValueError, match=r"^timestep="):  # a hand-built config is checked before the model is built
        build_model(SceneConfig(timestep=timestep))


def test_a_scene_config_at_the_edge_of_its_range_builds() -> None:
    model, _ = build_model(SceneConfig(timestep=MAX_TIMESTEP))
    assert model.opt.timestep == MAX_TIMESTEP
