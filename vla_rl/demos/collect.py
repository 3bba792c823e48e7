"""Demonstrations from the scripted experts, recorded as a LeRobot v3.0 dataset.

The experts (``sims.experts.ScriptedExpert``) act in a batch of rendering environments of the
``train`` instruction set. Every step records the observation the expert acted on and the expert's
action; with ``noise`` the executed action is the expert's plus Gaussian noise (DART: the states
drift the way a learner's would, the label stays the clean expert action). A finished episode is
kept if it succeeded (or always, with ``keep_failures``) until ``episodes`` are kept.

Episode k of environment i is sampled by sims from ``numpy.random.default_rng([seed, i, k])``;
each episode's ``sims/env_index`` and ``sims/env_episode`` in meta/episodes say which it was.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import sims
from sims import tasks as T
from sims.experts import ScriptedExpert
from sims.libero.vec_env import is_libero_task
from sims.vec_env import ACTION_DIM, SimVectorEnv
from vla_rl.demos.lerobot import LeRobotWriter, video_feature

ROBOT_TYPE = "sims_xyz_gripper"
PROPRIO_NAMES = ["arm_x", "arm_y", "arm_z", "arm_vx", "arm_vy", "arm_vz", "finger_left", "finger_right",
                 "finger_left_v", "finger_right_v", "tip_x", "tip_y", "tip_z"]
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
SPLIT = "train"
"""Demonstrations come from training episodes with the train instruction set only."""
PIX_FMT = "yuv444p"
"""Full-resolution colour in the mp4s: at 64 x 64, 4:2:0 would halve the colour of objects a few pixels wide."""
_NOISE_STREAM = 0xDA27  # the action noise's seed is [seed, _NOISE_STREAM]; sims' episodes use three numbers


@dataclass(frozen=True)
class CollectConfig:
    """What :func:`collect_demos` records."""

    task: str = "suite"
    """A task name or ``"suite"`` (a task sampled per episode)."""
    episodes: int = 100
    """Episodes to keep."""
    out: Path = Path("runs/demos/suite")
    """The dataset folder to write; it must not exist or be empty."""
    seed: int = 0
    """Base seed of the training episodes (and of the action noise)."""
    noise: float = 0.0
    """Standard deviation of the Gaussian noise added to the executed actions (0: none)."""
    keep_failures: bool = False
    """Keep episodes that failed too."""
    image_size: int = 64
    """Height and width of the recorded frames, pixels."""
    num_envs: int = 8
    """Environments stepped together."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras recorded, one mp4 stream each (``observation.images.<camera>``)."""
    episodes_per_file: int = 1000
    """Episodes per data parquet and mp4 before the next file starts."""
    crf: int = 0
    """H.264 quality of the mp4s: 0 lossless up to RGB <-> YUV rounding (about 200 bytes a 64 x 64 frame of
    these scenes), 18 visually lossless, 23 ffmpeg's default."""
    max_attempts: int | None = None
    """Give up after this many finished episodes (None: 10 x episodes + num_envs)."""
    num_threads: int | None = None
    """Physics and render threads (None: one per CPU core)."""
    task_weights: dict[str, float] = field(default_factory=dict)
    """Relative weight of each named task when a suite samples episodes (a task not named weighs 1;
    empty: uniform), e.g. ``{"push": 3, "stack": 3}`` for more demonstrations of those two."""
    max_steps: int | None = None
    """LIBERO only: the episode limit in control steps (None: LIBERO's for the suite)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field and its valid values."""
        if is_libero_task(self.task):
            self._validate_libero()
        else:
            T.resolve_tasks(self.task)
            T.task_weight_tuple(self.task, self.task_weights)
            if self.max_steps is not None:
                raise ValueError(f"max_steps={self.max_steps} limits LIBERO episodes; a sims task has its own limit")
        if self.episodes < 1 or self.num_envs < 1 or self.episodes_per_file < 1:
            raise ValueError(f"episodes={self.episodes}, num_envs={self.num_envs} and episodes_per_file="
                             f"{self.episodes_per_file} must be at least 1")
        if not np.isfinite(self.noise) or self.noise < 0:
            raise ValueError(f"noise={self.noise}; it must be a finite standard deviation >= 0")
        if not 8 <= self.image_size <= 1024:
            raise ValueError(f"image_size={self.image_size}; it must be in [8, 1024]")
        if not 0 <= self.crf <= 51:
            raise ValueError(f"crf={self.crf}; H.264's constant rate factor is in [0, 51]")
        if Path(self.out).exists() and any(Path(self.out).iterdir()):
            raise ValueError(f"out={self.out} is not empty; give a new folder (or remove the old dataset)")


    def _validate_libero(self) -> None:
        from sims.libero.scene import CAMERAS
        from sims.libero.toolchain.install import missing_variants
        from sims.libero.vec_env import resolve_libero_task

        resolve_libero_task(self.task)
        if self.task_weights:
            raise ValueError("task_weights weighs the gantry suite's tasks; LIBERO splits environments evenly over its tasks")
        if not self.cameras or set(self.cameras) - set(CAMERAS):
            raise ValueError(f"cameras={list(self.cameras)}; a LIBERO scene's cameras are {', '.join(CAMERAS)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps}; it must be at least 1 (or None: LIBERO's limit)")
        missing = missing_variants(self.task)
        if missing:
            raise ValueError(missing)


def control_fps(env: SimVectorEnv) -> int:
    """Control steps per second of ``env`` (frame_skip x physics timestep per step): the dataset's fps."""
    fps = 1.0 / (env.config.frame_skip * env.model.opt.timestep)
    if abs(fps - round(fps)) > 1e-6:
        raise ValueError(f"the control rate {fps:.4f} Hz is not a whole number; LeRobot datasets need an integer fps")
    return round(fps)


def sims_features(env: SimVectorEnv) -> dict[str, dict[str, Any]]:
    """The dataset features of a rendering sims env (LeRobot names; ``observation.state`` = proprio)."""
    render = env.config.render
    fps = control_fps(env)
    vector = {"observation.state": ("float32", [len(PROPRIO_NAMES)], PROPRIO_NAMES),
              "action": ("float32", [ACTION_DIM], ACTION_NAMES),
              "observation.environment_state": ("float32", [T.STATE_DIM], None),
              "observation.goal_pixel": ("float32", [len(render.cameras), 2], ["camera", "xy"]),
              "observation.object_goal_pixel": ("float32", [len(render.cameras), 2], ["camera", "xy"]),
              "sims.task_index": ("int64", [1], None)}
    features = {k: {"dtype": d, "shape": s, "names": n} for k, (d, s, n) in vector.items()}
    for camera in render.cameras:
        features[f"observation.images.{camera}"] = video_feature(render.height, render.width, fps, PIX_FMT)
    return features


def _step_record(obs: dict[str, np.ndarray], label: np.ndarray, i: int) -> dict[str, np.ndarray]:
    """Environment ``i``'s observation and expert action of one step (copies)."""
    return {"observation.state": obs["proprio"][i].copy(), "action": label[i].copy(),
            "observation.environment_state": obs["state"][i].copy(), "observation.goal_pixel": obs["goal_pixel"][i].copy(),
            "observation.object_goal_pixel": obs["object_goal_pixel"][i].copy(),
            "sims.task_index": obs["task"][i:i + 1].copy(), "rgb": obs["rgb"][i].copy(),
            "instruction": obs["instruction"][i].copy()}


def _add_episode(writer: LeRobotWriter, steps: list[dict[str, np.ndarray]], cameras: tuple[str, ...],
                 extra: dict[str, Any]) -> None:
    """Write one recorded episode (a list of :func:`_step_record` dicts)."""
    data = {k: np.stack([s[k] for s in steps]) for k in steps[0] if k not in ("rgb", "instruction")}
    rgb = np.stack([s["rgb"] for s in steps])  # [L, cams, 3, H, W]
    videos = {f"observation.images.{c}": rgb[:, j].transpose(0, 2, 3, 1) for j, c in enumerate(cameras)}
    writer.add_episode(data, videos, int(steps[0]["instruction"]), extra)


def _record(env: SimVectorEnv, writer: LeRobotWriter, cfg: CollectConfig, bar: tqdm) -> dict[str, int]:
    """Step the experts until ``cfg.episodes`` episodes are written; returns the episode counts."""
    expert = ScriptedExpert(env)
    rng = np.random.default_rng([cfg.seed, _NOISE_STREAM])
    limit = cfg.max_attempts or 10 * cfg.episodes + env.num_envs
    steps: list[list[dict[str, np.ndarray]]] = [[] for _ in range(env.num_envs)]
    env_episode = np.zeros(env.num_envs, np.int64)
    counts = {"attempted": 0, "succeeded": 0, "kept": 0}
    obs = env.reset_arrays(seed=cfg.seed)
    while counts["kept"] < cfg.episodes:
        label = expert.act(obs)
        executed = label
        if cfg.noise > 0:
            executed = np.clip(label + cfg.noise * rng.standard_normal(label.shape), -1.0, 1.0).astype(np.float32)
        for i in range(env.num_envs):
            steps[i].append(_step_record(obs, label, i))
        out = env.step_arrays(executed)
        done = out["terminated"] | out["truncated"]
        for i in np.flatnonzero(done):
            success = bool(out["success"][i])
            counts["attempted"] += 1
            counts["succeeded"] += success
            if (success or cfg.keep_failures) and counts["kept"] < cfg.episodes:
                extra = {"sims/env_index": int(i), "sims/env_episode": int(env_episode[i]), "sims/success": success}
                _add_episode(writer, steps[i], env.config.render.cameras, extra)
                counts["kept"] += 1
                bar.update(1)
            steps[i] = []
            env_episode[i] += 1
            bar.set_postfix(attempted=counts["attempted"], success=f"{counts['succeeded'] / counts['attempted']:.0%}")
        expert.reset(done)
        obs = out["observation"]
        if counts["attempted"] >= limit and counts["kept"] < cfg.episodes:
            raise RuntimeError(f"the expert kept {counts['kept']} of {counts['attempted']} episodes, short of "
                               f"{cfg.episodes}; lower --noise, pass --keep-failures or raise max_attempts")
    counts["max_env_episode"] = int(env_episode.max())
    return counts


def _source(env: SimVectorEnv, cfg: CollectConfig, counts: dict[str, int]) -> dict[str, Any]:
    """info.json ``source``: the split, seeds and settings the episodes come from, and the episode counts."""
    seeds = (f"episode k of environment i is drawn from sims.tasks.episode_rng({cfg.seed}, i, k, 'train') with i in [0, {cfg.num_envs}) "
             f"and k in [0, {counts['max_env_episode']}); meta/episodes sims/env_index, sims/env_episode say which")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    return {"generator": "scripts/collect_demos.py (sims.experts.ScriptedExpert)", "split": SPLIT,
            "task_names": list(env.task_names), "episode_seeds": seeds,
            "max_delta": env.config.max_delta, "frame_skip": env.config.frame_skip, **counts, **settings}


def _collect_sims(cfg: CollectConfig, partial: Path, progress: bool) -> dict[str, Any]:
    """Record the gantry tasks' experts into the dataset folder ``partial``; returns its meta/info.json."""
    render = sims.RenderConfig(height=cfg.image_size, width=cfg.image_size, cameras=tuple(cfg.cameras),
                               num_contexts=cfg.num_threads)
    extra = {"num_threads": cfg.num_threads} if cfg.num_threads else {}
    if cfg.task_weights:
        extra["task_weights"] = T.task_weight_tuple(cfg.task, cfg.task_weights)
    env = sims.make_vec_env(cfg.task, cfg.num_envs, seed=cfg.seed, split=SPLIT, render=render, **extra)
    try:
        writer = LeRobotWriter(partial, fps=control_fps(env), features=sims_features(env), tasks=env.instructions,
                               robot_type=ROBOT_TYPE, episodes_per_file=cfg.episodes_per_file, crf=cfg.crf)
        with tqdm(total=cfg.episodes, desc=f"demos {cfg.task}", unit="ep", disable=not progress) as bar:
            counts = _record(env, writer, cfg, bar)
        return writer.close(_source(env, cfg, counts))
    finally:
        env.close()


def collect_demos(cfg: CollectConfig, progress: bool = True) -> dict[str, Any]:
    """Record ``cfg.episodes`` expert episodes into the LeRobot v3.0 dataset folder ``cfg.out`` (a LIBERO
    task's: :func:`vla_rl.demos.libero.collect_libero_demos`).

    The folder is written under a temporary name and renamed at the end, so it is complete or absent.

    Returns:
        The dataset's meta/info.json; its ``source`` says how the episodes were made (split, seeds,
        noise, counts).
    """
    cfg.validate()
    out = Path(cfg.out)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if is_libero_task(cfg.task):
            from vla_rl.demos.libero import collect_libero_demos

            info = collect_libero_demos(cfg, partial, progress)
        else:
            info = _collect_sims(cfg, partial, progress)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # empty: validate() refuses a folder with files
    out.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(out)
    return info
