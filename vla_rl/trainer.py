"""The trainer: collect, update, evaluate, log, checkpoint — one loop for every algorithm.

What is particular to PPO, GRPO or DAgger lives in its :class:`vla_rl.algorithm.Algorithm`;
the trainer never branches on ``cfg.algo``.

``Trainer(cfg).train()`` runs a job described by a :class:`vla_rl.config.TrainConfig` and writes
``runs/NAME/`` (see :mod:`infra.common.runlog`). ``Trainer(cfg, resume=True)`` continues from
``runs/NAME/checkpoints/latest.pt`` so that the next iterates equal those of an uninterrupted
run with the same seed (environments that cannot snapshot their state, gymnasium's
``AsyncVectorEnv``, are re-reset with a warning, and then the continuation is statistically but not
bitwise the same). SIGTERM (a preemptible machine's notice) stops the run at the end of the
iteration in progress, with a checkpoint; :func:`unfinished` tells a relaunch to resume.
"""

from __future__ import annotations

import copy
import random
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import policies
from infra.common.limits import check_param_bytes
from infra.common.run_dir import RunDirLock
from infra.common.runlog import CONFIG, CURVES, METRICS, SUMMARY, Curves, Panel, RunLog
from vla_rl import checkpoint as ckpt
from vla_rl.algorithm import Setup
from vla_rl.algorithm_registry import algorithm_class, make_algorithm
from vla_rl.config import (
    RESUMABLE_KEYS,
    ConfigError,
    TrainConfig,
    algo_optim,
    diff_configs,
    run_relative,
    to_dict,
)
from vla_rl.device import resolve_device
from vla_rl.distributed import LOCAL, GradientSync
from vla_rl.envs import make_env
from vla_rl.evaluate import EVAL_SEED_OFFSET, evaluate_policy
from vla_rl.rollout import EpisodeStats, LocalCollector, Timer


def vla_curves(unit: str) -> Curves:
    """The VLA trainer's curves: return and success (train episodes, evaluation splits) against the
    budget's ``unit`` (``env_steps`` for RL, ``iterations`` for SFT)."""
    x, label = ("env_steps", "environment steps") if unit == "env_steps" else ("iteration", "iterations")
    success = (("episode_success", "train episode success"), ("eval/train/success", "eval success (train episodes)"),
               ("eval/validation/success", "eval success (validation)"),
               ("eval/paraphrase/success", "eval success (paraphrase, test)"),
               ("eval/composition/success", "eval success (composition, test)"))
    return Curves(
        x=x, x_label=label, unit="step" if x == "env_steps" else "it",
        panels=(Panel("return", (("episode_return", "train episode return"), ("eval/return", "eval return"))),
                Panel("success rate", success, fraction=True)),
        shown=(("episode_success", "episode_success"), ("episode_return", "episode_return"),
               ("eval/validation/success", "validation")),
    )


def unfinished(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s run directory holds a run that stopped before its end (checkpoints, no summary)."""
    run_dir = Path(cfg.out_dir) / cfg.run_name
    return (run_dir / "checkpoints" / ckpt.LATEST).exists() and not (run_dir / SUMMARY).exists()


def _read_init_from(path: str, config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint ``init_from`` names, read before anything is built and checked to hold the model ``config``
    (a run's config dict) configures.

    Raises:
        vla_rl.checkpoint.CheckpointError: the checkpoint is unusable or holds another model.
    """
    state = ckpt.load_checkpoint(path)
    theirs, ours = state["config"].get("policy", {}).get("name"), config["policy"]["name"]
    if theirs != ours:
        raise ckpt.CheckpointError(
            f"init_from={path} holds a {theirs!r} policy and this run's policy.name={ours!r}: init_from loads "
            f"weights into the same model; give a checkpoint of a {ours!r} run, or policy.name={theirs}"
        )
    return state


class StopRequest:
    """Set by SIGTERM while installed (main thread only): the loop checkpoints and stops at a safe point."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._request)
            # Restart system calls the signal interrupts: C code that does not retry on EINTR (gloo's
            # socket reads in a data-parallel all-reduce) would otherwise fail mid-collective.
            signal.siginterrupt(signal.SIGTERM, False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _request(self, signum: int, _frame: Any) -> None:
        self.signal = signal.Signals(signum).name


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Owns the environment, policy, update rule and run directory of one training job.

    Args:
        cfg: The validated run configuration.
        resume: Continue from the run directory's latest checkpoint (an error if there is none).
        collector: Where training experience comes from (see :class:`vla_rl.rollout.LocalCollector`);
            ``None`` steps the configured environment in this process.
        sync: This process's rank of a data-parallel job (:mod:`vla_rl.distributed`); ``None``: the only one.
            Rank 0 evaluates and writes the run directory; rank r logs its own metrics to ``rank<r>/`` in it.

    Raises:
        vla_rl.checkpoint.CheckpointError: ``resume`` without a usable checkpoint, a checkpoint whose
            config differs from ``cfg``, or a run directory that already holds checkpoints without ``resume``.
    """

    sync_timers: bool = False
    """Phase timers wait for the device at each boundary (a benchmark's render/simulate split on a GPU)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, collector: Any = None,
                 sync: GradientSync | None = None) -> None:
        cfg.check(envs_here=collector is None)  # before anything is built or written
        self.cfg = cfg
        self.sync = sync or LOCAL
        self.run_dir = Path(cfg.out_dir) / cfg.run_name
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.config_dict = to_dict(cfg)
        # one run per directory, held for the run's life (close() or this process's end frees it): a directory
        # that exists is locked before anything in it is read, a new one at its first write (nothing is made
        # for a run refused before)
        self.run_lock = RunDirLock(self.run_dir) if self.sync.is_writer and self.run_dir.is_dir() else None
        state = self._read_resume_state() if resume else None
        initial = _read_init_from(cfg.init_from, self.config_dict) if cfg.init_from else None
        if state is None and (self.ckpt_dir / ckpt.LATEST).exists():
            raise ckpt.CheckpointError(
                f"{self.run_dir} already holds checkpoints; pass --resume to continue it, or name=OTHER for a new run"
            )
        self.start_time = time.perf_counter()
        torch.set_num_threads(cfg.torch_threads)
        seed_everything(cfg.seed)
        try:  # before anything is built: a CUDA run on a machine without CUDA is a config error
            self.device = resolve_device(cfg.device)
        except ValueError as exc:
            raise ConfigError(f"device={cfg.device!r}: {exc}") from exc
        group_size = algorithm_class(cfg.algo).group_size(cfg)
        if collector is None:
            collector = LocalCollector(make_env(cfg.env, seed=cfg.seed, group_size=group_size), self.device)
        self.collector = collector
        first_obs = collector.reset(cfg.seed)
        action_dim = int(np.prod(collector.single_action_space.shape))
        # What the policy was built for, so that it can be rebuilt without an environment (vla_rl.deploy).
        self.obs_spec = {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype)} for k, v in first_obs.items()}
        self.action_dim = action_dim
        # Weights, gradients and Adam's two moments: 16 bytes a parameter, checked before any is allocated.
        check_param_bytes(policies.parameter_count(cfg.policy, first_obs, action_dim), "the policy.* sizes of this "
                          "config", bytes_per=16)
        self.policy = policies.make_policy(cfg.policy, first_obs, action_dim).to(self.device)
        self.policy.set_instructions(list(collector.instructions))
        reference = self._init_from(cfg.init_from, initial) if initial is not None else None
        self.sync.start(self.policy, cfg.seed)
        self.budget = algorithm_class(cfg.algo).budget(cfg)
        self.algorithm = make_algorithm(cfg, Setup(self.policy, self.device, first_obs, action_dim, collector.num_envs,
                                                   list(collector.instructions), reference, self.sync))
        self.stats = EpisodeStats.zeros(collector.num_envs, collector.task_names)
        self.iteration = 0
        self.env_steps = 0
        self.wall_before = 0.0  # wall seconds of earlier sessions of this run
        self.eval_envs: dict[str, Any] = {}
        if self.sync.is_writer:
            self.run_lock = self.run_lock or RunDirLock(self.run_dir)
            ckpt.remove_partial_writes(self.ckpt_dir)  # left by a process killed while writing
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log_dir, log_cfg = self.run_dir, cfg.log
        if not self.sync.is_writer:  # a data-parallel rank's own episodes, beside rank 0's run (no wandb, no progress bar)
            log_dir, log_cfg = self.run_dir / f"rank{self.sync.rank}", replace(cfg.log, wandb="disabled", progress=False)
        if state is not None:
            self._restore(state)
        self.log = RunLog(
            log_dir, log_cfg, self.budget.total, self.config_dict, vla_curves(self.budget.unit),
            wandb_id=state.get("wandb_id") if state and self.sync.is_writer else None,
        )
        self.log.load_rows(self.iteration)

    # ----------------------------------------------------------------------------------------- loop

    def train(self) -> dict[str, Any]:
        """Run iterations until the step budget (or ``stop_success``) is reached; returns the summary.

        On SIGTERM the iteration in progress ends, a checkpoint is written and the summary (with
        ``stopped_by`` naming the signal) is returned without writing ``summary.json``, so that
        :func:`unfinished` reports the run and a relaunch resumes it.
        """
        stop = StopRequest()
        try:
            if self.cfg.eval.at_start and self.iteration == 0 and not self.log.rows and self.sync.is_writer:
                self.log.log({"iteration": 0.0, "env_steps": 0.0, **self.evaluate(record=False),
                              "wall_time": self.wall_time()})
            with stop:
                self._loop(stop)
        finally:
            self.log.plot()
            self.log.close()
        summary = self.summary()
        if stop.signal is not None:
            return {**summary, "stopped_by": stop.signal}
        if not self.sync.is_writer:
            return summary
        self.log.write_summary(summary)
        return summary

    def _loop(self, stop: StopRequest) -> None:
        """Iterate (collect, update, evaluate, log, checkpoint) until done or asked to stop."""
        cfg = self.cfg
        while self.budget.done(self.env_steps, self.iteration) < 1.0:
            metrics = self.step()
            done = self.budget.done(self.env_steps, self.iteration) >= 1.0
            if cfg.eval.every and (self.iteration % cfg.eval.every == 0 or done) and self.sync.is_writer:
                evaluation = self.evaluate(record=cfg.log.video)
                metrics |= evaluation
                held = evaluation.get("eval/validation/success", evaluation.get("eval/train/success"))
                if cfg.stop_success is not None and held is not None and held >= cfg.stop_success:
                    done = True
            # Data-parallel ranks stop together: rank 0's evaluation, or a SIGTERM to any rank, stops all.
            done, stopping = self.sync.any(done, stop.signal is not None)
            if stopping and stop.signal is None:
                stop.signal = "SIGTERM"  # another rank's: this one checkpoints and stops with it
            metrics["wall_time"] = self.wall_time()
            self.log.log(metrics)
            if done or stop.signal is not None or self.iteration % cfg.checkpoint_every == 0:
                self.save()
            if done or stop.signal is not None:
                break

    def wall_time(self) -> float:
        """Wall seconds this run has trained, over all its sessions."""
        return self.wall_before + time.perf_counter() - self.start_time

    def step(self) -> dict[str, float]:
        """One iteration: collect experience, update the policy; returns its metrics (not logged)."""
        start = time.perf_counter()
        timer = Timer(sync_device=self.device if self.sync_timers else None)
        lr = self.algorithm.set_progress(self.budget.done(self.env_steps, self.iteration))
        experience = self.algorithm.collect(self.collector, self.stats, self.iteration, timer)
        update_start = time.perf_counter()
        metrics = self.algorithm.update(experience.batch)
        # Statistics move only after the update, so the update saw the ones used at collection;
        # data-parallel ranks merge every rank's batch, so their statistics stay equal too.
        self.policy.update_normalization(self.sync.gather_obs(experience.batch["obs"]))
        self.sync.check_equal(self.policy)
        timer.add("update", time.perf_counter() - update_start)
        self.iteration += 1
        env_steps = self.sync.total(experience.env_steps)  # every rank's
        self.env_steps += env_steps
        elapsed = time.perf_counter() - start
        metrics |= self.stats.pop_summary()
        metrics |= experience.metrics
        metrics |= self.collector.metrics()
        metrics |= {f"time/{k}": v for k, v in timer.seconds.items()}
        metrics |= {
            "iteration": float(self.iteration),
            "env_steps": float(self.env_steps),
            "lr": lr,
            "steps_per_s": env_steps / elapsed,
            "samples_per_s": experience.batch.batch_size[0] / elapsed,
            "time/iteration": elapsed,
        }
        return metrics

    # ------------------------------------------------------------------------------------ evaluation

    def evaluate(self, record: bool = False, episodes: int | None = None) -> dict[str, float]:
        """Evaluate the deterministic policy on each split of ``eval.splits``; writes videos when ``record`` and
        this evaluation is due some (``log.video_every``).

        Runs under saved-and-restored RNG states, so evaluating never changes the training iterates.
        ``time/eval`` of the result is the evaluation's wall seconds, videos included.
        """
        start = time.perf_counter()
        every = self.cfg.eval.every
        number = max(1, self.iteration // every) if every else 1
        record = record and self.log.video_due(number, last=self.budget.done(self.env_steps, self.iteration) >= 1.0)
        splits = self.cfg.eval.splits if self.cfg.env.kind == "sims" else ("train",)
        out: dict[str, float] = {}
        saved = ckpt.rng_state()
        try:
            for which in splits:
                if which not in self.eval_envs:
                    self.eval_envs[which] = make_env(
                        self.cfg.env, seed=self.cfg.seed + EVAL_SEED_OFFSET, num_envs=self.cfg.eval.num_envs,
                        split=which, video=self.cfg.log.video,
                    )
                env = self.eval_envs[which]
                self.policy.set_instructions(list(env.instructions))  # this split's instruction table
                metrics, frames = evaluate_policy(
                    self.policy, env, episodes or self.cfg.eval.episodes,
                    seed=self.cfg.seed + EVAL_SEED_OFFSET, device=self.device, record=record,
                )
                out |= {f"eval/{which}/{k}": v for k, v in metrics.items()}
                if record:
                    name = f"iter_{self.iteration:06d}_{which}"
                    self.log.video(frames, name, wandb_key=f"video/{which}", step=self.env_steps)
        finally:
            self.policy.set_instructions(list(self.collector.instructions))
            ckpt.set_rng_state(saved)
        out["eval/return"] = out[f"eval/{splits[-1]}/return"]
        out["time/eval"] = time.perf_counter() - start
        return out

    # ----------------------------------------------------------------------------------- checkpoints

    def save(self) -> Path:
        """Write a checkpoint of the current state (atomically); returns its path.

        Data-parallel ranks call this together: rank 0 writes every rank's own state (``RANK_KEYS``) with the
        shared one; the other ranks write nothing.
        """
        local = {
            "algorithm": self.algorithm.state_dict(),
            "rng": ckpt.rng_state(),
            "collector": self.collector.get_state(),
            "episode_stats": self.stats.state_dict(),
        }
        payload = {
            "config": self.config_dict,
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "wall_time": self.wall_time(),
            "policy": self.policy.state_dict(),
            "obs_spec": self.obs_spec,
            "action_dim": self.action_dim,
            **self.sync.gather_state(local),
            "wandb_id": self.log.wandb_id,
        }
        path = self.ckpt_dir / ckpt.LATEST
        return ckpt.save_checkpoint(payload, self.ckpt_dir, self.iteration) if self.sync.is_writer else path

    def _init_from(self, path: str, state: dict[str, Any]) -> torch.nn.Module | None:
        """Load the policy of checkpoint ``state`` (read from ``path``) into ours; returns a frozen copy when a
        penalty needs it.

        Raises:
            vla_rl.checkpoint.CheckpointError: its policy does not fit ours.
        """
        try:
            self.policy.load_weights(state["policy"])
        except ValueError as exc:
            raise ckpt.CheckpointError(
                f"init_from={path}: {exc}; use the policy section of the run that wrote it (its config.yaml)"
            ) from exc
        if self.cfg.init_log_std is not None:
            with torch.no_grad():
                self.policy.head.log_std.fill_(self.cfg.init_log_std)
        if algo_optim(self.cfg).ref_kl_coef == 0:
            return None
        reference = copy.deepcopy(self.policy).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
        return reference

    def _read_resume_state(self) -> dict[str, Any]:
        path = self.ckpt_dir / ckpt.LATEST
        if not path.exists():
            raise ckpt.CheckpointError(
                f"--resume: no checkpoint at {path}; check name=/out_dir= (the run directory is {self.run_dir}) "
                "or drop --resume to start a new run"
            )
        state = ckpt.load_checkpoint(path)
        before, now = run_relative(state["config"]), run_relative(self.config_dict)
        changed = [k for k in diff_configs(before, now) if k not in RESUMABLE_KEYS]
        if changed:
            details = ", ".join(f"{k}: {_get(state['config'], k)!r} -> {_get(self.config_dict, k)!r}" for k in changed)
            raise ckpt.CheckpointError(
                f"--resume: {path} was written with a different config ({details}); resume with the run's "
                f"original settings (see {self.run_dir / CONFIG}) or start a new run with name=OTHER"
            )
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        try:
            self.policy.load_weights(state["policy"])
            local = self.sync.local_state(state)
        except (RuntimeError, ValueError) as exc:
            raise ckpt.CheckpointError(f"the checkpoint does not fit this run: {exc}") from exc
        self.algorithm.load_state_dict(local["algorithm"])
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])
        self.wall_before = float(state["wall_time"])
        self.stats.load_state_dict(local["episode_stats"])
        self.collector.set_state(local["collector"], reset_seed=self.cfg.seed + self.iteration)
        ckpt.set_rng_state(local["rng"])

    # --------------------------------------------------------------------------------------- summary

    def summary(self) -> dict[str, Any]:
        """Final figures: steps, wall time and its iteration and evaluation parts, last evaluation, time to
        90% validation success, output paths."""
        rows = self.log.rows
        key = "eval/validation/success" if self.cfg.env.kind == "sims" else "eval/train/success"
        hit = next((r for r in rows if r.get(key, -1.0) >= 0.9), None)
        last_eval = next((r for r in reversed(rows) if key in r), {})
        wall = self.wall_time()
        eval_s = sum(r.get("time/eval", 0.0) for r in rows)
        return {
            "run_dir": str(self.run_dir),
            "iterations": self.iteration,
            "env_steps": self.env_steps,
            "wall_time_s": wall,
            "iteration_time_s": sum(r.get("time/iteration", 0.0) for r in rows),
            "eval_time_s": eval_s,
            "eval_share": eval_s / wall if wall > 0 else 0.0,
            "final_eval": {k: v for k, v in last_eval.items() if k.startswith("eval/")},
            "time_to_90pct_s": hit["wall_time"] if hit else None,
            "steps_to_90pct": hit["env_steps"] if hit else None,
            "checkpoint": str(self.ckpt_dir / ckpt.LATEST),
            "metrics": str(self.run_dir / METRICS),
            "curves": str(self.run_dir / CURVES),
            "videos": str(self.run_dir / "videos"),
        }

    def close(self) -> None:
        """Close the environments and free the run directory's lock."""
        self.collector.close()
        for env in self.eval_envs.values():
            close = getattr(env, "close", None)
            if close is not None:
                close()
        if self.run_lock is not None:
            self.run_lock.release()


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data

