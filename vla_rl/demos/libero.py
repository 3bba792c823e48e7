"""Demonstrations of LIBERO tasks from the scripted experts, recorded as a LeRobot v3.0 dataset.

:func:`collect_libero_demos` runs the suite's expert (:func:`sims.libero.expert.expert_for`: Spatial,
Object, Goal's tasks but goal/5; one per task, acting on that task's
:class:`~sims.libero.sim.LiberoSim`) in a :class:`sims.libero.vec_env.LiberoVectorEnv` of the ``train`` split (LIBERO's fixed initial states with each object shifted by up to 1 cm, so
the evaluation states themselves are never demonstrated). Every step records the observation the
expert acted on and its action; with ``noise`` the executed action is the expert's plus Gaussian
noise (DART), the label stays the expert's. An episode ends at its first success (recorded up to
and including that step) or at the step limit; it is kept if it succeeded (or always, with
``keep_failures``). A task's environments start their episodes together (the expert plans per
batch), so a task's block restarts once all its episodes have ended.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from sims.libero.expert import Expert, expert_for
from sims.libero.sim import libero_render_config
from sims.libero.vec_env import ACTION_DIM, LiberoVectorEnv, make_libero_env
from vla_rl.demos.collect import PIX_FMT, SPLIT, CollectConfig, _add_episode
from vla_rl.demos.lerobot import LeRobotWriter, video_feature

ROBOT_TYPE = "panda_libero"
PROPRIO_NAMES = ["eef_x", "eef_y", "eef_z", "eef_ax", "eef_ay", "eef_az", "finger_left", "finger_right"]
ACTION_NAMES = ["dx", "dy", "dz", "drx", "dry", "drz", "gripper"]
_NOISE_STREAM = 0xDA28


def libero_features(env: LiberoVectorEnv) -> dict[str, dict[str, Any]]:
    """The dataset features of a rendering LIBERO env (LeRobot names; ``observation.state`` = LIBERO's 8-d state)."""
    render = env.config.render
    vector = {"observation.state": ("float32", [len(PROPRIO_NAMES)], PROPRIO_NAMES),
              "action": ("float32", [ACTION_DIM], ACTION_NAMES),
              "observation.environment_state": ("float32", [env.state_dim], None),
              "sims.task_index": ("int64", [1], None)}
    features = {k: {"dtype": d, "shape": s, "names": n} for k, (d, s, n) in vector.items()}
    fps = round(env.tasks[0].control_freq)
    for camera in render.cameras:
        features[f"observation.images.{camera}"] = video_feature(render.height, render.width, fps, PIX_FMT)
    return features


def _experts(env: LiberoVectorEnv) -> list[Expert]:
    try:
        return [expert_for(sim) for sim in env.sims]
    except ValueError as exc:
        raise ValueError(f"{exc}; collect LIBERO-Spatial, LIBERO-Object or one of Goal's tasks with an expert "
                         "(libero_goal/0-4, 6-9)") from None


def _record(env: LiberoVectorEnv, writer: LeRobotWriter, cfg: CollectConfig, bar: tqdm) -> dict[str, int]:
    """Step the experts until ``cfg.episodes`` episodes are written; returns the episode counts."""
    experts = _experts(env)
    bounds = env.bounds
    rng = np.random.default_rng([cfg.seed, _NOISE_STREAM])
    limit = cfg.max_attempts or 10 * cfg.episodes + env.num_envs
    steps: list[list[dict[str, np.ndarray]]] = [[] for _ in range(env.num_envs)]
    ended = np.zeros(env.num_envs, bool)
    counts = {"attempted": 0, "succeeded": 0, "kept": 0}
    obs = env.reset_arrays(seed=cfg.seed)
    for expert in experts:
        expert.reset()
    while counts["kept"] < cfg.episodes:
        label = np.concatenate([e.act() for e in experts]).astype(np.float32)
        executed = label
        if cfg.noise > 0:
            executed = np.clip(label + cfg.noise * rng.standard_normal(label.shape), -1.0, 1.0).astype(np.float32)
        for i in np.flatnonzero(~ended):
            steps[i].append({"observation.state": obs["proprio"][i].copy(), "action": label[i],
                             "observation.environment_state": obs["state"][i].copy(),
                             "sims.task_index": obs["task"][i:i + 1].copy(), "rgb": obs["rgb"][i].copy(),
                             "instruction": obs["instruction"][i].copy()})
        out = env.step_arrays(executed)
        for i in np.flatnonzero(~ended & (out["success"] | out["truncated"])):
            success = bool(out["success"][i])
            ended[i] = True
            counts["attempted"] += 1
            counts["succeeded"] += success
            if (success or cfg.keep_failures) and counts["kept"] < cfg.episodes:
                extra = {"libero/task": env.task_names[env.env_task[i]], "libero/state_index": int(env.state_index[i]),
                         "sims/success": success}
                _add_episode(writer, steps[i], env.config.render.cameras, extra)
                counts["kept"] += 1
                bar.update(1)
            steps[i] = []
            bar.set_postfix(attempted=counts["attempted"], success=f"{counts['succeeded'] / counts['attempted']:.0%}")
        obs = out["observation"]
        for k, expert in enumerate(experts):  # a task's block restarts together: its expert plans per batch
            block = np.zeros(env.num_envs, bool)
            block[bounds[k]:bounds[k + 1]] = True
            if ended[block].all():
                obs = env.reset_arrays(mask=block)
                expert.reset()
                ended[block] = False
        if counts["attempted"] >= limit and counts["kept"] < cfg.episodes:
            raise RuntimeError(f"the expert kept {counts['kept']} of {counts['attempted']} episodes, short of "
                               f"{cfg.episodes}; lower --noise, pass --keep-failures or raise max_attempts")
    return counts


def collect_libero_demos(cfg: CollectConfig, out: Path, progress: bool = True) -> dict[str, Any]:
    """Record ``cfg.episodes`` expert episodes of LIBERO task ``cfg.task`` into the (partial) dataset folder ``out``.

    Returns:
        The dataset's meta/info.json; its ``source`` says how the episodes were made.
    """
    render = libero_render_config(cfg.image_size, tuple(cfg.cameras), num_contexts=cfg.num_threads)
    # No termination at success: the env would restart that simulation under its expert's running plan.
    env = make_libero_env(cfg.task, cfg.num_envs, seed=cfg.seed, split=SPLIT, render=render,
                          num_threads=cfg.num_threads, terminate_on_success=False, max_steps=cfg.max_steps)
    try:
        writer = LeRobotWriter(out, fps=round(env.tasks[0].control_freq), features=libero_features(env),
                               tasks=env.instructions, robot_type=ROBOT_TYPE, episodes_per_file=cfg.episodes_per_file,
                               crf=cfg.crf)
        with tqdm(total=cfg.episodes, desc=f"demos {cfg.task}", unit="ep", disable=not progress) as bar:
            counts = _record(env, writer, cfg, bar)
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
        source = {"generator": "scripts/collect_demos.py (sims.libero.expert.expert_for)", "split": SPLIT,
                  "task_names": list(env.task_names), "max_steps": env.max_episode_steps,
                  "episode_seeds": f"LiberoVectorEnv split {SPLIT!r}, seed {cfg.seed}: a fixed initial state and "
                                   f"object shifts of up to {env.config.jitter} m per episode; meta/episodes "
                                   "libero/task and libero/state_index say which", **counts, **settings}
        return writer.close(source)
    finally:
        env.close()
