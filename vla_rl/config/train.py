"""The whole training job's config: its sections, the checks that tie them together, and the machine checks."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sims
from infra.common.files import unwritable
from infra.common.limits import check_threads
from infra.common.run_dir import check_run_name
from infra.common.runlog import LogConfig
from infra.common.typed_config import ConfigError, validate_section
from rlcore.update_config import (
    GRPOConfig,
    OptimConfig,
)
from vla_rl.config.env import TrainEnvConfig, _check_gym_id, env_splits, env_suite
from vla_rl.config.policy import _policy_name
from vla_rl.config.ranges import RANGES, _check_ranges
from vla_rl.config.sections import DistillConfig, EvalConfig, PPOConfig, SFTConfig
from vla_rl.fleet.checks import validate_fleet
from vla_rl.fleet.section import FleetConfig
from vla_rl.memory import STEP_BYTES, MemoryEstimate, check_memory, estimate_envs, frame_bytes


@dataclass
class TrainConfig:
    """A whole training job; each component reads only its own section."""

    name: str = ""
    """Run name: results go to ``<out_dir>/<name>/``. Empty: ``<task>-<algo>-<model>-s<seed>``."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed of torch, numpy, python and the environments."""
    algo: Literal["ppo", "grpo", "distill", "sft"] = "ppo"
    """Training algorithm: ``ppo``, ``grpo``, ``distill`` (imitate a state teacher, DAgger) or ``sft``
    (supervised fine-tuning on a demonstration dataset)."""
    init_from: str = ""
    """Start from the policy weights (and observation statistics) of this checkpoint, e.g. an
    ``algo=sft`` run; the optimiser starts fresh. Empty: random initialisation."""
    init_log_std: float | None = None
    """With ``init_from``: set the loaded Gaussian head's log standard deviation to this (RL's exploration
    noise from a policy fine-tuned on demonstrations; the reference of ``ref_kl_coef`` gets it too).
    ``None`` keeps the checkpoint's."""
    total_env_steps: int = 200_000
    """Stop after this many environment steps (summed over environments)."""
    stop_success: float | None = None
    """Also stop once evaluation success on the ``validation`` split reaches this fraction (``None``: never)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (and after the last one)."""
    torch_threads: int = 1
    """Threads torch may use for inference and updates (1 is fastest for small networks on a busy machine)."""
    device: str = "cpu"
    """Torch device of the policy."""
    env: TrainEnvConfig = field(default_factory=TrainEnvConfig)
    """Environment section."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO section (used when ``algo=ppo``)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO section (used when ``algo=grpo``)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Distillation section (used when ``algo=distill``)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning section (used when ``algo=sft``)."""
    policy: Any = None
    """Policy section: ``name`` picks a model of ``policies.MODELS``, the other keys are its fields."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation section."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging section."""
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """Where the job's components run (``inprocess``, or Ray modes; see ``vla_rl.fleet``)."""

    @property
    def run_name(self) -> str:
        """The run directory's name (``name`` or one derived from task, algorithm, model and seed)."""
        if self.name:
            return self.name
        model = _policy_name(self.policy)
        task = self.env.task.replace("/", "_")
        return f"{task}-{self.algo}-{model}-s{self.seed}"

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value and the fix: each section's own values (its
        ``validate``, the policy's included), every number's range (:data:`RANGES`, the policy config's ``RANGES``) and the settings that tie
        sections together (algorithm, policy and fleet against the environment). Reads no file, device or
        registry (:meth:`check` does), so ``typed_config.from_dict`` runs it on every config it builds."""
        if not dataclasses.is_dataclass(self.policy):
            raise ConfigError(f"policy={self.policy!r} is not a policy config; build the config with "
                              "vla_rl.config.build_config or load_config (they read the policy section)")
        for section in (self.env, self.ppo, self.distill, self.sft, self.eval, self.log, self.fleet):
            section.validate()
        validate_section(self.policy, "policy")
        _check_ranges(self, RANGES | {f"policy.{key}": r for key, r in self.policy.RANGES.items()})
        check_run_name(self.run_name)
        if not self.out_dir or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name={self.name!r}, out_dir={self.out_dir!r}: out_dir must be set and name one "
                              "directory name")
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"device={self.device!r} is not a torch device; valid: cpu, cuda, cuda:N, mps")
        splits = env_splits(self.env)
        if bad_splits := sorted(set(self.eval.splits) - set(splits)):
            raise ConfigError(f"eval.splits has unknown split(s) {bad_splits}; valid: {', '.join(splits)} "
                              f"(env.task={self.env.task})")
        if self.env.kind == "sims" and (test := [s for s in self.eval.splits if s in env_suite(self.env).protocol.test_splits]):
            raise ConfigError(f"eval.splits holds {test}: {self.env.task}'s test states, never evaluated during training; "
                              "remove them and test after training (a recipe's test.splits, scripts/eval_libero.py)")
        if self.env.kind == "sims" and self.stop_success is not None and "validation" not in self.eval.splits:
            raise ConfigError("stop_success reads the validation split: add it to eval.splits (e.g. [train, validation])")
        _check_algo(self)
        _check_policy(self)
        validate_fleet(self)

    def check(self, envs_here: bool = True, inputs: bool = True) -> None:
        """:meth:`validate`, then what the run needs of this machine, where the job starts and before anything
        is built (run directory, Ray, environments): a registered gymnasium id, the files it reads, a writable
        run directory and the memory of its environments and rollout buffer.

        Args:
            envs_here: The environments and rollout buffer live in this process: check the memory they take.
            inputs: Check that the files the run reads exist (``sft.dataset``, ``init_from``); ``False`` for a
                recipe's stages before the earlier stages write them.

        Raises:
            ConfigError: The first problem found, naming its key and the fix.
        """
        self.validate()
        check_threads(self.torch_threads, "torch_threads")
        if self.env.kind == "gym":
            _check_gym_id(self.env.task)
        else:
            suite = env_suite(self.env)
            if message := (suite.training_refusal(self.env.task, self.env.suite)
                           or suite.missing_files(self.env.task, False, self.env.suite)):  # lan: test only, never here
                raise ConfigError(message)
        if inputs:
            _check_files(self)
        why = unwritable(Path(self.out_dir) / self.run_name)
        if why:
            raise ConfigError(f"out_dir={self.out_dir!r}: {why}; set out_dir= to a writable directory")
        if envs_here:
            check_run_memory(self)


# Keys that may differ between a checkpoint's config and a resumed run's config (out_dir and name: a run
# directory moved or renamed resumes where it now is).
RESUMABLE_KEYS = frozenset(
    {"total_env_steps", "stop_success", "checkpoint_every", "torch_threads", "device", "fleet.address",
     "out_dir", "name"}
    | {"eval." + f.name for f in dataclasses.fields(EvalConfig)}
    | {"log." + f.name for f in dataclasses.fields(LogConfig)}
)


SIMS_FLAT_KEYS = ("proprio", "state")
"""The flat float observation keys of a ``sims`` environment (docs/ARCHITECTURE.md, "sims -> vla_rl")."""


_DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")


def _check_algo(cfg: TrainConfig) -> None:
    """The selected algorithm's settings against each other and the environment."""
    optim = algo_optim(cfg)
    if optim.kl_adaptive_lr and optim.target_kl is None:
        raise ConfigError(f"{cfg.algo}.optim.kl_adaptive_lr=true needs {cfg.algo}.optim.target_kl (e.g. 0.01)")
    batch = cfg.ppo.rollout_steps * cfg.env.num_envs
    if cfg.algo == "ppo" and optim.num_minibatches > batch:
        raise ConfigError(
            f"ppo.optim.num_minibatches={optim.num_minibatches} must be at most the batch "
            f"ppo.rollout_steps x env.num_envs = {batch}"
        )
    if cfg.algo == "distill" and not cfg.distill.teacher:
        raise ConfigError(
            "algo=distill needs distill.teacher=PATH, a checkpoint of a state-policy run, e.g. "
            "python scripts/train.py --config configs/reach_state_ppo.yaml name=teacher, then distill.teacher=runs/teacher"
        )
    if cfg.algo == "sft" and cfg.sft.template_mix > 0 and cfg.env.kind == "sims" and not env_suite(cfg.env).template_groups:
        raise ConfigError(f"sft.template_mix={cfg.sft.template_mix} mixes a task's instruction templates; the "
                          f"{env_suite(cfg.env).name} suite's tasks have one instruction each: set sft.template_mix=0")
    if cfg.algo == "sft" and cfg.sft.template_mix > 0 and cfg.env.kind != "sims":
        raise ConfigError(f"sft.template_mix={cfg.sft.template_mix} mixes templates of the sims tasks; env.kind="
                          f"{cfg.env.kind!r} has none: set sft.template_mix=0 (sft.instruction_noise works on any env)")
    if cfg.algo == "sft" and cfg.sft.token_tail_cut and cfg.sft.token_dropout == 0:
        raise ConfigError("sft.token_tail_cut=true cuts at the tokens dropout keeps, and sft.token_dropout=0 keeps "
                          "them all: set sft.token_dropout > 0 or sft.token_tail_cut=false")
    if cfg.algo == "sft" and cfg.sft.token_dropout > 0 and getattr(cfg.policy, "language", None) != "tokens":
        raise ConfigError(f"sft.token_dropout={cfg.sft.token_dropout} hides instruction tokens; the policy reads "
                          f"none: set policy.language=tokens or sft.token_dropout=0")
    if cfg.algo == "sft" and not cfg.sft.dataset:
        raise ConfigError(
            "algo=sft needs sft.dataset=DIR, a LeRobot v3.0 dataset, e.g. "
            "python scripts/collect_demos.py --task reach --episodes 200 --out demos/reach, then sft.dataset=demos/reach"
        )
    if cfg.algo == "ppo" and cfg.ppo.task_adv_norm and cfg.env.kind != "sims":
        raise ConfigError("ppo.task_adv_norm normalises advantages per sims task (the task observation); env.kind="
                          f"{cfg.env.kind!r} has no tasks: set ppo.task_adv_norm=false")
    if (optim.ref_kl_coef > 0 or optim.critic_warmup_iterations > 0) and not cfg.init_from:
        raise ConfigError(f"{cfg.algo}.optim.ref_kl_coef and critic_warmup_iterations act toward/for the policy "
                          "init_from loads; set init_from=CHECKPOINT or leave them at 0")
    if optim.critic_warmup_iterations > 0 and cfg.algo != "ppo":
        raise ConfigError(f"{cfg.algo}.optim.critic_warmup_iterations needs a critic: algo=ppo")
    if cfg.init_log_std is not None and not cfg.init_from:
        raise ConfigError(f"init_log_std={cfg.init_log_std} sets the std of the policy init_from loads; set "
                          "init_from=CHECKPOINT, or policy.head.init_log_std for a fresh policy")
    if cfg.init_log_std is not None and getattr(getattr(cfg.policy, "head", None), "kind", "") != "gaussian":
        raise ConfigError(f"init_log_std={cfg.init_log_std} needs a Gaussian action head (policy.head.kind=gaussian)")
    rl_only = [k for k in ("clip_coef_high", "rollout_temperature") if getattr(optim, k) != getattr(OptimConfig(), k)]
    if cfg.algo in ("sft", "distill") and rl_only:
        raise ConfigError(f"{cfg.algo}.optim.{rl_only[0]} acts in the clipped RL update (algo=ppo or grpo); leave "
                          f"it at {getattr(OptimConfig(), rl_only[0])} for algo={cfg.algo}")
    if cfg.algo == "grpo":
        try:
            cfg.grpo.validate()
        except ValueError as exc:
            raise ConfigError(f"grpo.{exc}") from exc
        if cfg.env.kind != "sims":
            raise ConfigError("algo=grpo needs env.kind=sims (groups of G environments sharing an initial state)")
        if cfg.env.num_envs % cfg.grpo.group_size:
            raise ConfigError(
                f"env.num_envs={cfg.env.num_envs} must be a multiple of grpo.group_size={cfg.grpo.group_size}"
            )


def _check_files(cfg: TrainConfig) -> None:
    """The files the run reads: the SFT dataset and the ``init_from`` checkpoint."""
    if cfg.algo == "sft" and not Path(cfg.sft.dataset, "meta", "info.json").is_file():
        raise ConfigError(f"sft.dataset={cfg.sft.dataset!r} holds no meta/info.json; give the folder of a LeRobot "
                          "v3.0 dataset (scripts/collect_demos.py writes one)")
    if cfg.init_from and not Path(cfg.init_from).exists():
        raise ConfigError(f"init_from={cfg.init_from!r} does not exist; give a checkpoint .pt or a run directory")


def _check_policy(cfg: TrainConfig) -> None:
    """The policy section against itself and the observations the environment gives."""
    p, env, name = cfg.policy, cfg.env, _policy_name(cfg.policy)
    if not hasattr(p, "image_key"):  # a state policy
        flat = {"policy.obs_keys": p.obs_keys}
    elif env.kind != "sims" or env.frames is None:
        raise ConfigError(f"policy.name={name} reads camera images: it needs env.kind=sims and env.frames (frames on, "
                          "not null)")
    elif p.image_size != env.frames.width or p.image_size != env.frames.height:
        raise ConfigError(f"policy.image_size={p.image_size} must equal env.frames.width={env.frames.width} and "
                          f"env.frames.height={env.frames.height} (the frame size)")
    else:
        flat = {"policy.proprio_key": (p.proprio_key,), "policy.trunk_target_key": (p.trunk_target_key,),
                "policy.critic_obs_keys": p.critic_obs_keys}
    if env.kind != "sims":
        return
    for key, names in flat.items():
        unknown = [k for k in names if k and k not in SIMS_FLAT_KEYS]
        if unknown:
            raise ConfigError(f"{key}={unknown} are not sims observation keys; valid: {', '.join(SIMS_FLAT_KEYS)}")


def algo_optim(cfg: TrainConfig) -> OptimConfig:
    """The optimiser section of the selected algorithm."""
    return {"ppo": cfg.ppo.optim, "grpo": cfg.grpo.optim, "distill": cfg.distill.optim, "sft": cfg.sft.optim}[cfg.algo]


def _rollout_steps(cfg: TrainConfig) -> int:
    """Steps T per environment the selected algorithm's batch holds (GRPO: the longest episode)."""
    if cfg.algo == "grpo":
        return sims.suite_of(cfg.env.task).max_steps(cfg.env.task, None)
    return {"ppo": cfg.ppo.rollout_steps, "distill": cfg.distill.rollout_steps}.get(cfg.algo, 0)


def estimate_run(cfg: TrainConfig) -> tuple[MemoryEstimate, int]:
    """What ``cfg``'s training environments, evaluation environments (one set per split) and rollout buffer take.

    Returns:
        The estimate, and the part of it that does not grow with ``env.num_envs`` (the evaluation environments).
    """
    train = estimate_envs(cfg.env, cfg.env.num_envs)
    splits = len(cfg.eval.splits) if cfg.eval.every or cfg.eval.at_start else 0
    evaluation = estimate_envs(cfg.env, splits * cfg.eval.num_envs, scenes=False)  # LIBERO: the training env's scenes
    buffer = _rollout_steps(cfg) * cfg.env.num_envs * (frame_bytes(cfg.env) + STEP_BYTES) if cfg.env.kind == "sims" else 0
    need = MemoryEstimate(train.envs + evaluation.envs, train.frames + evaluation.frames, buffer)
    return need, evaluation.total


def check_run_memory(cfg: TrainConfig, available: int | None = None) -> None:
    """:func:`check_memory` of a training run (``env.num_envs`` is what to lower)."""
    need, fixed = estimate_run(cfg)
    check_memory(need, "env.num_envs", cfg.env.num_envs, fixed, available)
