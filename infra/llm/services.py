"""The LLM job's services: rollout (generation), reward (verification) and trainer (GRPO).

Each service is a plain class, usable in-process, that becomes a long-lived Ray actor when
placed by :mod:`infra.llm.service_plane`. Every service serves several jobs at once:

- a job registers once; its state (weights; for the trainer also the reference model and the
  optimiser) stays resident in the service's host memory for the job's lifetime;
- each call is one *slice*: it runs for one job, alone (a lock serialises slices even when the
  actor is threaded), and starts by swapping that job's state onto the service's device when
  another job's state is there (a host-to-device copy, never a reload from disk);
- the service logs every slice (job, function, start, end on the machine's monotonic clock), so
  tests and the multiplexer can check that slices of different jobs never overlap;
- a failing call fails only its own job: the exception is raised to that caller, and the other
  jobs' state is untouched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from infra.llm.engine import GenerationEngine, load_engine
from infra.llm.grpo import GRPOConfig, GRPOTrainer
from infra.llm.model import ModelConfig
from infra.llm.tasks import EOS, PAD, exact_reward, load_task


@dataclass(frozen=True)
class SliceRecord:
    """One function call of one job on one service."""

    job: str
    fn: str
    start: float
    end: float


class _Sliced:
    """Serialises calls into slices and logs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: list[SliceRecord] = []

    @contextmanager
    def _slice(self, job: str, fn: str) -> Iterator[None]:
        with self._lock:
            start = time.monotonic()
            try:
                yield
            finally:
                self._log.append(SliceRecord(job, fn, start, time.monotonic()))

    def slices(self) -> list[SliceRecord]:
        """Every slice run so far, in start order."""
        return list(self._log)


def _unknown_job(job: str, known: list[str]) -> KeyError:
    return KeyError(f"job {job!r} is not registered on this service (registered: {known}); call register_job first.")


def _host_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host-memory copy of ``state`` (pinned when CUDA is present, for fast swaps)."""
    pin = torch.cuda.is_available()
    return {k: (v.detach().to("cpu", copy=True).pin_memory() if pin else v.detach().to("cpu", copy=True)) for k, v in state.items()}


def resolve_device(device: str) -> str:
    """``auto``: the GPU Ray gave this process when CUDA has one (logical GPUs on a CPU box: ``cpu``)."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class RolloutService(_Sliced):
    """Batched generation for several jobs over one device-resident engine.

    Each job's weights are kept in host memory; the engine holds one job's weights at a time and is
    swapped to the calling job's weights at the start of its slice.
    """

    def __init__(self, model_cfg: ModelConfig, *, engine: str = "torch", device: str = "cpu") -> None:
        super().__init__()
        self.engine: GenerationEngine = load_engine(engine, model_cfg, eos_id=EOS, pad_id=PAD,
                                                    device=resolve_device(device))
        self._host: dict[str, dict[str, torch.Tensor]] = {}
        self._versions: dict[str, int] = {}
        self._resident: str | None = None
        self.swaps = 0

    def register_job(self, job: str, state: dict[str, torch.Tensor], version: int = 0) -> None:
        """Keep ``state`` resident in host memory for ``job`` (replaces an earlier registration)."""
        with self._slice(job, "register"):
            self._host[job] = _host_copy(state)
            self._versions[job] = version
            if self._resident == job:
                self._resident = None

    def update_weights(self, job: str, state: dict[str, torch.Tensor], version: int) -> None:
        """New weights for ``job`` from its trainer (copied into its host buffer)."""
        with self._slice(job, "update_weights"):
            if job not in self._host:
                raise _unknown_job(job, sorted(self._host))
            for k, v in state.items():
                self._host[job][k].copy_(v)
            self._versions[job] = version
            if self._resident == job:
                self._resident = None

    def unregister_job(self, job: str) -> None:
        """Drop ``job``'s state (its run ended or crashed)."""
        with self._slice(job, "unregister"):
            self._host.pop(job, None)
            self._versions.pop(job, None)
            if self._resident == job:
                self._resident = None

    def generate(
        self, job: str, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, seed: int = 0
    ) -> tuple[list[list[int]], int]:
        """Sample one completion per prompt with ``job``'s weights; returns (completions, weight version)."""
        with self._slice(job, "generate"):
            if job not in self._host:
                raise _unknown_job(job, sorted(self._host))
            if self._resident != job:
                self.engine.load_weights(self._host[job])  # host -> device swap
                self._resident = job
                self.swaps += 1
            return self.engine.generate(prompts, max_new_tokens, temperature=temperature, seed=seed), self._versions[job]

    def jobs(self) -> list[str]:
        """Registered jobs."""
        return sorted(self._host)

    @property
    def resident(self) -> str | None:
        """The job whose current weights the engine holds (None: none, or stale after an update)."""
        return self._resident


class RewardService(_Sliced):
    """Verifiable rewards: recomputes each prompt's answer and checks the completion exactly."""

    def score(self, job: str, task: str, size: int, prompts: list[str], completions: list[list[int]]) -> list[float]:
        """1.0 per completion equal to its prompt's answer (then EOS), else 0.0."""
        with self._slice(job, "score"):
            if len(prompts) != len(completions):
                raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions; pass one per prompt.")
            t = load_task(task, size)
            return [exact_reward(t, p, c) for p, c in zip(prompts, completions)]


class TrainerService(_Sliced):
    """GRPO training for several jobs; each job's model, reference and optimiser live in host memory
    between its slices and are moved onto the device for its slice."""

    def __init__(self, *, device: str = "cpu") -> None:
        super().__init__()
        self.device = resolve_device(device)
        self._jobs: dict[str, GRPOTrainer] = {}

    def register_job(self, job: str, model_cfg: ModelConfig, cfg: GRPOConfig, seed: int) -> None:
        """Create ``job``'s model from ``seed`` (host memory)."""
        with self._slice(job, "register"):
            self._jobs[job] = GRPOTrainer.from_config(model_cfg, cfg, pad_id=PAD, eos_id=EOS, seed=seed)

    def unregister_job(self, job: str) -> None:
        """Drop ``job``'s state."""
        with self._slice(job, "unregister"):
            self._jobs.pop(job, None)

    @contextmanager
    def _on_device(self, job: str, fn: str) -> Iterator[GRPOTrainer]:
        with self._slice(job, fn):
            if job not in self._jobs:
                raise _unknown_job(job, sorted(self._jobs))
            trainer = self._jobs[job]
            trainer.to(self.device)  # host -> device at slice start
            try:
                yield trainer
            finally:
                trainer.to("cpu")  # back to host memory at slice end

    def supervised(self, job: str, prompts: list[list[int]], answers: list[list[int]]) -> float:
        """One supervised (format warm-up) step; returns the loss."""
        with self._on_device(job, "supervised") as t:
            return t.supervised_step(prompts, answers)

    def finish_warmup(self, job: str) -> None:
        """Freeze the current policy as ``job``'s KL reference and reset its optimiser."""
        with self._on_device(job, "finish_warmup") as t:
            t.sync_reference()

    def train(
        self, job: str, prompts: list[list[int]], completions: list[list[int]], rewards: list[float], group_size: int
    ) -> dict[str, float]:
        """One GRPO update of ``job``; returns its diagnostics."""
        with self._on_device(job, "train") as t:
            return t.update(prompts, completions, rewards, group_size)

    def weights(self, job: str) -> tuple[dict[str, torch.Tensor], int]:
        """``job``'s current weights (host copies) and version."""
        with self._slice(job, "weights"):
            if job not in self._jobs:
                raise _unknown_job(job, sorted(self._jobs))
            t = self._jobs[job]
            return {k: v.detach().clone() for k, v in t.model.state_dict().items()}, t.version

    def jobs(self) -> list[str]:
        """Registered jobs."""
        return sorted(self._jobs)

