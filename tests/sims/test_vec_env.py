"""The vector environment: API contract, bad input, seeding, autoreset, grouping, scripted success."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import sims
from sims import tasks as T
from sims.vec_env import ACTION_DIM, make_vec_env


def scripted_reach(obs: dict[str, np.ndarray]) -> np.ndarray:
    """Move the tip towards the task's tip goal (state[:, :3]) with the gripper open."""
    goal = obs["state"][:, :3]
    return np.concatenate([np.clip(goal / 0.03, -1, 1), -np.ones((len(goal), 1))], 1).astype(np.float32)


@pytest.mark.parametrize("task", [*sims.TASK_NAMES, "suite"])
def test_every_task_steps_with_contract_shapes(task: str) -> None:
    env = make_vec_env(task, 4, seed=0, num_threads=1)
    obs, _ = env.reset()
    assert env.single_observation_space.contains({k: v[0] for k, v in obs.items()})
    assert obs["proprio"].dtype == np.float32 and obs["proprio"].shape == (4, T.PROPRIO_DIM)
    assert obs["state"].shape == (4, T.STATE_DIM)
    assert obs["instruction"].dtype == np.int64 and (obs["instruction"] < len(env.instructions)).all()
    for _ in range(3):
        obs, reward, term, trunc, _info = env.step(env.action_space.sample())
        assert reward.dtype == np.float32 and np.isfinite(reward).all()
        assert term.dtype == bool and trunc.dtype == bool
    texts = [env.instructions[i] for i in obs["instruction"]]
    assert all(isinstance(t, str) and t for t in texts)


def test_instruction_tables_of_the_splits_are_disjoint_and_name_the_colour() -> None:
    for task in sims.TASK_NAMES:
        train = set(T.instruction_table((task,), "train"))
        paraphrase = set(T.instruction_table((task,), "paraphrase"))
        assert train and paraphrase and not train & paraphrase, task
        assert set(T.instruction_table((task,), "validation")) == train
        if task != "drawer":
            composition = set(T.instruction_table((task,), "composition"))
            assert composition and not composition & (train | paraphrase), task
    env = make_vec_env("reach", 8, seed=3, num_threads=1, split="paraphrase")
    obs, _ = env.reset()
    for i in range(8):
        text = env.instructions[obs["instruction"][i]]
        colour = T.COLOUR_NAMES[env._colours[i, env._a[i]]]
        assert colour in text and text in T.instruction_table(("reach",), "paraphrase")


def _episodes(split: str, n: int = 64) -> list[tuple[int, int, int, str]]:
    env = make_vec_env("suite", n, seed=11, num_threads=1, split=split)
    obs = env.reset_arrays(seed=11)
    names = env.task_names
    return [(int(obs["task"][i]), int(env._a[i]), int(env._colours[i, env._a[i]]) if env._a[i] < T.NUM_COLOURED
             else -1, env.instructions[obs["instruction"][i]]) for i in range(n)] + [names]  # type: ignore[list-item]


def test_composition_combinations_appear_only_in_the_composition_split() -> None:
    *comp, names = _episodes("composition")
    assert all(colour in T.held_out_colours(names[task], a) for task, a, colour, _ in comp)
    assert {names[task] for task, *_ in comp} == set(T.composition_tasks(names))
    train_words = set(" ".join(T.instruction_table(names, "train")).split())
    for split in ("train", "validation", "paraphrase"):
        *eps, _ = _episodes(split)
        assert not any(colour in T.held_out_colours(names[task], a) for task, a, colour, _ in eps), split
    # Every word of a composition instruction is a word of training instructions: only the combination is new.
    assert all(set(text.split()) <= train_words for *_, text in comp)


def test_splits_draw_disjoint_episode_streams() -> None:
    firsts = {split: _episodes(split)[:-1] for split in ("train", "validation", "paraphrase")}
    assert firsts["train"] != firsts["validation"]
    layouts = {}
    for split in T.SPLITS:
        env = make_vec_env("reach", 8, seed=0, num_threads=1, split=split)
        layouts[split] = env.reset_arrays(seed=0)["state"].tobytes()
    assert len(set(layouts.values())) == len(T.SPLITS)


def test_unknown_task_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown task 'fly'.*reach.*drawer"):
        make_vec_env("fly", 2)
    with pytest.raises(ValueError, match=r"unknown split 'test'.*paraphrase"):
        make_vec_env("reach", 2, split="test")
    with pytest.raises(ValueError, match="no composition split"):
        make_vec_env("drawer", 2, split="composition")
    with pytest.raises(ValueError, match="group_size"):
        make_vec_env("reach", 6, group_size=4)


def test_bad_actions_raise_and_leave_every_env_untouched() -> None:
    env = make_vec_env("push", 3, seed=1, num_threads=1)
    env.reset()
    env.step(np.zeros((3, ACTION_DIM), np.float32))
    qpos = env._backend.qpos.copy()
    steps = env._steps.copy()
    with pytest.raises(ValueError, match=r"expected \(3, 4\)"):
        env.step(np.zeros((3, 3), np.float32))
    bad = np.zeros((3, ACTION_DIM), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf for environments \[1\]"):
        env.step(bad)
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(bad)
    np.testing.assert_array_equal(env._backend.qpos, qpos)
    np.testing.assert_array_equal(env._steps, steps)


def test_out_of_range_actions_are_clipped() -> None:
    runs = []
    for scale in (1.0, 7.0):
        env = make_vec_env("reach", 2, seed=5, num_threads=1)
        env.reset()
        action = np.array([[1, -1, 1, 1], [-1, 1, -1, -1]], np.float32) * scale
        for _ in range(3):
            obs = env.step(action)[0]
        runs.append(obs["proprio"])
    np.testing.assert_array_equal(runs[0], runs[1])


def _rollout(num_threads: int, steps: int = 30) -> list[np.ndarray]:
    env = make_vec_env("suite", 8, seed=11, num_threads=num_threads)
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    out = [obs["state"].copy(), obs["instruction"].copy()]
    for _ in range(steps):
        obs, reward, term, trunc, _ = env.step(rng.uniform(-1, 1, (8, ACTION_DIM)).astype(np.float32))
        out += [obs["state"].copy(), reward, term | trunc]
    return out


def test_same_seed_identical_at_any_thread_count() -> None:
    a, b = _rollout(1), _rollout(2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    env = make_vec_env("suite", 8, seed=12, num_threads=2)
    assert not np.array_equal(env.reset()[0]["state"], a[0])


def test_group_size_shares_initial_states() -> None:
    env = make_vec_env("suite", 8, seed=2, group_size=4, num_threads=1)
    obs, _ = env.reset()
    for g in (0, 4):
        for k in ("state", "instruction", "task"):
            assert (obs[k][g:g + 4] == obs[k][g]).all()
    assert not np.array_equal(obs["state"][0], obs["state"][4])
    np.testing.assert_array_equal(env._colours[0], env._colours[3])


def test_same_step_autoreset_keeps_final_observation_and_truncates() -> None:
    env = make_vec_env("reach", 6, seed=4, num_threads=1)
    obs, _ = env.reset()
    first_instruction = obs["instruction"].copy()
    for _ in range(T.TASKS["reach"].max_steps):
        out = env.step_arrays(np.zeros((6, ACTION_DIM), np.float32))  # standing still: no success
        if out["truncated"].any():
            break
    assert out["truncated"].all() and not out["terminated"].any()
    final, nxt = out["final_observation"], out["observation"]
    np.testing.assert_array_equal(final["instruction"], first_instruction)
    assert not np.allclose(final["state"], nxt["state"])  # new layouts after the reset
    assert (env._steps == 0).all()


def test_scripted_reach_succeeds_and_terminates() -> None:
    env = make_vec_env("reach", 16, seed=7, num_threads=1, split="paraphrase")
    obs, _ = env.reset()
    done = np.zeros(16, bool)
    success = np.zeros(16, bool)
    for _ in range(T.TASKS["reach"].max_steps):
        obs, _reward, term, trunc, info = env.step(scripted_reach(obs))
        success |= term & ~done
        done |= term | trunc
    assert success.mean() >= 0.9
    assert info["success"][term].all()


def test_partial_reset_by_mask() -> None:
    """Masked environments start their next episode exactly as an unstepped twin does; the rest keep running."""
    env = make_vec_env("reach", 4, seed=0, num_threads=1)
    env.reset()
    stepped, *_ = env.step(np.ones((4, ACTION_DIM), np.float32))
    before = env._backend.qpos.copy()
    mask = np.array([True, False, False, True])
    obs2, _ = env.reset(options={"reset_mask": mask})
    twin = make_vec_env("reach", 4, seed=0, num_threads=1)  # same streams, never stepped: episode 1 everywhere
    twin.reset()
    fresh, _ = twin.reset()
    assert not np.allclose(stepped["state"][mask], fresh["state"][mask])  # the step moved what the reset must undo
    np.testing.assert_array_equal(env._backend.qpos[mask], twin._backend.qpos[mask])
    for key in ("state", "proprio", "instruction", "task"):
        np.testing.assert_allclose(obs2[key][mask], fresh[key][mask], err_msg=key)
        np.testing.assert_array_equal(obs2[key][~mask], stepped[key][~mask], err_msg=key)
    np.testing.assert_array_equal(env._backend.qpos[~mask], before[~mask])
    with pytest.raises(ValueError, match="bool array of shape"):
        env.reset(options={"reset_mask": np.ones(3, bool)})


def test_tensordict_view() -> None:
    env = make_vec_env("suite", 4, seed=0, num_threads=1, group_size=2)
    td = env.reset_td(seed=1)
    assert td.batch_size == torch.Size([4]) and td["proprio"].dtype == torch.float32
    assert td["instruction"].dtype == torch.int64 and td["task"].dtype == torch.int64
    out = env.step_td(torch.zeros(4, ACTION_DIM))
    assert set(out.keys()) >= {"observation", "final_observation", "reward", "terminated", "truncated",
                               "success"}
    assert out["reward"].shape == (4,) and out["success"].dtype == torch.bool
    assert out["observation", "state"].shape == (4, T.STATE_DIM)
    with pytest.raises(ValueError, match="NaN"):
        env.step_td(torch.full((4, ACTION_DIM), float("nan")))


@pytest.mark.parametrize("task", ["reach", "suite"])
def test_gymnasium_single_env_passes_check_env(task: str) -> None:
    env = gymnasium.make(sims.gym_id(task))
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    env.close()


def test_shards_with_env_offset_equal_one_large_set() -> None:
    whole = make_vec_env("suite", 8, seed=4, num_threads=1, group_size=2).reset_arrays()
    for offset in (0, 4):
        part = make_vec_env("suite", 4, seed=4, num_threads=1, group_size=2, env_offset=offset).reset_arrays()
        for key in ("state", "instruction", "task"):
            np.testing.assert_array_equal(part[key], whole[key][offset:offset + 4])


def _replay(env, actions: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [env.step_arrays(a)["observation"] for a in actions]


@pytest.mark.parametrize("render", [False, True])
def test_snapshot_restores_bit_for_bit_with_sleeping_bodies(render: bool) -> None:
    # Suite scenes with most bodies at rest: MuJoCo puts them to sleep, which the state rows do not hold.
    env = make_vec_env("suite", 6, seed=3, render=render, num_threads=2)
    env.reset_arrays(seed=3)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (160, 6, ACTION_DIM)).astype(np.float32)
    actions[:, :3] *= 0.05  # half the envs barely move, so their trees fall asleep
    _replay(env, actions[:100])
    asleep = [int((env._backend.batch.get_data(i).tree_asleep >= 0).sum()) for i in range(6)]
    assert max(asleep) > 0, "the scenario must have sleeping bodies to test their restore"
    snapshot = env.get_state()
    expected = _replay(env, actions[100:])
    restored = make_vec_env("suite", 6, seed=3, render=render, num_threads=1)  # other thread count
    restored.set_state(snapshot)
    got = _replay(restored, actions[100:])
    for want, have in zip(expected, got):
        for key in want:
            np.testing.assert_array_equal(want[key], have[key], err_msg=key)
    env.close()
    restored.close()


def test_a_snapshot_without_start_velocities_restores_its_episodes_from_rest() -> None:
    # Snapshots written before the batch backend logged start velocities (checkpoints of earlier runs).
    env = make_vec_env("reach", 2, seed=0, num_threads=1)
    env.reset_arrays(seed=0)
    actions = np.random.default_rng(1).uniform(-1, 1, (10, 2, ACTION_DIM)).astype(np.float32)
    _replay(env, actions[:5])
    snapshot = env.get_state()
    del snapshot["backend"]["start"]["qvel"]
    expected = _replay(env, actions[5:])
    restored = make_vec_env("reach", 2, seed=0, num_threads=1)
    restored.set_state(snapshot)
    for want, have in zip(expected, _replay(restored, actions[5:])):
        np.testing.assert_array_equal(want["state"], have["state"])


def test_snapshot_of_another_size_is_refused() -> None:
    env = make_vec_env("reach", 4, seed=0)
    env.reset_arrays(seed=0)
    other = make_vec_env("reach", 2, seed=0)
    with pytest.raises(ValueError, match="snapshot"):
        other.set_state(env.get_state())


def test_group_members_restart_together_after_early_termination() -> None:
    env = make_vec_env("reach", 4, seed=0, group_size=2, num_threads=1)
    obs = env.reset_arrays(seed=0)
    for _ in range(60):  # env 0 reaches its goal and autoresets; env 1 keeps still
        act = np.zeros((4, ACTION_DIM), np.float32)
        act[0] = scripted_reach({"state": obs["state"][:1]})[0]
        obs = env.step_arrays(act)["observation"]
    assert env._episode[0] > env._episode[1]
    obs = env.reset_arrays()
    np.testing.assert_array_equal(obs["state"][0], obs["state"][1])
    assert obs["instruction"][0] == obs["instruction"][1]
