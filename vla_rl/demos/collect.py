"""Demonstrations from the scripted experts, recorded as a LeRobot v3.0 dataset.

The task's suite's expert (``sims.suite_of(task).expert``: the gantry tasks' ``sims.experts.ScriptedExpert``,
LIBERO's per-task experts) acts in a batch of rendering environments of the ``train`` split. Every step
records the observation the expert acted on and the expert's action; with ``noise`` the executed action is
the expert's plus Gaussian noise (DART: the states drift the way a learner's would, the label stays the
clean expert action). An episode ends at its first success (recorded up to and including that step) or at
its step limit; it is kept if it succeeded (or always, with ``keep_failures``) until ``episodes`` are kept.
The expert says when an environment starts its next episode (:class:`sims.registry.Expert`: at once, by the
env's autoreset, or, for LIBERO's experts that plan per task, once all of the task's episodes have ended).

Each episode's ``sims/env_index`` and ``sims/env_episode`` in meta/episodes say which environment and which
of its episodes it was (gantry: sampled from ``sims.tasks.episode_rng(seed, i, k, "train")``), with the
env's own tags (LIBERO: ``libero/task``, ``libero/state_index``).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import sims
from sims.registry import Expert
from sims.vec_env import ArrayVectorEnv
from vla_rl.demos.lerobot import LeRobotWriter, video_feature

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
    per_task: int | None = None
    """At most this many kept episodes of each task (few-shot demonstrations, e.g. 5 per task; None: no cap, the
    episodes fall to the tasks as their environments finish them). ``episodes`` must fit: at most per_task x tasks."""
    max_steps: int | None = None
    """The episode limit in control steps, for a suite with one (LIBERO; None: the suite's own)."""
    suite_settings: dict[str, Any] = field(default_factory=dict)
    """The suite's own settings of the recorded envs, as a run's ``env.suite`` (``sims.suite_settings``; e.g. LIBERO's
    ``controller``), so demonstrations come from the env the policy is trained in; ``task_weights`` and ``max_steps``
    above take precedence."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field and its valid values."""
        suite = sims.suite_of(self.task)
        suite.resolve(self.task)
        if self.task_weights and suite.weigh is None:
            raise ValueError(f"task_weights weighs a suite's tasks; the {suite.name} suite splits environments evenly "
                             "over its tasks")
        if self.task_weights:
            suite.weigh(self.task, self.task_weights)
        if self.max_steps is not None and "max_steps" not in {f.name for f in fields(suite.config)}:
            raise ValueError(f"max_steps={self.max_steps}: a {suite.name} task has its own episode limit; remove it")
        if unknown := sorted(set(self.suite_settings) - set(sims.suite_settings(suite.config))):
            raise ValueError(f"suite_settings has unknown key(s) {unknown}; the {suite.name} suite's settings: "
                             f"{', '.join(sims.suite_settings(suite.config))}")
        if self.per_task is not None and not 1 <= self.episodes <= self.per_task * len(suite.resolve(self.task)):
            raise ValueError(f"episodes={self.episodes} with per_task={self.per_task} over the "
                             f"{len(suite.resolve(self.task))} task(s) of {self.task}: set episodes to at most "
                             f"per_task x tasks (and per_task >= 1)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps}; it must be at least 1 (or None: the suite's limit)")
        if not self.cameras or set(self.cameras) - set(suite.cameras):
            raise ValueError(f"cameras={list(self.cameras)}; a {suite.name} scene's cameras are {', '.join(suite.cameras)}")
        if missing := (suite.training_refusal(self.task, self.suite_settings)
                       or suite.missing_files(self.task, False, self.suite_settings)):
            raise ValueError(missing)
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


def control_fps(env: ArrayVectorEnv) -> int:
    """Control steps per second of ``env``: the dataset's fps."""
    fps = env.control_hz
    if abs(fps - round(fps)) > 1e-6:
        raise ValueError(f"the control rate {fps:.4f} Hz is not a whole number; LeRobot datasets need an integer fps")
    return round(fps)


def features(env: ArrayVectorEnv, suite: sims.Suite) -> dict[str, dict[str, Any]]:
    """The dataset features of a rendering env (LeRobot names; ``observation.state`` = proprio, the suite's names)."""
    render, space = env.config.render, env.single_observation_space
    cams = [len(render.cameras), 2]
    vector = {"observation.state": ("float32", [len(suite.proprio_names)], list(suite.proprio_names)),
              "action": ("float32", [len(suite.action_names)], list(suite.action_names)),
              "observation.environment_state": ("float32", list(space["state"].shape), None),
              **{f"observation.{k}": ("float32", cams, ["camera", "xy"]) for k in _PIXEL_KEYS if k in space.spaces},
              "sims.task_index": ("int64", [1], None)}
    out = {k: {"dtype": d, "shape": s, "names": n} for k, (d, s, n) in vector.items()}
    for camera in render.cameras:
        out[f"observation.images.{camera}"] = video_feature(render.height, render.width, control_fps(env), PIX_FMT)
    return out


_PIXEL_KEYS = ("goal_pixel", "object_goal_pixel")


def _step_record(obs: dict[str, np.ndarray], label: np.ndarray, i: int) -> dict[str, np.ndarray]:
    """Environment ``i``'s observation and expert action of one step (copies)."""
    return {"observation.state": obs["proprio"][i].copy(), "action": label[i].copy(),
            "observation.environment_state": obs["state"][i].copy(),
            **{f"observation.{k}": obs[k][i].copy() for k in _PIXEL_KEYS if k in obs},
            "sims.task_index": obs["task"][i:i + 1].copy(), "rgb": obs["rgb"][i].copy(),
            "instruction": obs["instruction"][i].copy()}


def _add_episode(writer: LeRobotWriter, steps: list[dict[str, np.ndarray]], cameras: tuple[str, ...],
                 extra: dict[str, Any]) -> None:
    """Write one recorded episode (a list of :func:`_step_record` dicts)."""
    data = {k: np.stack([s[k] for s in steps]) for k in steps[0] if k not in ("rgb", "instruction")}
    rgb = np.stack([s["rgb"] for s in steps])  # [L, cams, 3, H, W]
    videos = {f"observation.images.{c}": rgb[:, j].transpose(0, 2, 3, 1) for j, c in enumerate(cameras)}
    writer.add_episode(data, videos, int(steps[0]["instruction"]), extra)


def _record(env: ArrayVectorEnv, expert: Expert, writer: LeRobotWriter, cfg: CollectConfig,
            bar: tqdm) -> dict[str, int]:
    """Step the expert until ``cfg.episodes`` episodes are written; returns the episode counts."""
    rng = np.random.default_rng([cfg.seed, _NOISE_STREAM])
    limit = cfg.max_attempts or 10 * cfg.episodes + env.num_envs
    steps: list[list[dict[str, np.ndarray]]] = [[] for _ in range(env.num_envs)]
    ended = np.zeros(env.num_envs, bool)  # episodes over, not recorded until the expert restarts them
    env_episode = np.zeros(env.num_envs, np.int64)
    counts = {"attempted": 0, "succeeded": 0, "kept": 0}
    kept_of_task: dict[int, int] = {}
    obs = env.reset_arrays(seed=cfg.seed)
    expert.reset()
    while counts["kept"] < cfg.episodes:
        label = expert.act(obs)
        executed = label
        if cfg.noise > 0:
            executed = np.clip(label + cfg.noise * rng.standard_normal(label.shape), -1.0, 1.0).astype(np.float32)
        for i in np.flatnonzero(~ended):
            steps[i].append(_step_record(obs, label, i))
        out = env.step_arrays(executed)
        for i in np.flatnonzero(~ended & (out["success"] | out["truncated"])):
            success = bool(out["success"][i])
            ended[i] = True
            counts["attempted"] += 1
            counts["succeeded"] += success
            task = int(steps[i][0]["sims.task_index"][0])
            room = cfg.per_task is None or kept_of_task.get(task, 0) < cfg.per_task
            if (success or cfg.keep_failures) and counts["kept"] < cfg.episodes and room:
                kept_of_task[task] = kept_of_task.get(task, 0) + 1
                extra = {"sims/env_index": int(i), "sims/env_episode": int(env_episode[i]), **env.episode_tags(i),
                         "sims/success": success}
                _add_episode(writer, steps[i], env.config.render.cameras, extra)
                counts["kept"] += 1
                bar.update(1)
            steps[i] = []
            env_episode[i] += 1
            bar.set_postfix(attempted=counts["attempted"], success=f"{counts['succeeded'] / counts['attempted']:.0%}")
        obs = out["observation"]
        start = expert.restart(ended)
        if start is None:
            ended[:] = False
        elif start.any():
            obs = env.reset_arrays(mask=start)
            expert.reset(start)
            ended &= ~start
        if counts["attempted"] >= limit and counts["kept"] < cfg.episodes:
            raise RuntimeError(f"the expert kept {counts['kept']} of {counts['attempted']} episodes, short of "
                               f"{cfg.episodes}; lower --noise, pass --keep-failures or raise max_attempts")
    counts["max_env_episode"] = int(env_episode.max())
    return counts


def _source(env: ArrayVectorEnv, expert: Expert, cfg: CollectConfig, counts: dict[str, int]) -> dict[str, Any]:
    """info.json ``source``: the split, seeds and settings the episodes come from, and the episode counts."""
    suite = sims.suite_of(cfg.task)
    seeds = (f"{suite.name} split {SPLIT!r} with seed {cfg.seed}, environments i in [0, {cfg.num_envs}), episodes k "
             f"in [0, {counts['max_env_episode']}); meta/episodes sims/env_index, sims/env_episode say which")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    env_fields = {k: v for k, v in asdict(env.config).items() if k not in ("render", *settings)}
    return {"generator": f"scripts/collect_demos.py ({type(expert).__module__}.{type(expert).__name__})",
            "suite": suite.name, "split": SPLIT, "task_names": list(env.task_names), "episode_seeds": seeds,
            "max_episode_steps": env.max_episode_steps, **env_fields, **counts, **settings}


def _collect(cfg: CollectConfig, partial: Path, progress: bool) -> dict[str, Any]:
    """Record the task's suite's expert into the dataset folder ``partial``; returns its meta/info.json."""
    suite = sims.suite_of(cfg.task)
    settings: dict[str, Any] = {**cfg.suite_settings, "num_threads": cfg.num_threads}
    if cfg.task_weights:
        settings["task_weights"] = cfg.task_weights
    if cfg.max_steps is not None:
        settings["max_steps"] = cfg.max_steps
    if not suite.demo_terminates:  # the expert restarts environments itself
        settings["terminate_on_success"] = False
    render = sims.RenderConfig(width=cfg.image_size, height=cfg.image_size, cameras=tuple(cfg.cameras),
                               num_contexts=cfg.num_threads)
    env = sims.make_vec_env(cfg.task, cfg.num_envs, seed=cfg.seed, split=SPLIT, render=render, **settings)
    try:
        expert = suite.expert(env)
        writer = LeRobotWriter(partial, fps=control_fps(env), features=features(env, suite), tasks=env.instructions,
                               robot_type=suite.robot_type, episodes_per_file=cfg.episodes_per_file, crf=cfg.crf)
        with tqdm(total=cfg.episodes, desc=f"demos {cfg.task}", unit="ep", disable=not progress) as bar:
            counts = _record(env, expert, writer, cfg, bar)
        return writer.close(_source(env, expert, cfg, counts))
    finally:
        env.close()


def collect_demos(cfg: CollectConfig, progress: bool = True) -> dict[str, Any]:
    """Record ``cfg.episodes`` expert episodes of ``cfg.task``'s suite into the LeRobot v3.0 dataset folder ``cfg.out``.

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
        info = _collect(cfg, partial, progress)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # empty: validate() refuses a folder with files
    out.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(out)
    return info
