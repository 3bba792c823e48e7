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
  jobs' state is untouched;
- a trainer call that leaves a job's loss or weights non-finite raises :class:`JobStopped` before
  the job's checkpoint is written, so the checkpoint on disk keeps the last finite state.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from infra.llm import trainer_checkpoint as ckpt
from infra.llm.engine import GenerationEngine, load_engine
from infra.llm.grpo_trainer import GRPOTrainer
from infra.llm.model import ModelConfig
from infra.llm.reward import RewardBatch, RewardRunner
from infra.llm.trainer_checkpoint import CheckpointError, CheckpointSpec
from rlcore.update_config import GRPOConfig


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


class JobStopped(RuntimeError):
    """A job stopped itself so that its saved work stays good: its loss, weights or rewards went
    non-finite, or too many of its reward calls failed. Nothing was saved after the fault."""


def _unknown_job(job: str, known: list[str]) -> KeyError:
    return KeyError(f"job {job!r} is not registered on this service (registered: {known}); call register_job first.")


def _host_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host-memory copy of ``state`` (pinned when CUDA is present, for fast swaps)."""
    pin = torch.cuda.is_available()
    return {k: (v.detach().to("cpu", copy=True).pin_memory() if pin else v.detach().to("cpu", copy=True)) for k, v in state.items()}


def service_device(device: str) -> str:
    """``auto``: the GPU Ray gave this process when CUDA has one (logical GPUs on a CPU box: ``cpu``)."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class RolloutService(_Sliced):
    """Batched generation for several jobs over one device-resident engine.

    Each job's weights are kept in host memory; the engine holds one job's weights at a time and is
    swapped to the calling job's weights at the start of its slice.
    """

    def __init__(self, model_cfg: ModelConfig, *, engine: str | None = None, device: str = "cpu") -> None:
        super().__init__()
        # engine None: the default engine of the model's kind (infra.llm.engine.DEFAULT_ENGINES)
        self.engine: GenerationEngine = load_engine(engine, model_cfg, device=service_device(device))
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
    """Rewards of completions against reference answers, each reward (``module:function``) in its own
    worker process under a time limit (:class:`~infra.llm.reward.RewardRunner`), kept across calls."""

    def __init__(self) -> None:
        super().__init__()
        self._runners: dict[tuple[str, float, float], RewardRunner] = {}

    def score(
        self, job: str, reward: str, prompts: list[str], completions: list[str], answers: list[str], timeout_s: float,
        import_timeout_s: float = 60.0,
    ) -> RewardBatch:
        """``reward(prompt, completion, answer)`` per sample; a call that raises or times out scores 0 and is counted.

        Raises:
            RewardUnavailable: the reward's worker cannot import it within ``import_timeout_s``.
        """
        with self._slice(job, "score"):
            key = (reward, timeout_s, import_timeout_s)
            if key not in self._runners:
                self._runners[key] = RewardRunner(reward, timeout_s, import_timeout_s)
            return self._runners[key].score(prompts, completions, answers)

    def close(self) -> None:
        """Stop the reward worker processes."""
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()


@dataclass
class _TrainerJob:
    """One job on the trainer service: its GRPO state, where it is checkpointed, and its call record."""

    trainer: GRPOTrainer
    checkpoint: CheckpointSpec | None
    seed: int
    rng: dict[str, torch.Tensor] = field(default_factory=dict)
    """The job's own torch RNG states (``cpu``, ``cuda``), swapped in for its slices (dropout draws)."""
    step: int = 0
    """State-changing calls applied: warm-up steps, the end of the warm-up, GRPO updates."""
    last: Any = None
    """Result of the last state-changing call, answered again when a crash lost its reply."""


def _check_finite(job: str, fn: str, step: int, trainer: GRPOTrainer, result: Any) -> None:
    """Raise :class:`JobStopped` when the call's result (a loss, or a dict of diagnostics) or any weight
    of ``trainer`` is NaN or infinite.

    The weights are summed (one read of each on its device; a NaN or infinity anywhere makes the sum
    non-finite), far cheaper than an elementwise test: 76 ms against 1.6 s for an 85M-parameter model
    on one CPU thread of the loaded 2-core VM. Only a non-finite sum pays for finding the bad tensors."""
    values = result.values() if isinstance(result, dict) else [] if result is None else [result]
    bad = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
    params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        total = float(torch.stack([p.sum() for p in params.values()]).sum())
    if not bad and not math.isfinite(total):
        bad = [n for n, p in params.items() if not bool(torch.isfinite(p).all())][:3] or ["the weights' sum"]
    if bad:
        raise JobStopped(f"job {job!r}: {fn} (state-changing call {step}) made the loss or weights non-finite "
                         f"({bad}); it stopped before checkpointing this state (the checkpoint keeps the last finite one). "
                         "Scale the reward to a few units, or lower grpo.optim.lr.")


class TrainerService(_Sliced):
    """GRPO training for several jobs; each job's model, reference and optimiser live in host memory
    between its slices and are moved onto the device for its slice.

    A job registered with a :class:`~infra.llm.trainer_checkpoint.CheckpointSpec` is written to its
    directory at registration and after every ``every``-th state-changing call (supervised step,
    ``finish_warmup``, ``train``), together with its step, RNG states and last result; a trainer
    started again registers it with ``resume=True`` and continues from there, never from the seed.
    Callers that pass ``step`` (the job's count of state-changing calls before this one) get a call
    that was applied before a crash answered from the record instead of applied twice.
    """

    def __init__(self, *, device: str = "cpu") -> None:
        super().__init__()
        self.device = service_device(device)
        self._jobs: dict[str, _TrainerJob] = {}

    def register_job(
        self, job: str, model_cfg: ModelConfig, cfg: GRPOConfig, seed: int,
        checkpoint: CheckpointSpec | None = None, resume: bool = False,
    ) -> int:
        """Create ``job``'s model from ``seed`` (host memory), or with ``resume`` restore it from its
        checkpoint; returns the job's step. A fresh registration with ``checkpoint`` writes step 0
        there at once, into a directory that holds no checkpoint yet.

        Raises:
            CheckpointError: ``resume`` and the checkpoint is absent, broken or another job's, or the
                job has no checkpoint at all (its state died with an earlier trainer); or a fresh
                registration whose directory already holds a checkpoint (it is never overwritten).
        """
        if checkpoint is not None:
            checkpoint.validate()
            path = ckpt.checkpoint_path(checkpoint.dir)
            if not resume and path.exists():
                raise CheckpointError(f"job {job!r}: {path} already holds a trainer checkpoint, which a fresh start would "
                                      "overwrite; resume the job from it (resume=true), or give the job another name or "
                                      "checkpoint directory.")
        elif resume:
            raise CheckpointError(f"job {job!r} was registered without a checkpoint, so its trainer state died with the "
                                  "service; register it with checkpoint=CheckpointSpec(dir) to survive restarts.")
        with self._slice(job, "register"):
            trainer = GRPOTrainer.from_config(model_cfg, cfg, seed=seed)
            record = _TrainerJob(trainer, checkpoint, seed)
            if resume:
                payload = ckpt.load(ckpt.checkpoint_path(checkpoint.dir), job)
                ckpt.restore_trainer(trainer, payload)
                record.step, record.rng, record.last = payload["step"], payload["rng"], payload["last"]
            elif checkpoint is not None:
                self._save(job, record, checkpoint)
            self._jobs[job] = record
            return record.step

    def unregister_job(self, job: str) -> None:
        """Drop ``job``'s state (its checkpoint stays on disk)."""
        with self._slice(job, "unregister"):
            self._jobs.pop(job, None)

    def _record(self, job: str) -> _TrainerJob:
        if job not in self._jobs:
            raise _unknown_job(job, sorted(self._jobs))
        return self._jobs[job]

    def _save(self, job: str, record: _TrainerJob, spec: CheckpointSpec) -> None:
        payload = ckpt.trainer_payload(job, record.trainer, step=record.step, rng=record.rng, last=record.last)
        ckpt.save(ckpt.checkpoint_path(spec.dir), payload)

    @contextmanager
    def _swapped(self, record: _TrainerJob) -> Iterator[GRPOTrainer]:
        """The job's state on the device and its RNG streams in force for the body of a slice."""
        dev = torch.device(self.device)
        cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
        record.trainer.to(dev)  # host -> device at slice start
        # The job's own random streams: other jobs' slices never shift them, and a restored job
        # draws what it would have drawn.
        with torch.random.fork_rng(devices=cuda):
            if record.rng:
                torch.set_rng_state(record.rng["cpu"])
                if cuda and "cuda" in record.rng:
                    torch.cuda.set_rng_state(record.rng["cuda"], cuda[0])
            else:
                torch.manual_seed(record.seed)  # seeds the CUDA generators too
            try:
                yield record.trainer
            finally:
                record.rng = {"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(cuda[0])} if cuda else {})}
                record.trainer.to("cpu")  # back to host memory at slice end

    def _mutate(self, job: str, fn: str, step: int | None, apply: Callable[[GRPOTrainer], Any]) -> Any:
        """Run one state-changing call as a slice: check ``step``, apply, count, checkpoint when due."""
        with self._slice(job, fn):
            record = self._record(job)
            if step is not None and step != record.step:
                if step == record.step - 1:
                    return record.last  # applied before a crash lost its reply: answer it, do not apply it twice
                where = f" (checkpoint every {record.checkpoint.every} in {record.checkpoint.dir})" if record.checkpoint else ""
                raise CheckpointError(f"job {job!r} sent {fn} as its state-changing call {step} but its trainer is at "
                                      f"{record.step}{where}; calls were lost in a restart: checkpoint with every=1, or "
                                      f"resume the job from its checkpoint's step.")
            with self._swapped(record) as trainer:
                record.last = apply(trainer)
                _check_finite(job, fn, record.step, trainer, record.last)
            record.step += 1
            if record.checkpoint is not None and record.step % record.checkpoint.every == 0:
                self._save(job, record, record.checkpoint)
            return record.last

    def supervised(self, job: str, prompts: list[list[int]], answers: list[list[int]], step: int | None = None) -> float:
        """One supervised (format warm-up) step; returns the loss."""
        return self._mutate(job, "supervised", step, lambda t: t.supervised_step(prompts, answers))

    def finish_warmup(self, job: str, step: int | None = None) -> None:
        """Freeze the current policy as ``job``'s KL reference and reset its optimiser."""
        self._mutate(job, "finish_warmup", step, lambda t: t.sync_reference())

    def train(
        self, job: str, prompts: list[list[int]], completions: list[list[int]], rewards: list[float],
        step: int | None = None,
    ) -> dict[str, float]:
        """One GRPO update of ``job`` (its group size is the registered ``cfg.group_size``); returns its diagnostics."""
        return self._mutate(job, "train", step, lambda t: t.update(prompts, completions, rewards))

    def weights(self, job: str) -> tuple[dict[str, torch.Tensor], int]:
        """``job``'s current weights (host copies) and version."""
        with self._slice(job, "weights"):
            t = self._record(job).trainer
            return {k: v.detach().clone() for k, v in t.model.state_dict().items()}, t.version

    def jobs(self) -> list[str]:
        """Registered jobs."""
        return sorted(self._jobs)

