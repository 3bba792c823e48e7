"""The interface every training algorithm offers the trainer, and the factory that builds one.

An :class:`Algorithm` owns what is particular to a way of learning — how experience is gathered
from the collector (PPO: T steps with GAE; GRPO: one episode per environment, group-relative
advantages; DAgger: teacher-labelled steps), its update rule, optimiser and any state beyond the
policy (a reward normaliser, an aggregated data set). The trainer (:mod:`vla_rl.trainer`) owns the
loop, evaluation, logging and checkpoints, and never asks which algorithm it runs (rsl_rl's split
of runner and algorithm).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from tensordict import TensorDict
from torch import nn

from vla_rl.config import TrainConfig
from vla_rl.distributed import LOCAL, GradientSync
from vla_rl.rollout import EpisodeStats, Timer


@dataclass
class Experience:
    """One iteration's experience, ready for :meth:`Algorithm.update`.

    Attributes:
        batch: A flat TensorDict ``[B]`` on the policy's device; its ``obs`` feed the
            observation normaliser after the update.
        env_steps: Environment steps it took (decisions x chunk length, summed over environments).
        metrics: Collection diagnostics to log (e.g. teacher-student agreement).
    """

    batch: TensorDict
    env_steps: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Setup:
    """What an algorithm is built from besides the config.

    Attributes:
        policy: The policy being trained (on ``device``).
        device: Device of the policy and of the batches handed to the update.
        first_obs: A sample observation ``[N]`` of the training environments.
        action_dim: Size A of one action.
        num_envs: N, the training environments.
        instructions: The training environments' instruction table (``instruction`` indexes it).
        reference: A frozen copy of the policy ``init_from`` loaded (``None`` without one), for
            penalties toward it.
        sync: The ranks of a data-parallel job the update averages its gradients over (one: :data:`LOCAL`).
    """

    policy: nn.Module
    device: torch.device
    first_obs: TensorDict
    action_dim: int
    num_envs: int
    instructions: list[str]
    reference: nn.Module | None = None
    sync: GradientSync = LOCAL


@dataclass(frozen=True)
class Budget:
    """How long a run lasts: ``total`` environment steps (RL) or iterations (SFT)."""

    unit: str
    total: int

    def done(self, env_steps: int, iteration: int) -> float:
        """Fraction of the budget used (1.0 or more: the run is over)."""
        return (env_steps if self.unit == "env_steps" else iteration) / self.total


class Algorithm(ABC):
    """A training algorithm behind the trainer's small interface (collect, update, state_dict)."""

    registry: ClassVar[dict[str, type[Algorithm]]] = {}
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Algorithm.registry[cls.name] = cls

    @staticmethod
    def group_size(cfg: TrainConfig) -> int:
        """Consecutive training environments that must share every initial state (1: independent)."""
        return 1

    @staticmethod
    def budget(cfg: TrainConfig) -> Budget:
        """The run's length: ``total_env_steps`` environment steps."""
        return Budget("env_steps", cfg.total_env_steps)

    @abstractmethod
    def set_progress(self, fraction_done: float) -> float:
        """Set the learning rate for the iteration starting at ``fraction_done`` of the run; returns it."""

    @abstractmethod
    def collect(self, collector: Any, stats: EpisodeStats, iteration: int, timer: Timer) -> Experience:
        """Gather one iteration's experience from ``collector``, recording finished episodes into ``stats``."""

    @abstractmethod
    def update(self, batch: TensorDict) -> dict[str, float]:
        """Learn from ``batch``; returns mean diagnostics (losses, KL, gradient norm)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything beyond the policy's weights that a resumed run needs (optimiser, normalisers, data)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def chunk_length(action: torch.Tensor, batch_dims: int) -> int:
    """K of actions ``[..., K, A]`` (1 without action chunks)."""
    return action.shape[batch_dims] if action.dim() == batch_dims + 2 else 1
