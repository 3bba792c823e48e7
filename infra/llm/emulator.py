"""Compute emulator: how long each device call of an RLVR job would hold its GPU.

On a machine without the GPUs (or with two CPU cores shared by many processes), running the
services' real compute would measure CPU contention, not multiplexing. The elastic pool
(:mod:`infra.llm.elastic`) therefore runs every generate and train call for real on a tiny model
and then *holds* its leased device until the duration this module draws for the call has
passed; everything else (scheduler, leases, queues, routing, weight swaps) is the running system.
Figures measured this way are labelled "emulated compute".

The durations follow the workload of :mod:`infra.llm.sim.workload` (``JobProfile``: long-tailed
turn lengths, multi-turn agents with tool stalls, CPU reward times) and the cost model of
``Hardware``, at the granularity the real services run: one turn of a job's batch on one instance
(sent in pieces, see ``infra.llm.elastic.Emulation.chunk_s``), one train request per update. Per turn, continuous batching of sequences
of lengths ``L_i`` takes ``max(L) * decode_step_s + decode_s_per_seq * sum(L)`` plus the prefill of
the turn's new tokens; the next turn starts when the slowest tool call of the sequences that go
on returns (a stall that holds no GPU). Every duration is multiplied by ``time_scale``, so that a
workload of hours runs in minutes; GPU-hours and slowdowns are compared after undoing the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infra.llm.sim.workload import Hardware, JobProfile


@dataclass(frozen=True)
class Turn:
    """One generate request of an iteration (seconds of workload time, before scaling)."""

    prompt_tokens: int
    """Tokens prefilled by this turn (prompts, then tool outputs)."""
    sequences: int
    """Sequences that decode in this turn."""
    prefill_s: float
    decode_s: float
    stall_s: float
    """Tool wait after this turn before the next one (0 after the last)."""


@dataclass(frozen=True)
class IterationWork:
    """The device and CPU time of one RLVR iteration of one job."""

    turns: tuple[Turn, ...]
    reward_s: float
    train_s: float
    tokens: int
    """Tokens generated (what the train step processes)."""

    @property
    def alone_s(self) -> float:
        """The iteration's length on a dedicated GPU that never waits."""
        return sum(t.prefill_s + t.decode_s + t.stall_s for t in self.turns) + self.reward_s + self.train_s


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


def draw_iteration(p: JobProfile, hw: Hardware, seed: int, iteration: int) -> IterationWork:
    """The work of iteration ``iteration`` of job ``p`` on draw ``seed`` (a stream of its own per job)."""
    key = [seed, sum(ord(c) * 31**k for k, c in enumerate(p.name)) % 2**31, iteration, 7]
    rng = np.random.default_rng(key)
    n = p.batch
    turns_of = 1 + (rng.geometric(1.0 / p.turns_mean, n) - 1 if p.turns_mean > 1 else np.zeros(n, dtype=np.int64))
    prompt = np.maximum(1, _lognormal(rng, p.prompt_median, p.prompt_sigma, n))
    prefill_per_token = 2 * p.params / (p.gpus * hw.peak_flops * hw.prefill_mfu)
    turns, tokens, new_tokens = [], 0.0, prompt
    for k in range(int(turns_of.max())):
        on = turns_of > k
        lengths = np.clip(_lognormal(rng, p.out_median, p.out_sigma, int(on.sum())), 1, p.out_cap)
        goes_on = turns_of[on] > k + 1
        stall = 0.0
        if goes_on.any():
            tool = np.minimum(_lognormal(rng, p.tool_median_s, p.tool_sigma, int(goes_on.sum())), p.tool_cap_s)
            stall = float(tool.max())
        pre = float(new_tokens[on].sum()) if k == 0 else float(new_tokens.sum())
        turns.append(Turn(int(pre), int(on.sum()), pre * prefill_per_token,
                          float(lengths.max() * hw.decode_step_s + hw.decode_s_per_seq * lengths.sum()), stall))
        tokens += float(lengths.sum())
        new_tokens = np.maximum(1, _lognormal(rng, p.tool_tokens_median, 0.5, int(goes_on.sum())))
    reward_s = float(_lognormal(rng, p.reward_median_s, 0.5, 1)[0])
    train_s = 10 * p.params * tokens / (p.gpus * hw.peak_flops * hw.train_mfu)
    return IterationWork(tuple(turns), reward_s, train_s, int(tokens))


def job_work(p: JobProfile, hw: Hardware, seed: int) -> list[IterationWork]:
    """Every iteration of job ``p`` on draw ``seed``."""
    return [draw_iteration(p, hw, seed, i) for i in range(p.iterations)]


def pace_s(p: JobProfile, hw: Hardware, seed: int) -> float:
    """Seconds per iteration of ``p`` alone, from draws ``seed`` (profile it on draws the run does not use)."""
    return float(np.mean([w.alone_s for w in job_work(p, hw, seed)]))


def swap_s(p: JobProfile, hw: Hardware, service: str) -> float:
    """Host-to-device copy when a GPU switches to job ``p``: its bf16 weights for a rollout instance;
    weights, gradients and Adam state in and out for a trainer (the costs of the simulation)."""
    if service == "rollout":
        return 2 * p.params / hw.pcie_bytes_per_s
    return 2 * 16 * p.params / p.gpus / hw.pcie_bytes_per_s
