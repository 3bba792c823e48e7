"""Host memory a run will take, estimated from its config and checked before anything is allocated.

``env.num_envs=100000000`` used to grow the process by gigabytes (environments, then frames, then the
rollout buffer) until the machine ran out. :func:`vla_rl.config.train.check_run_memory` adds up what the config asks for
and raises :class:`~infra.common.typed_config.ConfigError` with the figure and the largest ``num_envs`` that
fits before the first environment is built. The estimate is a lower bound (the policy, the optimiser
and Python's own overhead come on top), so a refused config would certainly not have fitted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sims
from infra.common.typed_config import ConfigError

if TYPE_CHECKING:
    from vla_rl.config.env import TrainEnvConfig

STEP_BYTES = 512
"""Per environment and step of the rollout buffer besides the frames: proprio (13), state (42), goal
pixels, action, log-probability, value, reward and flags, as float32 / int64, rounded up."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run allocates, by part (lower bounds)."""

    envs: int
    """Simulator state of the training and evaluation environments."""
    frames: int
    """Rendered frames (and depth) the environments hold, and their renderers."""
    buffer: int
    """The rollout buffer: ``T x N`` observations (frames included) and decisions."""

    @property
    def total(self) -> int:
        """All parts together."""
        return self.envs + self.frames + self.buffer


def frame_bytes(env: TrainEnvConfig) -> int:
    """Bytes of one environment's observation images: ``cams x 3 x H x W`` uint8 (+ float32 depth), 0 unrendered."""
    if env.kind != "sims" or env.frames is None:
        return 0
    pixels = len(env.frames.cameras) * env.frames.height * env.frames.width
    return pixels * 3 + (pixels * 4 if env.frames.depth else 0)


def estimate_envs(env: TrainEnvConfig, num_envs: int, scenes: bool = True) -> MemoryEstimate:
    """What ``num_envs`` environments of ``env`` take, frames included (no buffer), by its suite's
    :class:`sims.registry.MemoryModel`. Only ``sims`` environments are counted: a gymnasium environment's size is
    not known before it is built. A suite with per-task scenes (LIBERO) adds them (unless ``scenes`` is False:
    another env of the process already holds them) and, rendering, a GL context per task."""
    if env.kind != "sims":
        return MemoryEstimate(0, 0, 0)
    frame = frame_bytes(env)
    suite = sims.suite_of(env.task)
    model, tasks = suite.memory, len(suite.resolve(env.task))
    return MemoryEstimate(num_envs * model.per_env + (tasks * model.per_task_scene if scenes else 0),
                          num_envs * (frame + (model.per_rendered_env if frame else 0))
                          + (tasks * model.per_task_context if frame else 0), 0)


def available_bytes() -> int:
    """Memory this machine can give a new allocation now (``MemAvailable``; total physical memory elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(n: float) -> str:
    """``n`` bytes as GiB with one decimal (MiB below one GiB)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_memory(need: MemoryEstimate, key: str, value: int, fixed: int = 0, available: int | None = None) -> None:
    """Raise :class:`ConfigError` when ``need`` exceeds ``available`` bytes (default: this machine's now).

    Args:
        need: The estimate, which grows in proportion to the setting ``key=value`` but for ``fixed`` bytes.
        key, value: The setting to lower; the message gives the largest value that fits.
        fixed: Bytes of ``need`` that do not grow with ``value``.
        available: Bytes available (tests); ``None`` reads :func:`available_bytes`.
    """
    have = available_bytes() if available is None else available
    if need.total <= have:
        return
    fits = max(0, (have - fixed) * value // max(1, need.total - fixed))
    raise ConfigError(
        f"{key}={value} needs at least {gib(need.total)} of memory (environments {gib(need.envs)}, frames "
        f"{gib(need.frames)}, rollout buffer {gib(need.buffer)}) and this machine has {gib(have)} available: "
        f"lower {key} to at most about {fits}"
    )
