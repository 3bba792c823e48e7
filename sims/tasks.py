"""The language-conditioned task suite: instructions, episode sampling, rewards and success.

Every task shares the scene of :mod:`sims.scene`. An episode names one or two *entities*
(``a`` and ``b``) of the scene: the five objects (0-4), the two target pads (5-6), the two button
caps (7-8) and the drawer handle (9). Rewards, success and observations are computed by
:func:`evaluate`, written once against an array module ``xp`` (``numpy``, ``jax.numpy``, or
:class:`sims.xp_torch.TorchNamespace` for torch on a device), so
every backend shares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sims import scene as S

#: Colour palette: name -> RGBA. Distinct at 64x64; the rendering test checks them. It holds at
#: least one colour per coloured entity, so that a scene never shows two entities of one colour.
PALETTE: dict[str, tuple[float, float, float, float]] = {
    "red": (0.9, 0.1, 0.1, 1.0),
    "green": (0.1, 0.75, 0.15, 1.0),
    "blue": (0.1, 0.25, 0.95, 1.0),
    "yellow": (0.95, 0.85, 0.1, 1.0),
    "purple": (0.6, 0.15, 0.8, 1.0),
    "cyan": (0.05, 0.8, 0.85, 1.0),
    "orange": (0.95, 0.5, 0.05, 1.0),
    "pink": (0.95, 0.35, 0.65, 1.0),
    "white": (0.95, 0.95, 0.95, 1.0),
}
COLOUR_NAMES = tuple(PALETTE)
PALETTE_RGBA = np.array(list(PALETTE.values()), dtype=np.float32)

NUM_OBJECTS = len(S.OBJECT_NAMES)
PAD0 = NUM_OBJECTS  # entity index of the first pad
BUTTON0 = PAD0 + S.NUM_PADS  # entity index of the first button cap
HANDLE = BUTTON0 + S.NUM_BUTTONS  # entity index of the drawer handle
NUM_ENTITIES = HANDLE + 1
NUM_COLOURED = HANDLE  # objects, pads and buttons carry a colour each
ENTITY_NOUNS = (*S.OBJECT_NOUNS, *("target",) * S.NUM_PADS, *("button",) * S.NUM_BUTTONS, "drawer")

#: Grid of start cells for objects, pads and buttons (x, y), jittered per episode.
_CELLS = np.array([(x, y) for x in (-0.2, -0.1, 0.0, 0.1, 0.2) for y in (-0.2, -0.1, 0.0, 0.1)])
_JITTER = 0.015
CAP_TOP = S.BUTTON_CAP_Z + 0.016  # cap top surface above its base, at rest

#: Reach: the tip should come within REACH_TOLERANCE of a point REACH_HOVER above the object's
#: centre (just over it, so that the fingers do not knock it away on the way).
REACH_HOVER = 0.05
REACH_TOLERANCE = 0.04

PROPRIO_DIM = 13
STATE_DIM = 3 + 3 + 3 + 3 * NUM_ENTITIES + S.NUM_BUTTONS + 1
STATE_TIP_GOAL = slice(0, 3)  # state columns: tip goal - tip
STATE_TIP = slice(6, 9)  # state columns: the tip


@dataclass(frozen=True)
class Task:
    """One task: instruction templates, what an episode names, and its length.

    Attributes:
        name: registry name.
        train: instruction templates used in training; ``{a}`` and ``{b}`` name the entities.
        heldout: paraphrases never used in training, for evaluation.
        a_choices: entity indices the instruction's first entity is drawn from.
        b_choices: entity indices of the second entity (empty: the task names one).
        max_steps: episode length in control steps (truncation).
    """

    name: str
    train: tuple[str, ...]
    heldout: tuple[str, ...]
    a_choices: tuple[int, ...]
    b_choices: tuple[int, ...]
    max_steps: int

    def templates(self, which: str) -> tuple[str, ...]:
        """The templates of instruction set ``which`` ("train" or "heldout")."""
        return self.train if which == "train" else self.heldout


_CUBES = tuple(range(S.NUM_CUBES))
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("reach",
             ("reach the {a}", "move to the {a}", "go to the {a}", "touch the {a}", "reach for the {a}",
              "move the gripper to the {a}"),
             ("bring your hand over to the {a}", "approach the {a}", "put the gripper next to the {a}"),
             tuple(range(NUM_OBJECTS)), (), 50),
        Task("push",
             ("push the {a} to the {b}", "slide the {a} onto the {b}", "move the {a} to the {b}",
              "shove the {a} over to the {b}"),
             ("nudge the {a} until it is on the {b}", "get the {a} onto the {b} by pushing it"),
             _CUBES, (PAD0, PAD0 + 1), 100),
        Task("lift",
             ("pick up the {a}", "lift the {a}", "grab the {a} and raise it", "raise the {a} off the table"),
             ("take the {a} and hold it up high", "grasp the {a} and lift it up"),
             _CUBES, (), 100),
        Task("stack",
             ("put the {a} on the {b}", "stack the {a} on top of the {b}", "place the {a} onto the {b}",
              "set the {a} on the {b}"),
             ("build a tower with the {a} on the {b}", "rest the {a} on top of the {b}"),
             _CUBES, _CUBES, 120),
        Task("press",
             ("press the {a}", "push down the {a}", "push the {a}", "hit the {a}"),
             ("depress the {a}", "give the {a} a press"),
             (BUTTON0, BUTTON0 + 1), (), 60),
        Task("drawer",
             ("open the drawer", "pull the drawer open", "pull out the drawer", "slide the drawer open"),
             ("get the drawer open", "draw the drawer out toward you"),
             (HANDLE,), (), 100),
    )
}
TASK_NAMES = tuple(TASKS)

SPLITS = ("train", "validation", "paraphrase", "composition")
"""Episode splits. ``train``: the training templates on the training seed stream (demonstrations
and RL). ``validation``: the same templates on another seed stream (the only split that may stop
a run or pick a checkpoint). ``paraphrase``: the held-out templates on a test stream.
``composition``: training templates naming a (task, entity, colour) combination that no other
split ever instructs (:func:`held_out_colours`), on a test stream. The four streams are disjoint."""
_TEMPLATES = {"train": "train", "validation": "train", "paraphrase": "heldout", "composition": "train"}
_STREAM = {"train": (), "validation": (1,), "paraphrase": (2,), "composition": (3,)}


_NOUNS = tuple(dict.fromkeys(ENTITY_NOUNS))


def held_out_colours(task: str, entity: int) -> tuple[int, ...]:
    """Colours (palette indices) in which ``task`` never names ``entity`` outside the composition split.

    The combination is of words: task, colour and noun (the three cubes share "block"), two of
    the nine colours per (task, noun), shifted across tasks and nouns, so that every colour word,
    every noun and every task still appears in training, only not together. Uncoloured entities
    (the drawer handle) have none.
    """
    if entity >= NUM_COLOURED:
        return ()
    first = (2 * TASK_NAMES.index(task) + 3 * _NOUNS.index(ENTITY_NOUNS[entity])) % len(COLOUR_NAMES)
    return first, (first + 4) % len(COLOUR_NAMES)


def composition_tasks(task_names: tuple[str, ...]) -> tuple[str, ...]:
    """The tasks of ``task_names`` that have composition combinations (all but drawer)."""
    return tuple(t for t in task_names if any(held_out_colours(t, e) for e in TASKS[t].a_choices))


def check_split(split: str, task_names: tuple[str, ...]) -> None:
    """Raise ValueError naming the valid splits, or why ``split`` cannot run on these tasks."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    if split == "composition" and not composition_tasks(task_names):
        raise ValueError(f"tasks {list(task_names)} name no coloured entity, so they have no composition split")


def episode_rng(seed: int, group: int, episode: int, split: str) -> np.random.Generator:
    """The generator of episode ``episode`` of environment group ``group``: one disjoint stream per split."""
    return np.random.default_rng([seed, group, episode, *_STREAM[split]])


def resolve_tasks(task: str) -> tuple[str, ...]:
    """Task names for ``task``: one name, or ``"suite"`` for all of them.

    Raises:
        ValueError: an unknown name; the message lists the valid ones.
    """
    if task == "suite":
        return TASK_NAMES
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASK_NAMES)} or 'suite'")
    return (task,)


def check_task_weights(weights: tuple[float, ...], task_names: tuple[str, ...]) -> None:
    """Raise ValueError unless ``weights`` holds one finite weight >= 0 per task of ``task_names``, not all 0."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(task_names),) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"task_weights={list(weights)}: each weight must be a number >= 0 and one of them > 0, "
                         f"one per task of {', '.join(task_names)}")


def task_weight_tuple(task: str, weights: dict[str, float]) -> tuple[float, ...]:
    """Weights by task name (a task not named weighs 1) as one weight per task of ``resolve_tasks(task)``.

    Raises:
        ValueError: a name that is not a task of ``task``, or weights :func:`check_task_weights` refuses.
    """
    return weights_by_name(resolve_tasks(task), weights, task)


def weights_by_name(names: tuple[str, ...], weights: dict[str, float], task: str) -> tuple[float, ...]:
    """One weight per name of ``names`` (the tasks of env task ``task``) from ``weights`` by name, a task not
    named weighing 1 (any suite's ``weigh``).

    Raises:
        ValueError: a name that is not one of ``names``, or weights :func:`check_task_weights` refuses.
    """
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"task weights name {unknown}, not tasks of {task!r}; valid: {', '.join(names)}")
    out = tuple(float(weights.get(name, 1.0)) for name in names)
    check_task_weights(out, names)
    return out


def entity_phrase(entity: int, colour: int) -> str:
    """How an instruction names ``entity`` in palette colour ``colour``: "red block", "drawer"."""
    noun = ENTITY_NOUNS[entity]
    return noun if entity == HANDLE else f"{COLOUR_NAMES[colour]} {noun}"


def _allowed(task: str, entity: int, colour: int, split: str) -> bool:
    """Whether ``split`` may name ``entity`` of ``task`` in ``colour`` (composition: only held-out ones)."""
    held = colour in held_out_colours(task, entity)
    return held if split == "composition" else not held


def instruction_groups(task_names: tuple[str, ...], split: str) -> list[tuple[str, ...]]:
    """The instructions ``split`` can issue, grouped by meaning: each group is one (task, entities)
    said with each of the split's templates, e.g. ("lift the red block", "pick up the red block", ...).

    Raises:
        ValueError: an unknown split, or ``composition`` for tasks without coloured entities.
    """
    check_split(split, task_names)
    if split == "composition":
        task_names = composition_tasks(task_names)
    groups: list[tuple[str, ...]] = []
    colours = range(len(COLOUR_NAMES))
    for name in task_names:
        task = TASKS[name]
        a_phrases = {entity_phrase(e, c) for e in task.a_choices for c in colours if _allowed(name, e, c, split)}
        b_phrases = {entity_phrase(e, c) for e in task.b_choices for c in colours} or {""}
        templates = task.templates(_TEMPLATES[split])
        for a in sorted(a_phrases):
            groups.extend(tuple(t.format(a=a, b=b) for t in templates) for b in sorted(b_phrases))
    return groups


def instruction_table(task_names: tuple[str, ...], split: str) -> list[str]:
    """Every instruction string the tasks can issue in ``split``, sorted.

    Raises:
        ValueError: an unknown split, or ``composition`` for tasks without coloured entities.
    """
    return sorted({s for group in instruction_groups(task_names, split) for s in group})


@dataclass
class Episode:
    """What one sampled episode is: its task, scene layout, colours and instruction (numpy).

    Attributes:
        task: index into the env's task names.
        a, b: entity indices the instruction names (``b`` = ``a`` when it names one).
        colours: palette index of each coloured entity, [NUM_COLOURED].
        text: the instruction string.
        qpos: initial joint positions, [nq].
        mocap_pos: positions of the mocap bodies, [nmocap, 3].
    """

    task: int
    a: int
    b: int
    colours: np.ndarray
    text: str
    qpos: np.ndarray
    mocap_pos: np.ndarray


def _colours_for(rng: np.random.Generator, task: str, a: int, split: str) -> np.ndarray:
    """Distinct colours of every coloured entity, with ``a``'s colour allowed in ``split``."""
    # Distinct colours across objects, pads and buttons: the colour word of an instruction then
    # picks out one thing in view (a red pad beside the red block made reach a shape
    # discrimination at 3-5 pixels per object, which pixels-to-action RL did not learn).
    colours = rng.choice(len(COLOUR_NAMES), NUM_COLOURED, replace=False)
    if a >= NUM_COLOURED:
        return colours
    allowed = [c for c in range(len(COLOUR_NAMES)) if _allowed(task, a, c, split)]
    if int(colours[a]) not in allowed:  # swap a's colour with the entity that wears an allowed one
        want = allowed[int(rng.integers(len(allowed)))]
        other = int(np.flatnonzero(colours == want)[0])
        colours[a], colours[other] = want, colours[a]
    return colours


def sample_episode(rng: np.random.Generator, task_names: tuple[str, ...], split: str,
                   layout: S.SceneLayout, nmocap: int, task_p: np.ndarray | None = None) -> Episode:
    """Sample an episode of ``split``: task, layout, colours, instruction paraphrase, arm start.

    ``task_p``: probability of each of ``task_names`` (``None``: uniform; not for ``composition``)."""
    choices = composition_tasks(task_names) if split == "composition" else task_names
    if task_p is not None and split == "composition":
        raise ValueError("task weights apply to the train split; composition samples its own tasks uniformly")
    index = int(rng.integers(len(choices))) if task_p is None else int(rng.choice(len(choices), p=task_p))
    name = choices[index]
    task_idx, task = task_names.index(name), TASKS[name]
    n_placed = NUM_OBJECTS + S.NUM_PADS + S.NUM_BUTTONS
    cells = _CELLS[rng.choice(len(_CELLS), n_placed, replace=False)]
    cells = cells + rng.uniform(-_JITTER, _JITTER, cells.shape)
    a_choices = task.a_choices
    if split == "composition":
        a_choices = tuple(e for e in a_choices if held_out_colours(name, e))
    a = int(rng.choice(a_choices))
    colours = _colours_for(rng, name, a, split)
    b = int(rng.choice([e for e in task.b_choices if e != a])) if task.b_choices else a
    templates = task.templates(_TEMPLATES[split])
    template = templates[int(rng.integers(len(templates)))]
    text = template.format(a=entity_phrase(a, int(colours[a]) if a < NUM_COLOURED else 0),
                           b=entity_phrase(b, int(colours[b]) if b < NUM_COLOURED else 0))

    qpos = layout.qpos0.copy()
    qpos[layout.arm_qpos] = (*rng.uniform(-0.05, 0.05, 2), 0.0)
    qpos[layout.finger_qpos] = S.FINGER_OPEN
    z_rest = (S.CUBE_HALF, S.CUBE_HALF, S.CUBE_HALF, S.BALL_RADIUS, S.CYL_HALF_HEIGHT)
    for i, adr in enumerate(layout.object_qpos):
        qpos[adr:adr + 3] = (*cells[i], z_rest[i])
        qpos[adr + 3:adr + 7] = (1.0, 0.0, 0.0, 0.0)
    qpos[layout.button_place_qpos] = cells[BUTTON0:HANDLE]
    qpos[layout.cabinet_place_qpos] = rng.uniform(-0.12, 0.12)
    mocap_pos = np.zeros((nmocap, 3))
    mocap_pos[layout.pad_mocap, :2] = cells[NUM_OBJECTS:PAD0 + S.NUM_PADS]
    return Episode(task_idx, a, b, colours, text, qpos, mocap_pos)


def entity_positions(xp: Any, qpos, mocap_pos, layout: S.SceneLayout):
    """Positions of the task entities, [N, NUM_ENTITIES, 3], from qpos [N, nq] and mocap_pos."""
    objects = qpos[:, layout.object_qpos[:, None] + np.arange(3)]
    pads = mocap_pos[:, layout.pad_mocap]
    caps = xp.concatenate([qpos[:, layout.button_place_qpos], CAP_TOP + qpos[:, layout.button_qpos, None]],
                          axis=-1)
    drawer = qpos[:, layout.drawer_qpos]
    handle = xp.asarray(S.HANDLE_OFFSET + np.array([0.0, S.CABINET_Y, 0.0])) + xp.stack(
        [qpos[:, layout.cabinet_place_qpos], -drawer, xp.zeros_like(drawer)], axis=-1)
    return xp.concatenate([objects, pads, caps, handle[:, None]], axis=1)


def tip_position(xp: Any, qpos, layout: S.SceneLayout):
    """Gripper tip (between the fingertips), [N, 3]."""
    arm = qpos[:, layout.arm_qpos]
    return arm + xp.asarray([0.0, 0.0, S.HAND_HOME_Z - S.TIP_BELOW_HAND])


def _closeness(xp: Any, distance, scale: float):
    """Dense shaping in (0, 1]: 1 at distance 0."""
    return 1.0 - xp.tanh(scale * distance)


def _norm(xp: Any, v):
    return xp.sqrt(xp.sum(v * v, axis=-1))


def task_signals(xp: Any, qpos, qvel, mocap_pos, task_ids, a, b, task_names: tuple[str, ...],
             layout: S.SceneLayout) -> dict[str, Any]:
    """Observations, reward and success of every environment, for any array module.

    Args:
        xp: ``numpy``, ``jax.numpy`` or a :class:`sims.xp_torch.TorchNamespace`.
        qpos: [N, nq]; qvel: [N, nv]; mocap_pos: [N, nmocap, 3].
        task_ids: [N] index into ``task_names``; a, b: [N] entity indices of the instruction.
        task_names: the env's tasks.
        layout: the scene's addresses.

    Returns:
        ``proprio`` [N, PROPRIO_DIM], ``state`` [N, STATE_DIM] (float32), ``reward`` [N] float32,
        ``success`` [N] bool, ``goal_points`` [N, 2, 3] float32: where the gripper tip should go and
        where entity ``a`` should go, in world coordinates (the points ``goal_pixel`` and
        ``object_goal_pixel`` locate in the cameras).
    """
    ents = entity_positions(xp, qpos, mocap_pos, layout)
    tip = tip_position(xp, qpos, layout)
    pa = xp.take_along_axis(ents, a[:, None, None], axis=1)[:, 0]
    pb = xp.take_along_axis(ents, b[:, None, None], axis=1)[:, 0]
    press_all = -qpos[:, layout.button_qpos]
    press = xp.take_along_axis(press_all, xp.clip(a - BUTTON0, 0, S.NUM_BUTTONS - 1)[:, None], axis=1)[:, 0]
    drawer = qpos[:, layout.drawer_qpos]
    reach = _closeness(xp, _norm(xp, tip - pa), 10.0)
    hover = pa + xp.asarray([0.0, 0.0, REACH_HOVER])
    hover_dist = _norm(xp, tip - hover)
    height = pa[:, 2] - S.CUBE_HALF
    stack_goal = pb + xp.asarray([0.0, 0.0, 2 * S.CUBE_HALF])
    behind_handle = pa + xp.asarray([0.0, 0.015, 0.0])
    push_err = _norm(xp, pa[:, :2] - pb[:, :2])
    stack_xy = _norm(xp, pa[:, :2] - stack_goal[:, :2])
    stack_z = xp.abs(pa[:, 2] - stack_goal[:, 2])

    # Per task: (reward, success, point the tip should go to, where entity a should go).
    per_task = {
        "reach": (_closeness(xp, hover_dist, 10.0), hover_dist < REACH_TOLERANCE, hover, pa),
        "push": (0.5 * reach + 1.5 * _closeness(xp, push_err, 5.0), push_err < 0.04, pa, pb),
        "lift": (0.5 * reach + 2.0 * xp.clip(height / 0.08, 0.0, 1.0), height > 0.08, pa,
                 pa + xp.asarray([0.0, 0.0, 0.1])),
        "stack": (0.5 * reach + 0.5 * xp.clip(height / 0.05, 0.0, 1.0)
                  + 1.5 * _closeness(xp, _norm(xp, pa - stack_goal), 5.0),
                  (stack_xy < 0.02) & (stack_z < 0.01), pa, stack_goal),
        "press": (0.5 * reach + 1.5 * xp.clip(press / 0.01, 0.0, 1.0), press > 0.01, pa, pa),
        "drawer": (0.5 * _closeness(xp, _norm(xp, tip - behind_handle), 10.0)
                   + 1.5 * xp.clip(drawer / 0.1, 0.0, 1.0), drawer > 0.1, behind_handle,
                   pa + xp.asarray([0.0, -0.1, 0.0])),
    }
    chosen = [per_task[name] for name in task_names]
    if len(chosen) == 1:
        reward, success, tip_goal, obj_goal = chosen[0]
    else:
        def pick(k: int):
            stacked = xp.stack([c[k] for c in chosen], axis=1)
            index = task_ids.reshape((-1,) + (1,) * (stacked.ndim - 1))
            return xp.take_along_axis(stacked, index, axis=1)[:, 0]
        reward, success, tip_goal, obj_goal = (pick(k) for k in range(4))

    fingers = qpos[:, layout.finger_qpos]
    proprio = xp.concatenate([qpos[:, layout.arm_qpos], qvel[:, layout.arm_qvel], fingers,
                              qvel[:, layout.finger_qvel], tip], axis=1)
    state = xp.concatenate([tip_goal - tip, obj_goal - pa, tip, ents.reshape(ents.shape[0], -1),
                            press_all, drawer[:, None]], axis=1)
    return {
        "proprio": xp.astype(proprio, xp.float32),
        "state": xp.astype(state, xp.float32),
        "reward": xp.astype(reward, xp.float32),
        "success": success,
        "goal_points": xp.astype(xp.stack([tip_goal, obj_goal], axis=1), xp.float32),
    }
