"""Verifiable tasks for RLVR: a character tokenizer, prompt samplers and exact-answer checkers.

A task turns a random draw into a prompt string and recomputes its answer from the prompt itself
(it never trusts a label carried along), so the reward — :func:`exact_match` of the completion
against that answer — is verifiable in the RLVR sense. Both kinds of prompt source (these tasks,
and a user's file in :mod:`infra.llm.data`) give the job :class:`Example` rows.

- ``add``: ``"37+85="`` -> ``"122"`` (operands with up to ``digits`` digits, no zero padding, so
  prompt lengths vary and the left-padded batch path is exercised).
- ``sort``: ``"s:3141="`` -> ``"1134"`` (a list of ``length`` digits, sorted ascending).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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
class VerifiableTask:
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


def load_task(name: str, size: int) -> VerifiableTask:
    """The task ``name`` (``add`` with ``size`` digits per operand, ``sort`` of ``size`` digits)."""
    if size < 1:
        raise ValueError(f"task size must be >= 1, got {size}.")
    if name == "add":
        return VerifiableTask("add", _sample_add(size), _solve_add, max_answer_len=size + 1)
    if name == "sort":
        return VerifiableTask("sort", _sample_sort(size), _solve_sort, max_answer_len=size)
    raise ValueError(f"unknown task {name!r}; choose one of ['add', 'sort'].")


@dataclass(frozen=True)
class Example:
    """One prompt and its reference answer (the text a correct completion must say)."""

    prompt: str
    answer: str


class PromptSource(Protocol):
    """Where a job's prompts come from: a built-in task or a user's file (:mod:`infra.llm.data`)."""

    def sample(self, rng: np.random.Generator, n: int) -> list[Example]:
        """``n`` training examples drawn with ``rng``."""
        ...

    def eval_set(self, n: int) -> list[Example]:
        """The fixed held-out examples the greedy accuracy is measured on (at most ``n``)."""
        ...

    def probe(self) -> list[Example]:
        """Examples whose prompts and answers bound the token lengths of every example's (checked
        against the model's positions; the longest answer sets the rollout's max_new_tokens)."""
        ...


class TaskSource:
    """A built-in task as a :class:`PromptSource`: fresh draws, answers recomputed from each prompt."""

    def __init__(self, task: VerifiableTask, seed: int) -> None:
        self.task = task
        self.seed = seed

    def sample(self, rng: np.random.Generator, n: int) -> list[Example]:
        return [Example(t, self.task.solve(t)) for t in self.task.sample(rng, n)]

    def eval_set(self, n: int) -> list[Example]:
        return self.sample(np.random.default_rng([self.seed, 999]), n)

    def probe(self) -> list[Example]:
        # the longest answer there can be, beside a sample of prompts (prompt lengths vary little)
        longest = "9" * self.task.max_answer_len
        return [Example(t, longest) for t in self.task.sample(np.random.default_rng(0), 64)]


def exact_match(prompt: str, completion: str, answer: str) -> float:
    """The default reward: 1.0 when the completion, whitespace stripped, equals the reference answer."""
    return float(completion.strip() == answer.strip())
