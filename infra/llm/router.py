"""Request routing across rollout instances: round-robin, least-loaded, and prefill/decode-aware.

An inference engine with continuous batching and chunked prefill runs *steps*; each step
prefills up to ``chunk_tokens`` waiting prompt tokens and decodes one token for every running
sequence, and takes ``step_s + prefill_s_per_token * prefilled + decode_s_per_seq * running``.
A request's time to first token (TTFT) is the time until its prompt is fully prefilled, which
depends on two loads of the instance it lands on: the prompt tokens queued ahead of it (prefill
load: a few long prompts are as bad as many short ones) and the number of sequences decoding
(decode load: every step is slower with more of them).

``RoundRobin`` ignores load, ``LeastLoaded`` counts outstanding requests (blind to how long
each prompt or generation is), ``PrefillDecodeAware`` estimates each instance's TTFT for the new
request from both loads with the cost model above and picks the smallest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class EngineCost:
    """Step-time model of one rollout instance (seconds)."""

    step_s: float = 0.012
    """Fixed time of a step (weights read once per step: decoding is memory-bound)."""
    decode_s_per_seq: float = 0.00005
    """Extra step time per running sequence (its KV cache read)."""
    prefill_s_per_token: float = 0.00003
    """Prefill time per prompt token (compute-bound)."""
    chunk_tokens: int = 2048
    """Most prompt tokens prefilled in one step."""

    def step_time(self, prefill_tokens: int, running: int) -> float:
        """Duration of one step that prefills ``prefill_tokens`` and decodes ``running`` sequences."""
        return self.step_s + self.prefill_s_per_token * prefill_tokens + self.decode_s_per_seq * running


@dataclass(frozen=True)
class InstanceLoad:
    """What the router knows of one instance when a request arrives."""

    outstanding: int
    """Requests dispatched and not finished."""
    queued_prefill_tokens: int
    """Prompt tokens dispatched and not yet prefilled."""
    running: int
    """Sequences decoding."""


class Router(Protocol):
    """Picks the instance for a request."""

    name: str

    def choose(self, prompt_tokens: int, loads: list[InstanceLoad]) -> int:
        """Index of the instance that gets a request with ``prompt_tokens`` prompt tokens."""
        ...


class RoundRobin:
    """Instances in turn, whatever their load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, prompt_tokens: int, loads: list[InstanceLoad]) -> int:
        i = self._next % len(loads)
        self._next += 1
        return i


class LeastLoaded:
    """The instance with the fewest outstanding requests (ties: lowest index)."""

    name = "least_loaded"

    def choose(self, prompt_tokens: int, loads: list[InstanceLoad]) -> int:
        return min(range(len(loads)), key=lambda i: (loads[i].outstanding, i))


class PrefillDecodeAware:
    """The instance with the smallest estimated TTFT for this request under ``cost``."""

    name = "prefill_decode_aware"

    def __init__(self, cost: EngineCost) -> None:
        self.cost = cost

    def estimated_ttft(self, prompt_tokens: int, load: InstanceLoad) -> float:
        """Steps to prefill the queue ahead plus this prompt, each carrying the running decodes."""
        tokens = load.queued_prefill_tokens + prompt_tokens
        steps = max(1, math.ceil(tokens / self.cost.chunk_tokens))
        return self.cost.prefill_s_per_token * tokens + steps * (self.cost.step_s + self.cost.decode_s_per_seq * load.running)

    def choose(self, prompt_tokens: int, loads: list[InstanceLoad]) -> int:
        return min(range(len(loads)), key=lambda i: (self.estimated_ttft(prompt_tokens, loads[i]), i))


def load_router(name: str, cost: EngineCost | None = None) -> Router:
    """A router by name: ``round_robin``, ``least_loaded`` or ``prefill_decode_aware``."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "prefill_decode_aware":
        return PrefillDecodeAware(cost or EngineCost())
    raise ValueError(f"unknown router {name!r}; choose one of ['round_robin', 'least_loaded', 'prefill_decode_aware'].")
