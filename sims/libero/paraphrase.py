"""LIBERO's instructions as a person would give them: paraphrases of the 40 tasks from the project's
own templates and word lists, in splits like the gantry suite's (:mod:`sims.tasks`).

Each task is described by its language structure (:data:`TASKS`): one or two clauses (pick and place,
put both, push, open, close, turn on), each naming things from :data:`NOUNS` (a thing's names, and
the BDDL object it is), with a relation (:data:`RELATIONS`: on, in, on top of, to the right of, in
front of) and, for LIBERO-Spatial, a locator that tells which of two black bowls is meant
(:data:`LOCATORS`: between the X and the Y, next to, on, in the top drawer of, the table's centre).
A clause is said with a skill's templates (:data:`SKILLS`), in four sets that share no sentence:
``train`` for training, ``validation`` for the ``validation`` split (phrasings never trained on, where
language settings may be chosen), ``heldout`` for the ``paraphrase`` test split only, and ``structures``,
a development set in sentence shapes the other three lack (the destination first, a request, the locator
as a relative clause: "the black bowl that is next to the ramekin"), where robustness to how a sentence is
built can be measured without a test split (``scripts/bench_language_dev.py``); a two-clause task
joins its clauses with a conjunction of the same set (:data:`CONJUNCTIONS`). Every template is filled with
every choice of words; a task keeps at most :data:`PER_TASK` of them per set, drawn once with a fixed
seed, so the tables are the same on every machine and do not depend on which tasks an env runs.

LIBERO-PRO's ``_lan`` instructions are never read here: they are test data
(tests/sims/test_libero_paraphrase.py checks that no instruction of any set equals one of them).
"""

from __future__ import annotations

import functools
import itertools
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sims.libero.suites import SUITES, parse_task_id, resolve_libero_task

INSTRUCTION_MODES = ("original", "paraphrase")
"""What training and validation episodes are instructed with: ``original``, the task's BDDL
instruction only (LIBERO's protocol); ``paraphrase``, that instruction or one of the task's training
paraphrases per training episode, and of its validation paraphrases per validation episode."""
PER_TASK = {"train": 48, "heldout": 24, "validation": 24, "structures": 24}  # the order seeds each set's draw: append, never reorder
"""The most instructions a task keeps of each template set."""
_TABLE_SEED = 0x1A56  # draws each task's kept instructions; fixed: the tables are part of the benchmark


@dataclass(frozen=True)
class Noun:
    """A thing and how a person names it.

    Attributes:
        names: its names, the first the one LIBERO's instruction uses.
        bddl: the BDDL object category it is (``akita_black_bowl``), "" for a part of one.
        article: say "the" before a name (False for "both moka pots").
    """

    names: tuple[str, ...]
    bddl: str = ""
    article: bool = True

    def phrases(self) -> tuple[str, ...]:
        """Its names as noun phrases: "the black bowl", "the bowl"."""
        return tuple(f"the {n}" if self.article else n for n in self.names)


NOUNS: dict[str, Noun] = {
    "black bowl": Noun(("black bowl", "bowl"), "akita_black_bowl"),
    "plate": Noun(("plate",), "plate"),
    "left plate": Noun(("left plate", "plate on the left"), "plate"),
    "right plate": Noun(("right plate", "plate on the right"), "plate"),
    "ramekin": Noun(("ramekin", "small ramekin"), "glazed_rim_porcelain_ramekin"),
    "cookie box": Noun(("cookie box", "box of cookies"), "cookies"),
    "wooden cabinet": Noun(("wooden cabinet", "cabinet"), "wooden_cabinet"),
    "stove": Noun(("stove", "cooktop"), "flat_stove"),
    "basket": Noun(("basket",), "basket"),
    "alphabet soup": Noun(("alphabet soup", "can of alphabet soup"), "alphabet_soup"),
    "cream cheese": Noun(("cream cheese", "cream cheese box", "box of cream cheese"), "cream_cheese"),
    "salad dressing": Noun(("salad dressing", "bottle of salad dressing"), "salad_dressing"),
    "bbq sauce": Noun(("bbq sauce", "barbecue sauce"), "bbq_sauce"),
    "ketchup": Noun(("ketchup", "ketchup bottle"), "ketchup"),
    "tomato sauce": Noun(("tomato sauce", "can of tomato sauce"), "tomato_sauce"),
    "butter": Noun(("butter", "box of butter"), "butter"),
    "milk": Noun(("milk", "milk carton"), "milk"),
    "chocolate pudding": Noun(("chocolate pudding", "box of chocolate pudding"), "chocolate_pudding"),
    "orange juice": Noun(("orange juice", "orange juice carton"), "orange_juice"),
    "wine bottle": Noun(("wine bottle", "bottle of wine"), "wine_bottle"),
    "wine rack": Noun(("wine rack", "rack"), "wine_rack"),
    "middle drawer": Noun(("middle drawer", "middle drawer of the cabinet"), "wooden_cabinet"),
    "top drawer": Noun(("top drawer", "top drawer of the cabinet"), "wooden_cabinet"),
    "bottom drawer": Noun(("bottom drawer", "bottom drawer of the cabinet"), "white_cabinet"),
    "moka pot": Noun(("moka pot", "espresso maker"), "moka_pot"),
    "moka pots": Noun(("both moka pots", "the two moka pots", "both of the moka pots"), "moka_pot", article=False),
    "white mug": Noun(("white mug", "white cup"), "porcelain_mug"),
    "yellow and white mug": Noun(("yellow and white mug", "white and yellow mug"), "white_yellow_mug"),
    "book": Noun(("book", "black book"), "black_book"),
    "caddy back": Noun(("back compartment of the caddy", "rear compartment of the caddy",
                        "back compartment of the desk caddy"), "desk_caddy"),
    "microwave": Noun(("microwave", "microwave oven"), "microwave"),
}
"""The word list of things: key -> :class:`Noun`."""

RELATIONS: dict[str, tuple[str, ...]] = {
    "on": ("on", "onto", "down on"),
    "in": ("in", "into", "inside"),
    "on_top": ("on top of", "onto the top of", "on the top of"),
    "right_of": ("to the right of", "on the right side of", "right of"),
    "front_of": ("to the front of", "in front of"),
}
"""Where a thing goes relative to another: relation -> its words."""

LOCATORS: dict[str, tuple[str, ...]] = {
    "between": ("between {x} and {y}", "in between {x} and {y}"),
    "next_to": ("next to {x}", "beside {x}", "by {x}"),
    "on": ("on {x}", "on top of {x}", "from {x}"),
    "in_top_drawer": ("in the top drawer of {x}", "inside the top drawer of {x}", "from the top drawer of {x}"),
    "center": ("in the middle of the table", "at the center of the table", "from the center of the table"),
}
"""Which of several alike things is meant, by where it is: locator -> phrases (``{x}``, ``{y}``: referents)."""

RELATIVE_LOCATORS: dict[str, tuple[str, ...]] = {
    "between": ("that is between {x} and {y}", "sitting between {x} and {y}"),
    "next_to": ("that is next to {x}", "sitting beside {x}"),
    "on": ("that is on {x}", "sitting on top of {x}"),
    "in_top_drawer": ("that is in the top drawer of {x}", "sitting inside the top drawer of {x}"),
    "center": ("that is in the middle of the table", "sitting at the center of the table"),
}
"""The locators as relative clauses (the ``{objrel}`` slot of the ``structures`` templates)."""

VERBS: dict[str, tuple[str, ...]] = {"pick": ("pick up", "grab", "take", "lift"), "place": ("put", "place", "set")}
"""Verb slots of the templates."""

SKILLS: dict[str, dict[str, tuple[str, ...]]] = {
    "pick_place": {"train": ("{pick} {obj} and {place} it {rel} {dest}", "{place} {obj} {rel} {dest}"),
                   "heldout": ("get {obj} {rel} {dest}", "{obj} goes {rel} {dest}", "i need {obj} {rel} {dest}"),
                   "validation": ("move {obj} {rel} {dest}", "bring {obj} {rel} {dest}", "transfer {obj} {rel} {dest}"),
                   "structures": ("{rel} {dest}, {place} {objrel}", "could you {place} {objrel} {rel} {dest}",
                                  "find {objrel} and leave it {rel} {dest}")},
    "put_both": {"train": ("{place} {obj} {rel} {dest}", "{pick} {obj} and {place} them {rel} {dest}"),
                 "heldout": ("get {obj} {rel} {dest}", "{obj} go {rel} {dest}", "i need {obj} {rel} {dest}"),
                 "validation": ("move {obj} {rel} {dest}", "bring {obj} {rel} {dest}", "transfer {obj} {rel} {dest}"),
                 "structures": ("{rel} {dest}, {place} {obj}", "could you {place} {obj} {rel} {dest}",
                                "find {obj} and leave them {rel} {dest}")},
    "push": {"train": ("push {obj} {rel} {dest}", "slide {obj} {rel} {dest}"),
             "heldout": ("nudge {obj} {rel} {dest}", "shove {obj} over {rel} {dest}"),
             "validation": ("scoot {obj} {rel} {dest}", "move {obj} {rel} {dest} without lifting it"),
             "structures": ("could you push {obj} {rel} {dest}", "{obj} has to be pushed {rel} {dest}")},
    "open": {"train": ("open {obj}", "pull {obj} open", "pull open {obj}"),
             "heldout": ("get {obj} open", "i need {obj} open"),
             "validation": ("open up {obj}", "slide {obj} open"),
             "structures": ("could you open {obj}", "{obj} has to be opened")},
    "close": {"train": ("close {obj}", "shut {obj}"), "heldout": ("get {obj} closed", "push {obj} shut"),
              "validation": ("close {obj} up", "make sure {obj} is closed"),
              "structures": ("could you close {obj}", "{obj} has to be shut")},
    "turn_on": {"train": ("turn on {obj}", "switch {obj} on", "turn {obj} on"),
                "heldout": ("fire up {obj}", "get {obj} going", "i need {obj} on"),
                "validation": ("power on {obj}", "start up {obj}"),
                "structures": ("could you turn on {obj}", "{obj} has to be switched on")},
}
"""Each skill's templates: ``train`` (training), ``validation`` (the validation split) and ``heldout`` (the
paraphrase test split) and ``structures`` (a development set of sentence shapes none of the others has)."""

CONJUNCTIONS: dict[str, tuple[str, ...]] = {
    "train": ("{0} and {1}", "{0}, then {1}", "first {0}, then {1}"),
    "heldout": ("{0} and after that {1}", "{0}; once that is done, {1}"),
    "validation": ("{0}, and next {1}", "{0}, and when that is finished, {1}"),
    "structures": ("before anything else {0}; afterwards {1}", "{0}. when you are done, {1}"),
}
"""How a two-clause task joins its clauses, per template set."""


@dataclass(frozen=True)
class Clause:
    """One step of a task, in words.

    Attributes:
        skill: key of :data:`SKILLS`.
        obj: key of :data:`NOUNS`, or two keys joined by ``+`` for ``put_both`` ("both the X and the Y").
        rel: key of :data:`RELATIONS` ("" for skills without a destination).
        dest: key of :data:`NOUNS` ("" for none).
        loc: a locator of :data:`LOCATORS` and its referents (keys of :data:`NOUNS`), () for none.
        it: the clause's last named thing (``dest``, else ``obj``) may be said "it": the clause before named it.
    """

    skill: str
    obj: str
    rel: str = ""
    dest: str = ""
    loc: tuple[str, ...] = ()
    it: bool = False

    def things(self) -> tuple[str, ...]:
        """Keys of every noun the clause names."""
        return tuple(k for k in (*self.obj.split("+"), self.dest, *self.loc[1:]) if k)


def _spatial(*loc: str) -> tuple[Clause, ...]:
    return (Clause("pick_place", "black bowl", "on", "plate", loc),)


def _into_basket(obj: str) -> tuple[Clause, ...]:
    return (Clause("put_both" if "+" in obj else "pick_place", obj, "in", "basket"),)


TASKS: dict[str, tuple[Clause, ...]] = {
    **{f"spatial/{i}": c for i, c in enumerate((
        _spatial("between", "plate", "ramekin"), _spatial("next_to", "ramekin"), _spatial("center"),
        _spatial("on", "cookie box"), _spatial("in_top_drawer", "wooden cabinet"), _spatial("on", "ramekin"),
        _spatial("next_to", "cookie box"), _spatial("on", "stove"), _spatial("next_to", "plate"),
        _spatial("on", "wooden cabinet")))},
    **{f"object/{i}": _into_basket(o) for i, o in enumerate((
        "alphabet soup", "cream cheese", "salad dressing", "bbq sauce", "ketchup", "tomato sauce", "butter", "milk",
        "chocolate pudding", "orange juice"))},
    "goal/0": (Clause("open", "middle drawer"),),
    "goal/1": (Clause("pick_place", "black bowl", "on", "stove"),),
    "goal/2": (Clause("pick_place", "wine bottle", "on_top", "wooden cabinet"),),
    "goal/3": (Clause("open", "top drawer"), Clause("pick_place", "black bowl", "in", "top drawer", it=True)),
    "goal/4": (Clause("pick_place", "black bowl", "on_top", "wooden cabinet"),),
    "goal/5": (Clause("push", "plate", "front_of", "stove"),),
    "goal/6": (Clause("pick_place", "cream cheese", "on", "black bowl"),),
    "goal/7": (Clause("turn_on", "stove"),),
    "goal/8": (Clause("pick_place", "black bowl", "on", "plate"),),
    "goal/9": (Clause("pick_place", "wine bottle", "on", "wine rack"),),
    "10/0": _into_basket("alphabet soup+tomato sauce"),
    "10/1": _into_basket("cream cheese+butter"),
    "10/2": (Clause("turn_on", "stove"), Clause("pick_place", "moka pot", "on", "stove", it=True)),
    "10/3": (Clause("pick_place", "black bowl", "in", "bottom drawer"), Clause("close", "bottom drawer", it=True)),
    "10/4": (Clause("pick_place", "white mug", "on", "left plate"),
             Clause("pick_place", "yellow and white mug", "on", "right plate")),
    "10/5": (Clause("pick_place", "book", "in", "caddy back"),),
    "10/6": (Clause("pick_place", "white mug", "on", "plate"),
             Clause("pick_place", "chocolate pudding", "right_of", "plate", it=True)),
    "10/7": _into_basket("alphabet soup+cream cheese"),
    "10/8": (Clause("put_both", "moka pots", "on", "stove"),),
    "10/9": (Clause("pick_place", "yellow and white mug", "in", "microwave"), Clause("close", "microwave", it=True)),
}
"""Every LIBERO task's language structure, from its BDDL goal and instruction: task id -> its clauses."""


def _object_phrases(clause: Clause, locators: dict[str, tuple[str, ...]] = LOCATORS) -> tuple[str, ...]:
    """How the clause can name its object: with its locator (phrased as ``locators`` says), "both the X and the Y",
    or "it"."""
    if "+" in clause.obj:
        a, b = (NOUNS[k].phrases() for k in clause.obj.split("+"))
        pairs = [(x, y) for x, y in itertools.product(a, b)] + [(y, x) for x, y in itertools.product(a, b)]
        return tuple(f"{both}{x} and {y}" for both in ("both ", "") for x, y in pairs)
    own = NOUNS[clause.obj].phrases()
    if clause.it and not clause.dest:
        own = ("it", *own)
    if not clause.loc:
        return own
    kind, *refs = clause.loc
    places = [t.format(**dict(zip("xy", r))) for t in locators[kind]
              for r in itertools.product(*(NOUNS[k].phrases() for k in refs))]
    return tuple(f"{o} {p}" for o in own for p in places)


def _slots(clause: Clause) -> dict[str, tuple[str, ...]]:
    dest = NOUNS[clause.dest].phrases() if clause.dest else ()
    return {**VERBS, "obj": _object_phrases(clause), "objrel": _object_phrases(clause, RELATIVE_LOCATORS),
            "rel": RELATIONS.get(clause.rel, ()),
            "dest": ("it", *dest) if clause.it and clause.dest else dest}


def clause_texts(clause: Clause, which: str) -> list[str]:
    """Every way template set ``which`` (a key of :data:`PER_TASK`) says ``clause``, in a fixed order."""
    slots, out = _slots(clause), []
    for template in SKILLS[clause.skill][which]:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        for words in itertools.product(*(slots[n] for n in names)):
            filled = dict(zip(names, words))
            if filled.get("dest") == "it" and " it " in template:  # "put it on it": name the object instead
                continue
            out.append(template.format(**filled))
    return out


@functools.cache
def paraphrases(task_id: str, which: str) -> tuple[str, ...]:
    """The instructions template set ``which`` (a key of :data:`PER_TASK`) keeps for ``task_id``, sorted:
    every filling of its templates, or :data:`PER_TASK` of them drawn with a fixed seed.

    Raises:
        ValueError: an unknown task id or template set.
    """
    suite, index = parse_task_id(task_id)
    if which not in PER_TASK:
        raise ValueError(f"unknown template set {which!r}; use one of {', '.join(PER_TASK)}")
    clauses = [clause_texts(c, which) for c in TASKS[f"{suite}/{index}"]]
    joins = (CONJUNCTIONS[which],) if len(clauses) > 1 else ()
    sizes = [len(c) for c in (*clauses, *joins)]
    total, keep = int(np.prod(sizes)), PER_TASK[which]
    rng = np.random.default_rng([_TABLE_SEED, SUITES.index(suite), index, list(PER_TASK).index(which)])
    picks = range(total) if total <= keep else np.sort(rng.choice(total, keep, replace=False))
    texts = []
    for flat in picks:
        parts = np.unravel_index(int(flat), sizes)
        words = [c[int(i)] for c, i in zip(clauses, parts)]
        texts.append(joins[0][int(parts[-1])].format(*words) if joins else words[0])
    return tuple(sorted(set(texts)))


def normalise(text: str) -> str:
    """``text`` lower-case, without punctuation, single-spaced: how two instructions are compared."""
    return " ".join(re.sub(r"[^\w\s]", "", text.lower()).split())


def check_mode(mode: str) -> None:
    """Raise ValueError naming the valid modes unless ``mode`` is one of :data:`INSTRUCTION_MODES`."""
    if mode not in INSTRUCTION_MODES:
        raise ValueError(f"instructions={mode!r}; use one of {', '.join(INSTRUCTION_MODES)}")


def split_groups(task_ids: Sequence[str], instructions: Sequence[str], split: str, mode: str) -> list[tuple[str, ...]]:
    """The instructions each task's episodes of ``split`` draw from, one tuple per task.

    ``instructions`` are the tasks' own (the BDDL's; for ``lan`` the variant's). ``paraphrase``: the
    held-out paraphrases; ``train`` (``validation``) with ``mode="paraphrase"``: the task's own instruction
    and its training (validation) paraphrases; otherwise the task's own instruction only.
    """
    check_mode(mode)
    if split == "paraphrase":
        return [paraphrases(t, "heldout") for t in task_ids]
    if split in ("train", "validation") and mode == "paraphrase":
        return [tuple(dict.fromkeys((own, *paraphrases(t, split)))) for t, own in zip(task_ids, instructions)]
    return [(own,) for own in instructions]


def libero_training_groups(task: str, mode: str, cache: str | None = None) -> list[tuple[str, ...]]:
    """Each task's training instructions under ``mode`` (:data:`INSTRUCTION_MODES`: its own, then with
    ``paraphrase`` its training paraphrases) of env task ``task`` (``libero_spatial``), the own ones read from the
    task cache; the LIBERO suite's ``training_instructions`` (:mod:`sims.registry`).

    Raises:
        ValueError: an unknown task or mode. FileNotFoundError: a task not in the cache (naming the setup command).
    """
    from sims.libero.scene import load_task

    ids = resolve_libero_task(task)
    return split_groups(ids, [load_task(t, cache).instruction for t in ids], "train", mode)


DEV_SETS = ("validation", "structures")
"""The template sets where language settings may be chosen: the validation split's, and the sentence shapes none
of the other sets has."""


def libero_validation_phrasings(task: str, which: str = "validation") -> dict[str, tuple[str, ...]]:
    """Each task of env task ``task``'s paraphrases of development set ``which`` (:data:`DEV_SETS`), by task name
    (``libero_spatial/0``): the LIBERO suite's ``validation_instructions`` (:mod:`sims.registry`), in neither its
    training nor its test sets.

    Raises:
        ValueError: an unknown task, or a set that is not a development set.
    """
    if which not in DEV_SETS:
        raise ValueError(f"{which!r} is not a development phrasing set of LIBERO; use one of {', '.join(DEV_SETS)}")
    return {f"libero_{t}": paraphrases(t, which) for t in resolve_libero_task(task)}


_SPLIT_STREAM = {"train": 0x1A50, "validation": 0x1A51, "paraphrase": 0x1A52}  # apart from the starts' streams


class InstructionSampler:
    """Each episode's instruction: an index into :attr:`table`, drawn from its task's group.

    The draw is a function of ``(seed, group, episode)`` alone, on a stream of its own, so the
    episodes' initial states do not change with the instructions, and a restored env draws the same.

    Attributes:
        table: every instruction of the groups, each once, in group order (one group per task).
    """

    def __init__(self, groups: Sequence[tuple[str, ...]], split: str) -> None:
        self.table: list[str] = list(dict.fromkeys(s for g in groups for s in g))
        position = {s: i for i, s in enumerate(self.table)}
        self._members = [np.array([position[s] for s in g], np.int64) for g in groups]
        self._stream = _SPLIT_STREAM.get(split)

    def draw(self, task: int, seed: int, groups: np.ndarray, episodes: np.ndarray) -> np.ndarray:
        """Instruction indices int64 [M] of episode ``episodes[j]`` of environment group ``groups[j]`` of task ``task``."""
        members = self._members[task]
        if len(members) == 1:
            return np.full(len(groups), members[0], np.int64)
        pick = [np.random.default_rng([seed, int(g), int(e), self._stream]).integers(len(members))
                for g, e in zip(groups, episodes)]
        return members[np.array(pick, np.int64)]

