"""Verifiable tasks for RLVR: a character tokenizer, prompt samplers and exact-answer checkers.

A task turns a random draw into a prompt string and checks a completion string exactly: the
checker recomputes the answer from the prompt itself (it never trusts a label carried along),
so the reward is verifiable in the RLVR sense.

- ``add``: ``"37+85="`` -> ``"122"`` (operands with up to ``digits`` digits, no zero padding, so
  prompt lengths vary and the left-padded batch path is exercised).
- ``sort``: ``"s:3141="`` -> ``"1134"`` (a list of ``length`` digits, sorted ascending).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS = 0, 1, 2
_CHARS = "0123456789+=s:"
_TO_ID = {c: i + 3 for i, c in enumerate(_CHARS)}
_TO_CHAR = {i: c for c, i in _TO_ID.items()}
VOCAB_SIZE = 3 + len(_CHARS)


def encode(text: str) -> list[int]:
    """Token ids of ``text`` with a leading BOS; raises on a character outside the vocabulary."""
    bad = sorted(set(text) - set(_CHARS))
    if bad:
        raise ValueError(f"characters {bad} are not in the task vocabulary {_CHARS!r}.")
    return [BOS] + [_TO_ID[c] for c in text]


def decode(ids: list[int]) -> tuple[str, bool]:
    """Text of ``ids`` up to the first EOS, and whether an EOS was emitted."""
    out = []
    for i in ids:
        if i == EOS:
            return "".join(out), True
        out.append(_TO_CHAR.get(i, "?"))
    return "".join(out), False


@dataclass(frozen=True)
class Task:
    """A verifiable task: ``sample`` draws prompt texts, ``solve`` recomputes the answer from one."""

    name: str
    sample: Callable[[np.random.Generator, int], list[str]]
    solve: Callable[[str], str]
    max_answer_len: int
    """Longest answer in tokens, EOS excluded (the rollout's max_new_tokens is this + 1)."""


def _sample_add(digits: int) -> Callable[[np.random.Generator, int], list[str]]:
    def sample(rng: np.random.Generator, n: int) -> list[str]:
        a, b = rng.integers(0, 10**digits, size=(2, n))
        return [f"{x}+{y}=" for x, y in zip(a, b)]

    return sample


def _solve_add(prompt: str) -> str:
    left, right = prompt.rstrip("=").split("+")
    return str(int(left) + int(right))


def _sample_sort(length: int) -> Callable[[np.random.Generator, int], list[str]]:
    def sample(rng: np.random.Generator, n: int) -> list[str]:
        return ["s:" + "".join(map(str, row)) + "=" for row in rng.integers(0, 10, size=(n, length))]

    return sample


def _solve_sort(prompt: str) -> str:
    return "".join(sorted(prompt[2:].rstrip("=")))


def load_task(name: str, size: int) -> Task:
    """The task ``name`` (``add`` with ``size`` digits per operand, ``sort`` of ``size`` digits)."""
    if size < 1:
        raise ValueError(f"task size must be >= 1, got {size}.")
    if name == "add":
        return Task("add", _sample_add(size), _solve_add, max_answer_len=size + 1)
    if name == "sort":
        return Task("sort", _sample_sort(size), _solve_sort, max_answer_len=size)
    raise ValueError(f"unknown task {name!r}; choose one of ['add', 'sort'].")


def exact_reward(task: Task, prompt: str, completion: list[int]) -> float:
    """1.0 when ``completion`` decodes to the task's answer for ``prompt`` followed by EOS, else 0.0."""
    text, ended = decode(completion)
    return float(ended and text == task.solve(prompt))
