"""Typed run configuration: dataclasses, YAML loading and ``key=value`` overrides.

One source of defaults: the dataclasses below. A YAML file under ``configs/`` only names what
differs from them, and ``key=value`` arguments (dotted paths, values parsed as YAML scalars) are
applied on top. Every key is checked against the dataclass fields where it enters, and an unknown
key, task, algorithm or model raises :class:`ConfigError` naming the valid choices.

Each component receives only its own section: the environment factory gets :class:`EnvConfig`,
PPO gets :class:`PPOConfig`, the policy factory gets the policy's own dataclass from ``policies``.
Reading and checking dicts and overrides is :mod:`infra.typed_config`'s, shared with the LLM jobs.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from infra.typed_config import ConfigError, from_dict, merge, parse_overrides
from vla_rl.fleet.config import FleetConfig, validate_fleet

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class EnvConfig:
    """Which environment to train on and how many copies to step at once."""

    kind: Literal["sims", "gym"] = "sims"
    """``sims``: the project's batched MuJoCo tasks; ``gym``: any gymnasium environment id."""
    task: str = "reach"
    """Task name of ``sims`` (or ``suite`` for all tasks), or a gymnasium id such as ``HalfCheetah-v5``."""
    num_envs: int = 32
    """Environments stepped in parallel (N)."""
    render: bool = True
    """Render RGB camera frames into the observation (``sims`` only; the VLA needs them)."""
    image_size: int = 64
    """Height and width of rendered frames in pixels (``sims`` only)."""
    backend: str = "batch"
    """Simulator backend of ``sims``: ``batch`` (threaded CPU) or ``mjx``."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium vectorisation (``gym`` only): one process, or one subprocess per environment."""
    max_episode_steps: int | None = None
    """Episode length limit (gymnasium only); ``None`` keeps the environment's own limit."""
    terminate_on_success: bool = True
    """End a ``sims`` episode at its first success (else it runs to its step limit)."""


@dataclass
class OptimConfig:
    """The clipped policy-gradient update shared by PPO and GRPO."""

    lr: float = 3e-4
    """Adam learning rate at the start of training."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run."""
    epochs: int = 4
    """Passes over each batch of experience."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """PPO ratio clip range epsilon."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL of a minibatch exceeds this (``None``: never)."""
    kl_adaptive_lr: bool = False
    """Scale the learning rate by 1.5 up or down to keep the KL near ``target_kl`` (needs ``target_kl``)."""


@dataclass
class PPOConfig:
    """Proximal Policy Optimisation with a learned critic and GAE."""

    rollout_steps: int = 64
    """Steps T collected per environment per iteration; the batch is T x N."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    norm_adv: bool = True
    """Normalise advantages per minibatch to zero mean and unit variance."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    clip_value: bool = False
    """Clip the value prediction around the old value by ``clip_coef`` (PPO2's value clipping)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's ``VecNormalize``)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The clipped update's settings."""


@dataclass
class GRPOConfig:
    """Group Relative Policy Optimisation: G episodes from one initial state, no critic."""

    group_size: int = 8
    """Episodes G per initial state; ``env.num_envs`` must be a multiple of it."""
    std_eps: float = 1e-6
    """Added to the group's return standard deviation before dividing."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The clipped update's settings."""


@dataclass
class DistillConfig:
    """Teacher-student distillation (DAgger): a privileged-state teacher labels the student's states."""

    teacher: str = ""
    """Checkpoint (file or run directory) of the teacher, e.g. a ``configs/reach_state_ppo.yaml`` run."""
    rollout_steps: int = 50
    """Steps T collected per environment per iteration."""
    teacher_iterations: int = 1
    """First iterations whose rollouts the teacher drives (afterwards the student acts: DAgger)."""
    buffer_size: int = 50_000
    """Labelled observations kept (the aggregated DAgger data set; oldest dropped first)."""
    updates: int = 64
    """Gradient steps per iteration, each on a minibatch drawn uniformly from the buffer."""
    batch_size: int = 256
    """Minibatch size of the imitation update."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, anneal_lr=False))
    """Learning rate and gradient clipping of the imitation update (epochs/minibatches unused)."""


@dataclass
class LogConfig:
    """Where and how progress is reported."""

    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode: files under the run directory (``offline``), synced (``online``), or none."""
    wandb_project: str = "vla-rl"
    """wandb project name."""
    progress: bool = True
    """Show a progress bar with steps/s and success."""
    video: bool = True
    """Write evaluation videos (train and held-out instructions) under ``videos/``."""
    video_format: Literal["mp4", "gif"] = "mp4"
    """Video container."""


@dataclass
class EvalConfig:
    """Evaluation of the deterministic policy on train and held-out instructions."""

    every: int = 10
    """Evaluate every this many iterations (and after the last one); 0 disables periodic evaluation."""
    episodes: int = 32
    """Episodes per instruction set."""
    num_envs: int = 32
    """Environments stepped in parallel during evaluation."""
    sets: tuple[str, ...] = ("train", "heldout")
    """Instruction sets evaluated (``sims`` only; gymnasium tasks have one)."""


@dataclass
class TrainConfig:
    """A whole training job; each component reads only its own section."""

    name: str = ""
    """Run name: results go to ``<out_dir>/<name>/``. Empty: ``<task>-<algo>-<model>-s<seed>``."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed of torch, numpy, python and the environments."""
    algo: Literal["ppo", "grpo", "distill"] = "ppo"
    """Training algorithm: ``ppo``, ``grpo``, or ``distill`` (imitate a state teacher, DAgger)."""
    total_env_steps: int = 200_000
    """Stop after this many environment steps (summed over environments)."""
    stop_success: float | None = None
    """Also stop once held-out evaluation success reaches this fraction (``None``: never)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (and after the last one)."""
    torch_threads: int = 1
    """Threads torch may use for inference and updates (1 is fastest for small networks on a busy machine)."""
    device: str = "cpu"
    """Torch device of the policy."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment section."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO section (used when ``algo=ppo``)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO section (used when ``algo=grpo``)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Distillation section (used when ``algo=distill``)."""
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


# Keys that may differ between a checkpoint's config and a resumed run's config.
RESUMABLE_KEYS = frozenset(
    {"total_env_steps", "stop_success", "checkpoint_every", "torch_threads", "device", "fleet.address"}
    | {"eval." + f.name for f in dataclasses.fields(EvalConfig)}
    | {"log." + f.name for f in dataclasses.fields(LogConfig)}
)


def _policy_models() -> dict[str, type]:
    """The registry of policy configs (imported lazily: config parsing must not build networks)."""
    import policies

    return dict(policies.MODELS)


def policy_from_dict(data: dict[str, Any] | None, path: str = "policy") -> Any:
    """Build the policy's own config dataclass from ``{"name": ..., <its fields>}``."""
    models = _policy_models()
    data = dict(data or {})
    name = data.pop("name", "vla")
    if name not in models:
        raise ConfigError(f"{path}.name={name!r} is not a known model; valid: {', '.join(sorted(models))}")
    cfg = from_dict(models[name], data, path)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (tuples become lists), the form written to ``config.yaml``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
            if f.name == "policy":
                value = {"name": _policy_name(cfg.policy), **value}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _policy_name(policy_cfg: Any) -> str:
    for name, cls in _policy_models().items():
        if type(policy_cfg) is cls:
            return name
    raise ConfigError(f"policy config of type {type(policy_cfg).__name__} is not in policies.MODELS")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; a missing or malformed file raises :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        known = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"config file {path} not found; configs shipped in {CONFIG_DIR}: {', '.join(known)}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load ``path`` (default ``configs/default.yaml``), apply ``key=value`` overrides, validate.

    Raises:
        ConfigError: Unknown keys, wrong types, an unknown model or task, or inconsistent settings.
    """
    data = read_yaml(path or CONFIG_DIR / "default.yaml")
    data = merge(data, parse_overrides(overrides or []))
    return build_config(data)


def build_config(data: dict[str, Any]) -> TrainConfig:
    """Validate a nested dict (as in ``config.yaml``) into a :class:`TrainConfig`."""
    data = dict(data)
    policy = data.pop("policy", None)  # its dataclass depends on its ``name``: built apart
    cfg = from_dict(TrainConfig, data)
    cfg.policy = policy_from_dict(policy)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Check cross-field consistency without modifying ``cfg``.

    Raises:
        ConfigError: The first inconsistency found, with the fix.
    """
    positive = {
        "env.num_envs": cfg.env.num_envs,
        "total_env_steps": cfg.total_env_steps,
        "ppo.rollout_steps": cfg.ppo.rollout_steps,
        "distill.rollout_steps": cfg.distill.rollout_steps,
        "grpo.group_size": cfg.grpo.group_size,
        "eval.num_envs": cfg.eval.num_envs,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    optim = algo_optim(cfg)
    if optim.kl_adaptive_lr and optim.target_kl is None:
        raise ConfigError(f"{cfg.algo}.optim.kl_adaptive_lr=true needs {cfg.algo}.optim.target_kl (e.g. 0.01)")
    if optim.num_minibatches < 1 or optim.epochs < 1:
        raise ConfigError(f"{cfg.algo}.optim.epochs and num_minibatches must be at least 1")
    if cfg.algo == "distill" and not cfg.distill.teacher:
        raise ConfigError(
            "algo=distill needs distill.teacher=PATH, a checkpoint of a state-policy run, e.g. "
            "python scripts/train.py --config configs/reach_state_ppo.yaml name=teacher, then distill.teacher=runs/teacher"
        )
    if cfg.algo == "grpo":
        if cfg.env.kind != "sims":
            raise ConfigError("algo=grpo needs env.kind=sims (groups of G environments sharing an initial state)")
        if cfg.env.num_envs % cfg.grpo.group_size:
            raise ConfigError(
                f"env.num_envs={cfg.env.num_envs} must be a multiple of grpo.group_size={cfg.grpo.group_size}"
            )
    bad_sets = sorted(set(cfg.eval.sets) - {"train", "heldout"})
    if bad_sets:
        raise ConfigError(f"eval.sets has unknown instruction set(s) {bad_sets}; valid: train, heldout")
    check_task(cfg.env)
    validate_fleet(cfg)


def algo_optim(cfg: TrainConfig) -> OptimConfig:
    """The optimiser section of the selected algorithm."""
    return {"ppo": cfg.ppo.optim, "grpo": cfg.grpo.optim, "distill": cfg.distill.optim}[cfg.algo]


def check_task(env: EnvConfig) -> None:
    """Raise :class:`ConfigError` listing the valid tasks when ``env.task`` is unknown."""
    if env.kind == "sims":
        from sims.tasks import TASK_NAMES

        valid = [*TASK_NAMES, "suite"]
        if env.task not in valid:
            raise ConfigError(f"env.task={env.task!r} is not a sims task; valid: {', '.join(valid)}")
    else:
        import gymnasium

        if env.task not in gymnasium.registry:
            close = difflib.get_close_matches(env.task, list(gymnasium.registry), n=3, cutoff=0.7)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for valid ids"
            raise ConfigError(f"env.task={env.task!r} is not a registered gymnasium id{hint}")


def diff_configs(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    keys = sorted(set(a) | set(b))
    out = []
    for key in keys:
        path = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(diff_configs(va, vb, path + "."))
        elif va != vb:
            out.append(path)
    return out


def save_yaml(data: dict[str, Any], path: Path) -> None:
    """Write a config dict as YAML atomically (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)
