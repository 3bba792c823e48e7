"""LIBERO's paraphrased instructions (sims.libero.paraphrase): no instruction of the project's equals one of
LIBERO-PRO's held-out ``_lan`` instructions, each names its task's things and belongs to one task of the 40,
the training, validation and held-out sets share no instruction, and the tables are the same in every process.

The BDDL files (each task's instruction and goal, and the ``_lan`` variants') are read from the export
toolchain in the LIBERO cache (installed if missing, as the other LIBERO tests do); the exported tasks' ``lan.json``
are read where the cache has them (skipped, naming the setup command, where it has none). The env tests run
spatial/0 (exported if missing) with two environments and no frames.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import sims
from sims.libero.paraphrase import (
    NOUNS,
    PER_TASK,
    SKILLS,
    TASKS,
    InstructionSampler,
    normalise,
    paraphrases,
    split_groups,
)
from sims.libero.scene import load_task
from sims.libero.suites import LIBERO_SUITE, all_task_ids, cache_dir, setup_hint
from sims.libero.toolchain.install import ensure_lan, ensure_toolchain
from sims.libero.toolchain.region_starts import ensure_region_starts
from vla_rl.config import CONFIG_DIR, ConfigError, load_config

IDS = all_task_ids()
SETS = tuple(PER_TASK)  # train, heldout, validation, structures
_LANGUAGE = re.compile(r"\(:language\s+(.*)\)")


@pytest.fixture(scope="module")
def bddl() -> dict[str, dict[str, str]]:
    """Per task id: its BDDL text, its instruction and LIBERO-PRO's ``_lan`` instruction."""
    site = ensure_toolchain(cache_dir())
    root = site / "libero" / "libero"
    tree = ast.parse((root / "benchmark" / "libero_suite_task_map.py").read_text())
    (task_map,) = [ast.literal_eval(n.value) for n in tree.body
                   if isinstance(n, ast.Assign) and n.targets[0].id == "libero_task_map"]
    out = {}
    for task_id in IDS:
        suite, index = task_id.split("/")
        bench = LIBERO_SUITE[suite]
        name = task_map[bench][int(index)]
        text = (root / "bddl_files" / bench / f"{name}.bddl").read_text()
        lan = (root / "bddl_files" / f"{bench}_lan" / f"{name}.bddl").read_text()
        out[task_id] = {"text": text, "name": name, "instruction": _LANGUAGE.search(text).group(1).strip().lower(),
                        "lan": _LANGUAGE.search(lan).group(1).strip()}
    return out


def _all(task_id: str) -> tuple[str, ...]:
    return tuple(t for which in SETS for t in paraphrases(task_id, which))


def _clashes(texts, held_out) -> list[str]:
    """The ``texts`` that say one of ``held_out``, compared as the tables compare instructions (:func:`normalise`)."""
    said = {normalise(t) for t in held_out}
    return sorted({t for t in texts if normalise(t) in said})


def test_no_instruction_equals_a_lan_instruction(bddl):
    lan = {normalise(b["lan"]) for b in bddl.values()}
    assert len(lan) == 40
    assert _clashes([t for task_id in IDS for t in _all(task_id)], lan) == []


def test_no_instruction_equals_a_cached_lan_instruction():
    """The ``_lan`` instructions the exported tasks carry (``<cache>/<suite>/<i>/lan.json``, what the ``lan`` split
    instructs with) against every table of the 40 tasks: a task's paraphrase must not say another task's either."""
    files = [cache_dir() / t / "lan.json" for t in IDS]
    lan = [json.loads(f.read_text())["instruction"] for f in files if f.is_file()]
    if not lan:
        pytest.skip(f"no task's lan.json in the LIBERO cache {cache_dir()}; {setup_hint()}")
    assert _clashes([t for task_id in IDS for t in _all(task_id)], lan) == []


def test_the_clash_check_finds_a_paraphrase_said_another_way():
    """A built-in case (no cache): an instruction given back with other capitals, punctuation and spacing is a clash,
    so the two tests above cannot pass by comparing raw strings; a sentence of the project's own, in no set, is not."""
    trained = paraphrases("spatial/0", "train")
    disguised = "  " + trained[3].upper().replace(" and ", ", and ") + "."
    outside = "fetch the black bowl between the plate and the ramekin and leave it on the plate"
    assert _clashes(_all("spatial/0"), [disguised, outside]) == [trained[3]]
    assert _clashes(_all("spatial/0"), [outside]) == []


def test_every_instruction_belongs_to_one_task_of_the_forty(bddl):
    """No two tasks (of a suite or of the 40) can issue the same instruction, their own BDDL ones included."""
    owner: dict[str, set[str]] = {}
    for task_id in IDS:
        for text in (*_all(task_id), bddl[task_id]["instruction"]):
            owner.setdefault(normalise(text), set()).add(task_id)
    shared = {t: sorted(o) for t, o in owner.items() if len(o) > 1}
    assert shared == {}
    assert len(owner) > 40 * 20  # not a vacuous pass: every task has paraphrases


def test_the_three_sets_share_no_instruction():
    """Training, validation (where language settings may be chosen) and held-out (the paraphrase test split) paraphrases
    are disjoint pools, each non-empty for every task."""
    pools = {w: {normalise(t) for task_id in IDS for t in paraphrases(task_id, w)} for w in SETS}
    assert all(pools.values())
    assert {(a, b): pools[a] & pools[b] for a, b in itertools.combinations(SETS, 2)} == {
        (a, b): set() for a, b in itertools.combinations(SETS, 2)}


def _named(noun: str, text: str) -> bool:
    return any(re.search(rf"\b{re.escape(name)}\b", text) for name in NOUNS[noun].names)


def test_every_instruction_names_its_tasks_things():
    for task_id in IDS:
        things = {k for clause in TASKS[task_id] for k in clause.things()}
        for text in _all(task_id):
            missing = [k for k in things if not _named(k, text)]
            assert not missing, (task_id, text, missing)


def test_described_things_are_the_bddl_tasks_things(bddl):
    """The word lists describe each task's own objects: every noun's BDDL category is in the task's BDDL, and
    every object its goal names (``akita_black_bowl_1``, ``basket_1_contain_region``) is one of its nouns."""
    for task_id in IDS:
        text = bddl[task_id]["text"]
        goal = text[text.index("(:goal"):]
        cats = {NOUNS[k].bddl for clause in TASKS[task_id] for k in clause.things()}
        assert all(c in text for c in cats), (task_id, cats)
        named = {m.group(1) for m in re.finditer(r"\b([a-z_]+?)_\d+\b", goal)}
        assert named <= cats, (task_id, named - cats)


def test_tables_are_bounded_and_use_every_template():
    for task_id in IDS:
        for which in SETS:
            texts = paraphrases(task_id, which)
            assert 4 <= len(texts) <= PER_TASK[which] and list(texts) == sorted(set(texts))
    for which in SETS:  # the draw keeps every template
        spatial = [t for i in range(10) for t in paraphrases(f"spatial/{i}", which)]
        frames = [re.sub(r"\{\w+\}", ".*", f) for f in SKILLS["pick_place"][which]]
        assert all(any(re.fullmatch(f, t) for t in spatial) for f in frames), which


_DUMP = ("from sims.libero.paraphrase import paraphrases; from sims.libero.suites import all_task_ids; "
         "print('\\n'.join(t for i in all_task_ids() for w in ('train', 'heldout', 'validation', 'structures') "
         "for t in paraphrases(i, w)))")


def test_tables_are_the_same_in_every_process():
    """Nothing depends on hash order or on which tasks a process asked for first."""
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", _DUMP], env=env, capture_output=True, text=True, check=True,
                             timeout=120, cwd=os.getcwd()).stdout
        digests.add(hashlib.sha256(out.encode()).hexdigest())
    paraphrases.cache_clear()
    asked_backwards = {i: paraphrases(i, "train") for i in reversed(IDS)}
    mine = "\n".join(t for i in IDS for w in SETS
                     for t in (asked_backwards[i] if w == "train" else paraphrases(i, w)))
    assert digests == {hashlib.sha256((mine + "\n").encode()).hexdigest()}


def test_split_groups_and_sampler():
    ids, own = ["spatial/0", "spatial/1"], ["pick the bowl a", "pick the bowl b"]
    assert split_groups(ids, own, "train", "original") == [("pick the bowl a",), ("pick the bowl b",)]
    assert split_groups(ids, own, "fixed", "paraphrase") == [("pick the bowl a",), ("pick the bowl b",)]
    train = split_groups(ids, own, "train", "paraphrase")
    assert train[0][0] == own[0] and set(train[0][1:]) == set(paraphrases("spatial/0", "train"))
    validation = split_groups(ids, own, "validation", "paraphrase")
    assert validation[1][0] == own[1] and set(validation[1][1:]) == set(paraphrases("spatial/1", "validation"))
    assert split_groups(ids, own, "paraphrase", "original") == [paraphrases(i, "heldout") for i in ids]
    with pytest.raises(ValueError, match="instructions='free'; use one of original, paraphrase"):
        split_groups(ids, own, "train", "free")
    sampler = InstructionSampler(train, "train")
    groups, episodes = [0] * 200, range(200)
    drawn = sampler.draw(1, 7, groups, episodes)
    texts = [sampler.table[i] for i in drawn]
    assert set(texts) <= set(train[1]) and len(set(texts)) > len(train[1]) // 2  # spread over the group
    assert (sampler.draw(1, 7, groups, episodes) == drawn).all()  # a function of (seed, group, episode)
    assert (sampler.draw(1, 8, groups, episodes) != drawn).any()
    assert (InstructionSampler(train, "validation").draw(1, 7, groups, episodes) != drawn).any()


# ----------------------------------------------------------------------------- the env's hook (spatial/0, 2 envs)
HOLD = np.array([[0, 0, 0, 0, 0, 0, -1]] * 2, np.float32)  # no motion, gripper open


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_lan(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)  # the train and validation splits' starts


def _env(split: str = "train", **kw):
    return sims.make_vec_env("libero_spatial/0", 2, split=split, num_threads=1, **kw)


def _texts(env, obs) -> list[str]:
    return [env.instructions[i] for i in obs["instruction"]]


def test_paraphrase_training_draws_an_instruction_per_episode_and_keeps_the_starts(cached):
    original, para = _env(), _env(instructions="paraphrase")
    own = load_task("spatial/0").instruction
    assert original.instructions == [own]
    assert para.instructions == [own, *paraphrases("spatial/0", "train")]
    assert para.single_observation_space["instruction"].n == len(para.instructions)
    seen = []
    for seed in range(6):
        a, b = original.reset_arrays(seed=seed), para.reset_arrays(seed=seed)
        np.testing.assert_array_equal(a["state"], b["state"])  # instructions draw on a stream of their own
        assert a["instruction"].tolist() == [0, 0]
        seen += _texts(para, b)
    assert len(set(seen)) > 4 and set(seen) <= set(para.instructions)
    again = _env(instructions="paraphrase")
    assert _texts(again, again.reset_arrays(seed=5)) == seen[-2:]  # seeded: the same draw in a fresh env


def test_paraphrase_validation_draws_phrasings_never_trained_on(cached):
    """With instructions=paraphrase the validation split (the one that may pick a checkpoint) instructs with the
    task's own instruction or a validation paraphrase: apart from the own one, nothing the training split says."""
    train, validation = _env(instructions="paraphrase"), _env("validation", instructions="paraphrase")
    own = load_task("spatial/0").instruction
    assert validation.instructions == [own, *paraphrases("spatial/0", "validation")]
    assert set(train.instructions) & set(validation.instructions) == {own}
    seen = {t for seed in range(6) for t in _texts(validation, validation.reset_arrays(seed=seed))}
    assert len(seen) > 4 and seen <= set(validation.instructions)


def test_paraphrase_split_plays_the_fixed_states_with_held_out_instructions(cached):
    fixed, para = _env("fixed"), _env("paraphrase")
    a, b = fixed.reset_arrays(seed=0), para.reset_arrays(seed=0)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert (fixed.state_index == para.state_index).all()
    assert para.instructions == list(paraphrases("spatial/0", "heldout"))
    assert set(_texts(para, b)) <= set(paraphrases("spatial/0", "heldout"))


def test_a_restored_env_issues_the_same_instructions(cached):
    env = _env(instructions="paraphrase", max_steps=2)
    env.reset_arrays(seed=3)
    for _ in range(3):  # past an episode's end: new instructions
        env.step_arrays(HOLD)
    twin = _env(instructions="paraphrase", max_steps=2)
    twin.set_state(env.get_state())
    for _ in range(4):
        a, b = env.step_arrays(HOLD), twin.step_arrays(HOLD)
        assert a["observation"]["instruction"].tolist() == b["observation"]["instruction"].tolist()


def test_instructions_setting_is_checked_and_forwarded(cached):
    from vla_rl.envs import make_env

    with pytest.raises(ValueError, match=r"^instructions='free'; use one of original, paraphrase$"):
        _env(instructions="free")
    with pytest.raises(ConfigError, match=r"^env.suite.instructions='free'; use one of original, paraphrase$"):
        load_config(CONFIG_DIR / "libero.yaml", ["env.suite.instructions=free"])
    with pytest.raises(ConfigError, match=r"^env.suite has unknown key\(s\) \['instructions'\] for env.task='reach'"):
        load_config(CONFIG_DIR / "default.yaml", ["env.suite.instructions=paraphrase"])
    cfg = load_config(CONFIG_DIR / "libero.yaml", ["env.task=libero_spatial/0", "env.suite.instructions=paraphrase"])
    env = make_env(dataclasses.replace(cfg.env, frames=None), seed=0, num_envs=2)
    assert env.instructions[1:] == list(paraphrases("spatial/0", "train"))
