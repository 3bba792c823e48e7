"""Supervised fine-tuning (behaviour cloning) of a policy on a demonstration dataset.

Each iteration draws ``sft.updates x sft.batch_size`` frames uniformly from a LeRobot v3.0 dataset
(:class:`vla_rl.demos.reader.DemoDataset`, frames decoded once into memory) with the trainer's torch
RNG, so a resumed run draws the same frames, and takes ``sft.updates`` gradient steps that maximise
the policy's log-likelihood of the recorded actions: a Gaussian head's negative log-likelihood, a
binned head's cross-entropy over bins (the same ``log_prob``), summed over the K actions of a chunk
(``policy.head.chunk=K``: the next K recorded actions, the last one repeated past an episode's end).
The policy's auxiliary perception losses are added where the dataset carries their targets
(``goal_pixel``, ``state``). The trainer evaluates SFT runs in the environment exactly as RL runs.

Language augmentation (``sft.template_mix``, ``sft.instruction_noise``, ``sft.token_dropout``) hands
the policy a perturbed instruction embedding per frame (``instruction_embedding``, which takes the
place of the indexed one): the recorded instructions are a few templates, and an unaugmented policy
learns their exact embeddings and loses 20-40 pp on paraphrases it never saw. Image augmentation
(``sft.image_shift``, :func:`random_shift`) moves each camera image by a few pixels.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from policies.vla import INSTRUCTION_EMBEDDING
from vla_rl.algorithm import Algorithm, Budget, Experience, Setup
from vla_rl.config import ConfigError, TrainConfig, env_suite, suite_config
from vla_rl.demos.reader import DatasetError, DemoDataset
from vla_rl.ppo import ClippedUpdate, LossWeights
from vla_rl.rollout import EpisodeStats, Timer

OBS_KEYS = ("rgb", "proprio", "instruction", "task", "state", "goal_pixel", "object_goal_pixel")
"""Dataset keys that are observations (those present are handed to the policy)."""


def load_dataset(cfg: TrainConfig, instructions: list[str]) -> tuple[DemoDataset, torch.Tensor]:
    """The run's dataset and the map from its task indices to ``instructions`` (the env's table).

    Raises:
        ConfigError: the dataset is unreadable, or names an instruction the environment does not know.
    """
    head = getattr(cfg.policy, "head", None)
    chunk = getattr(head, "chunk", 1)
    frames = cfg.env.frames if getattr(cfg.policy, "image_key", None) else None  # a VLA's (its check: not None)
    cameras = list(frames.cameras) if frames else []
    try:
        data = DemoDataset(cfg.sft.dataset, action_chunk=chunk if chunk > 1 else None, cameras=cameras,
                           image_size=frames.height if frames else None)
    except (DatasetError, ValueError) as exc:
        raise ConfigError(f"sft.dataset={cfg.sft.dataset!r}: {exc}") from exc
    index = {text: i for i, text in enumerate(instructions)}
    unknown = [t for t in data.instructions if t not in index]
    if unknown:
        raise ConfigError(
            f"sft.dataset={cfg.sft.dataset!r} has {len(unknown)} instruction(s) that env.task={cfg.env.task!r} "
            f"does not issue, e.g. {unknown[0]!r}; record the demonstrations on the same task and instruction set"
        )
    return data, torch.tensor([index[t] for t in data.instructions], dtype=torch.int64)


def paraphrase_table(instructions: list[str], groups: list[tuple[str, ...]]) -> torch.Tensor:
    """``[L, G]`` int64: row i lists the indices of the instructions that say what ``instructions[i]``
    says (its own index included), padded by repeating it; G is the largest group."""
    index = {text: i for i, text in enumerate(instructions)}
    members = [[i] for i in range(len(instructions))]
    for group in groups:
        rows = [index[t] for t in group if t in index]
        for i in rows:
            members[i] = rows
    width = max(len(m) for m in members)
    return torch.tensor([m + [m[0]] * (width - len(m)) for m in members], dtype=torch.int64)


def template_groups(cfg: TrainConfig) -> list[tuple[str, ...]]:
    """The instructions of one meaning that ``sft.template_mix`` mixes (the env suite's ``template_groups``).

    Raises:
        ConfigError: the run's env gives each task a single training instruction, so there is nothing to mix.
    """
    groups = env_suite(cfg.env).template_groups(suite_config(cfg.env))
    if all(len(group) < 2 for group in groups):
        raise ConfigError(f"sft.template_mix={cfg.sft.template_mix} mixes a task's training instructions, and "
                          f"env.task={cfg.env.task!r} trains each task on one here: set sft.template_mix=0, or give its "
                          "tasks several (env.suite.instructions=paraphrase on a LIBERO task)")
    return groups


class ParaphraseResample:
    """Each frame's instruction drawn anew, uniformly, from the instructions that say what it says (its suite's
    ``training_instructions``; a LIBERO run with ``env.suite.instructions=paraphrase``: the task's own and its training
    paraphrases, ``sims.libero.paraphrase``), so SFT sees them all although the demonstrations recorded the task's own.

    Args:
        instructions: the env's instruction table; groups: instructions of the same meaning (one group per task).
    """

    def __init__(self, instructions: list[str], groups: list[tuple[str, ...]]) -> None:
        self.members = paraphrase_table(instructions, groups)  # each row's own members first, then padding
        self.counts = torch.tensor([len(set(row)) for row in self.members.tolist()])

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        """Instruction indices ``[B]`` -> a uniformly drawn member of each one's group ``[B]`` (the trainer's torch RNG)."""
        pick = (torch.rand(len(index)) * self.counts[index]).long()
        return self.members[index].gather(1, pick[:, None]).squeeze(1)


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """``images`` uint8 ``[B, C, 3, H, W]``, each of the B x C images shifted by its own offsets in
    ``[-pad, pad]`` pixels in x and y (the trainer's torch RNG); pixels shifted in from outside repeat
    the edge (replicate padding, then a crop back to H x W). Same shape and dtype."""
    b, c, ch, h, w = images.shape
    flat = images.reshape(b * c, ch, h * w)
    offsets = torch.randint(-pad, pad + 1, (b * c, 2), device=images.device)
    rows = (torch.arange(h, device=images.device) + offsets[:, :1]).clamp(0, h - 1)  # [BC, H]
    cols = (torch.arange(w, device=images.device) + offsets[:, 1:]).clamp(0, w - 1)  # [BC, W]
    # One gather of flat pixel indices: 4x faster on the CPU than indexing with three broadcast index tensors.
    source = (rows[:, :, None] * w + cols[:, None, :]).reshape(b * c, 1, h * w).expand(b * c, ch, h * w)
    return flat.gather(2, source).reshape(b, c, ch, h, w)


class LanguageAugment:
    """Perturbed instruction embeddings for SFT frames (see the module docstring).

    Args:
        embeddings: ``[L, D]`` unit-norm sentence embeddings of the instruction table, or
            ``[L, 1 + T, D]`` with token embeddings after the sentence's (``policy.language: tokens``).
        partners: ``[L, G]`` from :func:`paraphrase_table` (``None``: no template mixing).
        template_mix: upper end of the mixing weight ``u``; noise: expected norm of the Gaussian noise.
        token_dropout: probability that a token is hidden from the policy (token embeddings only).
        tail_cut: also hide the tokens past the largest count of kept tokens of the call's frames.
    """

    def __init__(self, embeddings: torch.Tensor, partners: torch.Tensor | None, template_mix: float,
                 noise: float, token_dropout: float = 0.0, tail_cut: bool = False) -> None:
        self.sentences = embeddings if embeddings.dim() == 2 else embeddings[:, 0]
        self.tokens: torch.Tensor | None = None
        if embeddings.dim() == 3:  # cut the padding no instruction of the table reaches
            length = int((embeddings[:, 1:].abs().sum(-1) != 0).sum(-1).max().clamp(min=1))
            self.tokens = embeddings[:, 1 : 1 + length]
        self.partners = partners
        self.template_mix, self.noise, self.token_dropout = template_mix, noise, token_dropout
        self.tail_cut = tail_cut

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        """The instruction embeddings of indices ``index`` ``[B]`` (the trainer's torch RNG): ``[B, D]``,
        or ``[B, 1 + T', D]`` with tokens (T' the table's longest instruction).

        The sentence row moves toward another template of the same meaning; the tokens of two
        templates do not line up, so they are not mixed. Noise moves every row (tokens are unit-norm
        too), and each token is hidden (zeroed, which the policy masks as padding) with probability
        ``token_dropout``; a frame whose tokens would all be hidden keeps them all. With ``tail_cut``
        (one call per minibatch) the tokens past the largest count any frame kept are hidden too,
        except in a frame that would be left with none."""
        e = self.sentences[index]
        if self.partners is not None and self.template_mix > 0:
            row = self.partners[index]
            other = row.gather(1, torch.randint(0, row.shape[1], (len(index), 1))).squeeze(1)
            u = torch.rand(len(index), 1) * self.template_mix
            e = e + u * (self.sentences[other] - e)
        e = self._noisy(e)
        if self.tokens is None:
            return e
        tokens = self.tokens[index]
        present = tokens.abs().sum(-1) != 0  # [B, T']
        if self.noise > 0:
            tokens = self._noisy(tokens)
        if self.token_dropout > 0:
            keep = present & (torch.rand(present.shape) >= self.token_dropout)
            keep = torch.where(keep.any(-1, keepdim=True), keep, present)
            if self.tail_cut:
                cut = keep.clone()
                cut[:, int(keep.sum(-1).max()):] = False
                keep = torch.where(cut.any(-1, keepdim=True), cut, keep)
            present = keep
        return torch.cat([e.unsqueeze(1), tokens * present.unsqueeze(-1)], dim=1)

    def _noisy(self, e: torch.Tensor) -> torch.Tensor:
        """Unit-norm rows ``e`` ``[..., D]`` plus Gaussian noise of expected norm ``noise``, renormalised."""
        if self.noise > 0:
            e = e + torch.randn_like(e) * (self.noise / e.shape[-1] ** 0.5)
        return nn.functional.normalize(e, dim=-1)


class SFT(Algorithm):
    """Behaviour cloning on demonstrations, behind the trainer's algorithm interface."""

    name = "sft"

    def __init__(self, cfg: TrainConfig, setup: Setup) -> None:
        self.cfg = cfg.sft
        self.device = setup.device
        self.policy = setup.policy
        self.data, self.instruction_map = load_dataset(cfg, setup.instructions)
        self.resample: ParaphraseResample | None = None
        training = env_suite(cfg.env).training_instructions if cfg.env.kind == "sims" else None
        groups = training(suite_config(cfg.env)) if training is not None else []
        if any(len(group) > 1 for group in groups):  # else each frame keeps its own (and the RNG its stream)
            self.resample = ParaphraseResample(setup.instructions, groups)
        if not self.cfg.learn_std:  # the exploration noise RL from this checkpoint starts with
            for name, param in setup.policy.named_parameters():
                if name.endswith("log_std"):
                    param.requires_grad_(False)
        self.augment: LanguageAugment | None = None
        if self.cfg.template_mix > 0 or self.cfg.instruction_noise > 0 or self.cfg.token_dropout > 0:
            partners = None
            if self.cfg.template_mix > 0:
                partners = paraphrase_table(setup.instructions, template_groups(cfg))
            embeddings = setup.policy.instruction_embeddings.detach().cpu()
            self.augment = LanguageAugment(embeddings, partners, self.cfg.template_mix, self.cfg.instruction_noise,
                                           self.cfg.token_dropout, self.cfg.token_tail_cut)
        # ClippedUpdate serves for its optimiser and learning-rate schedule; the loss is the NLL below.
        self.updater = ClippedUpdate(setup.policy, self.cfg.optim, LossWeights(vf_coef=0.0, norm_adv=False))

    @staticmethod
    def budget(cfg: TrainConfig) -> Budget:
        """``sft.iterations`` iterations."""
        return Budget("iterations", cfg.sft.iterations)

    def set_progress(self, fraction_done: float) -> float:
        """See :meth:`ClippedUpdate.set_progress`."""
        return self.updater.set_progress(fraction_done)

    def collect(self, collector: Any, stats: EpisodeStats, iteration: int, timer: Timer) -> Experience:
        """This iteration's frames ``[updates * batch_size]``: ``obs`` and the labels ``action``."""
        size = self.cfg.updates * self.cfg.batch_size
        frames = self.data.batch(torch.randint(0, len(self.data), (size,)))
        obs = frames.select(*(k for k in OBS_KEYS if k in frames))
        obs["instruction"] = self.instruction_map[obs["instruction"]]
        if self.resample is not None:
            obs["instruction"] = self.resample(obs["instruction"])
        batch = TensorDict({"obs": obs, "action": frames["action"]}, batch_size=[size])
        return Experience(batch.to(self.device), 0, {"sft/dataset_frames": float(len(self.data))})

    def update(self, batch: TensorDict) -> dict[str, float]:
        """``updates`` gradient steps on consecutive slices of ``batch``; mean NLL, auxiliary loss, grad norm.

        Each slice's instructions are augmented just before its step: a slice's embeddings fit in
        cache, where the whole iteration's (``[updates * batch_size, 1 + T', 384]`` with tokens) cost
        as much time to allocate and write as the gradient steps."""
        totals: dict[str, float] = {}
        params = self.updater.params
        optimizer = self.updater.optimizer
        for start in range(0, batch.batch_size[0], self.cfg.batch_size):
            mb = batch[start : start + self.cfg.batch_size]
            if self.augment is not None:
                mb["obs"][INSTRUCTION_EMBEDDING] = self.augment(mb["obs"]["instruction"].cpu()).to(self.device)
            if self.cfg.image_shift > 0 and "rgb" in mb["obs"].keys():  # noqa: SIM118 (TensorDict has no `in`)
                mb["obs"]["rgb"] = random_shift(mb["obs"]["rgb"], self.cfg.image_shift)
            dist, _, aux = self.policy.evaluate_terms(mb["obs"])
            nll = -dist.log_prob(mb["action"]).mean()
            entropy = dist.entropy()
            loss = nll if aux is None else nll + aux
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
            optimizer.step()
            step = {"sft_nll": nll, "entropy": entropy.mean(), "grad_norm": grad_norm}
            if aux is not None:
                step["aux_loss"] = aux
            for key, value in step.items():
                totals[key] = totals.get(key, 0.0) + float(value.detach())
        return {k: v / self.cfg.updates for k, v in totals.items()}

    def state_dict(self) -> dict[str, Any]:
        """Optimiser and learning-rate scale (the frames drawn follow the checkpointed torch RNG)."""
        return {"updater": self.updater.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.updater.load_state_dict(state["updater"])
