"""A tiny causal transformer with batched, KV-cached autoregressive generation.

The model is small enough to train from scratch on two CPU cores in minutes (the RLVR job of
``scripts/llm_rlvr.py``) and has the structure of a real decoder: token and learned position
embeddings, pre-LayerNorm blocks of causal multi-head self-attention and a GELU MLP, a tied
output head. Prompts of different lengths are left-padded; positions and the key mask are
computed from the padding mask, so a padded row generates exactly what it would alone.

Shapes: ``B`` batch, ``T`` sequence length, ``D`` model width, ``H`` heads, ``L`` layers,
``V`` vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from infra.common.typed_config import ConfigError

MODEL_KINDS = ("hf", "char")


@dataclass(frozen=True)
class ModelConfig:
    """Which policy model a job trains: a Hugging Face causal LM from a folder, or the tiny one.

    ``kind="hf"`` loads ``AutoModelForCausalLM`` and ``AutoTokenizer`` from ``path`` (see
    :mod:`infra.llm.lm`); ``kind="char"`` builds :class:`TinyCausalLM` from the size fields below
    (the CPU demo; its tokenizer is the character vocabulary of :mod:`infra.llm.verifiable_tasks`).
    """

    kind: str = "hf"
    """``hf`` (a transformers model folder at ``path``) or ``char`` (the tiny character model)."""
    path: str = ""
    """Local folder written by ``save_pretrained`` holding the model and its tokenizer (``hf``)."""
    vocab_size: int = 32
    """Number of token ids (set from the task's tokenizer)."""
    max_len: int = 48
    """Longest prompt + generation, in tokens."""
    d_model: int = 96
    """Residual stream width D."""
    n_heads: int = 4
    """Attention heads H (D must be a multiple of H)."""
    n_layers: int = 3
    """Transformer blocks L."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the first bad field and the fix."""
        if self.kind not in MODEL_KINDS:
            raise ConfigError(f"model.kind={self.kind!r} is unknown; choose one of {list(MODEL_KINDS)}.")
        for name in ("vocab_size", "max_len", "d_model", "n_heads", "n_layers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be positive.")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not a multiple of n_heads={self.n_heads}; "
                              "pick d_model = k * n_heads.")

    def num_params(self) -> int:
        """Parameter count of the model (``char``: from the sizes, embeddings tied with the head;
        ``hf``: counted on a copy built from the folder's config on the meta device)."""
        if self.kind == "hf":
            return hf_num_params(self.path)
        d = self.d_model
        per_block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attn, mlp, 2 layernorms
        return self.vocab_size * d + self.max_len * d + self.n_layers * per_block + 2 * d


def hf_num_params(path: str) -> int:
    """Parameters of the model in ``path``, counted on the meta device (no weights are read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in net.parameters())


@dataclass
class KVCache:
    """Keys and values of every layer for a batch being generated.

    ``k[l]`` and ``v[l]`` are ``[B, H, max_len, D/H]``; positions ``< length`` are filled.
    ``key_mask`` ``[B, max_len]`` is False at left padding.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    key_mask: torch.Tensor
    length: int = 0
    positions: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor, cache: KVCache | None, layer: int
    ) -> torch.Tensor:
        """x: [B, Tq, D]; attn_mask: [B, 1, Tq, Tk] bool (True = may attend)."""
        b, tq, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, tq, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            start = cache.length
            cache.k[layer][:, :, start : start + tq] = k
            cache.v[layer][:, :, start : start + tq] = v
            k = cache.k[layer][:, :, : start + tq]
            v = cache.v[layer][:, :, : start + tq]
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, tq, d))
        return x + self.mlp(self.ln2(x))


def sample_next(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens ``[B]`` from last-position logits ``[B, V]``: argmax at ``temperature=0``, else a
    draw from ``softmax(logits / temperature)`` with ``generator`` (so a seed fixes the sample)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class TinyCausalLM(nn.Module):
    """Decoder-only transformer; ``forward`` for training, ``generate`` for rollouts."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` for ``tokens`` ``[B, T]`` (no cache).

        ``pad_mask`` ``[B, T]`` is True at real tokens; padding must be on the left.
        """
        if pad_mask is None:
            pad_mask = torch.ones_like(tokens, dtype=torch.bool)
        positions = (pad_mask.long().cumsum(-1) - 1).clamp(min=0)
        t = tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        attn_mask = causal[None, None] & pad_mask[:, None, None, :]
        attn_mask = attn_mask | torch.eye(t, dtype=torch.bool, device=tokens.device)[None, None]
        x = self.tok(tokens) + self.pos(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, None, i)
        return self.ln_f(x) @ self.tok.weight.T

    def _step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed ``tokens`` [B, Tq] after the cached prefix; returns logits of the last position [B, V]."""
        tq = tokens.shape[1]
        start = cache.length
        positions = cache.positions[:, start : start + tq]
        keys = cache.key_mask[:, : start + tq]
        q_idx = torch.arange(start, start + tq, device=tokens.device)
        k_idx = torch.arange(start + tq, device=tokens.device)
        causal = k_idx[None, :] <= q_idx[:, None]
        attn_mask = (causal[None, None] & keys[:, None, None, :]) | (k_idx[None, :] == q_idx[:, None])
        x = self.tok(tokens) + self.pos(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, cache, i)
        cache.length += tq
        return self.ln_f(x[:, -1]) @ self.tok.weight.T

    @torch.no_grad()
    def generate(
        self,
        prompts: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        *,
        eos_id: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Sample continuations of left-padded ``prompts`` ``[B, P]``; returns ``[B, max_new_tokens]``.

        ``temperature=0`` is greedy. After a row emits ``eos_id`` it keeps emitting ``eos_id``.
        ``use_cache=False`` recomputes the whole sequence each step (the reference the cached
        path is tested against).
        """
        b, p = prompts.shape
        if p + max_new_tokens > self.cfg.max_len:
            raise ValueError(
                f"prompt length {p} + max_new_tokens {max_new_tokens} exceeds max_len={self.cfg.max_len}; "
                "shorten the task or build the model with a larger max_len."
            )
        device = prompts.device
        full_mask = torch.cat([prompt_mask, torch.ones(b, max_new_tokens, dtype=torch.bool, device=device)], 1)
        seq = prompts
        out = torch.empty(b, max_new_tokens, dtype=torch.long, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        cache = None
        if use_cache:
            hd = self.cfg.d_model // self.cfg.n_heads
            shape = (b, self.cfg.n_heads, p + max_new_tokens, hd)
            dtype = self.tok.weight.dtype
            cache = KVCache(
                k=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.blocks],
                v=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.blocks],
                key_mask=full_mask,
                positions=(full_mask.long().cumsum(-1) - 1).clamp(min=0),
            )
        for i in range(max_new_tokens):
            if cache is not None:
                logits = self._step(seq if i == 0 else out[:, i - 1 : i], cache)
            else:
                logits = self.forward(seq, full_mask[:, : seq.shape[1]])[:, -1]
            nxt = sample_next(logits, temperature, generator)
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            out[:, i] = nxt
            done |= nxt == eos_id
            if cache is None:
                seq = torch.cat([seq, nxt[:, None]], 1)
            if bool(done.all()):
                out[:, i + 1 :] = eos_id
                break
        return out

    def logprobs(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, C]`` of ``completions`` given left-padded ``prompts`` (see :func:`sequence_logprobs`)."""
        return sequence_logprobs(self, prompts, prompt_mask, completions)

    def save(self, path: Path) -> None:
        """Write ``model.safetensors`` and ``model_config.json`` (the sizes) into the folder ``path``."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path / "model.safetensors"))
        (path / "model_config.json").write_text(json.dumps(dataclasses.asdict(self.cfg), indent=2))


def sequence_logprobs(
    model: TinyCausalLM, prompts: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities ``[B, C]`` of ``completions`` ``[B, C]`` given left-padded ``prompts`` ``[B, P]``."""
    seq = torch.cat([prompts, completions], 1)
    mask = torch.cat([prompt_mask, torch.ones_like(completions, dtype=torch.bool)], 1)
    logits = model(seq, mask)[:, prompts.shape[1] - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None]).squeeze(-1)
