"""Cross-job multiplexing: several RLVR jobs share the rollout and trainer services of a GPU group.

PlexRL's observation (arXiv 2605.20863) is that one RLVR job leaves its GPUs idle for long
stretches (verification on CPU, tool stalls, waiting for the slowest rollout) and that these gaps
are largely anti-correlated across jobs. Here a *GPU group* is a set of GPUs hosting one rollout
service and one trainer service (affinity: a job's trainer and rollout on the same GPUs); several
jobs are admitted to a group and its GPUs are time-sliced among them by phase:

- a slice is one phase of one job (``generate`` on the rollout service, ``train`` on the trainer);
  the group runs one slice at a time and grants waiting jobs in arrival order (a FIFO ticket lock),
  so a job's CPU phases (reward, tool stalls) are filled by other jobs' GPU phases;
- each job's weights stay resident in the group's host memory; the service swaps them onto the
  device at the start of the job's slice (see :mod:`infra.llm.service_actors`); models never move
  between actors or nodes, and a job is only ever sliced on the group that holds its state;
- admission refuses a job whose model cannot fit any GPU, or whose state does not fit the
  group's host memory, with the reason;
- a job that raises (its own bug, a bad request) is recorded as failed and removed from the
  services; the other jobs keep running.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from infra.llm.gpu_group import BYTES_PER_PARAM_TRAIN_STATE, BYTES_PER_PARAM_WEIGHTS, GPUGroup
from infra.llm.handles import JobServices, ServiceHandle
from infra.llm.rlvr import JobResult, RLVRConfig, run_job


class JobRefused(ValueError):
    """A job that no GPU group can run, with the reason."""


@dataclass(frozen=True)
class LLMJobSpec:
    """What the multiplexer needs to admit a job."""

    name: str
    num_params: int
    """Model parameters."""
    nodes: tuple[str, ...] = ()
    """Nodes that already hold this job's state (affinity); empty = any node."""


@dataclass(frozen=True)
class GroupSlice:
    """A slice granted on a group (driver-side record)."""

    group: str
    job: str
    phase: str
    start: float
    end: float


class _FifoLock:
    """A lock granted in request order (so no job starves while another loops on its phases)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[int] = deque()
        self._next = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._cv:
            ticket = self._next
            self._next += 1
            self._queue.append(ticket)
            self._cv.wait_for(lambda: self._queue[0] == ticket)
        try:
            yield
        finally:
            with self._cv:
                self._queue.popleft()
                self._cv.notify_all()


class Multiplexer:
    """Admits jobs to GPU groups and time-slices each group's services across its jobs by phase."""

    def __init__(self, groups: list[GPUGroup], reward: ServiceHandle) -> None:
        if not groups:
            raise ValueError("Multiplexer needs at least one GPU group; place one with infra.llm.service_plane.")
        self.groups = {g.name: g for g in groups}
        self.reward = reward
        self._locks = {g.name: _FifoLock() for g in groups}
        self._job_group: dict[str, str] = {}
        self._log: list[GroupSlice] = []
        self._log_lock = threading.Lock()

    def admit(self, spec: LLMJobSpec) -> str:
        """Choose the group of ``spec`` (the least loaded that fits); raises :class:`JobRefused`."""
        if spec.name in self._job_group:
            raise JobRefused(f"job {spec.name!r} is already admitted (group {self._job_group[spec.name]}); pick a new name.")
        weights_mib = spec.num_params * BYTES_PER_PARAM_WEIGHTS / 2**20
        largest = max(g.gpu_memory_mib for g in self.groups.values())
        if weights_mib > largest:
            raise JobRefused(
                f"job {spec.name!r}: its model needs {weights_mib:,.0f} MiB for the weights alone, more than the "
                f"largest GPU ({largest:,} MiB); use a smaller model or add GPUs with more memory."
            )
        state_mib = spec.num_params * BYTES_PER_PARAM_TRAIN_STATE / 2**20
        reasons = []
        candidates = []
        for g in self.groups.values():
            if spec.nodes and g.node not in spec.nodes:
                reasons.append(f"{g.name}: node {g.node} does not hold the job's state (nodes {list(spec.nodes)})")
            elif state_mib / g.num_gpus > g.gpu_memory_mib:
                reasons.append(f"{g.name}: training state {state_mib:,.0f} MiB over {g.num_gpus} GPU(s) of {g.gpu_memory_mib:,} MiB")
            elif g.host_used_mib + state_mib > g.host_memory_mib:
                reasons.append(f"{g.name}: host memory {g.host_used_mib + state_mib:,.0f} > {g.host_memory_mib:,} MiB")
            else:
                candidates.append(g)
        if not candidates:
            raise JobRefused(f"job {spec.name!r} fits no GPU group: " + "; ".join(reasons))
        group = min(candidates, key=lambda g: (len(g.jobs), g.name))
        group.jobs.append(spec.name)
        group.host_used_mib += int(state_mib)
        self._job_group[spec.name] = group.name
        return group.name

    def release(self, job: str) -> None:
        """Forget ``job`` (after it ended or failed)."""
        name = self._job_group.pop(job, None)
        if name is not None:
            self.groups[name].jobs.remove(job)

    @contextmanager
    def slice(self, job: str, phase: str) -> Iterator[None]:
        """Hold ``job``'s group exclusively for one phase."""
        group = self._job_group.get(job)
        if group is None:
            raise KeyError(f"job {job!r} is not admitted; call Multiplexer.admit first.")
        with self._locks[group].hold():
            start = time.monotonic()
            try:
                yield
            finally:
                with self._log_lock:
                    self._log.append(GroupSlice(group, job, phase, start, time.monotonic()))

    def slices(self) -> list[GroupSlice]:
        """Every slice granted so far."""
        with self._log_lock:
            return list(self._log)

    def services(self, job: str) -> JobServices:
        """The services of ``job``'s group."""
        g = self.groups[self._job_group[job]]
        return JobServices(rollout=g.rollout, reward=self.reward, trainer=g.trainer)

    def run(self, jobs: list[tuple[LLMJobSpec, RLVRConfig]], timeout_s: float = 600.0) -> dict[str, JobResult | BaseException]:
        """Admit and run ``jobs`` concurrently; returns each job's result, or the exception it died of."""
        results: dict[str, JobResult | BaseException] = {}
        for spec, _ in jobs:
            self.admit(spec)

        def work(spec: LLMJobSpec, cfg: RLVRConfig) -> None:
            try:
                results[spec.name] = run_job(spec.name, cfg, self.services(spec.name), slicer=self)
            except BaseException as e:  # one job's crash is recorded, never propagated to the others
                results[spec.name] = e
            finally:
                self.release(spec.name)

        threads = [threading.Thread(target=work, args=job, name=f"llm-job-{job[0].name}", daemon=True) for job in jobs]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for spec, _ in jobs:
            results.setdefault(spec.name, TimeoutError(f"job {spec.name!r} did not finish within {timeout_s} s"))
        return results
