"""The algorithms by name: importing this module imports each algorithm's module, whose class registers
itself on :class:`vla_rl.algorithm.Algorithm` (``ppo``, ``grpo``, ``distill``, ``sft``); the trainer picks one here.

Kept apart from :mod:`vla_rl.algorithm` (the interface the algorithm modules import), so that no module
imports one that imports it back.
"""

from __future__ import annotations

import vla_rl.distill
import vla_rl.grpo
import vla_rl.ppo
import vla_rl.sft  # noqa: F401  (each registers its algorithm when imported)
from vla_rl.algorithm import Algorithm, Setup
from vla_rl.config import TrainConfig


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name`` (``ppo``, ``grpo``, ``distill``, ``sft``)."""
    if name not in Algorithm.registry:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(Algorithm.registry))}")
    return Algorithm.registry[name]


def make_algorithm(cfg: TrainConfig, setup: Setup) -> Algorithm:
    """Build the algorithm ``cfg.algo`` names for the policy and environments of ``setup``."""
    return algorithm_class(cfg.algo)(cfg, setup)
