"""The whole recipe in one call: demonstrations -> SFT -> RL from the SFT checkpoint -> test splits.

:func:`run_recipe` runs the stages of a :class:`RecipeConfig` under ``<out_dir>/<name>/``:

1. ``demos/``: the scripted experts' episodes of the ``train`` split, with DART noise, as a
   LeRobot v3.0 dataset (:mod:`vla_rl.demos`);
2. ``sft/``: ``algo=sft`` on that dataset (the base config with the ``sft`` overrides);
3. ``rl/``: PPO (or GRPO) started from the SFT checkpoint with ``init_from`` (``rl`` overrides);
4. each stage's final checkpoint evaluated on fresh episodes of the test splits
   (``paraphrase``, ``composition``) and of ``train``, with 95 % Wilson intervals; a LIBERO run
   by LIBERO's protocol on ``fixed`` and ``lan`` (:func:`vla_rl.evaluate.libero_protocol`).

Training stops and picks checkpoints on nothing but the ``validation`` split; the test streams
are drawn only in step 4. A stage that finished is reused and an unfinished one resumed, so the
same command continues an interrupted recipe; a stage's test results (``<stage>/test.json``) are reused
when the same test settings ran on the same checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sims
from infra.common.checkpoint_io import MAGIC
from infra.common.files import DIGEST_BYTES, write_atomic
from infra.common.typed_config import ConfigError, from_dict, merge, parse_overrides
from rlcore.update_config import AT_LEAST_1, Range, out_of_range
from vla_rl.config import (
    CONFIG_DIR,
    TrainConfig,
    TrainEnvConfig,
    build_config,
    check_task_weights,
    env_splits,
    env_suite,
    read_yaml,
    to_dict,
)
from vla_rl.demos.collect import CollectConfig, collect_demos
from vla_rl.envs import sims_env_config
from vla_rl.evaluate import evaluate_checkpoint, libero_protocol, wilson_interval
from vla_rl.trainer import Trainer, unfinished


@dataclass
class DemoSettings:
    """The demonstrations of step 1 (the base config's task, image size and cameras)."""

    episodes: int = 2000
    """Successful expert episodes to record."""
    noise: float = 0.3
    """DART noise on the executed actions (labels stay the expert's): recovery states for SFT."""
    num_envs: int = 16
    """Environments the experts act in together."""
    task_weights: dict[str, float] = field(default_factory=dict)
    """Relative weight of each named task among the demonstrations (a task not named weighs 1)."""
    keep_failures: bool = False
    """Keep the episodes the expert failed too (toy runs whose episodes are too short to succeed)."""
    per_task: int | None = None
    """At most this many demonstrations of each task (few-shot SFT, e.g. 5; None: no cap)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range (the task weights are checked
        against the SFT stage's task by :meth:`RecipeConfig.check`)."""
        _check_numbers(self, RECIPE_RANGES, "demos.")


@dataclass
class TestSettings:
    """The final evaluation of step 4, on fresh episodes."""

    splits: tuple[str, ...] = ("train", "paraphrase", "composition")
    """Splits evaluated (never ``validation``: the runs were stopped on it); a LIBERO run's: ``fixed``, ``lan``."""
    episodes: int = 1024
    """Episodes per split and checkpoint (LIBERO: per task, by LIBERO's protocol, ``vla_rl.evaluate.libero_protocol``)."""
    num_envs: int = 64
    """Environments stepped together (LIBERO: per task; it must divide ``episodes``)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first number out of its range, or the ``validation`` split."""
        _check_numbers(self, RECIPE_RANGES, "test.")
        if "validation" in self.splits:
            raise ConfigError("test.splits must not hold validation: the runs are stopped on it; use train, "
                              "paraphrase, composition (LIBERO: fixed, lan)")


@dataclass
class RecipeConfig:
    """Demonstrations, SFT, RL and the test evaluation of one recipe run."""

    name: str = "sft-rl"
    """Results go to ``<out_dir>/<name>/`` (demos/, sft/, rl/, recipe.json)."""
    out_dir: str = "runs"
    """Parent directory."""
    seed: int = 0
    """Seed of the demonstrations and of both training runs, unless a stage sets its own (``rl.seed=1``)."""
    base: str = "suite.yaml"
    """Training config both stages start from (a file in configs/, or a path)."""
    demos: DemoSettings = field(default_factory=DemoSettings)
    """Step 1."""
    sft: dict[str, Any] = field(default_factory=dict)
    """Overrides of the base config for the SFT stage (``algo`` and ``sft.dataset`` are set)."""
    rl: dict[str, Any] = field(default_factory=dict)
    """Overrides of the base config for the RL stage (``init_from`` is set)."""
    test: TestSettings = field(default_factory=TestSettings)
    """Step 4."""
    stages: tuple[str, ...] = ("sft", "rl")
    """Training stages to run: both, or ``[sft]`` alone (SFT against the number of demonstrations)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value of the recipe itself: its numbers
        (:data:`RECIPE_RANGES`) and stages (the ``demos`` and ``test`` sections check their own). The stages'
        training configs read the base file: :meth:`check` builds them."""
        self.demos.validate()
        self.test.validate()
        _check_numbers(self, RECIPE_RANGES)
        if self.stages not in (("sft", "rl"), ("sft",)):
            raise ConfigError(f"stages={list(self.stages)}; use [sft, rl] (the recipe) or [sft] (SFT alone)")

    def check(self) -> None:
        """:meth:`validate`, then every stage's training config (built from the base file and validated), the
        demonstrations' task weights against the SFT stage's task and the two stages' language settings.

        Raises:
            ConfigError: The first problem found; a stage's names the stage.
        """
        self.validate()
        configs = stage_configs(self)
        env = configs["sft"].env
        if bad := sorted(set(self.test.splits) - set(env_splits(env))):
            raise ConfigError(f"test.splits {bad} are not splits of env.task={env.task}; valid: {', '.join(env_splits(env))}")
        check_task_weights(self.demos.task_weights, env.task, "demos.task_weights")
        tasks = len(env_suite(env).resolve(env.task))
        if self.demos.per_task is not None and self.demos.episodes > self.demos.per_task * tasks:
            raise ConfigError(f"demos.episodes={self.demos.episodes} is more than demos.per_task={self.demos.per_task} "
                              f"x the {tasks} task(s) of {env.task}: lower demos.episodes or raise demos.per_task")
        if env_suite(env).protocol.fixed_states and self.test.episodes % self.test.num_envs:
            raise ConfigError(f"test.num_envs={self.test.num_envs} must divide test.episodes={self.test.episodes} "
                              f"({env_suite(env).name}'s protocol plays each fixed initial state once per task)")
        if "rl" in self.stages:  # an SFT-only recipe never loads its checkpoint into the RL stage
            _check_rl_fits_sft(configs["sft"].policy, configs["rl"].policy)


class RecipeStopped(RuntimeError):
    """A stage was stopped by a signal (SIGTERM) before its end; relaunching continues it."""


def load_recipe(path: str | Path | None, overrides: list[str]) -> RecipeConfig:
    """Read a recipe YAML (default ``configs/suite_sft_rl.yaml``) with ``key=value`` overrides.

    Both stages' training configs are built and validated here, before anything runs.

    Raises:
        ConfigError: an unknown key, a bad value, or a stage config that does not validate.
    """
    data = merge(read_yaml(path or CONFIG_DIR / "suite_sft_rl.yaml"), parse_overrides(overrides))
    recipe = from_dict(RecipeConfig, data)  # runs RecipeConfig.validate
    recipe.check()
    return recipe


def _root(recipe: RecipeConfig) -> Path:
    return Path(recipe.out_dir) / recipe.name


def _stage_dicts(recipe: RecipeConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    base_path = Path(recipe.base)
    base = read_yaml(base_path if base_path.is_file() else CONFIG_DIR / recipe.base)
    root = _root(recipe)
    base = merge(base, {"seed": recipe.seed})  # a stage's own seed (``rl.seed=1``: RL seeds from one SFT) wins
    common = {"out_dir": str(root)}
    sft = merge(merge(base, recipe.sft), {**common, "name": "sft", "algo": "sft", "sft": {"dataset": str(root / "demos")}})
    rl = merge(merge(base, recipe.rl), {**common, "name": "rl", "init_from": str(root / "sft"),
                                        "eval": {"at_start": True}})
    return sft, rl


RECIPE_RANGES: dict[str, Range] = {
    "seed": Range(0, 2**31 - 1), "demos.episodes": AT_LEAST_1, "demos.num_envs": AT_LEAST_1, "demos.per_task": AT_LEAST_1,
    "test.episodes": AT_LEAST_1, "test.num_envs": AT_LEAST_1,
}
"""Valid ranges of the recipe's own numbers (any other, e.g. ``demos.noise``: finite and >= 0)."""


def _check_numbers(section: Any, ranges: dict[str, Range], prefix: str = "") -> None:
    """Raise :class:`ConfigError` naming the first number of ``section`` (the recipe's ``prefix`` section)
    outside its range in ``ranges`` (dotted keys from the recipe's top)."""
    message = out_of_range(section, {k.removeprefix(prefix): r for k, r in ranges.items() if k.startswith(prefix)},
                           prefix)
    if message:
        raise ConfigError(message)


def stage_configs(recipe: RecipeConfig) -> dict[str, TrainConfig]:
    """Every training stage's config of ``recipe``, validated (:meth:`TrainConfig.validate`: the files the earlier
    stages will write, the SFT dataset and the SFT checkpoint RL starts from, are checked when each stage starts).

    Raises:
        ConfigError: The first stage whose config does not validate, named.
    """
    out = {}
    for stage, data in zip(("sft", "rl"), _stage_dicts(recipe)):
        try:
            out[stage] = build_config(data)
        except ConfigError as exc:
            raise ConfigError(f"recipe stage {stage}: {exc}") from exc
    return out


_SHARED_POLICY_FIELDS = ("language", "language_tokens", "language_heads", "language_width", "head.chunk")


def _check_rl_fits_sft(sft: Any, rl: Any) -> None:
    """RL loads the SFT checkpoint, so both stages must read instructions the same way and act in
    chunks of the same length."""
    for key in _SHARED_POLICY_FIELDS:
        a, b = (functools.reduce(lambda obj, name: getattr(obj, name, None), key.split("."), cfg) for cfg in (sft, rl))
        if a != b:
            raise ConfigError(f"sft.policy.{key}={a!r} but rl.policy.{key}={b!r}: RL starts from the SFT "
                              f"checkpoint, so set both to the same value")


def _train(cfg: TrainConfig) -> dict[str, Any]:
    """Train one stage to its end, resuming it if it was interrupted; a finished stage is reused."""
    run_dir = Path(cfg.out_dir) / cfg.run_name
    if (run_dir / "summary.json").exists():
        return json.loads((run_dir / "summary.json").read_text())
    trainer = Trainer(cfg, resume=unfinished(cfg))
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    if "stopped_by" in summary:  # preempted: the stage is unfinished, so nothing after it may run
        raise RecipeStopped(f"stage {cfg.run_name} stopped by {summary['stopped_by']} after iteration "
                            f"{summary['iterations']}; run the same command again to continue")
    return summary


def _test_fixed_states(run_dir: Path, recipe: RecipeConfig, device: str) -> dict[str, Any]:
    """The fixed-initial-states protocol (LIBERO's) on each test split, the policy on ``device``: per task, and
    overall over the run's tasks."""
    protocol = libero_protocol(run_dir, recipe.test.splits, recipe.test.episodes, recipe.test.num_envs, device=device)
    out: dict[str, Any] = {"protocol": protocol["protocol"], "side_by_side": protocol["side_by_side"]}
    for split, r in protocol["splits"].items():
        n = sum(t["episodes"] for t in r["tasks"].values())
        k = round(sum(t["success"] * t["episodes"] for t in r["tasks"].values()))
        out[split] = {"success": k / n, "ci95": list(wilson_interval(k, n)), "episodes": n,
                      **{f"success_{t}": v["success"] for t, v in r["tasks"].items()},
                      "tasks": r["tasks"], "suites": r["suites"], "wall_s": r["wall_s"]}
    return out


TEST_FILE = "test.json"
"""A stage's test results, beside its checkpoints: ``{test, checkpoint, results}``."""


def _checkpoint_identity(run_dir: Path) -> str | None:
    """The stage checkpoint's first bytes, hex: its format's magic and its payload's SHA-256
    (``infra/common/checkpoint_io.py``); None without a checkpoint file."""
    path = run_dir / "checkpoints" / "latest.pt"
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        return f.read(len(MAGIC) + DIGEST_BYTES).hex()


def _test(run_dir: Path, recipe: RecipeConfig, fixed_states: bool, device: str) -> dict[str, Any]:
    """:func:`_evaluate`, reused from the stage's ``test.json`` when the same test settings were run on the same
    checkpoint (a relaunched recipe does not test a finished stage again)."""
    path = run_dir / TEST_FILE
    key = {"test": dataclasses.asdict(recipe.test), "checkpoint": _checkpoint_identity(run_dir)}
    if key["checkpoint"] is None:  # nothing to tie the results to: not kept
        return _evaluate(run_dir, recipe, fixed_states, device)
    if path.exists():
        saved = json.loads(path.read_text())
        if {k: saved.get(k) for k in key} == json.loads(json.dumps(key)):
            return saved["results"]
    results = _evaluate(run_dir, recipe, fixed_states, device)
    write_atomic(path, json.dumps({**key, "results": results}, indent=1).encode())
    return results


def _evaluate(run_dir: Path, recipe: RecipeConfig, fixed_states: bool, device: str) -> dict[str, Any]:
    """The final evaluation of a stage's checkpoint, its policy on ``device`` (the stage's training device): by
    its suite's fixed-initial-states protocol, or on fresh episodes of each test split."""
    if fixed_states:
        return _test_fixed_states(run_dir, recipe, device)
    out = {}
    for split in recipe.test.splits:
        report = evaluate_checkpoint(run_dir, split, recipe.test.episodes, recipe.test.num_envs, device=device,
                                     record=False, progress=f"test {split}").report()
        out[split] = {"success": report["success"], "ci95": report["ci95"], "episodes": report["episodes"],
                      **{f"success_{t}": r["success"] for t, r in report["tasks"].items()},
                      "tasks": report["tasks"]}
    return out


_PHRASING_ONLY = {"instructions"}
"""Suite settings that leave the recorded episodes as they are: experts record each task's own instruction, and
SFT draws every frame's phrasing from the env's instruction groups itself (:class:`vla_rl.sft.ParaphraseResample`)."""


def check_demos(demos: Path, env: TrainEnvConfig) -> None:
    """Raise :class:`ConfigError` if the recorded demonstrations in ``demos`` (a relaunch reuses them) came from
    another env than the SFT stage's ``env`` would record in (a suite setting of its own that differs, LIBERO's
    controller, starts or meshes; not the recorder's own settings such as its episode limit)."""
    source = json.loads((demos / "meta" / "info.json").read_text()).get("source", {})
    wanted = sims_env_config(env, num_envs=env.num_envs, seed=0)
    own = {f.name for f in dataclasses.fields(CollectConfig)}  # the recorder's own, e.g. its episode limit
    for key in sims.suite_settings(type(wanted)):
        if key in _PHRASING_ONLY:
            continue
        if key not in own and key in source and source[key] != getattr(wanted, key):
            raise ConfigError(f"{demos} holds demonstrations recorded with {key}={source[key]}, the SFT env has "
                              f"{key}={getattr(wanted, key)}: remove that folder (or set another name) to record them again")


def run_recipe(recipe: RecipeConfig, on_stage: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or continue) every stage; returns ``{config, results: {sft, rl}, checkpoints, wall_s, stage_wall_s}``.

    ``on_stage`` gets that dict so far after each stage's training and after its test (a run stopped
    by a time limit keeps what it finished)."""
    start = time.perf_counter()
    root = _root(recipe)
    walls: dict[str, float] = {}
    planned = stage_configs(recipe)
    for stage in recipe.stages:  # a run directory that cannot be written, or too little memory: before the demos
        planned[stage].check(inputs=False)  # each stage's inputs are written by the stages before it
    env = planned["sft"].env
    if message := env_suite(env).missing_files(env.task, "lan" in recipe.test.splits, env.suite):  # the test's files too
        raise ConfigError(message)
    demos = root / "demos"
    if (demos / "meta" / "info.json").exists():
        check_demos(demos, env)
    else:
        t = time.perf_counter()
        frames = env.frames or sims.RenderConfig()  # a state policy's demos hold the default frames (one camera at least)
        collect_demos(CollectConfig(task=env.task, episodes=recipe.demos.episodes, out=demos, seed=recipe.seed,
                                    noise=recipe.demos.noise, image_size=frames.height,
                                    num_envs=recipe.demos.num_envs, cameras=tuple(frames.cameras),
                                    task_weights=recipe.demos.task_weights, keep_failures=recipe.demos.keep_failures, per_task=recipe.demos.per_task,
                                    suite_settings=dict(env.suite)))
        walls["demos"] = time.perf_counter() - t
    results: dict[str, Any] = {}
    configs: dict[str, TrainConfig] = {}

    def report() -> dict[str, Any]:
        return {"config": {"recipe": dataclasses.asdict(recipe), **{s: to_dict(c) for s, c in configs.items()}},
                "results": results, "checkpoints": {s: str(root / s / "checkpoints" / "latest.pt") for s in configs},
                "wall_s": time.perf_counter() - start, "stage_wall_s": walls}

    for stage in recipe.stages:
        cfg = configs[stage] = planned[stage]  # Trainer checks its inputs, which exist by now
        t = time.perf_counter()
        summary = _train(cfg)
        walls[stage] = time.perf_counter() - t
        results[stage] = {"train_wall_time_s": summary["wall_time_s"]}
        if on_stage is not None:
            on_stage(report())
        t = time.perf_counter()
        results[stage] |= _test(root / stage, recipe, env_suite(env).protocol.fixed_states, cfg.device)
        walls[f"test_{stage}"] = time.perf_counter() - t
        if on_stage is not None:
            on_stage(report())
    return report()
