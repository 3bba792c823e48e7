"""The simulated RLVR workload: job profiles, the GPU cost model and the random draws.

Times are in seconds. A job runs ``iterations`` synchronous RLVR iterations: rollout (GPU), reward
(CPU), train (GPU).

- Rollout: ``batch`` sequences with ``LogNormal(prompt_median, prompt_sigma)`` prompt tokens; each
  has ``1 + Geometric`` turns (mean ``turns_mean``; 1 for single-turn jobs); each turn decodes
  ``LogNormal(median=out_median, sigma=out_sigma)`` tokens (capped at ``out_cap``); between turns
  the sequence waits on a tool call for ``LogNormal(median=tool_median_s, sigma=tool_sigma)``
  seconds (capped at ``tool_cap_s``) and then prefills the tool's
  ``LogNormal(median=tool_tokens_median, sigma=0.5)`` output tokens.
- Rollout cost model (continuous batching, simulated in chunks of ``chunk`` tokens): a decode step
  takes ``decode_step_s + decode_s_per_seq * active`` (memory-bound: it reads the weights once per
  step); prefill costs ``2 * params / (gpus * peak_flops * prefill_mfu)`` per token.
- Reward: ``LogNormal(median=reward_median_s, sigma=0.5)`` on CPU (verifier or sandbox tests).
- Train: ``10 * params * generated_tokens / (gpus * peak_flops * train_mfu)`` (forward+backward,
  and the old-policy and reference log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JobProfile:
    """Distributions and size of one RLVR job (see the module docstring)."""

    name: str
    kind: str
    params: float = 7e9
    gpus: int = 4
    iterations: int = 10
    batch: int = 256
    prompt_median: float = 400.0
    prompt_sigma: float = 0.5
    turns_mean: float = 1.0
    out_median: float = 1000.0
    out_sigma: float = 0.8
    out_cap: int = 16384
    tool_median_s: float = 0.0
    tool_sigma: float = 1.0
    tool_cap_s: float = 120.0
    tool_tokens_median: float = 300.0
    reward_median_s: float = 20.0


@dataclass(frozen=True)
class Hardware:
    """Cost model of one GPU (H100-class defaults) and its host link."""

    peak_flops: float = 989e12
    train_mfu: float = 0.35
    prefill_mfu: float = 0.5
    decode_step_s: float = 0.012
    decode_s_per_seq: float = 0.00004
    pcie_bytes_per_s: float = 25e9
    chunk: int = 64


def mixed_workload(n_jobs: int = 8, iterations: int = 8) -> list[JobProfile]:
    """Half single-turn math jobs (long-tailed answers), half multi-turn tool-using agent jobs."""
    jobs = []
    for i in range(n_jobs):
        if i % 2 == 0:
            jobs.append(
                JobProfile(
                    f"math{i}",
                    "math",
                    iterations=iterations,
                    batch=512,
                    prompt_median=300,
                    out_median=1200,
                    out_sigma=0.9,
                    reward_median_s=30.0,
                )
            )
        else:
            jobs.append(
                JobProfile(
                    f"agent{i}",
                    "agent",
                    iterations=iterations,
                    batch=256,
                    prompt_median=800,
                    turns_mean=4.0,
                    out_median=250,
                    out_sigma=0.8,
                    out_cap=4096,
                    tool_median_s=6.0,
                    tool_sigma=1.0,
                    reward_median_s=60.0,
                )
            )
    return jobs


def batch_key(seed: int, name: str, iteration: int) -> list[int]:
    """Seed of one iteration's draws of job ``name``: keyed by (seed, job, iteration), so a job sees
    the same workload whether it runs alone or shared (common random numbers)."""
    return [seed, sum(ord(c) * 31**k for k, c in enumerate(name)) % 2**31, iteration]


def lognormal(rng: np.random.Generator, median: float, sigma: float, size: int | None = None) -> np.ndarray:
    """``size`` draws of ``LogNormal(log median, sigma)``."""
    return median * np.exp(sigma * rng.standard_normal(size))


def turn_lengths(p: JobProfile, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` decoded lengths of one turn, in ``[1, out_cap]`` tokens."""
    return np.clip(lognormal(rng, p.out_median, p.out_sigma, n), 1, p.out_cap)


def extra_turns(p: JobProfile, rng: np.random.Generator, n: int) -> np.ndarray:
    """Tool calls of each of ``n`` sequences (``turns - 1``; zeros for single-turn jobs)."""
    return rng.geometric(1.0 / p.turns_mean, n) - 1 if p.turns_mean > 1 else np.zeros(n, dtype=np.int64)


@dataclass(frozen=True)
class BatchDraws:
    """One iteration's batch of a job, per sequence, as the running pool's compute emulator draws it
    (:func:`draw_batch`; ``infra.llm.sim.emulator`` sums it into device calls). Columns are turns."""

    n_turns: np.ndarray
    """``[n]`` turns of each sequence (>= 1)."""
    prompt: np.ndarray
    """``[n]`` prompt tokens."""
    turn_len: np.ndarray
    """``[n, turns]`` tokens generated in each turn (0 past a sequence's last)."""
    tool_s: np.ndarray
    """``[n, turns]`` tool call after each turn (0 where the sequence does not go on)."""
    tool_tokens: np.ndarray
    """``[n, turns]`` tokens the tool call returns (prefilled by the next turn)."""
    reward_s: float


def draw_batch(p: JobProfile, seed: int, iteration: int) -> BatchDraws:
    """Iteration ``iteration`` of job ``p`` on draw ``seed``, the emulator's stream (``batch_key`` + 7):
    per turn, the lengths of the sequences still going, then the tool calls of those that go on."""
    rng = np.random.default_rng([*batch_key(seed, p.name, iteration), 7])
    n = p.batch
    n_turns = 1 + (rng.geometric(1.0 / p.turns_mean, n) - 1 if p.turns_mean > 1 else np.zeros(n, dtype=np.int64))
    prompt = np.maximum(1, lognormal(rng, p.prompt_median, p.prompt_sigma, n))
    width = int(n_turns.max())
    turn_len, tool_s, tool_tokens = np.zeros((n, width)), np.zeros((n, width)), np.zeros((n, width))
    for k in range(width):
        on = np.flatnonzero(n_turns > k)
        turn_len[on, k] = np.clip(lognormal(rng, p.out_median, p.out_sigma, on.size), 1, p.out_cap)
        goes_on = on[n_turns[on] > k + 1]
        if goes_on.size:
            tool_s[goes_on, k] = np.minimum(lognormal(rng, p.tool_median_s, p.tool_sigma, goes_on.size), p.tool_cap_s)
        tool_tokens[goes_on, k] = np.maximum(1, lognormal(rng, p.tool_tokens_median, 0.5, goes_on.size))
    reward_s = float(lognormal(rng, p.reward_median_s, 0.5, 1)[0])
    return BatchDraws(n_turns, prompt, turn_len, tool_s, tool_tokens, reward_s)
