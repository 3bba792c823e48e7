"""Evaluation: the deterministic policy over a fixed number of episodes, per task, with a video.

Each environment ``i`` of ``N`` contributes exactly its first ``episodes // N`` (+1 for the
first ``episodes % N``) episodes, so short successful episodes are not over-counted. The
environment is reset with the same seed at every evaluation, so successive evaluations of one
run face the same initial states and instructions and their curves are comparable.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn


def _frame(env: Any, obs: TensorDict) -> np.ndarray | None:
    """Environment 0's camera image ``[H, W, 3]`` (cameras side by side), or the env's own render."""
    if "rgb" in obs:
        cams = obs["rgb"][0].numpy()  # [cams, 3, H, W]
        return np.concatenate(list(cams.transpose(0, 2, 3, 1)), axis=1)
    render = getattr(env, "render_frame", None)
    return render() if render is not None else None


@torch.no_grad()
def evaluate_policy(
    policy: nn.Module,
    env: Any,
    episodes: int,
    seed: int,
    device: torch.device | str = "cpu",
    record: bool = False,
    max_decisions: int = 100_000,
) -> tuple[dict[str, float], list[np.ndarray]]:
    """Run the policy's mode action until every environment has finished its quota of episodes.

    Args:
        policy: Policy with ``act(obs, deterministic=True)``.
        env: Vector env with the TensorDict view (its own instance: evaluation resets it).
        episodes: Total episodes to evaluate.
        seed: Reset seed (fixed per run so evaluations are comparable).
        device: Device of the policy.
        record: Collect environment 0's frames of its first episode for a video.
        max_decisions: Safety bound on the number of decisions.

    Returns:
        Metrics (``success``, ``return``, ``length``, ``success/<task>`` per task, ``episodes``,
        ``steps_per_s``) and the recorded frames.
    """
    n = env.num_envs
    quota = torch.tensor([episodes // n + (i < episodes % n) for i in range(n)])
    counted = torch.zeros(n, dtype=torch.int64)
    ret = torch.zeros(n)
    length = torch.zeros(n, dtype=torch.int64)
    succeeded = torch.zeros(n, dtype=torch.bool)
    results: list[tuple[int, float, int, bool]] = []  # task, return, length, success
    frames: list[np.ndarray] = []
    recording = record
    obs = env.reset_td(seed=seed)
    start = time.perf_counter()
    env_steps = 0
    for _ in range(max_decisions):
        if bool((counted >= quota).all()):
            break
        task = obs["task"].clone()
        if recording and (frame := _frame(env, obs)) is not None:
            frames.append(frame)
        action = policy.act(obs.to(device), deterministic=True)["action"].cpu()
        chunk = action.unsqueeze(1) if action.dim() == 2 else action
        for k in range(chunk.shape[1]):
            step = env.step_td(chunk[:, k].contiguous())
            env_steps += n
            live = ~(step["terminated"] | step["truncated"])
            ret += step["reward"]
            length += 1
            succeeded |= step["success"]
            for i in torch.nonzero(~live).flatten().tolist():
                if counted[i] < quota[i]:
                    results.append((int(task[i]), float(ret[i]), int(length[i]), bool(succeeded[i])))
                    counted[i] += 1
                if i == 0 and recording:
                    recording = False
                    final = _frame(env, step["final_observation"])
                    if final is not None:
                        frames.append(final)
            ret[~live] = 0.0
            length[~live] = 0
            succeeded[~live] = False
            obs = step["observation"]
    elapsed = time.perf_counter() - start
    if not results:
        raise RuntimeError(f"evaluation finished no episode within {max_decisions} decisions")
    metrics = {
        "success": float(np.mean([r[3] for r in results])),
        "return": float(np.mean([r[1] for r in results])),
        "length": float(np.mean([r[2] for r in results])),
        "episodes": float(len(results)),
        "steps_per_s": env_steps / max(elapsed, 1e-9),
    }
    names = list(getattr(env, "task_names", []))
    for t, name in enumerate(names):
        of_task = [r[3] for r in results if r[0] == t]
        if of_task and len(names) > 1:
            metrics[f"success/{name}"] = float(np.mean(of_task))
    return metrics, frames


def evaluate_checkpoint(
    path: str | Path,
    instructions: str = "heldout",
    episodes: int | None = None,
    num_envs: int | None = None,
    seed: int | None = None,
    device: str = "cpu",
) -> tuple[dict[str, float], Any, list[np.ndarray]]:
    """Load a checkpoint's policy and evaluate it on a fresh environment of its task.

    Args:
        path: A checkpoint file, a ``checkpoints/`` directory or a run directory.
        instructions: Instruction set, ``train`` or ``heldout`` (``sims`` tasks only).
        episodes: Episodes to run (default: the run's ``eval.episodes``).
        num_envs: Parallel environments (default: the run's ``eval.num_envs``).
        seed: Reset seed (default: the run's evaluation seed).
        device: Where the policy runs: ``cpu``, ``cuda`` or ``cuda:N`` (the environment stays on the CPU).

    Returns:
        The metrics of :func:`evaluate_policy`, the run config and environment 0's frames.

    Raises:
        vla_rl.checkpoint.CheckpointError: The checkpoint is missing, corrupt, or does not fit its config.
        ValueError: An unknown instruction set, or a device this machine does not have.
    """
    import policies
    from vla_rl.checkpoint import CheckpointError, load_checkpoint
    from vla_rl.config import build_config
    from vla_rl.device import resolve_device
    from vla_rl.envs import make_env

    if instructions not in ("train", "heldout"):
        raise ValueError(f"instructions={instructions!r}; valid: train, heldout")
    target = resolve_device(device)
    state = load_checkpoint(path)
    cfg = build_config(state["config"])
    torch.set_num_threads(cfg.torch_threads)
    if cfg.env.kind != "sims" and instructions != "train":
        instructions = "train"  # gymnasium tasks have a single "instruction set"
    n = num_envs or cfg.eval.num_envs
    env = make_env(cfg.env, seed=cfg.seed + 7919, num_envs=n, instructions=instructions, video=True)
    try:
        obs = env.reset_td(seed=cfg.seed + 7919)
        policy = policies.make_policy(cfg.policy, obs, int(np.prod(env.single_action_space.shape)))
        try:
            policy.load_state_dict(state["policy"])
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: weights do not fit the policy its config describes: {exc}") from exc
        policy.to(target).set_instructions(list(env.instructions))
        policy.eval()
        metrics, frames = evaluate_policy(
            policy, env, episodes or cfg.eval.episodes, seed if seed is not None else cfg.seed + 7919,
            device=target, record=True,
        )
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return metrics, cfg, frames
