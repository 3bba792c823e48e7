"""Typed run configuration: dataclasses, YAML loading and ``key=value`` overrides.

One source of defaults: the dataclasses below (the ``env`` section's simulator settings take
:class:`sims.EnvConfig`'s). A YAML file under ``configs/`` only names what
differs from them, and ``key=value`` arguments (dotted paths, values parsed as YAML scalars) are
applied on top. Every key is checked against the dataclass fields where it enters, and an unknown
key, task, algorithm or model raises :class:`ConfigError` naming the valid choices.

Each section checks its own values in its ``validate()``, which ``from_dict`` runs as it builds it;
:meth:`TrainConfig.validate` adds what ties sections together. Neither reads a file, the machine or
gymnasium's registry: :meth:`TrainConfig.check` does, where a job starts, before anything is built.

Each component receives only its own section: the environment factory gets :class:`TrainEnvConfig`,
PPO gets :class:`PPOConfig`, the policy factory gets the policy's own dataclass from ``policies``.
Reading and checking dicts and overrides is :mod:`infra.common.typed_config`'s, shared with the LLM jobs.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

import sims
from infra.common.runlog import LogConfig
from infra.common.typed_config import ConfigError, from_dict, merge, parse_overrides
from rlcore.update_config import (
    AT_LEAST_1,
    FRACTION,
    GRPO_RANGES,
    NON_NEGATIVE,
    OPTIM_RANGES,
    GRPOConfig,
    OptimConfig,
    Range,
    out_of_range,
)
from sims.libero.paraphrase import INSTRUCTION_MODES
from sims.libero.scene import MIN_VISUAL_FACES, VISUAL_FACES
from vla_rl.fleet.section import FLEET_RANGES, FleetConfig, validate_fleet

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_POLICY = "vla"
"""The model of a config whose ``policy`` section names none."""


_SIMS = sims.EnvConfig()
_FRAMES = sims.RenderConfig()


@dataclass
class TrainEnvConfig:
    """The ``env`` section: which environment to train on and how many copies to step at once.

    A ``sims`` environment is described by :class:`sims.EnvConfig`: the fields below that it shares take
    its defaults (and :class:`sims.RenderConfig`'s for the frames), and :func:`vla_rl.envs.sims_env_config`
    turns this section into one. The other fields are the trainer's: ``kind``, whether to ``render``, and the
    gymnasium settings.
    """

    kind: Literal["sims", "gym"] = "sims"
    """``sims``: the project's batched MuJoCo tasks; ``gym``: any gymnasium environment id."""
    task: str = _SIMS.task
    """Task name of ``sims`` (or ``suite`` for all tasks; ``libero_<suite>`` or ``libero_<suite>/<i>`` for LIBERO, e.g.
    ``libero_spatial``), or a gymnasium id such as ``HalfCheetah-v5``."""
    num_envs: int = _SIMS.num_envs
    """Environments stepped in parallel (N)."""
    render: bool = True
    """Render RGB camera frames into the observation (``sims`` only; the VLA, the default policy, needs them)."""
    image_size: int = _FRAMES.height
    """Height and width of rendered frames in pixels, 8 to 1024 (``sims`` only; the VLA's
    ``policy.image_size`` must equal it)."""
    cameras: tuple[str, ...] = _FRAMES.cameras
    """Cameras rendered, in this order (``sims`` only): ``front`` and/or ``wrist`` (LIBERO: ``agentview`` and/or
    ``robot0_eye_in_hand``); ``rgb`` is ``[N, cams, 3, H, W]``."""
    depth: bool = _FRAMES.depth
    """Also render linear depth in metres as ``depth`` float ``[N, cams, H, W]`` (``sims`` only)."""
    backend: str = _SIMS.backend
    """Simulator backend of ``sims``, one of ``sims.backends.BACKENDS``: ``batch`` (threaded CPU),
    ``warp`` (MuJoCo Warp: physics, task code and rendering on ``warp_device``), ``mjx``."""
    warp_device: str = _SIMS.warp_device
    """Device of ``backend=warp``: ``cpu`` (Warp's CPU device, for tests), ``cuda:N``, or ``auto`` (the
    first GPU if there is one, else the CPU)."""
    warp_deterministic: bool = _SIMS.warp_deterministic
    """``backend=warp``: run-to-run identical physics on a GPU (mujoco_warp's ``DeterminismType.ALL`` on
    the dense Jacobian; slower, and at most about 4,300 suite worlds, checked before allocation)."""
    warp_uncaptured: bool = _SIMS.warp_uncaptured
    """``backend=warp`` on CUDA: step without CUDA graphs (about 100x slower); otherwise a failed graph
    capture is an error."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium vectorisation (``gym`` only): one process, or one subprocess per environment."""
    max_episode_steps: int | None = None
    """Episode length limit (gymnasium and LIBERO); ``None`` keeps the environment's own limit (LIBERO's per suite)."""
    visual_faces: int | None = VISUAL_FACES
    """LIBERO only: triangle budget of each visual-only mesh (decimated copies, ``sims.libero.lod``; at least
    ``sims.libero.scene.MIN_VISUAL_FACES``); ``null`` draws LIBERO's full meshes. Frames only: physics is the same."""
    instructions: str = INSTRUCTION_MODES[0]
    """LIBERO only: what training and validation episodes are instructed with: ``original`` (the task's own
    instruction, LIBERO's protocol) or ``paraphrase`` (the task's own or one of its training paraphrases, drawn
    per episode, ``sims.libero.paraphrase``); ``env.instructions`` of the env lists them all."""
    terminate_on_success: bool = _SIMS.terminate_on_success
    """End a ``sims`` episode at its first success (else it runs to its step limit)."""
    reward: str = _SIMS.reward
    """What a ``sims`` step pays, one of ``sims.REWARDS`` (LIBERO: ``success`` only): ``dense`` (the shaped reward, positive at every
    step: with ``terminate_on_success`` a near miss held to the step limit can return more than finishing),
    ``progress`` (the change of the shaped reward: an episode returns its final minus its initial
    shaping) or ``success`` (1 at the step the task succeeds)."""
    success_bonus: float = _SIMS.success_bonus
    """Reward added at every step a ``sims`` task succeeds (its shaped reward pays a near miss almost as
    much as a success; a bonus makes finishing the task pay)."""
    task_weights: dict[str, float] = field(default_factory=dict)
    """Relative weight of each named task when a ``sims`` multi-task env samples training episodes, e.g.
    ``{push: 3, stack: 3}`` (a task not named weighs 1; empty: uniform, as ``sims.EnvConfig.task_weights=None``).
    Evaluation splits sample uniformly."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value: the numbers, a ``sims`` task, backend, reward,
        cameras and task weights. A gymnasium id is looked up by :meth:`TrainConfig.check` (gymnasium's registry)."""
        _check_numbers(self, "env.")
        if is_libero(self):
            _check_libero_env(self)
            return
        if self.visual_faces != VISUAL_FACES:
            raise ConfigError(f"env.visual_faces={self.visual_faces} sets the mesh detail of LIBERO scenes; "
                              f"env.task={self.task!r} has none: remove it")
        if self.instructions != INSTRUCTION_MODES[0]:
            raise ConfigError(f"env.instructions={self.instructions!r} paraphrases LIBERO's instructions; "
                              f"env.task={self.task!r} has its own splits (sims: eval.splits paraphrase): remove it")
        if self.kind == "sims":
            from sims.tasks import TASK_NAMES

            valid = [*TASK_NAMES, "suite", "libero_<suite>", "libero_<suite>/<i>"]
            if self.task not in valid:
                raise ConfigError(f"env.task={self.task!r} is not a sims task; valid: {', '.join(valid)}")
            _check_sims_env(self)
        elif self.task_weights:
            raise ConfigError(f"env.task_weights weighs the tasks of a sims suite; env.kind={self.kind!r} has one "
                              "task: remove it")


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
    task_adv_norm: bool = False
    """Before minibatching, normalise advantages within each task of the rollout (the ``task`` observation):
    in a multi-task suite a task with small or rare rewards then weighs as much in the update as the others."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    clip_value: bool = False
    """Clip the value prediction around the old value by ``clip_coef`` (PPO2's value clipping)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's ``VecNormalize``)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The clipped update's settings."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``ppo.optim``'s included)."""
        _check_numbers(self, "ppo.")


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

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``distill.optim``'s included)."""
        _check_numbers(self, "distill.")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on demonstrations: maximise the policy's log-likelihood of the dataset's actions.

    The dataset is a LeRobot v3.0 folder (``scripts/collect_demos.py`` writes one); with action
    chunks (``policy.head.chunk=K``) each frame's label is its next K actions. The policy's
    auxiliary perception losses are added where the dataset carries their keys.
    """

    dataset: str = ""
    """Folder of the LeRobot v3.0 dataset."""
    iterations: int = 200
    """Iterations of the run (the budget of ``algo=sft``; ``total_env_steps`` is not used)."""
    updates: int = 50
    """Gradient steps per iteration."""
    batch_size: int = 256
    """Frames per gradient step, drawn uniformly with the trainer's torch RNG."""
    learn_std: bool = False
    """Also fit a Gaussian head's standard deviation. Off: it stays at ``policy.head.init_log_std``, so
    the NLL fits the mean (a scaled squared error) and RL from the checkpoint still explores; a fitted
    std collapses to the expert's near-deterministic spread and PPO from it barely moved (measured)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, anneal_lr=True))
    """Learning rate, its annealing over ``iterations`` and the gradient clip (epochs/minibatches unused)."""
    template_mix: float = 0.0
    """Language augmentation (sims tasks): each frame's instruction embedding moves by ``u`` x the step to
    the embedding of another training template of the same meaning (the same task and entities),
    ``u ~ U(0, template_mix)``; past 1 it extrapolates beyond that template. 0 disables it."""
    instruction_noise: float = 0.0
    """Language augmentation: Gaussian noise of expected norm ``instruction_noise`` added to each frame's
    unit-norm sentence embedding, then renormalised (a colour word moves the embedding by 0.4-0.6); with
    ``policy.language: tokens`` to each token embedding too. 0 disables it."""
    token_dropout: float = 0.0
    """Language augmentation (``policy.language: tokens``): the probability that each token of a frame's
    instruction is hidden from the policy, so that no single word of a training template is relied on."""
    image_shift: int = 0
    """Image augmentation: each camera image of a frame is shifted by up to ``image_shift`` pixels in x and
    y (edge pixels repeated, a DrQ-style random shift), so that the policy does not key on exact pixel
    positions of the few scenes its demonstrations show. 0 disables it."""
    token_tail_cut: bool = False
    """With ``token_dropout``: also hide, in each minibatch, every token past the largest number of tokens
    any of its frames kept, so the longest instructions (push and stack, two entities) often lose their
    last words. An earlier padding cut of the token attention did this by accident, and the recipe scored
    higher on dev phrasings with it (docs/training.md)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (``sft.optim``'s included)."""
        _check_numbers(self, "sft.")


@dataclass
class EvalConfig:
    """Evaluation of the deterministic policy during training, on the splits of ``sims.tasks.SPLITS``."""

    every: int = 10
    """Evaluate every this many iterations (and after the last one); 0 disables periodic evaluation."""
    episodes: int = 32
    """Episodes per split."""
    num_envs: int = 32
    """Environments stepped in parallel during evaluation."""
    splits: tuple[str, ...] = ("train", "validation")
    """Splits evaluated during training (``sims`` only; gymnasium tasks have one): ``train``,
    ``validation`` (the only split ``stop_success`` reads), and the test splits ``paraphrase`` and
    ``composition``, whose figures are for curves only — quote them from ``scripts/eval.py`` on
    fresh episodes, never from a run that could have been tuned on them."""
    at_start: bool = False
    """Also evaluate before the first iteration (iteration 0): what a policy loaded with ``init_from`` starts at."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range or an unknown split."""
        from sims.libero.vec_env import LIBERO_SPLITS
        from sims.tasks import SPLITS

        _check_numbers(self, "eval.")
        known = (*SPLITS, *(s for s in LIBERO_SPLITS if s not in SPLITS))
        bad_splits = sorted(set(self.splits) - set(known))
        if bad_splits:
            raise ConfigError(f"eval.splits has unknown split(s) {bad_splits}; valid: {', '.join(known)}")
        if not self.splits:
            raise ConfigError(f"eval.splits is empty; valid: {', '.join(known)}")


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
        ``validate``), every number's range (:data:`RANGES`, :data:`POLICY_RANGES`) and the settings that tie
        sections together (algorithm, policy and fleet against the environment). Reads no file, device or
        registry (:meth:`check` does), so ``typed_config.from_dict`` runs it on every config it builds."""
        if not dataclasses.is_dataclass(self.policy):
            raise ConfigError(f"policy={self.policy!r} is not a policy config; build the config with "
                              "vla_rl.config.build_config or load_config (they read the policy section)")
        for section in (self.env, self.ppo, self.distill, self.sft, self.eval, self.log, self.fleet):
            section.validate()
        _check_ranges(self, RANGES | {f"policy.{key}": r for key, r in POLICY_RANGES.items()})
        if not self.out_dir or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name={self.name!r}, out_dir={self.out_dir!r}: out_dir must be set and name one "
                              "directory name")
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"device={self.device!r} is not a torch device; valid: cpu, cuda, cuda:N, mps")
        splits = env_splits(self.env)
        if bad_splits := sorted(set(self.eval.splits) - set(splits)):
            raise ConfigError(f"eval.splits has unknown split(s) {bad_splits}; valid: {', '.join(splits)} "
                              f"(env.task={self.env.task})")
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
        from infra.common.files import unwritable
        from vla_rl.memory import check_run_memory  # it imports this module

        self.validate()
        if self.env.kind == "gym":
            _check_gym_id(self.env.task)
        if is_libero(self.env):
            from sims.libero.install import missing_variants

            if message := missing_variants(self.env.task, with_lan="lan" in self.eval.splits):
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


INPUT_PATH_KEYS = ("init_from", "sft.dataset", "distill.teacher")
"""Config keys naming files a run reads; inside ``out_dir`` (a recipe's demos/ and sft/), they move with it."""


def run_relative(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a nested dict, as in ``config.yaml``) with each of :data:`INPUT_PATH_KEYS` that lies inside its
    ``out_dir`` written as ``<out_dir>/REST``: two configs of one run directory, before and after it was moved,
    then compare equal."""
    out = copy.deepcopy(config)
    root = Path(config.get("out_dir") or ".").absolute()
    for key in INPUT_PATH_KEYS:
        *sections, leaf = key.split(".")
        node = out
        for part in sections:
            node = node.get(part) or {}
        value = node.get(leaf)
        if value and Path(value).absolute().is_relative_to(root):
            node[leaf] = f"<out_dir>/{Path(value).absolute().relative_to(root).as_posix()}"
    return out


def _policy_models() -> dict[str, type]:
    """The registry of policy configs (imported lazily: config parsing must not build networks)."""
    import policies

    return dict(policies.MODELS)


def policy_from_dict(data: dict[str, Any] | None, path: str = "policy") -> Any:
    """Build the policy's own config dataclass from ``{"name": ..., <its fields>}``."""
    models = _policy_models()
    data = dict(data or {})
    name = data.pop("name", DEFAULT_POLICY)
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
    """Build a nested dict (as in ``config.yaml``) into a :class:`TrainConfig`, validated (:meth:`TrainConfig.validate`;
    what depends on the machine is :meth:`TrainConfig.check`'s, where the job starts)."""
    data = dict(data)
    # The policy's dataclass depends on its ``name``: built first, so that TrainConfig.validate sees it.
    data["policy"] = policy_from_dict(data.pop("policy", None))
    return from_dict(TrainConfig, data)


RANGES: dict[str, Range] = {
    "seed": Range(0, 2**31 - 1), "total_env_steps": AT_LEAST_1, "stop_success": FRACTION,
    "checkpoint_every": AT_LEAST_1, "torch_threads": AT_LEAST_1, "init_log_std": Range(-10, 2),
    "env.num_envs": AT_LEAST_1, "env.image_size": Range(8, 1024), "env.max_episode_steps": AT_LEAST_1,
    "env.success_bonus": Range(0, 100), "env.visual_faces": Range(MIN_VISUAL_FACES),
    "ppo.rollout_steps": AT_LEAST_1, "ppo.gamma": FRACTION, "ppo.gae_lambda": FRACTION, "ppo.vf_coef": NON_NEGATIVE,
    **{f"grpo.{key}": r for key, r in GRPO_RANGES.items() if not key.startswith("optim.")},
    "distill.rollout_steps": AT_LEAST_1, "distill.teacher_iterations": NON_NEGATIVE,
    "distill.buffer_size": AT_LEAST_1, "distill.updates": AT_LEAST_1, "distill.batch_size": AT_LEAST_1,
    "sft.iterations": AT_LEAST_1, "sft.updates": AT_LEAST_1, "sft.batch_size": AT_LEAST_1,
    "sft.template_mix": Range(0, 4), "sft.instruction_noise": Range(0, 2),
    "sft.token_dropout": Range(0, 0.9),
    "sft.image_shift": Range(0, 32),
    **{f"{algo}.optim.{key}": r for algo in ("ppo", "grpo", "distill", "sft") for key, r in OPTIM_RANGES.items()},
    "eval.every": NON_NEGATIVE, "eval.episodes": AT_LEAST_1, "eval.num_envs": AT_LEAST_1,
    "log.video_every": AT_LEAST_1, **{f"fleet.{key}": r for key, r in FLEET_RANGES.items()},
}
"""Valid range of every numeric field of :class:`TrainConfig` (the policy's: :data:`POLICY_RANGES`);
``None`` values (optional fields left unset) are not checked. Tuples are checked element by element, and a
number no entry names must be finite and >= 0 (``rlcore.update_config.DEFAULT_RANGE``)."""
POLICY_RANGES: dict[str, Range] = {
    "hidden_sizes": AT_LEAST_1, "trunk_sizes": AT_LEAST_1, "critic_hidden_sizes": AT_LEAST_1,
    "conv_channels": AT_LEAST_1, "obs_clip": NON_NEGATIVE, "image_size": Range(8, 1024), "patch_size": AT_LEAST_1,
    "conv_stride": AT_LEAST_1, "attention_heads": AT_LEAST_1, "width": AT_LEAST_1, "trunk_target_dims": AT_LEAST_1,
    "language_tokens": Range(3, 512), "language_heads": AT_LEAST_1, "language_width": AT_LEAST_1,
    "aux_loss_coef": NON_NEGATIVE, "head.chunk": AT_LEAST_1, "head.bins": Range(2), "head.init_log_std": Range(),
}
"""Valid ranges of the numeric fields of the policies' config dataclasses (a field a policy lacks is skipped)."""
SIMS_FLAT_KEYS = ("proprio", "state")
"""The flat float observation keys of a ``sims`` environment (docs/ARCHITECTURE.md, "sims -> vla_rl")."""
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")


def _check_numbers(section: Any, prefix: str) -> None:
    """Raise :class:`ConfigError` naming the first number of ``section`` (the config's ``prefix`` section, e.g.
    ``env.``) outside its range in :data:`RANGES`."""
    _check_ranges(section, {k.removeprefix(prefix): r for k, r in RANGES.items() if k.startswith(prefix)}, prefix)


def _check_ranges(section: Any, ranges: dict[str, Range], prefix: str = "") -> None:
    """Raise :class:`ConfigError` naming the first field of ``section`` (dotted keys of ``ranges``) out of its range."""
    message = out_of_range(section, ranges, prefix)
    if message:
        raise ConfigError(message)


def _check_sims_env(env: TrainEnvConfig) -> None:
    """The ``sims``-only settings: backend, reward and cameras."""
    from sims.backends import BACKENDS
    from sims.scene import CAMERAS
    from sims.vec_env import REWARDS

    if env.backend not in BACKENDS:
        raise ConfigError(f"env.backend={env.backend!r} is not a sims backend; valid: {', '.join(BACKENDS)}")
    if env.reward not in REWARDS:
        raise ConfigError(f"env.reward={env.reward!r} is not a sims reward; valid: {', '.join(REWARDS)}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", env.warp_device):
        raise ConfigError(f"env.warp_device={env.warp_device!r}; valid: auto, cpu, cuda, cuda:N")
    check_task_weights(env.task_weights, env.task, "env.task_weights")
    unknown = [c for c in env.cameras if c not in CAMERAS]
    if unknown or not env.cameras or len(set(env.cameras)) < len(env.cameras):
        raise ConfigError(
            f"env.cameras={list(env.cameras)} must name distinct cameras (at least one); valid: {', '.join(CAMERAS)}"
        )


def is_libero(env: TrainEnvConfig) -> bool:
    """Whether ``env`` names LIBERO tasks (``env.task=libero_<suite>`` or ``libero_<suite>/<i>``)."""
    return env.kind == "sims" and env.task.startswith("libero_")


def env_splits(env: TrainEnvConfig) -> tuple[str, ...]:
    """The episode splits ``env``'s task offers (``sims.tasks.SPLITS``; LIBERO's ``sims.libero.vec_env.LIBERO_SPLITS``)."""
    if is_libero(env):
        from sims.libero.vec_env import LIBERO_SPLITS

        return LIBERO_SPLITS
    from sims.tasks import SPLITS

    return SPLITS


def _check_libero_env(env: TrainEnvConfig) -> None:
    """A LIBERO env's task name, cameras, reward, backend and task weights (its cached files: :meth:`TrainConfig.check`)."""
    from sims.libero.scene import CAMERAS
    from sims.libero.vec_env import resolve_libero_task

    try:
        resolve_libero_task(env.task)
    except ValueError as exc:
        raise ConfigError(f"env.task: {exc}") from exc
    if env.instructions not in INSTRUCTION_MODES:
        raise ConfigError(f"env.instructions={env.instructions!r}; use one of {', '.join(INSTRUCTION_MODES)}")
    if env.reward != "success":
        raise ConfigError(f"env.reward={env.reward!r}: LIBERO tasks pay success only (their goals are predicates, "
                          "with no shaping); set env.reward=success")
    if env.backend not in ("batch", "warp"):
        raise ConfigError(f"env.backend={env.backend!r}: LIBERO runs on the batch and warp backends")
    if env.task_weights:
        raise ConfigError("env.task_weights weighs the gantry suite's tasks; a LIBERO env splits its environments "
                          "evenly over its tasks: remove it")
    if env.depth or not env.cameras or len(set(env.cameras)) < len(env.cameras) or set(env.cameras) - set(CAMERAS):
        raise ConfigError(f"env.cameras={list(env.cameras)}, env.depth={env.depth}: a LIBERO env renders RGB of "
                          f"distinct cameras among {', '.join(CAMERAS)} (no depth)")


def check_task_weights(weights: dict[str, Any], task: str, key: str) -> None:
    """Raise :class:`ConfigError` unless ``weights`` (config ``key``) weighs tasks of ``task`` by numbers >= 0,
    not all of them 0 (a task not named weighs 1)."""
    from sims.tasks import task_weight_tuple

    if not weights:
        return
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in weights.values()):
        raise ConfigError(f"{key}={weights}: each weight must be a number >= 0 (unnamed tasks weigh 1)")
    try:
        task_weight_tuple(task, weights)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


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
    if cfg.algo == "sft" and cfg.sft.template_mix > 0 and is_libero(cfg.env):
        raise ConfigError(f"sft.template_mix={cfg.sft.template_mix} mixes the gantry tasks' templates; a LIBERO task "
                          "has one instruction: set sft.template_mix=0")
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
    if cfg.algo == "grpo":
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
    if getattr(p, "obs_keys", None) == ():
        raise ConfigError("policy.obs_keys is empty; name at least one observation key, e.g. [state]")
    if not hasattr(p, "image_key"):  # a state policy
        flat = {"policy.obs_keys": p.obs_keys}
    elif env.kind != "sims" or not env.render:
        raise ConfigError(f"policy.name={name} reads camera images: it needs env.kind=sims and env.render=true")
    elif p.image_size != env.image_size:
        raise ConfigError(f"policy.image_size={p.image_size} must equal env.image_size={env.image_size} (the frame size)")
    elif p.image_size % p.patch_size:
        raise ConfigError(f"policy.image_size={p.image_size} must be a multiple of policy.patch_size={p.patch_size}")
    elif not p.conv_channels:
        raise ConfigError("policy.conv_channels is empty; give the stem's channels at least, e.g. [16, 16, 16]")
    elif p.attention_target_keys and p.readout != "attention":
        raise ConfigError(f"policy.attention_target_keys={list(p.attention_target_keys)} need policy.readout=attention")
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


def _check_gym_id(task: str) -> None:
    """Raise :class:`ConfigError` with the closest ids when ``task`` is not in gymnasium's registry (which
    packages installed on this machine fill)."""
    import gymnasium

    if task not in gymnasium.registry:
        close = difflib.get_close_matches(task, list(gymnasium.registry), n=3, cutoff=0.7)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for valid ids"
        raise ConfigError(f"env.task={task!r} is not a registered gymnasium id{hint}")


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
