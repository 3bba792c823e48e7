"""The generation-engine interface the rollout service calls, and its registry.

The rollout service never touches a model directly: it holds a :class:`GenerationEngine`. The
built-in engines run the job's :class:`~infra.llm.lm.CausalLM` in-process with its KV cache:
``"transformers"`` (the default, any Hugging Face causal LM) and ``"char"`` (the tiny CPU demo). An
external engine (vLLM, SGLang) plugs in by implementing the four methods below and calling
:func:`register_engine` once at import time of the adapter module; nothing else in the services
changes. No such adapter ships here: vLLM is not installed on the project's CPU machines, and an
adapter that cannot be run would be untested code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from infra.llm.lm import build_model, load_codec
from infra.llm.model import ModelConfig

EngineFactory = Callable[..., "GenerationEngine"]
"""``factory(model_cfg, *, device) -> GenerationEngine``."""


@runtime_checkable
class GenerationEngine(Protocol):
    """What the rollout service needs from an inference engine."""

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (host tensors) into the engine's device-resident model."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's current weights (device tensors)."""
        ...

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, temperature: float, seed: int
    ) -> list[list[int]]:
        """Sample one continuation per prompt (token ids, EOS included when emitted)."""
        ...

    @property
    def device(self) -> torch.device:
        """Device the engine computes on."""
        ...


class LocalEngine:
    """Batched KV-cached generation in this process with the job's own :class:`~infra.llm.lm.CausalLM`
    (a transformers model for ``model.kind=hf``, the tiny character model for ``char``)."""

    def __init__(self, cfg: ModelConfig, *, device: str = "cpu") -> None:
        codec = load_codec(cfg)
        self.model = build_model(cfg, seed=0).to(device).eval()
        self.eos_id, self.pad_id = codec.eos_id, codec.pad_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, temperature: float, seed: int
    ) -> list[list[int]]:
        tokens, mask = left_pad(prompts, self.pad_id, self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        out = self.model.generate(
            tokens, mask, max_new_tokens, eos_id=self.eos_id, temperature=temperature, generator=gen
        )
        return [_cut_at_eos(row, self.eos_id) for row in out.tolist()]


def _local_engine(kind: str) -> EngineFactory:
    def factory(cfg: ModelConfig, *, device: str = "cpu") -> GenerationEngine:
        if cfg.kind != kind:
            raise ValueError(f"engine for model.kind={kind!r} got model.kind={cfg.kind!r}; leave the engine unset "
                             f"to get the default engine of the model's kind ({DEFAULT_ENGINES}).")
        return LocalEngine(cfg, device=device)

    return factory


def _cut_at_eos(row: list[int], eos_id: int) -> list[int]:
    return row[: row.index(eos_id) + 1] if eos_id in row else row


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to ``[B, max_len]``; returns (tokens, mask True at real tokens)."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("left_pad needs a non-empty list of non-empty token sequences.")
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = True
    return tokens.to(device), mask.to(device)


DEFAULT_ENGINES = {"hf": "transformers", "char": "char"}
"""The engine a rollout service builds for each model kind when none is named."""
_ENGINES: dict[str, EngineFactory] = {name: _local_engine(kind) for kind, name in DEFAULT_ENGINES.items()}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``load_engine(name, ...)`` build engines with ``factory`` (an external-engine adapter)."""
    _ENGINES[name] = factory


def load_engine(name: str | None, cfg: ModelConfig, *, device: str = "cpu") -> GenerationEngine:
    """Build the engine registered as ``name`` for the model of ``cfg`` (None: the default of its kind)."""
    name = name or DEFAULT_ENGINES[cfg.kind]
    if name not in _ENGINES:
        raise ValueError(
            f"unknown generation engine {name!r}; registered: {sorted(_ENGINES)}. An external engine such as "
            "vLLM needs an adapter implementing infra.llm.engine.GenerationEngine, registered with "
            "infra.llm.engine.register_engine(name, factory)."
        )
    return _ENGINES[name](cfg, device=device)
