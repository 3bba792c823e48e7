"""The algorithms' and evaluation's sections: PPO, distillation, SFT, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

import sims
from infra.common.typed_config import ConfigError
from rlcore.update_config import (
    OptimConfig,
)
from vla_rl.config.ranges import _check_numbers


@dataclass
class PPOConfig:
    """Proximal Policy Optimisation with a learned critic and GAE."""

    rollout_steps: int = 64
    """Steps T collected per environment per iteration; the batch is T x N."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    norm_adv: bool = True
    """Normalise advantages per minibatch to zero mean and unit variance."""
    task_adv_norm: bool = False
    """Before minibatching, normalise advantages within each task of the rollout (the ``task`` observation):
    in a multi-task suite a task with small or rare rewards then weighs as much in the update as the others."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    clip_value: bool = False
    """Clip the value prediction around the old value by ``clip_coef`` (PPO2's value clipping)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's ``VecNormalize``)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The clipped update's settings."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``ppo.optim``'s included)."""
        _check_numbers(self, "ppo.")


@dataclass
class DistillConfig:
    """Teacher-student distillation (DAgger): a privileged-state teacher labels the student's states."""

    teacher: str = ""
    """Checkpoint (file or run directory) of the teacher, e.g. a ``configs/reach_state_ppo.yaml`` run."""
    rollout_steps: int = 50
    """Steps T collected per environment per iteration."""
    teacher_iterations: int = 1
    """First iterations whose rollouts the teacher drives (afterwards the student acts: DAgger)."""
    buffer_size: int = 50_000
    """Labelled observations kept (the aggregated DAgger data set; oldest dropped first)."""
    updates: int = 64
    """Gradient steps per iteration, each on a minibatch drawn uniformly from the buffer."""
    batch_size: int = 256
    """Minibatch size of the imitation update."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, anneal_lr=False))
    """Learning rate and gradient clipping of the imitation update (epochs/minibatches unused)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``distill.optim``'s included)."""
        _check_numbers(self, "distill.")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on demonstrations: maximise the policy's log-likelihood of the dataset's actions.

    The dataset is a LeRobot v3.0 folder (``scripts/collect_demos.py`` writes one); with action
    chunks (``policy.head.chunk=K``) each frame's label is its next K actions. The policy's
    auxiliary perception losses are added where the dataset carries their keys.
    """

    dataset: str = ""
    """Folder of the LeRobot v3.0 dataset."""
    iterations: int = 200
    """Iterations of the run (the budget of ``algo=sft``; ``total_env_steps`` is not used)."""
    updates: int = 50
    """Gradient steps per iteration."""
    batch_size: int = 256
    """Frames per gradient step, drawn uniformly with the trainer's torch RNG."""
    learn_std: bool = False
    """Also fit a Gaussian head's standard deviation. Off: it stays at ``policy.head.init_log_std``, so
    the NLL fits the mean (a scaled squared error) and RL from the checkpoint still explores; a fitted
    std collapses to the expert's near-deterministic spread and PPO from it barely moved (measured)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, anneal_lr=True))
    """Learning rate, its annealing over ``iterations`` and the gradient clip (epochs/minibatches unused)."""
    template_mix: float = 0.0
    """Language augmentation (sims tasks): each frame's instruction embedding moves by ``u`` x the step to
    the embedding of another training template of the same meaning (the same task and entities),
    ``u ~ U(0, template_mix)``; past 1 it extrapolates beyond that template. 0 disables it."""
    instruction_noise: float = 0.0
    """Language augmentation: Gaussian noise of expected norm ``instruction_noise`` added to each frame's
    unit-norm sentence embedding, then renormalised (a colour word moves the embedding by 0.4-0.6); with
    ``policy.language: tokens`` to each token embedding too. 0 disables it."""
    token_dropout: float = 0.0
    """Language augmentation (``policy.language: tokens``): the probability that each token of a frame's
    instruction is hidden from the policy, so that no single word of a training template is relied on."""
    image_shift: int = 0
    """Image augmentation: each camera image of a frame is shifted by up to ``image_shift`` pixels in x and
    y (edge pixels repeated, a DrQ-style random shift), so that the policy does not key on exact pixel
    positions of the few scenes its demonstrations show. 0 disables it."""
    token_tail_cut: bool = False
    """With ``token_dropout``: also hide, in each minibatch, every token past the largest number of tokens
    any of its frames kept, so the longest instructions (push and stack, two entities) often lose their
    last words. An earlier padding cut of the token attention did this by accident, and the recipe scored
    higher on dev phrasings with it (docs/training.md)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``sft.optim``'s included)."""
        _check_numbers(self, "sft.")


@dataclass
class EvalConfig:
    """Evaluation of the deterministic policy during training, on the splits of ``sims.tasks.SPLITS``."""

    every: int = 10
    """Evaluate every this many iterations (and after the last one); 0 disables periodic evaluation."""
    episodes: int = 32
    """Episodes per split."""
    num_envs: int = 32
    """Environments stepped in parallel during evaluation."""
    splits: tuple[str, ...] = ("train", "validation")
    """Splits evaluated during training (``sims`` only; gymnasium tasks have one): ``train``,
    ``validation`` (the only split ``stop_success`` reads), and the test splits ``paraphrase`` and
    ``composition``, whose figures are for curves only — quote them from ``scripts/eval.py`` on
    fresh episodes, never from a run that could have been tuned on them."""
    at_start: bool = False
    """Also evaluate before the first iteration (iteration 0): what a policy loaded with ``init_from`` starts at."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range or an unknown split."""
        _check_numbers(self, "eval.")
        known = tuple(dict.fromkeys(split for suite in sims.suites() for split in suite.splits))
        bad_splits = sorted(set(self.splits) - set(known))
        if bad_splits:
            raise ConfigError(f"eval.splits has unknown split(s) {bad_splits}; valid: {', '.join(known)}")
        if not self.splits:
            raise ConfigError(f"eval.splits is empty; valid: {', '.join(known)}")
