"""Starts drawn by LIBERO's own placement rules: its training distribution, never the fixed states.

LIBERO's environments place every object and fixture at reset by the BDDL's regions
(``bddl_base_domain._add_placement_initializer``: fixtures uniformly in their regions with their yaw
ranges, objects by the problem's region samplers, objects on sites or on other objects after them,
articulations by their open/close and on/off ranges) and add the robot's initialisation noise, all
from numpy's global random state. :func:`ensure_region_starts` runs exactly that code, in the export
toolchain's process (:mod:`sims.libero.toolchain.install`), once per start: ``numpy.random.seed(seed)`` then a
hard ``env.reset()``, and records

- ``states`` float64 [K, 1 + nq + nv]: time, qpos and qvel, the fixed states' layout;
- ``fixture_pos`` [K, F, 3] and ``fixture_quat`` [K, F, 4] (w, x, y, z): where each of the task's
  fixtures (``fixtures`` [F], root body names: cabinets, stoves, racks, ...) stands in that start;
  LIBERO moves them per reset in ``model.body_pos`` / ``body_quat``, which
  :meth:`sims.libero.sim.LiberoSim.place_fixtures` writes per simulation;
- ``arm_noise``: the std of the Gaussian noise on each arm joint (:data:`ARM_NOISE`, robosuite's "default"
  initialisation noise, which ``BDDLBaseDomain`` asks for and LIBERO's fixed states show: their arm joints spread
  by 0.02 rad); a file without it was written without the noise and is stale (:func:`stale_starts`);

into ``<cache>/<suite>/<index>/region_starts.npz``. Start ``k`` comes from seed ``k`` and numpy's
legacy Mersenne Twister, whose stream numpy keeps identical on every platform and version, with the
toolchain's pinned LIBERO and robosuite: the same starts on every machine, independent of thread
counts and hash seeds. The ``train`` and ``validation`` splits own disjoint starts (:func:`split_pool`: every
:data:`VALIDATION_EVERY`-th is validation's), so no validation episode replays a start a demonstration or a training
episode saw; :func:`draw` picks an episode's start in its split's pool from ``(seed, group, episode, stream)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from sims.libero.suites import cache_dir, parse_task_id

FILE = "region_starts.npz"
#: Starts written per task: each is one hard reset of LIBERO's env (about 0.3 CPU-seconds).
DEFAULT_COUNT = 200
#: Starts ``k`` with ``k % VALIDATION_EVERY == VALIDATION_EVERY - 1`` are the ``validation`` split's, the others
#: the ``train`` split's (a fifth held out, as many as the validation episodes of a run need).
VALIDATION_EVERY = 5
REGION_SPLITS = ("train", "validation")
#: Std (rad) of robosuite's "default" Gaussian initialisation noise on each arm joint, in every region start.
ARM_NOISE = 0.02


@dataclass(frozen=True)
class RegionStarts:
    """One task's region-sampled starts (see the module docstring); ``count`` = K."""

    states: np.ndarray
    fixtures: tuple[str, ...]
    fixture_pos: np.ndarray
    fixture_quat: np.ndarray

    @property
    def count(self) -> int:
        return len(self.states)

    def fixture_places(self, model: mujoco.MjModel, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The fixtures' bodies in ``model`` [B] and their places [n, B, 3], [n, B, 4] (w, x, y, z) in starts
        ``index`` [n] (what :meth:`sims.libero.sim.LiberoSim.place_fixtures` takes); None: the task has no fixture."""
        if not self.fixtures:
            return None
        bodies = np.array([model.body(name).id for name in self.fixtures])
        return bodies, self.fixture_pos[index], self.fixture_quat[index]


def starts_path(task_id: str, cache: str | os.PathLike | None = None) -> Path:
    """Where ``task_id``'s region starts are cached."""
    suite, index = parse_task_id(task_id)
    return cache_dir(cache) / suite / str(index) / FILE


def stale_starts(starts: Mapping[str, np.ndarray]) -> bool:
    """Whether a loaded :data:`FILE` was written without robosuite's arm noise of :data:`ARM_NOISE` (by an earlier
    sampler: every start at one arm pose, unlike LIBERO's training distribution)."""
    return "arm_noise" not in starts or float(starts["arm_noise"]) != ARM_NOISE


def _usable(path: Path) -> bool:
    if not path.is_file():
        return False
    with np.load(path) as f:
        return not stale_starts(f)


def missing_region_starts(task_ids: Sequence[str], cache: str | os.PathLike | None = None) -> str:
    """A one-line error naming the tasks of ``task_ids`` whose region starts are not cached (or are stale: no arm
    noise), their files and the command that writes them; "" when every task has them."""
    missing = [t for t in task_ids if not _usable(starts_path(t, cache))]
    if not missing:
        return ""
    files = ", ".join(str(starts_path(t, cache)) for t in missing)
    where = "" if cache is None else f" --cache {cache}"
    return (f"no current region-sampled starts for {' '.join(missing)} ({files} missing, or written without LIBERO's "
            f"arm noise); write them with python scripts/setup_libero.py --tasks {' '.join(missing)} --region-starts "
            f"{DEFAULT_COUNT}{where}")


def load_region_starts(task_id: str, cache: str | os.PathLike | None = None) -> RegionStarts:
    """The cached region starts of ``task_id``.

    Raises:
        FileNotFoundError: none are cached, or only stale ones (the message names the command that writes them).
    """
    path = starts_path(task_id, cache)
    if path.is_file():  # read once: the staleness check and the starts come from the same open file
        with np.load(path) as f:
            if not stale_starts(f):
                return RegionStarts(states=f["states"], fixtures=tuple(str(n) for n in f["fixtures"]),
                                    fixture_pos=f["fixture_pos"], fixture_quat=f["fixture_quat"])
    raise FileNotFoundError(missing_region_starts([task_id], cache))


def split_pool(count: int, split: str) -> np.ndarray:
    """The indices int64 [n] of ``count`` starts that ``split`` (``train`` or ``validation``) draws from.

    Raises:
        ValueError: ``split`` is not a region split (LIBERO's fixed initial states are test data), or owns no
            start of ``count`` (the message names the command that writes more).
    """
    if split not in REGION_SPLITS:
        raise ValueError(f"split={split!r} does not start from region-sampled starts; they serve "
                         f"{', '.join(REGION_SPLITS)} only (the fixed-state splits are test data)")
    k = np.arange(count)
    held = k % VALIDATION_EVERY == VALIDATION_EVERY - 1
    pool = k[held if split == "validation" else ~held]
    if not len(pool):
        raise ValueError(f"{count} region-sampled starts leave the {split} split none (every {VALIDATION_EVERY}th is "
                         f"validation's); write more with scripts/setup_libero.py --region-starts {DEFAULT_COUNT}")
    return pool


def draw(pool: np.ndarray, seed: int, group: int, episode: int, stream: int) -> int:
    """The start index (an element of ``pool``, :func:`split_pool`) of episode ``episode`` of group ``group``
    (a pure function of its arguments)."""
    return int(pool[np.random.default_rng([seed, group, episode, stream]).integers(len(pool))])
