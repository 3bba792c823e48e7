"""LIBERO as a vector env (sims.libero.vec_env): the trainer's contract (shapes, spaces, SAME_STEP
autoreset, TensorDict view), the goal's reward on a hand-placed success, LIBERO's fixed initial
states and the _lan variant, the jittered splits, task weights sharing out the environments, and one-line errors naming the fix (a missing task, or
missing region-sampled starts, refused by the config checks before anything is built).

One task (spatial/0), two environments, 16x16 frames with one GL context; the fixture exports the
task and its _lan variant into the cache if they are missing.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np
import pytest
import torch

import sims
from sims.libero.osc import OscController
from sims.libero.regions import FILE as REGION_FILE
from sims.libero.scene import load_lan, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.suites import cache_dir, resolve_libero_task
from sims.libero.toolchain.install import ensure_lan, ensure_tasks, export_lan
from sims.libero.toolchain.region_starts import ensure_region_starts
from sims.libero.vec_env import (
    CONTROLLERS,
    LIBERO_SPLITS,
    SETTLE_STEPS,
    LiberoEnvConfig,
    LiberoVectorEnv,
    jitter_roots,
    shared_model,
)
from vla_rl.config import CONFIG_DIR, ConfigError, load_config
from vla_rl.demos.collect import CollectConfig
from vla_rl.recipe import load_recipe

RENDER = libero_render_config(16, num_contexts=1)
HOLD = np.array([[0, 0, 0, 0, 0, 0, -1]] * 2, np.float32)  # no motion, gripper open


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_lan(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)  # the train and validation splits' starts


def _env(split: str = "train", **kw) -> LiberoVectorEnv:
    return sims.make_vec_env("libero_spatial/0", 2, split=split, num_threads=1, **kw)


def test_reset_step_shapes_and_autoreset(cached):
    env = _env(render=RENDER, max_steps=3)
    obs = env.reset_arrays(seed=0)
    assert {k: (v.shape, v.dtype) for k, v in obs.items()} == {
        "proprio": ((2, 8), np.float32), "state": ((2, env.state_dim), np.float32), "instruction": ((2,), np.int64),
        "task": ((2,), np.int64), "rgb": ((2, 2, 3, 16, 16), np.uint8)}
    assert env.single_observation_space.contains({k: v[0] for k, v in obs.items()})
    assert env.single_action_space.shape == (7,) and env.instructions == [load_task("spatial/0").instruction]
    assert env.state_dim == 7 + env.sims[0].model.nq - 9  # arm angles, then every non-robot qpos
    with pytest.raises(ValueError, match=r"expected \(2, 7\)"):
        env.step_arrays(np.zeros((2, 4), np.float32))
    for _ in range(3):
        out = env.step_arrays(HOLD)
    assert out["truncated"].all() and not out["terminated"].any() and (out["reward"] == 0).all()
    assert not np.array_equal(out["final_observation"]["state"], out["observation"]["state"])  # a new episode
    td = env.step_td(torch.zeros(2, 7))
    assert td["observation"]["rgb"].shape == (2, 2, 3, 16, 16) and td["reward"].shape == (2,)
    env.close()


def test_reward_and_termination_on_a_hand_placed_success(cached):
    env = _env()
    env.reset_arrays(seed=0)
    sim = env.sims[0]
    (on,) = sim.task.goal  # On(bowl, plate)
    bowl, plate = (sim.model.body(e["body"]) for e in on["entities"])
    adr = sim.model.jnt_qposadr[bowl.jntadr[0]]
    sim.qpos[0, adr:adr + 3] = sim.field("xpos")[0, plate.id] + np.array([0.0, 0.0, 0.03])
    sim.forward()
    for _ in range(8):  # the bowl drops onto the plate: success once it rests there
        out = env.step_arrays(HOLD)
        if out["success"][0]:
            break
    assert out["success"].tolist() == [True, False] and out["reward"].tolist() == [1.0, 0.0]
    assert out["terminated"].tolist() == [True, False]
    bowl_z = out["final_observation"]["state"][0], out["observation"]["state"][0]
    assert not np.array_equal(*bowl_z), "environment 0 started its next episode in the same step"
    assert not env.sims[0].success()[0]


def test_fixed_and_lan_splits_play_libero_states_in_order(cached):
    task, lan = load_task("spatial/0"), load_lan(load_task("spatial/0"))
    assert lan.instruction != task.instruction and not np.array_equal(lan.init_states, task.init_states)
    for split, source in (("fixed", task), ("lan", lan)):
        env = _env(split, max_steps=1)
        env.reset_arrays(seed=0)
        assert env.state_index.tolist() == [0, 1] and env.instructions == [source.instruction]
        # Settling on a private batch is what LIBERO's 10 wait steps (no motion, the gripper opening) under the OSC
        # on a batch of the env's own do.
        reference = LiberoSim(source, 2, num_threads=1, model=shared_model(source, arm=CONTROLLERS["osc"]))
        reference.reset(np.array([0, 1]))
        ctl = OscController(reference)
        for _ in range(SETTLE_STEPS):
            ctl.step(reference, HOLD)
        np.testing.assert_allclose(env.sims[0].qpos, reference.qpos, atol=1e-6)
        if split == "fixed":  # LIBERO's objects start a few cm above their supports and drop in place
            model, qpos, given = env.sims[0].model, env.sims[0].qpos, source.init_states[[0, 1], 1:]
            free = model.jnt_qposadr[model.jnt_type == 0]
            for axis in (0, 1):
                np.testing.assert_allclose(qpos[:, free + axis], given[:, free + axis], atol=5e-3)
        env.step_arrays(HOLD)  # truncates: the next states are 2 and 3
        assert env.state_index.tolist() == [2, 3]


def test_jittered_splits_are_seeded_grouped_and_near_libero_states(cached):
    a, b = _env(group_size=2, starts="jitter"), _env(group_size=2, starts="jitter")
    a.reset_arrays(seed=3)
    b.reset_arrays(seed=3)
    np.testing.assert_array_equal(a.sims[0].qpos, b.sims[0].qpos)  # seeded
    np.testing.assert_array_equal(a.sims[0].qpos[0], a.sims[0].qpos[1])  # one group: one initial state
    states = a.sims[0].task.init_states[a.state_index, 1:]
    free = a.sims[0].model.jnt_qposadr[a.sims[0].model.jnt_type == 0]
    shift = a.sims[0].qpos[:, free] - states[:, free]
    assert 1e-4 < np.abs(shift).max() < 0.015, "objects moved by up to the 1 cm jitter (and settling)"
    a.reset_arrays(seed=4)
    assert not np.array_equal(a.sims[0].qpos, b.sims[0].qpos)


def test_jitter_roots_follow_stacks_to_their_base():
    # objects 0..3 at x, y, z: 1 stands on 2 which stands on 0; 3 is above 0 but elsewhere in one state
    states = np.zeros((3, 4 * 7))
    for s in range(3):
        for obj, (x, y, z) in enumerate([(0.1 * s, 0.2, 0.9), (0.1 * s, 0.2, 1.1), (0.1 * s, 0.2, 1.0), (0.1 * s, 0.2, 1.2)]):
            states[s, 7 * obj:7 * obj + 3] = (x, y, z)
    states[1, 7 * 3] += 0.05
    assert jitter_roots(states, np.arange(4) * 7).tolist() == [0, 0, 0, 3]


def test_an_object_on_another_is_jittered_with_it_and_settles_as_in_libero_states():
    """spatial/5: LIBERO puts the bowl on the ramekin (same x, y); jittered apart, it settled on top or fell
    off, while from LIBERO's states it slides off and leans on the ramekin. Shifted with the ramekin, the
    training starts settle as LIBERO's do."""
    ensure_tasks(["spatial/5"])
    envs = {s: sims.make_vec_env("libero_spatial/5", 4, split=s, num_threads=1, starts="jitter") for s in ("fixed", "train")}
    model = envs["fixed"].sims[0].model
    free = np.flatnonzero(model.jnt_type == 0)
    names = [model.body(model.jnt_bodyid[j]).name for j in free]
    roots = jitter_roots(envs["fixed"].sims[0].task.init_states[:, 1:1 + model.nq], model.jnt_qposadr[free])
    assert {names[a]: names[r] for a, r in enumerate(roots) if a != r} == {
        "akita_black_bowl_1_main": "glazed_rim_porcelain_ramekin_1_main", "akita_black_bowl_2_main": "cookies_1_main"}
    bowl, ramekin = (model.jnt_qposadr[free[names.index(n)]]
                     for n in ("akita_black_bowl_1_main", "glazed_rim_porcelain_ramekin_1_main"))
    offsets = {}
    for split, env in envs.items():
        env.reset_arrays(seed=0)
        q = np.asarray(env.sims[0].qpos)
        offsets[split] = q[:, bowl:bowl + 3] - q[:, ramekin:ramekin + 3]
    np.testing.assert_allclose(offsets["train"], np.broadcast_to(offsets["fixed"][0], (4, 3)), atol=3e-3)


def _play(env: LiberoVectorEnv, actions: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Step ``actions`` [K, N, 7]; every step's observation (rgb included), final observation, reward and dones."""
    outs = []
    for action in actions:
        out = env.step_arrays(action)
        outs.append({**{f"obs/{k}": v for k, v in out["observation"].items()},
                     **{f"final/{k}": v for k, v in out["final_observation"].items()},
                     **{k: out[k] for k in ("reward", "terminated", "truncated", "success")}})
    return outs


@pytest.mark.parametrize("split", ["train", "fixed"])
def test_a_snapshot_mid_episode_continues_bit_for_bit_in_a_fresh_env(cached, split):
    """The snapshot, through the checkpoint codec (data only), continues exactly in a fresh env: across an autoreset
    (max_steps=5: the next episodes start 2 steps after it) into the jittered or fixed split's next initial states."""
    from infra.common.checkpoint_io import dumps, loads

    actions = np.random.default_rng(0).uniform(-1, 1, (9, 2, 7)).astype(np.float32)
    env = _env(split, render=RENDER, max_steps=5)
    env.reset_arrays(seed=7)
    _play(env, actions[:3])
    snapshot = loads(dumps({"env": env.get_state()}, "test"), "test", "snapshot", "")["env"]
    straight = _play(env, actions[3:])
    env.close()
    fresh = _env(split, render=RENDER, max_steps=5)
    fresh.reset_arrays(seed=1)  # other episodes: the snapshot replaces them
    fresh.set_state(snapshot)
    resumed = _play(fresh, actions[3:])
    fresh.close()
    assert straight[1]["truncated"].all()  # an autoreset inside the window
    for t, (a, b) in enumerate(zip(straight, resumed)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {t}: {key}")
    assert not np.array_equal(straight[0]["obs/rgb"], straight[-1]["obs/rgb"])  # the frames do move


def test_a_snapshot_refuses_an_env_of_another_config(cached):
    env = _env(max_steps=5)
    env.reset_arrays(seed=0)
    state = env.get_state()
    with pytest.raises(ValueError, match=r"does not fit this env's .*build the env with the config it was saved with"):
        _env("fixed").set_state(state)
    state["sims"][0]["rows"] = state["sims"][0]["rows"][:1]
    with pytest.raises(ValueError, match=r"cannot be restored into a batch of"):
        _env(max_steps=5).set_state(state)


def test_visual_faces_from_a_training_config_reaches_the_env_and_bad_values_are_one_line(cached):
    """``env.suite.visual_faces`` sets the mesh detail the trainer's LIBERO env draws (null: LIBERO's full meshes), each
    setting its own shared model; a budget below the minimum, or the key on a gantry task, is a one-line error."""
    from sims.libero.scene import MIN_VISUAL_FACES, VISUAL_FACES
    from vla_rl.envs import make_env

    faces = {}
    for value in ("null", "400", str(VISUAL_FACES)):
        cfg = load_config(CONFIG_DIR / "libero.yaml", ["env.task=libero_spatial/0", f"env.suite.visual_faces={value}"])
        env = make_env(dataclasses.replace(cfg.env, frames=None), seed=0, num_envs=2)  # no GL contexts needed
        faces[value] = int(env.sims[0].model.mesh_facenum.sum())
        env.close()
    assert faces["null"] > faces[str(VISUAL_FACES)] > faces["400"], faces  # full > 2000 per mesh > 400 per mesh
    assert shared_model(load_task("spatial/0"))[0].mesh_facenum.sum() == faces[str(VISUAL_FACES)]  # the default
    with pytest.raises(ConfigError, match=rf"^env.suite.visual_faces=50: give at least {MIN_VISUAL_FACES} triangles"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.suite.visual_faces=50"])
    with pytest.raises(ConfigError, match=r"^env.suite has unknown key\(s\) \['visual_faces'\] for env.task='reach' "
                                          r"\(the gantry suite's: .*\)$"):
        load_config(CONFIG_DIR / "default.yaml", ["env.suite.visual_faces=1000"])
    with pytest.raises(ValueError, match=r"^visual_faces=3: give at least .*or None for LIBERO's full meshes$"):
        LiberoEnvConfig(task="libero_spatial/0", visual_faces=3).validate()


def test_a_training_configs_frames_reach_the_libero_sims_textured_without_multisampling(cached):
    """``env.frames`` (a sims.RenderConfig, its textures and samples left unset) reaches each task's sim with
    LIBERO's textures on, no multisampling and the env's threads as GL contexts; depth is refused, by the trainer's
    section and by LIBERO's config."""
    from vla_rl.envs import make_env

    cfg = load_config(CONFIG_DIR / "libero.yaml", ["env.task=libero_spatial/0", "env.frames.width=16",
                                                   "env.frames.height=16", "policy.image_size=16"])
    assert (cfg.env.frames.textures, cfg.env.frames.samples) == (False, None)
    env = make_env(cfg.env, seed=0, num_envs=2, num_threads=1)
    try:
        render = env.sims[0].render_config
        assert (render.textures, render.samples, render.num_contexts, render.width, render.cameras) == (
            True, 0, 1, 16, ("agentview", "robot0_eye_in_hand"))
    finally:
        env.close()
    with pytest.raises(ConfigError, match=r"^env.frames.depth=true: the libero suite renders RGB frames only; set "
                                          r"env.frames.depth=false$"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.frames.depth=true"])
    with pytest.raises(ValueError, match=r"^render.depth=True: a LIBERO env renders RGB frames only"):
        LiberoEnvConfig(task="libero_spatial/0", render=sims.RenderConfig(cameras=("agentview",), depth=True)).validate()


def test_controller_and_starts_from_a_training_config_reach_the_env_config():
    """``env.suite.controller`` and ``env.suite.starts`` become the LIBERO config's fields (their values LIBERO's),
    default to LIBERO's defaults, and are one-line errors for a bad value, on a gantry task or a gymnasium env, and
    written at the top of the section (their place before the suite's settings nested)."""
    from vla_rl.config import TrainEnvConfig
    from vla_rl.envs import sims_env_config

    assert TrainEnvConfig().suite == {}
    cfg = load_config(CONFIG_DIR / "libero.yaml", ["env.task=libero_spatial/0", "env.suite.controller=osc",
                                                   "env.suite.starts=regions"])
    built = sims_env_config(cfg.env, num_envs=2, seed=0, split="train")
    assert isinstance(built, LiberoEnvConfig) and (built.controller, built.starts) == ("osc", "regions")
    default = sims_env_config(load_config(CONFIG_DIR / "libero.yaml").env, num_envs=10, seed=0)
    assert (default.controller, default.starts) == (LiberoEnvConfig.controller, LiberoEnvConfig.starts) == ("osc", "regions")
    with pytest.raises(ConfigError, match=r"^env.suite.controller='pid'; valid: servo, osc$"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.suite.controller=pid"])
    with pytest.raises(ConfigError, match=r"^env.suite.starts='grid'; valid: regions, jitter$"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.suite.starts=grid"])
    with pytest.raises(ConfigError, match=r"^env.suite=\{'starts': 'regions'\} sets a sims suite's own settings; "
                                          r"env.kind='gym' has none: remove it$"):
        TrainEnvConfig(kind="gym", task="Pendulum-v1", suite={"starts": "regions"}).validate()
    for key in ("controller=osc", "starts=regions"):
        with pytest.raises(ConfigError, match=r"^env.suite has unknown key\(s\) .* \(the gantry suite's: .*\)$"):
            load_config(CONFIG_DIR / "default.yaml", [f"env.suite.{key}"])
        with pytest.raises(ConfigError, match=rf"^env.{key.split('=')[0]} is a suite's own setting \(libero\): write "
                                              rf"env.suite.{key} "):
            load_config(CONFIG_DIR / "libero.yaml", [f"env.{key}"])


def test_task_weights_share_the_environments_out_one_group_each_at_least(cached):
    """Without weights the groups are shared evenly (the earlier tasks take the remainder); with weights every task
    keeps one group and the rest go by weight (libero_10's demonstration recipe; a task weighing 0 keeps one); the
    env's blocks follow; a weight naming no task of the env, or a negative one, is a one-line error."""
    even = LiberoEnvConfig(task="libero_10", num_envs=23)
    assert even.groups_per_task(even.validate()).tolist() == [3, 3, 3, 2, 2, 2, 2, 2, 2, 2]
    weights = {"10/0": 3, "10/1": 4, "10/2": 2, "10/3": 5, "10/4": 3, "10/5": 1, "10/6": 3, "10/7": 3, "10/8": 6,
               "10/9": 5}
    assert load_recipe(CONFIG_DIR / "libero_10_cpu.yaml", []).demos.task_weights == weights
    cfg = LiberoEnvConfig(task="libero_10", num_envs=40, task_weights=weights)
    assert cfg.groups_per_task(cfg.validate()).tolist() == [4, 4, 3, 5, 4, 2, 4, 3, 6, 5]
    zero = LiberoEnvConfig(task="libero_10", num_envs=40, task_weights={**weights, "10/9": 0})
    assert zero.groups_per_task(zero.validate()).tolist() == [4, 5, 3, 6, 4, 2, 4, 4, 7, 1]
    pairs = dataclasses.replace(zero, group_size=2)  # 20 groups: 10 by weight, two of them by remainder
    assert pairs.groups_per_task(pairs.validate()).tolist() == [2, 2, 2, 3, 2, 1, 2, 2, 3, 1]
    ensure_tasks(["spatial/1"])
    env = sims.make_vec_env("libero_spatial/0+libero_spatial/1", 5, split="fixed", num_threads=1,
                            task_weights={"spatial/1": 2})
    assert env.bounds.tolist() == [0, 2, 5] and env.env_task.tolist() == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match=r"^task_weights=\{'spatial/1': 1\}: task weights name \['spatial/1'\], not "
                                         r"tasks of 'libero_spatial/0'; valid: spatial/0$"):
        LiberoEnvConfig(task="libero_spatial/0", task_weights={"spatial/1": 1}).validate()
    with pytest.raises(ValueError, match=r"^task_weights=.*each weight must be a number >= 0"):
        LiberoEnvConfig(task="libero_10", task_weights={"10/1": -1}).validate()


def test_bad_input_is_one_line_naming_the_fix(cached, tmp_path, monkeypatch):
    for bad in ("libero_kitchen", "libero_spatial/10", "libero_", "libero_spatial+reach", "libero_goal+"):
        with pytest.raises(ValueError, match=r"use libero_<suite> or libero_<suite>/<0..9>, or several joined by '\+', "
                                             r"with suite one of spatial, object, goal, 10"):
            resolve_libero_task(bad)
    assert resolve_libero_task("libero_goal") == tuple(f"goal/{i}" for i in range(10))
    four = resolve_libero_task("libero_spatial+libero_object+libero_goal+libero_10")  # the 40-task policy's env
    assert len(four) == 40 and four[0] == "spatial/0" and four[-1] == "10/9"
    assert resolve_libero_task("libero_goal/5+libero_spatial/0+libero_goal/5") == ("goal/5", "spatial/0")
    with pytest.raises(TypeError, match=r"reward"):  # LIBERO pays success only: its config has no reward
        LiberoEnvConfig(task="libero_spatial/0", reward="dense")
    with pytest.raises(ValueError, match=r"split='composition'.*valid: " + ", ".join(LIBERO_SPLITS)):
        LiberoEnvConfig(task="libero_spatial/0", split="composition").validate()
    with pytest.raises(ValueError, match=r"num_envs=4 .* use num_envs >= 10"):
        LiberoEnvConfig(task="libero_spatial", num_envs=4).validate()
    with pytest.raises(TypeError, match=r"env_offset"):  # a gantry setting: no field of LIBERO's config
        LiberoEnvConfig(task="libero_spatial/0", env_offset=10)
    assert isinstance(LiberoEnvConfig(task="libero_spatial"), sims.VecEnvConfig)  # the settings every suite reads
    with pytest.raises(FileNotFoundError, match=r"not in the cache .*setup_libero.py --tasks spatial/0"):
        LiberoVectorEnv(LiberoEnvConfig(task="libero_spatial/0", cache=str(tmp_path)))
    meta = (load_task("spatial/0").model_path.parent / "task.json").read_text()
    # A training job on a task the cache lacks fails in its machine check (before anything is built), naming the command.
    monkeypatch.setenv("VLA_RL_LIBERO_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"LIBERO tasks spatial/0 .*run python scripts/setup_libero.py --tasks spatial/0"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.task=libero_spatial/0"]).check()
    # A toolchain without LIBERO-PRO's _lan files (an asset package missing) names the reinstall.
    folder = tmp_path / "spatial" / "0"
    folder.mkdir(parents=True)
    (folder / "task.json").write_text(meta)
    with pytest.raises(RuntimeError, match=r"_lan/.*\.bddl is missing; reinstall the toolchain: .*--reinstall"):
        export_lan("spatial/0", tmp_path, tmp_path / "toolchain")


def test_training_from_the_jittered_fixed_states_is_refused_before_anything_is_built(cached, tmp_path):
    """starts=jitter (an env opt-in) starts episodes at LIBERO's test states, shifted by at most 1 cm: a training job's
    machine check, the recipe and the demonstration collector refuse it in one line naming the fix, before any
    file is written."""
    from vla_rl.recipe import load_recipe, run_recipe

    want = (r"^starts=jitter starts demonstrations, training and validation from LIBERO's fixed initial states .*; "
            r"use starts=regions \(python scripts/setup_libero.py --tasks spatial/0 --region-starts 200\)$")
    overrides = ["env.task=libero_spatial/0", "env.suite.starts=jitter", f"out_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=want):
        load_config(CONFIG_DIR / "libero.yaml", overrides).check(envs_here=False)
    with pytest.raises(ValueError, match=want):
        CollectConfig(task="libero_spatial/0", out=tmp_path / "demos", cameras=("agentview",),
                      suite_settings={"starts": "jitter"}).validate()
    recipe = load_recipe(CONFIG_DIR / "libero_spatial_cpu.yaml", ["sft.env.task=libero_spatial/0",
                                                                  "sft.env.suite.starts=jitter", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=want):
        run_recipe(recipe)
    assert not any(tmp_path.iterdir())
    env = _env(starts="jitter")  # the env itself plays them (an opt-in outside training)
    assert env.config.starts == "jitter"
    env.close()


def test_missing_region_starts_fail_the_config_check_naming_the_command(cached, tmp_path):
    """env.suite.starts=regions on a task whose region starts are not cached: the trainer's machine check (the recipe
    runs it for every stage before its demonstrations) and collect_demos' config refuse it before anything is built,
    in one line naming the task, the missing file and the command that writes it; with the file there they pass."""
    folder = tmp_path / "spatial" / "0"
    folder.mkdir(parents=True)
    source = load_task("spatial/0").model_path.parent
    for f in source.iterdir():
        if f.name != REGION_FILE:
            os.symlink(f, folder / f.name)
    want = (rf"^starts=regions: no current region-sampled starts for spatial/0 \({re.escape(str(folder / REGION_FILE))} "
            rf"missing, or written without LIBERO's arm noise\); write them with python scripts/setup_libero.py --tasks "
            rf"spatial/0 --region-starts 200 --cache {re.escape(str(tmp_path))}$")
    overrides = ["env.task=libero_spatial/0", "env.suite.starts=regions", f"env.suite.cache={tmp_path}"]
    with pytest.raises(ConfigError, match=want):
        load_config(CONFIG_DIR / "libero.yaml", overrides).check(envs_here=False)
    settings = {"starts": "regions", "cache": str(tmp_path)}
    with pytest.raises(ValueError, match=want):
        CollectConfig(task="libero_spatial/0", out=tmp_path / "demos", cameras=("agentview",),
                      suite_settings=settings).validate()
    suite = sims.suite_of("libero_spatial/0")
    assert suite.missing_files("libero_spatial/0", False, {**settings, "starts": "jitter"}) == ""
    ensure_region_starts(["spatial/0"], 5)
    # A file an earlier sampler wrote (every arm at one pose, no arm_noise field) is stale: refused alike, then
    # rewritten by the setup at its own size.
    with np.load(source / REGION_FILE) as f:
        current = {k: f[k] for k in f.files}
    np.savez(folder / REGION_FILE, **{k: v[:3] if k.startswith(("states", "fixture_")) else v
                                      for k, v in current.items() if k != "arm_noise"})
    with pytest.raises(ConfigError, match=want):
        load_config(CONFIG_DIR / "libero.yaml", overrides).check(envs_here=False)
    os.symlink(cache_dir() / "toolchain", tmp_path / "toolchain")  # the installed one, not a second install
    assert ensure_region_starts(["spatial/0"], 2, tmp_path) == ["spatial/0"]
    with np.load(folder / REGION_FILE) as f:
        np.testing.assert_array_equal(f["states"], current["states"][:3])  # the same seeds, now with the arm noise
        assert float(f["arm_noise"]) == 0.02
    assert suite.missing_files("libero_spatial/0", False, settings) == ""
    os.remove(folder / REGION_FILE)
    os.symlink(source / REGION_FILE, folder / REGION_FILE)
    assert suite.missing_files("libero_spatial/0", False, settings) == ""
