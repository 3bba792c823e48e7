"""The suite registry: the one place that maps a task name to the simulator suite that runs it.

A suite (the gantry tasks of :mod:`sims.tasks`, LIBERO in :mod:`sims.libero`, or a user's own) registers
one :class:`Suite` with :func:`register`: which task names it claims, its config dataclass, its vector-env
factory, its splits, its expert, what it accepts of the trainer's settings and how it is evaluated. Code
outside a suite's own package asks :func:`suite_of` (``sims.suite_of("libero_spatial").splits``) instead of
testing the task's name, so a third suite is one new package and one :func:`register` call (docs/sims.md,
"Adding a suite").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from sims.render import RenderConfig


class Expert(Protocol):
    """A scripted expert acting in a whole vector env, on its ``reset_arrays`` / ``step_arrays`` observations.

    Demonstrations (``vla_rl.demos``) record an episode until its first success or its step limit; then
    :meth:`restart` says when the environment may start its next one.
    """

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Actions float32 ``[N, A]`` in ``[-1, 1]`` for the observation dict ``obs`` (numpy arrays or tensors)."""

    def restart(self, ended: np.ndarray) -> np.ndarray | None:
        """The environments whose episodes ended (``ended``, bool ``[N]``, no longer recorded) may start anew.

        Returns:
            ``None``: the env's autoreset has started them all and the expert restarted its plans for them (they
            record again from the next step). Else the mask of environments to start now: the caller resets them
            (``env.reset_arrays(mask=...)``), then calls :meth:`reset` with it; the others wait, unrecorded.
        """

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Start new plans for environments ``mask`` (default all) after the env reset them."""


@dataclass(frozen=True)
class EvalProtocol:
    """How a suite's checkpoints are tested (``vla_rl.recipe``'s last step)."""

    fixed_states: bool = False
    """Each task plays the split's fixed initial states ``0 .. episodes - 1`` once (``episodes`` per task,
    ``num_envs`` per task dividing it), as LIBERO evaluates; otherwise fresh episodes of each split overall."""
    test_splits: tuple[str, ...] = ()
    """Splits that play the suite's test states (LIBERO's fixed initial states): test data only, evaluated after
    training and never used for demonstrations, training or validation (a training config naming one is refused)."""


@dataclass(frozen=True)
class MemoryModel:
    """Host bytes a suite's envs take beyond their frames (lower bounds, ``vla_rl.memory``)."""

    per_env: int
    """Simulator state of one environment."""
    per_rendered_env: int = 0
    """Renderer state of one rendering environment on top of its frames."""
    per_task_scene: int = 0
    """A task's compiled scene, built once per process and shared by its envs."""
    per_task_context: int = 0
    """A GL context per task of a rendering env (its copy of the model, textures and meshes)."""


@dataclass(frozen=True)
class Suite:
    """One registered suite: everything code outside the suite's package may ask of it."""

    name: str
    """Registry key, e.g. ``gantry`` or ``libero``."""
    task_forms: tuple[str, ...]
    """The task names it claims, as an error message lists them (``libero_<suite>``)."""
    claims: Callable[[str], bool]
    """Whether a task name (``env.task``) is this suite's."""
    resolve: Callable[[str], tuple[str, ...]]
    """Task ids of a task name; raises ``ValueError`` (one line, the valid forms) for an unknown one."""
    config: type
    """The suite's config dataclass (over :class:`sims.vec_env.VecEnvConfig`); its ``validate()`` raises ``ValueError``."""
    make: Callable[[Any], Any]
    """Vector env (an :class:`sims.vec_env.ArrayVectorEnv`) from an instance of ``config``."""
    splits: tuple[str, ...]
    """The episode splits its tasks offer; ``validation`` is the one that may stop a run."""
    cameras: tuple[str, ...]
    """Camera names its scenes render."""
    backends: tuple[str, ...]
    """Physics backends it runs on (of :data:`sims.backends.BACKENDS`)."""
    max_steps: Callable[[str, int | None], int]
    """``max_steps(task, limit)``: the longest episode of a task name, in control steps (``limit``: the
    configured episode limit, where the suite has one)."""
    expert: Callable[[Any], Expert]
    """The scripted expert of an env of this suite; raises ``ValueError`` for tasks without one."""
    memory: MemoryModel
    """Host memory of its environments."""
    frames: RenderConfig | None = None
    """Its default frames (what ``sims.make_vec_env(task, n, render=True)`` renders);
    ``None``: it renders none (``cameras`` is empty)."""
    depth: bool = False
    """Its renderer gives linear depth too (``RenderConfig.depth``)."""
    weigh: Callable[[str, dict[str, float]], tuple[float, ...]] | None = None
    """``weigh(task, {task_id: weight})``: the config's ``task_weights`` (one per task id, a task not named
    weighing 1; ``ValueError`` naming a bad one); ``None``: the suite samples its tasks evenly."""
    template_groups: Callable[[Any], list[tuple[str, ...]]] | None = None
    """``template_groups(config)``: instructions of one meaning each (a task said with each of its training
    templates), which SFT's template mixing (``sft.template_mix``) moves a frame's instruction embedding between;
    ``None``: the suite's tasks have one instruction each."""
    proprio_names: tuple[str, ...] = ()
    """Name of each ``proprio`` component (dataset feature names)."""
    action_names: tuple[str, ...] = ()
    """Name of each action component."""
    robot_type: str = ""
    """LeRobot's ``robot_type`` of its demonstrations."""
    demo_terminates: bool = True
    """Demonstration episodes end at success by the env's own autoreset (``terminate_on_success``); ``False``:
    the env runs on after success and the expert's :meth:`Expert.restart` names the environments to reset."""
    protocol: EvalProtocol = field(default_factory=EvalProtocol)
    """How its checkpoints are tested."""
    missing_files: Callable[[str, bool, Mapping[str, Any]], str] = lambda task, with_lan, settings: ""
    """``missing_files(task, with_lan, settings)``: a one-line error naming the setup command when a file the task
    needs (with ``with_lan``: its paraphrased-instruction variant too; with the suite's own ``settings``, a run's
    ``env.suite``: what they read) is not on this machine; ``""`` when all are."""
    training_refusal: Callable[[str, Mapping[str, Any]], str] = lambda task, settings: ""
    """``training_refusal(task, settings)``: a one-line error when the suite's own ``settings`` (a run's
    ``env.suite``) would start demonstration, training or validation episodes from its test states; ``""`` when
    they do not."""
    training_instructions: Callable[[Any], list[tuple[str, ...]]] | None = None
    """``training_instructions(config)``: the instructions each task of an instance of ``config`` is trained with
    (its settings say which), one tuple per task id (its own first, then those that say the same), which SFT
    draws from per frame (``vla_rl.sft.ParaphraseResample``); ``None``: the suite has no such setting."""
    validation_instructions: Callable[[str, str], dict[str, tuple[str, ...]]] | None = None
    """``validation_instructions(task, which)``: phrasings of set ``which`` (one of :attr:`dev_sets`) of each task of
    task name ``task`` that are in none of its training or test instruction sets, by task name
    (``{"libero_spatial/0": (...)}``), which ``scripts/bench_language_dev.py`` plays on validation episodes, where
    language settings may be chosen; ``None``: the suite has none of its own (the script then reads
    configs/language_dev.yaml)."""
    dev_sets: tuple[str, ...] = ()
    """The names of the development phrasing sets :attr:`validation_instructions` gives, the default first."""
    check_instructions: Callable[[str, str | None, list[str]], None] | None = None
    """``check_instructions(run_task, task, texts)``: raise ``ValueError`` (one line, naming the fix) unless the
    caller's instructions ``texts`` can instruct an evaluation of ``task`` (None: the run's) in a run of ``run_task``;
    ``None``: they are templates whose ``{a}``/``{b}`` each episode's entities fill (``vla_rl.evaluate.InstructedEnv``)."""


_SUITES: dict[str, Suite] = {}


def register(suite: Suite) -> Suite:
    """Add ``suite`` to the registry (a second suite of the same name replaces the first: tests re-register).

    Returns:
        ``suite``, so a module can write ``SUITE = register(Suite(...))``.
    """
    _SUITES[suite.name] = suite
    return suite


def unregister(name: str) -> None:
    """Remove the suite ``name`` (tests that registered their own)."""
    _SUITES.pop(name, None)


def suites() -> tuple[Suite, ...]:
    """The registered suites, in registration order."""
    return tuple(_SUITES.values())


def suite_of(task: str) -> Suite:
    """The suite whose task names include ``task``.

    Raises:
        ValueError: no registered suite claims ``task`` (one line naming each suite's tasks).
    """
    for suite in _SUITES.values():
        if suite.claims(task):
            return suite
    raise ValueError(f"unknown task {task!r}; valid: {', '.join(task_forms())}")


def task_forms() -> tuple[str, ...]:
    """Every registered suite's task names, as an error message lists them."""
    return tuple(form for suite in _SUITES.values() for form in suite.task_forms)
