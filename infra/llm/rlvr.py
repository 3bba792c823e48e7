"""The RLVR job: warm-up, then rollout -> verifiable reward -> GRPO update, over three services.

``run_job`` is the loop of one job against service handles (in-process objects or Ray actors),
so the same code runs alone, on Ray, or multiplexed with other jobs (the multiplexer passes a
``slicer`` that grants the job its time slices on the shared GPU group). ``run_rlvr`` is what
``scripts/llm_rlvr.py`` calls: it builds the services, runs one job, and writes its run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from infra.common.files import write_atomic
from infra.common.limits import check_param_bytes, check_threads
from infra.common.run_dir import RunDirLock, check_run_name
from infra.common.runlog import CONFIG, Curves, LogConfig, Panel, RunLog, read_config
from infra.common.typed_config import ConfigError
from infra.llm import trainer_checkpoint as ckpt
from infra.llm.data import DataConfig, load_file_source
from infra.llm.grpo_trainer import check_grpo, llm_grpo_config
from infra.llm.handles import JobServices, LocalHandle
from infra.llm.lm import Codec, HFCausalLM, build_model, check_model, load_codec
from infra.llm.model import ModelConfig
from infra.llm.reward import RewardBatch, check_reward
from infra.llm.service_actors import JobStopped, RewardService, RolloutService, TrainerService
from infra.llm.service_plane import ray_job_services
from infra.llm.trainer_checkpoint import CheckpointSpec
from infra.llm.verifiable_tasks import VOCAB_SIZE, Example, PromptSource, TaskSource, load_task
from rlcore.losses import group_advantages
from rlcore.update_config import GRPOConfig

log = logging.getLogger(__name__)


@dataclass
class RLVRConfig:
    """One RLVR job: a model (``model``), prompts with reference answers (``data``, or a built-in
    ``task``) and a verifiable reward (``reward``)."""

    name: str = "rlvr_sort"
    """Run name; outputs go to ``out_dir/name``. A name whose run exists (its config, model or trainer
    checkpoint) is refused unless ``resume``: a run's outputs and checkpoint are never overwritten."""
    resume: bool = False
    """Continue the run ``out_dir/name`` from its trainer checkpoint (same config; ``device``, ``threads``,
    ``ray``, ``priority`` and ``tenant`` may differ): the remaining warm-up steps and iterations run as
    they would have without the interruption."""
    task: str = "sort"
    """Built-in task, used when ``data.path`` is empty: ``sort`` or ``add``."""
    task_size: int = 4
    """Digits to sort, or digits per addend."""
    seed: int = 0
    """Seeds the model init, prompt draws and sampling."""
    iterations: int = 100
    """GRPO iterations (one rollout batch and one update each)."""
    prompts_per_iter: int = 32
    """Prompts per rollout batch P."""
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    warmup_steps: int = 40
    """Supervised steps on the task (answers given) before RL: teaches the output format and a
    little of the task, leaving the policy weak so that RL has to do the learning. 0 disables."""
    warmup_batch: int = 32
    """Examples per warm-up step."""
    eval_prompts: int = 256
    """Held-out prompts for the greedy accuracy reported before and after RL."""
    eval_every: int = 20
    """Greedy evaluation period, in iterations."""
    threads: int = 2
    """torch intra-op threads."""
    device: str = "auto"
    """Device of the in-process rollout and trainer services: ``auto`` (CUDA when torch sees a GPU,
    else ``cpu``), ``cpu``, ``cuda`` or ``cuda:N``. On Ray each service uses the GPU it was placed on."""
    out_dir: str = "runs"
    """Output root."""
    ray: bool | str = False
    """Run the three services as Ray actors placed by the cluster's scheduler service instead of
    in-process: ``true``/``local`` starts a one-node Ray cluster here, an address (``auto``,
    ``HOST:PORT``) joins that cluster and its service, shared with every other job there."""
    priority: int = 0
    """Priority of the job's gangs in the scheduler service (``ray`` only)."""
    tenant: str = "default"
    """Tenant whose GPU quota the job's gangs use (``ray`` only)."""
    checkpoint_dir: str = ""
    """The trainer's checkpoint directory for this job (``""``: ``<out_dir>/<name>/checkpoints``); on a
    cluster, a path on a filesystem every node that may host the trainer shares."""
    checkpoint_every: int = CheckpointSpec.every
    """Checkpoint the trainer after every N-th state-changing call (warm-up step, end of the warm-up,
    GRPO update); 1 makes a trainer crash invisible to the job; 0 turns checkpoints off, and a
    trainer crash then fails the job with an error."""
    data: DataConfig = field(default_factory=DataConfig)
    """A user's prompts and reference answers (JSONL or parquet); empty ``path``: the built-in ``task``."""
    reward: str = "infra.llm.verifiable_tasks:exact_match"
    """The reward, ``module:function`` (a module on ``PYTHONPATH`` or in the working directory) or
    ``path/to/file.py:function``, with signature ``(prompt, completion, answer) -> float``; it runs
    in a worker process, and a call that raises or outlives ``reward_timeout_s`` scores 0 and is counted."""
    reward_timeout_s: float = 10.0
    """Time limit of one reward call, in seconds."""
    reward_import_timeout_s: float = 60.0
    """Time limit of the reward worker's import of the reward module (at the check, and at every start
    of the worker), apart from ``reward_timeout_s``; an import that fails or outlives it stops the job."""
    reward_max_failed_share: float = 0.5
    """The job stops (non-zero exit, nothing saved) once more than this share of all its reward calls so
    far (sampled and held-out) raised, returned no finite number, or timed out; 1 never stops."""
    max_new_tokens: int = 0
    """Longest completion in tokens; 0: one more than the longest reference answer (room for EOS)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(vocab_size=VOCAB_SIZE))
    """The policy: ``model.path=DIR`` a Hugging Face causal LM (the default kind, ``hf``), or
    ``model.kind=char`` the tiny character model of the CPU demo (sizes ``model.d_model=...``)."""
    grpo: GRPOConfig = field(default_factory=llm_grpo_config)
    """The GRPO update, in the VLA trainer's shape (:class:`rlcore.update_config.GRPOConfig`): ``grpo.group_size``
    completions per prompt, ``grpo.optim.lr=...`` and the other fields the LLM trainer implements."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the first bad value and the fix: the
        ranges, the device's spelling, the GRPO update and the model's sizes. Reads no file, device or module
        (:meth:`check` does), so ``typed_config`` runs it on every config it builds."""
        self._check_ranges()
        check_run_name(self.name)
        check_grpo(self.grpo)
        if not (self.device in ("auto", "cpu") or self.device.split(":")[0] == "cuda"):
            raise ConfigError(f"device={self.device!r}; choose auto, cpu, cuda or cuda:N.")
        self.model.validate()

    def check(self) -> None:
        """:meth:`validate`, then what the job needs from this machine and its files: the device, model
        folder, data file, reward module, lengths, the rollout batch's memory and the run directory; all
        before any service starts or any file is written. Raises ``ValueError`` (a ``ConfigError`` for this
        config's own fields) naming the field and the fix."""
        self.validate()
        check_threads(self.threads)
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={self.device!r} but torch sees no CUDA device; use device=cpu (or auto).")
        check_model(self.model)
        # weights, gradients and Adam's two moments in float32, from the sizes alone (nothing built yet)
        check_param_bytes(self.model.num_params(), f"model ({self.model.kind}) to train", bytes_per=16)
        inputs = job_inputs(self)
        try:
            longest = max(len(inputs.codec.encode(e.prompt)) for e in inputs.source.probe()) + inputs.max_new_tokens
        except ValueError as e:
            raise ConfigError(f"{e} The char model reads only the built-in tasks; use model.kind=hf for other text.") from e
        limit = self.model.max_len if self.model.kind == "char" else HFCausalLM.max_positions_of(self.model.path)
        if limit is not None and longest > limit:
            raise ConfigError(
                f"prompts + completions need {longest} tokens but the model has {limit} positions; "
                "shorten the prompts, lower max_new_tokens, or use a model with more positions."
            )
        self._check_memory(longest)
        check_reward(self.reward, self.reward_import_timeout_s)
        self._check_run_dir()

    def _check_ranges(self) -> None:
        """Counts at least 1 (or 0), times finite and positive, the temperature finite and >= 0."""
        for name in ("iterations", "prompts_per_iter", "warmup_batch", "eval_prompts", "eval_every", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1.")
        for name in ("seed", "warmup_steps", "max_new_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0.")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be >= 0 (0 turns trainer checkpoints off).")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature={self.temperature} must be a finite number >= 0 (0: greedy; 1: the "
                              "model's own distribution).")
        for name in ("reward_timeout_s", "reward_import_timeout_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0 (a finite number of seconds).")
        if not 0 <= self.reward_max_failed_share <= 1:  # NaN fails both comparisons
            raise ConfigError(f"reward_max_failed_share={self.reward_max_failed_share} must be in [0, 1] (1: never stop).")

    def _check_memory(self, tokens: int) -> None:
        """Refuse a batch whose KV cache and logits alone (float32) exceed the memory of the device the
        in-process services use (on Ray the services' machines are not known here: not checked)."""
        if self.ray:
            return
        batches = {f"prompts_per_iter={self.prompts_per_iter} x grpo.group_size={self.grpo.group_size}":
                   (self.prompts_per_iter * self.grpo.group_size, self.grpo.group_size),
                   f"eval_prompts={self.eval_prompts}": (self.eval_prompts, 1),
                   f"warmup_batch={self.warmup_batch}": (self.warmup_batch, 1)}
        what, (batch, per_field) = max(batches.items(), key=lambda kv: kv[1][0])
        per_seq = sequence_bytes(self.model, tokens)
        where, have = device_memory(self.device)
        if batch * per_seq > have:
            field_name = what.split("=")[0]
            raise ConfigError(
                f"{what} = {batch} sequences of up to {tokens} tokens need at least {batch * per_seq / 2**30:.1f} GiB "
                f"(KV cache and logits in float32) but {where} has {have / 2**30:.1f} GiB; lower {field_name} to at "
                f"most {have // (per_seq * per_field)}.")

    def _check_run_dir(self) -> None:
        """Refuse a run name that exists unless ``resume``; with ``resume``, require its checkpoint and config."""
        out = Path(self.out_dir) / self.name
        spec = checkpoint_spec(self)
        saved = ckpt.checkpoint_path(spec.dir) if spec else None
        if not self.resume:
            existing = [p for p in (saved, out / CONFIG, out / "model") if p is not None and p.exists()]
            if existing:
                raise ConfigError(f"run {self.name!r} already exists ({existing[0]}); pass resume=true to continue it "
                                  "from its checkpoint, or choose another name= (a run is never overwritten).")
            return
        if saved is None or not saved.exists():
            raise ConfigError(f"resume=true but {saved or 'checkpoint_every=0'} holds no trainer checkpoint of run "
                              f"{self.name!r}; start it again under another name=, or without resume.")
        before = read_config(out)
        if before is not None:
            now = plain_config(self)
            differ = sorted(k for k in now.keys() - RESUME_MAY_CHANGE if before.get(k) != now[k])
            if differ:
                raise ConfigError(f"resume=true but {differ} differ from {out / CONFIG}; a run continues only "
                                  "with its own config (start a new name= for a new one).")


def plain_config(cfg: RLVRConfig) -> dict[str, Any]:
    """``cfg`` as plain YAML types (tuples become lists), the form written to the run's ``config.yaml``."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


RESUME_MAY_CHANGE = frozenset({"resume", "device", "threads", "ray", "priority", "tenant"})
"""Fields a resumed run may change: where and how fast it runs, not what it computes."""


def sequence_bytes(model: ModelConfig, tokens: int) -> int:
    """Bytes one generated sequence of ``tokens`` tokens holds at least: its KV cache (2 x layers x the
    key/value width) and its logits over the vocabulary, float32 (a lower bound: activations excluded)."""
    if model.kind == "char":
        layers, kv_width, vocab = model.n_layers, model.d_model, model.vocab_size
    else:
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(model.path)
        heads = c.num_attention_heads
        kv_width = c.hidden_size * (getattr(c, "num_key_value_heads", None) or heads) // heads
        layers, vocab = c.num_hidden_layers, c.vocab_size
    return tokens * (2 * layers * kv_width + vocab) * 4


def device_memory(device: str) -> tuple[str, int]:
    """(name, bytes) of the memory of ``device``: the GPU's for CUDA, this machine's RAM for the CPU."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device)
    if dev.type == "cuda":
        return f"GPU {dev}", torch.cuda.get_device_properties(dev.index or 0).total_memory
    return "this machine", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Slicer(Protocol):
    """Grants a job exclusive use of its GPU group for one phase (see :mod:`infra.llm.multiplex`)."""

    def slice(self, job: str, phase: str) -> AbstractContextManager[None]:
        """Hold the job's GPU group for ``phase`` (``generate`` or ``train``)."""
        ...


class _NoSlicer:
    def slice(self, job: str, phase: str) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


@dataclass
class JobResult:
    """What a finished job returns: its metrics rows and its final weights (host tensors)."""

    rows: list[dict[str, float]]
    weights: dict[str, Any]
    version: int


@dataclass(frozen=True)
class JobInputs:
    """What the job loop feeds the services: examples, the model's tokenizer, the completion length."""

    source: PromptSource
    codec: Codec
    max_new_tokens: int


def job_inputs(cfg: RLVRConfig) -> JobInputs:
    """The prompt source of ``cfg`` (its data file, or its built-in task), the tokenizer and max_new_tokens."""
    if cfg.data.path:
        source: PromptSource = load_file_source(cfg.data, cfg.eval_prompts, cfg.seed)
    else:
        source = TaskSource(load_task(cfg.task, cfg.task_size), cfg.seed)
    codec = load_codec(cfg.model)
    if cfg.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens} must be >= 0 (0: from the longest reference answer).")
    max_new = cfg.max_new_tokens or max(len(codec.encode_answer(e.answer)) for e in source.probe())
    return JobInputs(source, codec, max_new)


def score(job: str, cfg: RLVRConfig, svc: JobServices, inputs: JobInputs, batch: list[Example],
          completions: list[list[int]]) -> RewardBatch:
    """The reward of each decoded completion against its example's answer (failed calls score 0)."""
    texts = [inputs.codec.decode(c) for c in completions]
    return svc.reward.call("score", job, cfg.reward, [e.prompt for e in batch], texts, [e.answer for e in batch],
                           cfg.reward_timeout_s, cfg.reward_import_timeout_s)


def greedy_accuracy(job: str, cfg: RLVRConfig, svc: JobServices, slicer: Slicer, inputs: JobInputs) -> RewardBatch:
    """Rewards of greedy decoding on the ``cfg.eval_prompts`` fixed held-out examples (their mean is the accuracy)."""
    batch = inputs.source.eval_set(cfg.eval_prompts)
    with slicer.slice(job, "generate"):
        comps, _ = svc.rollout.call("generate", job, [inputs.codec.encode(e.prompt) for e in batch],
                                    inputs.max_new_tokens, 0.0, 0)
    return score(job, cfg, svc, inputs, batch, comps)


@dataclass
class _RewardFailures:
    """The job's reward calls so far and how many failed; stops the job above its allowed share."""

    job: str
    max_share: float
    calls: int = 0
    failed: int = 0

    def count(self, row: dict[str, float], scored: list[RewardBatch]) -> None:
        """Add the failed calls of ``scored`` to ``row``, log the first failure, and raise
        :class:`JobStopped` when more than ``max_share`` of all calls so far failed."""
        row["reward_errors"] = float(sum(b.errors for b in scored))
        row["reward_timeouts"] = float(sum(b.timeouts for b in scored))
        first = next((b.first_error for b in scored if b.first_error), "")
        if first:
            log.warning("job %s iteration %d: %d reward calls failed, %d timed out (scored 0); first: %s", self.job,
                        int(row["iteration"]), row["reward_errors"], row["reward_timeouts"], first)
        self.calls += sum(len(b.scores) for b in scored)
        self.failed += int(row["reward_errors"] + row["reward_timeouts"])
        if self.calls and self.failed / self.calls > self.max_share:
            raise JobStopped(f"job {self.job!r}: {self.failed} of its {self.calls} reward calls failed, more than "
                             f"reward_max_failed_share={self.max_share}; stopped before saving (last failure of "
                             f"iteration {int(row['iteration'])}: {first or 'see the log'}). Fix the reward, or raise "
                             "reward_timeout_s if its calls time out.")


def _check_rewards(job: str, it: int, rewards: list[float], cfg: RLVRConfig) -> None:
    """Raise :class:`JobStopped` when the rewards' group advantages are not finite in float32 (the trainer's
    precision): a reward of 1e308 (or groups spread beyond ~1e38) would make every weight NaN."""
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), cfg.grpo.group_size, cfg.grpo.std_eps)
    if not bool(torch.isfinite(adv).all()):
        raise JobStopped(f"job {job!r} iteration {it}: the reward returned values up to {max(map(abs, rewards)):.3g}, "
                         "whose group advantages overflow float32 (the trainer's precision); stopped before the "
                         "update. Scale the reward to a few units.")


def _warm_up(job: str, cfg: RLVRConfig, svc: JobServices, slicer: Slicer, inputs: JobInputs,
             rng: np.random.Generator, done: int) -> None:
    """The supervised warm-up and the end of the warm-up, from the trainer's state-changing call ``done`` on
    (the calls before it are in the resumed checkpoint: their examples are drawn, so that later draws match)."""
    for step in range(cfg.warmup_steps):
        batch = inputs.source.sample(rng, cfg.warmup_batch)
        if step < done:
            continue
        answers = [inputs.codec.encode_answer(e.answer) for e in batch]
        with slicer.slice(job, "train"):
            svc.trainer.call("supervised", job, [inputs.codec.encode(e.prompt) for e in batch], answers, step)
    if done <= cfg.warmup_steps:
        with slicer.slice(job, "train"):
            svc.trainer.call("finish_warmup", job, cfg.warmup_steps)


def _iteration(job: str, cfg: RLVRConfig, svc: JobServices, slicer: Slicer, inputs: JobInputs,
               rng: np.random.Generator, it: int) -> tuple[dict[str, float], list[RewardBatch]]:
    """One GRPO iteration ``it`` (the greedy evaluation when due; at ``it == cfg.iterations`` only that):
    its metrics row and every reward batch it scored."""
    row: dict[str, float] = {"iteration": it}
    scored = []
    if it % cfg.eval_every == 0 or it == cfg.iterations:
        scored.append(greedy_accuracy(job, cfg, svc, slicer, inputs))
        row["eval_greedy_accuracy"] = float(np.mean(scored[-1].scores))
    if it == cfg.iterations:
        return row, scored
    batch = [e for e in inputs.source.sample(rng, cfg.prompts_per_iter) for _ in range(cfg.grpo.group_size)]
    prompts = [inputs.codec.encode(e.prompt) for e in batch]
    with slicer.slice(job, "generate"):
        comps, used_version = svc.rollout.call("generate", job, prompts, inputs.max_new_tokens, cfg.temperature,
                                               cfg.seed * 100_003 + it)
    scored.append(score(job, cfg, svc, inputs, batch, comps))
    rewards = scored[-1].scores
    _check_rewards(job, it, rewards, cfg)
    with slicer.slice(job, "train"):
        stats = svc.trainer.call("train", job, prompts, comps, rewards,
                                 cfg.warmup_steps + 1 + it)  # the job's state-changing call number
        state, version = svc.trainer.call_ref("weights", job)
    svc.rollout.call("update_weights", job, state, version)
    row.update(stats, mean_reward=float(np.mean(rewards)), weight_staleness=version - 1 - used_version)
    return row, scored


def run_job(
    job: str,
    cfg: RLVRConfig,
    svc: JobServices,
    *,
    slicer: Slicer | None = None,
    on_iteration: Callable[[dict[str, float]], None] | None = None,
) -> JobResult:
    """Run one RLVR job to completion on ``svc``; returns one metrics row per iteration and its weights.

    The job registers itself on the services (with ``cfg.resume``: restored from its checkpoint, and
    only the iterations after it run; their rows are returned), warms up, freezes its KL reference,
    then loops: generate ``P * G`` completions, score them, run a GRPO update, push the weights to the
    rollout. It unregisters from the services when it ends or fails.

    Raises:
        JobStopped: the rewards, loss or weights went non-finite, or more than
            ``cfg.reward_max_failed_share`` of the reward calls failed (nothing is saved after the fault).
    """
    slicer = slicer or _NoSlicer()
    inputs = job_inputs(cfg)
    rng = np.random.default_rng(cfg.seed)
    # resume by keyword, and only when asked: a restarted trainer's replay sets it too (TRAINER_REPLAY)
    resume = {"resume": True} if cfg.resume else {}
    done = svc.trainer.call("register_job", job, cfg.model, cfg.grpo, cfg.seed, checkpoint_spec(cfg), **resume)
    try:
        _warm_up(job, cfg, svc, slicer, inputs, rng, done)
        state, version = svc.trainer.call_ref("weights", job)  # on Ray: a reference, the driver never fetches it
        svc.rollout.call("register_job", job, state, version)
        failures = _RewardFailures(job, cfg.reward_max_failed_share)
        first = max(0, done - cfg.warmup_steps - 1)  # GRPO updates the restored trainer already holds
        for _ in range(first):
            inputs.source.sample(rng, cfg.prompts_per_iter)  # their prompts, drawn so that later draws match
        rows: list[dict[str, float]] = []
        start = time.monotonic()
        for it in range(first, cfg.iterations + 1):
            row, scored = _iteration(job, cfg, svc, slicer, inputs, rng, it)
            row["wall_s"] = time.monotonic() - start
            failures.count(row, scored)
            rows.append(row)
            if on_iteration and it < cfg.iterations:
                on_iteration(row)
        state, version = svc.trainer.call("weights", job)
        return JobResult(rows, state, version)
    finally:
        for h in (svc.rollout, svc.trainer):
            with contextlib.suppress(Exception):
                h.call("unregister_job", job)


def checkpoint_spec(cfg: RLVRConfig) -> CheckpointSpec | None:
    """Where and how often the trainer checkpoints ``cfg``'s job (an absolute directory); None when off."""
    if cfg.checkpoint_every == 0:
        return None
    directory = Path(cfg.checkpoint_dir or Path(cfg.out_dir) / cfg.name / "checkpoints").resolve()
    return CheckpointSpec(str(directory), cfg.checkpoint_every)


def local_services(cfg: RLVRConfig) -> JobServices:
    """The three services in this process."""
    return JobServices(LocalHandle(RolloutService(cfg.model, device=cfg.device)), LocalHandle(RewardService()),
                       LocalHandle(TrainerService(device=cfg.device)))


# ---------------------------------------------------------------- outputs


RUN_LOG = LogConfig(wandb="disabled", video=False)
"""The job's run directory: a progress bar, no wandb, no frames (so no ``videos/``)."""


def open_run_log(cfg: RLVRConfig) -> RunLog:
    """The run directory ``out_dir/name`` of ``cfg`` (writes its ``config.yaml``): the mean sampled reward
    and the held-out greedy accuracy against the GRPO iteration."""
    curves = Curves(
        x="iteration", x_label="GRPO iteration", shown=(("mean_reward", "reward"), ("kl", "kl")),
        panels=(Panel("reward", (("mean_reward", f"mean reward (sampled, T={cfg.temperature:.1f})"),
                                 ("eval_greedy_accuracy", "greedy accuracy (held-out)"))),),
    )
    return RunLog(Path(cfg.out_dir) / cfg.name, RUN_LOG, cfg.iterations, plain_config(cfg), curves)


def write_outputs(run: RunLog, cfg: RLVRConfig) -> dict[str, float]:
    """Write ``summary.json`` and ``curves.png`` of the rows ``run`` holds; returns the summary (reward
    start -> end over windows of up to 10 iterations, greedy accuracy start -> end, reward calls that failed)."""
    rows = run.rows
    rewards = np.array([r["mean_reward"] for r in rows if "mean_reward" in r])
    k = max(1, min(10, len(rewards) // 5))
    evals = [r["eval_greedy_accuracy"] for r in rows if "eval_greedy_accuracy" in r]
    summary = {
        "mean_reward_first_iters": float(rewards[:k].mean()),
        "mean_reward_last_iters": float(rewards[-k:].mean()),
        "window_iters": k,
        "eval_greedy_accuracy_start": evals[0],
        "eval_greedy_accuracy_end": evals[-1],
        "wall_s": rows[-1]["wall_s"],
        "reward_errors": int(sum(r.get("reward_errors", 0) for r in rows)),
        "reward_timeouts": int(sum(r.get("reward_timeouts", 0) for r in rows)),
    }
    summary["reward_ratio_end_vs_start"] = summary["mean_reward_last_iters"] / max(summary["mean_reward_first_iters"], 1e-9)
    run.write_summary(summary)
    label = Path(cfg.data.path).stem if cfg.data.path else f"{cfg.task}{cfg.task_size}"
    run.plot(f"RLVR {label}: {summary['mean_reward_first_iters']:.2f} -> {summary['mean_reward_last_iters']:.2f}")
    return summary


def run_rlvr(cfg: RLVRConfig) -> dict[str, float]:
    """Run the job of ``cfg`` (in-process, or on Ray services with ``cfg.ray``) and write its outputs.

    The run directory is :mod:`infra.common.runlog`'s layout plus ``model/``: ``config.yaml`` is written
    first and ``metrics.csv`` after every iteration, so a run that stops keeps its rows, and ``resume=true``
    continues them; ``summary.json``, ``curves.png`` and the model are written only by a job that ends.

    Raises:
        JobStopped, RewardUnavailable, CheckpointError: the job stopped; nothing was saved over its model.
    """
    cfg.validate()  # the name, before its directory is locked (made)
    with RunDirLock(Path(cfg.out_dir) / cfg.name):  # one run per directory, held until the model is saved
        return _run_locked(cfg)


def _run_locked(cfg: RLVRConfig) -> dict[str, float]:
    """``run_rlvr`` while holding the run directory's lock."""
    cfg.check()
    torch.set_num_threads(cfg.threads)
    run = open_run_log(cfg)
    logged: list[dict[str, float]] = []
    try:
        def on_iteration(row: dict[str, float]) -> None:
            if cfg.resume and not logged:  # the earlier run's rows that this one does not redo
                run.load_rows(int(row["iteration"]) - 1)
            logged.append(row)
            run.log(row)

        if cfg.ray:
            address = "local" if cfg.ray is True or cfg.ray == "local" else str(cfg.ray)
            with ray_job_services(cfg.model, address=address, priority=cfg.priority, tenant=cfg.tenant) as svc:
                result = run_job(cfg.name, cfg, svc, on_iteration=on_iteration)
        else:
            svc = local_services(cfg)
            try:
                result = run_job(cfg.name, cfg, svc, on_iteration=on_iteration)
            finally:
                svc.reward.call("close")
        on_iteration(result.rows[-1])  # the last row: the final evaluation, which run_job does not report
        summary = write_outputs(run, cfg)
    finally:
        run.close()
    save_model(run.run_dir / "model", cfg, result.weights)
    summary["out_dir"] = str(run.run_dir)
    return summary


def save_model(path: Path, cfg: RLVRConfig, weights: dict[str, Any]) -> None:
    """Write the trained model with its tokenizer into the folder ``path`` (``save_pretrained`` for an
    ``hf`` model: ``AutoModelForCausalLM.from_pretrained(path)`` loads it).

    The files are staged in a temporary folder next to ``path``, then each is moved in with
    :func:`~infra.common.files.write_atomic` (written, fsynced, renamed over the old one): at every
    moment each file of ``path`` is whole, the previous save's or this one's, and the previous model is
    never deleted first. Files of the previous save that this one lacks are removed last.

    Raises:
        JobStopped: a weight is NaN or infinite (nothing is written).
    """
    bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise JobStopped(f"the weights {bad[:3]} are not finite; the model in {path} was left as it was.")
    model = build_model(cfg.model, cfg.seed)
    model.load_state_dict(weights)
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        staged = Path(tmp)
        model.save(staged)
        load_codec(cfg.model).save(staged)
        new = sorted(f.relative_to(staged) for f in staged.rglob("*") if f.is_file())
        for rel in new:
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path / rel, (staged / rel).read_bytes())
    for old in [f for f in path.rglob("*") if f.is_file() and f.relative_to(path) not in new]:
        old.unlink()
