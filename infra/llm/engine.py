"""The generation-engine interface the rollout service calls, and its registry.

The rollout service never touches a model directly: it holds a :class:`GenerationEngine`. The
built-in ``"torch"`` engine runs :class:`~infra.llm.model.TinyCausalLM` with its KV cache. An
external engine (vLLM, SGLang) plugs in by implementing the four methods below and calling
:func:`register_engine` once at import time of the adapter module; nothing else in the services
changes. No such adapter ships here: vLLM is not installed on the project's CPU machines, and an
adapter that cannot be run would be untested code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from infra.llm.model import ModelConfig, TinyCausalLM


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


class TorchEngine:
    """Batched KV-cached generation with the project's :class:`TinyCausalLM`."""

    def __init__(self, cfg: ModelConfig, *, eos_id: int, pad_id: int, device: str = "cpu") -> None:
        self.model = TinyCausalLM(cfg).to(device).eval()
        self.eos_id = eos_id
        self.pad_id = pad_id

    @property
    def device(self) -> torch.device:
        return self.model.tok.weight.device

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


EngineFactory = Callable[..., GenerationEngine]
_ENGINES: dict[str, EngineFactory] = {"torch": TorchEngine}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``load_engine(name, ...)`` build engines with ``factory`` (an external-engine adapter)."""
    _ENGINES[name] = factory


def load_engine(name: str, cfg: ModelConfig, *, eos_id: int, pad_id: int, device: str = "cpu") -> GenerationEngine:
    """Build the engine registered as ``name``."""
    if name not in _ENGINES:
        raise ValueError(
            f"unknown generation engine {name!r}; registered: {sorted(_ENGINES)}. An external engine such as "
            "vLLM needs an adapter implementing infra.llm.engine.GenerationEngine, registered with "
            "infra.llm.engine.register_engine(name, factory)."
        )
    return _ENGINES[name](cfg, eos_id=eos_id, pad_id=pad_id, device=device)
