"""The Vision-Language-Action policy: cameras + instruction + proprioception -> actions and value.

Data flow for a batch of N observations (``C`` cameras, ``d`` = ``cfg.width``)::

    instruction [N] --index--> cached MiniLM embeddings [L, 384] (frozen, set_instructions)
                               -> Linear+act -> language feature l [N, d]
        (``language: tokens``: [L, 1 + T, 384], the sentence embedding and T token embeddings;
        heads queried by the sentence attend over the tokens, and Linear+act reads both)
    rgb uint8 [N, C, 3, H, W] -> /255, resize to image_size -> shared ConvEncoder per camera
    proprio [N, P] -> RunningNorm -> Linear+act -> proprio feature p [N, d]

    fusion: every convolution of the image encoder is FiLM-modulated by l (per-channel scale
        and shift, so language decides which visual features pass); each camera's final map is
        either flattened (``readout: flatten``) or read by instruction-queried spatial attention
        (``readout: attention``: per head, where the attended thing is and what it looks like),
        then projected to d; concat(cameras, l, p) -> trunk
    trunk (MLP) -> action head (Gaussian / binned, optional chunks) and value head

Auxiliary losses (training only; privileged simulator keys read by the loss, never by the actor):
``attention_target_keys`` train the first attention heads to attend to image points (sims'
``goal_pixel``: where the gripper should go; ``object_goal_pixel``: where the named object should go), and ``trunk_target_key`` trains a linear read-out of
the trunk to predict a vector (sims' ``state[:3]``: tip-to-goal). Reinforcement alone did not
teach the encoder to find a 4-pixel object named by colour within budget (docs/training.md);
with these losses perception is learnt by supervision, control by RL, as in privileged-
information and auxiliary-task methods (UNREAL; Pinto et al. 2018).

Asymmetric actor-critic (``critic_obs_keys`` non-empty, e.g. ``("proprio", "state")``): the value
is a separate MLP over those flat keys (RunningNorm on its input), so ``value()`` and the critic
skip the image encoder and may read privileged simulator state; the actor is unchanged (pixels +
language + proprio), and evaluation uses the actor only.

Deployment (:meth:`~policies.base.ActorCritic.actor`): the actor alone maps ``rgb`` uint8
``[N, C, 3, H, W]``, ``instruction_embedding`` float ``[N, 384]`` (the MiniLM embedding of the
instruction text, :meth:`VLAPolicy.embed_instructions`, computed outside the graph) and ``proprio``
``[N, P]`` to the mode action; it holds no critic and no auxiliary head and reads neither ``state``
nor ``goal_pixel``. ``act`` runs the same actor computation on the embedding its ``instruction``
index selects.

A late-fusion alternative (a transformer over image, language and proprio tokens) was tried
and removed: on the pointing test of tests/policies it stayed near chance after 1,500 steps,
where FiLM reaches 99% after 200, at twice the cost per step (docs/policies.md).

MiniLM runs only in :meth:`VLAPolicy.set_instructions`, once per distinct string in the
process (a :class:`~policies.encoders.SentenceCache`); the per-step path is an index into a
buffer. The embeddings buffer is not part of the ``state_dict``: after loading a checkpoint,
call ``set_instructions`` with the instruction list of the environment you act in.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from tensordict import TensorDictBase
from torch import nn

from policies.base import (
    ACTIVATIONS,
    Activation,
    ActorCritic,
    ObsSpec,
    PolicyTerms,
    build_mlp,
    obs_entry,
    require_key,
    spec_shapes,
    value_layer,
)
from policies.encoders import (
    EMBED_DIM,
    ConvEncoder,
    SentenceCache,
    SpatialAttentionReadout,
    TokenAttention,
    preprocess_images,
    shared_sentence_cache,
    shared_token_cache,
)
from policies.heads import HEAD_RANGES, ActionHeadConfig, make_head
from policies.normalization import RunningNorm
from rlcore.update_config import AT_LEAST_1, NON_NEGATIVE, Range, check_choice, out_of_range

INSTRUCTION_EMBEDDING = "instruction_embedding"
"""Name of the actor's language input: the instruction's sentence embedding, float ``[N, EMBED_DIM]``
(``language: tokens``: ``[N, 1 + T, EMBED_DIM]``, the sentence embedding then the token embeddings)."""
PERCEPTION = "perception"
"""Key of a frozen perception's output in an update batch, float ``[N, d * (C + 1)]``
(:meth:`VLAPolicy.prepare_update_batch`): the image features of every camera and the language feature."""
PERCEPTION_MODULES = ("language", "language_tokens", "image_encoder", "attention", "image_proj")
"""What ``freeze_perception`` keeps fixed: everything between the pixels and language and the trunk."""


Readout = Literal["flatten", "attention"]
READOUTS: tuple[str, ...] = typing.get_args(Readout)
"""How each camera's final feature map becomes a vector (:attr:`VLAConfig.readout`)."""
Language = Literal["sentence", "tokens"]
LANGUAGES: tuple[str, ...] = typing.get_args(Language)
"""What the policy reads of an instruction (:attr:`VLAConfig.language`)."""


@dataclass
class VLAConfig:
    """Configuration of :class:`VLAPolicy`."""

    RANGES: ClassVar[dict[str, Range]] = {
        "image_size": Range(8, 1024), "patch_size": AT_LEAST_1, "conv_channels": AT_LEAST_1, "conv_stride": AT_LEAST_1,
        "attention_heads": AT_LEAST_1, "width": AT_LEAST_1, "language_tokens": Range(3, 512),
        "language_heads": AT_LEAST_1, "language_width": AT_LEAST_1, "trunk_sizes": AT_LEAST_1, "obs_clip": NON_NEGATIVE,
        "critic_hidden_sizes": AT_LEAST_1, "trunk_target_dims": AT_LEAST_1, "aux_loss_coef": NON_NEGATIVE,
        **{f"head.{k}": r for k, r in HEAD_RANGES.items()},
    }
    """Valid range of every numeric field (dotted keys reach the head); not a field: no config sets it."""

    image_key: str = "rgb"
    """Observation key of the camera images, uint8 ``[N, cams, 3, H, W]``."""
    proprio_key: str = "proprio"
    """Observation key of proprioception, float ``[N, P]``; empty string to ignore proprioception."""
    instruction_key: str = "instruction"
    """Observation key of the instruction index, int64 ``[N]`` into the list given to ``set_instructions``."""
    image_size: int = 64
    """Images are resized (area interpolation) to ``image_size`` x ``image_size`` when they differ."""
    patch_size: int = 4
    """Kernel and stride of the image encoder's patchify stem."""
    conv_channels: tuple[int, ...] = (32, 32, 64)
    """Channels of the stem, then of each 3x3 convolution (shared across cameras)."""
    conv_stride: int = 2
    """Stride of the 3x3 convolutions after the stem (1 keeps the stem's resolution)."""
    readout: Readout = "flatten"
    """How each camera's final map becomes a vector: ``flatten`` (every position and channel, then
    a linear layer) or ``attention`` (instruction-queried spatial attention: per head, where the
    attended thing is and what it looks like; :class:`~policies.encoders.SpatialAttentionReadout`)."""
    attention_heads: int = 4
    """Queries of the ``attention`` readout."""
    width: int = 128
    """Width d of the per-camera image feature, the language feature and the proprio feature."""
    language: Language = "sentence"
    """What the policy reads of an instruction: MiniLM's pooled ``sentence`` embedding, or also its
    ``tokens`` (contextual token embeddings read by attention queried from the sentence,
    :class:`~policies.encoders.TokenAttention`), which keeps apart which word fills which role."""
    language_tokens: int = 24
    """``language: tokens``: the most tokens an instruction may have ([CLS] and [SEP] included)."""
    language_heads: int = 4
    """``language: tokens``: attention heads over the tokens."""
    language_width: int = 32
    """``language: tokens``: key and value width of each head."""
    trunk_sizes: tuple[int, ...] = (256, 256)
    """Hidden widths of the MLP after fusion, shared by the action and value heads."""
    activation: Activation = "relu"
    """Nonlinearity of the encoders and the trunk (ReLU: ELU costs 2x in the CPU encoder's forward)."""
    head: ActionHeadConfig = field(default_factory=ActionHeadConfig)
    """Action head: Gaussian or binned, with optional action chunks."""
    normalize_proprio: bool = True
    """Normalise proprioception with running mean/variance (statistics checkpoint with the model)."""
    obs_clip: float = 10.0
    """Clip normalised proprioception to ``[-obs_clip, obs_clip]`` (0 disables clipping)."""
    critic_obs_keys: tuple[str, ...] = ()
    """Empty: the value head shares the actor's trunk. Otherwise the flat float keys (e.g.
    ``("proprio", "state")``) of a separate critic MLP that never sees the images."""
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden widths of the separate critic MLP (used only with ``critic_obs_keys``)."""
    attention_target_keys: tuple[str, ...] = ()
    """Empty: no auxiliary loss. Otherwise (with ``readout: attention``) observation keys of an image
    point per camera, float ``[N, cams, 2]`` in ``[-1, 1]`` (x right, y down); attention head ``i``
    learns to attend to key ``i``'s point: a cross-entropy against a Gaussian around it, added to the
    training loss. In the sims envs ``goal_pixel`` is where the gripper tip should go and
    ``object_goal_pixel`` where the named object should go (push: the pad; stack: on the other
    block). The keys are read only by the loss; the actor acts from pixels, language and proprioception."""
    trunk_target_key: str = ""
    """Empty: none. Otherwise an observation key whose first ``trunk_target_dims`` features the
    trunk's output learns to predict (a linear head, mean squared error on running-normalised
    targets), e.g. ``state``, whose first three features in the sims envs are the vector from the
    gripper tip to where it should go. Read only by the loss, like ``attention_target_keys``."""
    trunk_target_dims: int = 3
    """Leading features of ``trunk_target_key`` to predict."""
    aux_loss_coef: float = 1.0
    """Weight of each auxiliary loss (attention and trunk target) in the training loss."""
    freeze_perception: bool = False
    """Keep the perception (``PERCEPTION_MODULES``: language projection, image encoder, attention
    readout, image projection) fixed and train only proprioception, trunk, heads and critic, as in RL
    fine-tuning from an SFT checkpoint: RL then cannot re-learn how instructions read on the few
    training phrasings it sees, and an update computes the perception once per batch
    (:meth:`VLAPolicy.prepare_update_batch`) instead of forward and backward per minibatch.
    The attention loss needs the perception's gradients, so it is skipped (the trunk-target loss is not)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and the fix: a choice or a number outside
        :attr:`RANGES`, an image size the patch size does not divide, no stem channels, or attention
        targets without the attention readout's heads. Run by the policy it builds."""
        for key, valid in (("readout", READOUTS), ("language", LANGUAGES), ("activation", ACTIVATIONS)):
            check_choice(key, getattr(self, key), valid)
        self.head.validate("head.")
        message = out_of_range(self, self.RANGES)
        if message:
            raise ValueError(message)
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}")
        if not self.conv_channels:
            raise ValueError("conv_channels is empty; give the stem's channels at least, e.g. [16, 16, 16]")
        if self.attention_target_keys and self.readout != "attention":
            raise ValueError(f"attention_target_keys={list(self.attention_target_keys)} train the attention readout; "
                             f"set readout: attention (it is {self.readout!r}).")
        if len(self.attention_target_keys) > self.attention_heads:
            raise ValueError(f"attention_target_keys={list(self.attention_target_keys)} need as many heads; "
                             f"raise attention_heads (it is {self.attention_heads}).")




class VLAPolicy(ActorCritic):
    """Language-conditioned visuomotor actor-critic (see the module docstring for the data flow).

    Args:
        cfg: the policy configuration.
        obs_spec: feature shapes per observation key (or a sample observation TensorDict); must
            hold ``cfg.image_key`` as ``(cams, 3, H, W)`` and, unless disabled, ``cfg.proprio_key``.
        action_dim: A, the number of action dimensions.
        sentences: the frozen sentence-embedding cache; defaults to the process-wide MiniLM one.
    """

    actor_module_names = (
        "language", "language_tokens", "image_encoder", "attention", "image_proj", "proprio_norm", "proprio",
        "trunk", "head",
    )

    _indices_checked = False  # whether a batch's instruction indices were checked since set_instructions

    def __init__(
        self, cfg: VLAConfig, obs_spec: ObsSpec, action_dim: int, sentences: SentenceCache | None = None
    ) -> None:
        super().__init__()
        cfg.validate()
        shapes = spec_shapes(obs_spec)
        self.cameras, channels, _, _ = require_key(shapes, cfg.image_key, 4, "VLAPolicy")
        if channels != 3:
            raise ValueError(
                f"observation {cfg.image_key!r} has {channels} channels per camera; expected RGB (3)."
            )
        self.cfg = cfg
        self.sentences = sentences
        self.instructions: tuple[str, ...] = ()
        act = ACTIVATIONS[cfg.activation]
        d = cfg.width
        self.language_tokens: TokenAttention | None = None
        if cfg.language == "tokens":
            self.language_tokens = TokenAttention(EMBED_DIM, cfg.language_heads, cfg.language_width)
            self.instruction_shape: tuple[int, ...] = (1 + cfg.language_tokens, EMBED_DIM)
        else:
            self.instruction_shape = (EMBED_DIM,)
        self.register_buffer("instruction_embeddings", torch.zeros(0, *self.instruction_shape), persistent=False)
        language_in = EMBED_DIM + (self.language_tokens.out_features if self.language_tokens is not None else 0)
        self.language = nn.Sequential(nn.Linear(language_in, d), act())
        self.image_encoder = ConvEncoder(cfg.image_size, cfg.patch_size, cfg.conv_channels, d, act, cfg.conv_stride)
        channels, size = self.image_encoder.out_channels, self.image_encoder.out_size
        self.attention: SpatialAttentionReadout | None = None
        if cfg.readout == "attention":
            self.attention = SpatialAttentionReadout(channels, size, d, cfg.attention_heads)
            map_features = self.attention.out_features
        else:
            map_features = channels * size**2
        self.image_proj = nn.Sequential(nn.Flatten(), nn.Linear(map_features, d), act())
        fused = d * (self.cameras + 1)

        self.proprio_norm: RunningNorm | None = None
        self.proprio: nn.Sequential | None = None
        if cfg.proprio_key:
            (proprio_dim,) = require_key(shapes, cfg.proprio_key, 1, "VLAPolicy")
            if cfg.normalize_proprio:
                self.proprio_norm = RunningNorm(proprio_dim, clip=cfg.obs_clip)
            self.proprio = nn.Sequential(nn.Linear(proprio_dim, d), act())
            fused += d

        self.trunk = build_mlp(fused, cfg.trunk_sizes, cfg.activation)
        proprio_input = (cfg.proprio_key,) if cfg.proprio_key else ()
        self.actor_input_names = (cfg.image_key, INSTRUCTION_EMBEDDING, *proprio_input)
        out = cfg.trunk_sizes[-1] if cfg.trunk_sizes else fused
        self.head = make_head(cfg.head, out, action_dim)

        self.critic_keys = tuple(cfg.critic_obs_keys)
        self.critic_norm: RunningNorm | None = None
        self.critic_trunk: nn.Sequential | None = None
        if self.critic_keys:
            critic_dim = sum(require_key(shapes, k, 1, "VLAPolicy critic")[0] for k in self.critic_keys)
            self.critic_norm = RunningNorm(critic_dim, clip=cfg.obs_clip)
            self.critic_trunk = build_mlp(critic_dim, cfg.critic_hidden_sizes, cfg.activation)
            out = cfg.critic_hidden_sizes[-1] if cfg.critic_hidden_sizes else critic_dim
        self.value_head = value_layer(out)

        for key in cfg.attention_target_keys:
            require_key(shapes, key, 2, "VLAPolicy attention loss")
        self.target_norm: RunningNorm | None = None
        self.target_head: nn.Linear | None = None
        if cfg.trunk_target_key:
            (available,) = require_key(shapes, cfg.trunk_target_key, 1, "VLAPolicy trunk-target loss")
            if not 1 <= cfg.trunk_target_dims <= available:
                raise ValueError(
                    f"trunk_target_dims={cfg.trunk_target_dims}; observation {cfg.trunk_target_key!r} "
                    f"has {available} features."
                )
            self.target_norm = RunningNorm(cfg.trunk_target_dims, clip=cfg.obs_clip)
            self.target_head = nn.Linear(cfg.trunk_sizes[-1] if cfg.trunk_sizes else fused, cfg.trunk_target_dims)
        if cfg.freeze_perception:
            for name in PERCEPTION_MODULES:
                module = getattr(self, name)
                if module is not None:
                    module.requires_grad_(False)

    # --- language -------------------------------------------------------------------------
    def embed_instructions(self, instructions: Sequence[str]) -> torch.Tensor:
        """Embeddings ``[L, *instruction_shape]`` (float32, CPU) of ``instructions``, MiniLM cached per string."""
        sentences = self.sentences
        if sentences is None:
            tokens = self.cfg.language == "tokens"
            sentences = shared_token_cache(self.cfg.language_tokens) if tokens else shared_sentence_cache()
        embeddings = sentences(list(instructions))
        if tuple(embeddings.shape[1:]) != self.instruction_shape:
            raise ValueError(f"the language encoder gives {tuple(embeddings.shape[1:])} per instruction; "
                             f"language={self.cfg.language!r} reads {self.instruction_shape}")
        return embeddings

    def set_instructions(self, instructions: Sequence[str]) -> None:
        """Embed ``instructions`` (MiniLM, cached per string) so that index i means ``instructions[i]``."""
        if isinstance(instructions, str) or not instructions:
            raise ValueError("set_instructions needs a non-empty list of strings, e.g. env.instructions.")
        embeddings = self.embed_instructions(instructions)
        self.instructions = tuple(instructions)
        self.instruction_embeddings = embeddings.to(self.instruction_embeddings.device)
        self._indices_checked = False

    def _embedding(self, obs: TensorDictBase) -> torch.Tensor:
        """The batch's own ``instruction_embedding`` where it carries one (a deployed actor's input, SFT's
        augmented embeddings; with tokens ``[N, 1 + T', D]``, any T'), else the embedding
        ``[N, *instruction_shape]`` of each observation's ``instruction`` index."""
        if INSTRUCTION_EMBEDDING in obs:
            return obs_entry(obs, INSTRUCTION_EMBEDDING).float()
        index = obs_entry(obs, self.cfg.instruction_key)
        count = self.instruction_embeddings.shape[0]
        if count == 0:
            raise RuntimeError(
                "VLAPolicy has no instructions: call policy.set_instructions(env.instructions) after "
                "building or loading the policy."
            )
        if index.dtype != torch.int64 or index.dim() != 1:
            raise ValueError(
                f"{self.cfg.instruction_key!r} must be int64 [N]; got {index.dtype} {tuple(index.shape)}."
            )
        # The first batch after set_instructions is checked (a host read); later ones rely on the
        # gather's own bounds check: a read per act and value call would stall a GPU every step.
        if not self._indices_checked and bool((index < 0).any() | (index >= count).any()):
            raise IndexError(
                f"instruction index out of range [0, {count}); the policy holds {count} instructions. "
                f"Call set_instructions with the environment's instruction list."
            )
        self._indices_checked = True
        return self.instruction_embeddings[index]

    # --- observation -> features ------------------------------------------------------------
    def actor_inputs(self, obs: TensorDictBase) -> tuple[torch.Tensor, ...]:
        """``(rgb [N, C, 3, H, W], instruction_embedding [N, *instruction_shape], proprio [N, P])`` of a batch
        (no ``proprio`` when ``proprio_key`` is empty)."""
        inputs = (obs_entry(obs, self.cfg.image_key), self._embedding(obs))
        return inputs + ((obs_entry(obs, self.cfg.proprio_key),) if self.cfg.proprio_key else ())

    def _images(self, rgb: torch.Tensor) -> torch.Tensor:
        if rgb.dtype != torch.uint8 or rgb.dim() != 5 or rgb.shape[1:3] != (self.cameras, 3):
            raise ValueError(
                f"{self.cfg.image_key!r} must be uint8 [N, {self.cameras}, 3, H, W]; got {rgb.dtype} {tuple(rgb.shape)}."
            )
        return preprocess_images(rgb, self.cfg.image_size)

    def _proprio(self, proprio: torch.Tensor) -> torch.Tensor:
        x = proprio.float()
        return self.proprio(self.proprio_norm(x) if self.proprio_norm is not None else x)

    def _perceive(self, rgb: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Perception ``[N, d * (C + 1)]`` (each camera's image feature, then the language feature) and
        the attention logits (``None`` without attention)."""
        if self.language_tokens is not None:
            sentence = embedding[:, 0]
            lang = self.language(torch.cat([sentence, self.language_tokens(sentence, embedding[:, 1:])], dim=-1))
        else:
            lang = self.language(embedding)
        n = lang.shape[0]
        per_camera = lang.repeat_interleave(self.cameras, dim=0)
        maps = self.image_encoder(self._images(rgb), per_camera)
        logits = None
        if self.attention is not None:
            maps, logits = self.attention(maps, per_camera)
        return torch.cat([self.image_proj(maps).view(n, -1), lang], dim=-1), logits

    def _motor(self, perception: torch.Tensor, proprio: torch.Tensor | None) -> torch.Tensor:
        """Trunk output ``[N, F]`` from the perception and proprioception."""
        parts = [perception] if self.proprio is None else [perception, self._proprio(proprio)]
        return self.trunk(torch.cat(parts, dim=-1))

    def _actor(
        self, rgb: torch.Tensor, embedding: torch.Tensor, proprio: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Trunk output ``[N, F]`` and the attention logits (``None`` without attention) of the actor's inputs."""
        perception, logits = self._perceive(rgb, embedding)
        return self._motor(perception, proprio), logits

    def actor_features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Trunk output ``[N, F]`` from ``rgb``, ``instruction_embedding`` and ``proprio`` (see :meth:`actor_inputs`)."""
        return self._actor(*inputs)[0]

    def _forward(self, obs: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Actor features, critic features and the attention logits (``None`` without attention or
        when the batch carries a frozen perception's output)."""
        if PERCEPTION in obs:
            proprio = obs_entry(obs, self.cfg.proprio_key) if self.cfg.proprio_key else None
            x, logits = self._motor(obs_entry(obs, PERCEPTION), proprio), None
        else:
            x, logits = self._actor(*self.actor_inputs(obs))
        return x, (x if self.critic_trunk is None else self.critic_features(obs)), logits

    def features(self, obs: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        actor, critic, _ = self._forward(obs)
        return actor, critic

    def evaluate_terms(self, obs: TensorDictBase) -> PolicyTerms:
        actor, critic, logits = self._forward(obs)
        dist = self.head(actor)
        value = self.value_head(critic).squeeze(-1)
        losses = []  # each auxiliary loss where the batch carries its target (a dataset may not)
        for head, key in enumerate(self.cfg.attention_target_keys):
            if key in obs and self.attention is not None and logits is not None:
                points = obs_entry(obs, key).float().flatten(0, 1)  # [N * cams, 2]
                losses.append(self.attention.point_loss(logits, points, head))
        if self.target_head is not None and self.target_norm is not None and self.cfg.trunk_target_key in obs:
            target = self.target_norm(self._trunk_target(obs))
            losses.append((self.target_head(actor) - target).pow(2).mean())
        aux = self.cfg.aux_loss_coef * sum(losses) if losses else None
        return PolicyTerms(dist, value, aux)

    @torch.no_grad()
    def prepare_update_batch(self, obs: TensorDictBase, chunk_size: int = 1024) -> TensorDictBase:
        """With ``freeze_perception``: ``obs`` with the perception's output under ``PERCEPTION``
        ``[B, d * (C + 1)]`` in place of the images, so that minibatch epochs run only what they train.
        Without it: ``obs`` unchanged."""
        if not self.cfg.freeze_perception:
            return obs
        parts = []
        for start in range(0, obs.batch_size[0], chunk_size):
            chunk = obs[start : start + chunk_size]
            parts.append(self._perceive(obs_entry(chunk, self.cfg.image_key), self._embedding(chunk))[0])
        keep = obs.exclude(self.cfg.image_key, INSTRUCTION_EMBEDDING)
        return keep.set(PERCEPTION, torch.cat(parts))

    def _trunk_target(self, obs: TensorDictBase) -> torch.Tensor:
        return obs_entry(obs, self.cfg.trunk_target_key)[:, : self.cfg.trunk_target_dims].float()

    def _critic_input(self, obs: TensorDictBase) -> torch.Tensor:
        return torch.cat([obs_entry(obs, k).float() for k in self.critic_keys], dim=-1)

    @property
    def critic_obs_keys(self) -> tuple[str, ...] | None:
        """``critic_obs_keys`` of the config for a separate critic, else None (the critic shares the actor's images)."""
        return self.critic_keys if self.critic_trunk is not None else None

    def critic_features(self, obs: TensorDictBase) -> torch.Tensor:
        if self.critic_trunk is None or self.critic_norm is None:
            return super().critic_features(obs)
        return self.critic_trunk(self.critic_norm(self._critic_input(obs)))

    def update_normalization(self, obs: TensorDictBase) -> None:
        if self.proprio_norm is not None:
            self.proprio_norm.update(obs_entry(obs, self.cfg.proprio_key).float())
        # Privileged keys may be missing (a demonstration dataset without them): their statistics wait.
        if self.critic_norm is not None and all(k in obs for k in self.critic_keys):
            self.critic_norm.update(self._critic_input(obs))
        if self.target_norm is not None and self.cfg.trunk_target_key in obs:
            self.target_norm.update(self._trunk_target(obs))
