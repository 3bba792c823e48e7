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
(sent in pieces, see ``Emulation.chunk_s``), one train request per update. Per turn, continuous batching of sequences
of lengths ``L_i`` takes ``max(L) * decode_step_s + decode_s_per_seq * sum(L)`` plus the prefill of
the turn's new tokens; the next turn starts when the slowest tool call of the sequences that go
on returns (a stall that holds no GPU). Every duration is multiplied by ``time_scale``, so that a
workload of hours runs in minutes; GPU-hours and slowdowns are compared after undoing the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infra.llm.sim.workload import Hardware, JobProfile, draw_batch


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


def draw_iteration(p: JobProfile, hw: Hardware, seed: int, iteration: int) -> IterationWork:
    """The work of iteration ``iteration`` of job ``p`` on draw ``seed`` (a stream of its own per job,
    :func:`infra.llm.sim.workload.draw_batch`): one turn of the sequences still going per request."""
    d = draw_batch(p, seed, iteration)
    prefill_per_token = 2 * p.params / (p.gpus * hw.peak_flops * hw.prefill_mfu)
    turns, tokens = [], 0.0
    for k in range(d.turn_len.shape[1]):
        on = np.flatnonzero(d.n_turns > k)
        lengths = d.turn_len[on, k]
        goes_on = on[d.n_turns[on] > k + 1]
        stall = float(d.tool_s[goes_on, k].max()) if goes_on.size else 0.0
        pre = float(d.prompt.sum()) if k == 0 else float(d.tool_tokens[d.n_turns > k, k - 1].sum())
        turns.append(Turn(int(pre), int(on.size), pre * prefill_per_token,
                          float(lengths.max() * hw.decode_step_s + hw.decode_s_per_seq * lengths.sum()), stall))
        tokens += float(lengths.sum())
    train_s = 10 * p.params * tokens / (p.gpus * hw.peak_flops * hw.train_mfu)
    return IterationWork(tuple(turns), d.reward_s, train_s, int(tokens))


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


@dataclass(frozen=True)
class Emulation:
    """Emulated compute of one job: its iterations' work, its profile's swap costs, the time scale."""

    work: list[IterationWork]
    rollout_swap_s: float
    trainer_swap_s: float
    scale: float
    """Wall seconds per workload second."""
    chunk_s: float = 10.0
    """Longest device hold of one generate request, in workload seconds: a turn's decoding is sent as
    requests of at most this much, each queued EDF again on the same slot (its KV cache is there), so a
    job with an earlier deadline waits for one chunk, not for another job's whole rollout."""

    @classmethod
    def of(cls, profile: JobProfile, hw: Hardware, work: list[IterationWork], scale: float,
           chunk_s: float = 10.0) -> Emulation:
        """The emulation of ``profile``'s ``work`` on ``hw`` at ``scale``."""
        return cls(work, swap_s(profile, hw, "rollout"), swap_s(profile, hw, "trainer"), scale, chunk_s)
