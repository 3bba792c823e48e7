"""The entry points: ``vla-rl COMMAND`` runs the checkout's script, scripts find the project without editing
``sys.path`` and from any directory, and MuJoCo gets the headless GL defaults whichever script starts it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vla_rl import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
PROBE = """
import importlib.util, os, sys
path = sys.argv[1]
sys.path.insert(0, os.path.dirname(path))  # as `python scripts/x.py` has it: its siblings importable
spec = importlib.util.spec_from_file_location("probe", path)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
mujoco = sys.modules.get("mujoco")
print(getattr(getattr(mujoco, "GLContext", None), "__module__", "no mujoco"))
"""


def _run(args: list[str], cwd: Path, headless_defaults: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not headless_defaults:
        env.pop("MUJOCO_GL", None)
        env.pop("PYOPENGL_PLATFORM", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_entry_point_is_declared_and_lists_every_command(tmp_path):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"vla-rl": "vla_rl.cli:main"}
    out = _run(["-m", "vla_rl.cli", "--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    for command, stem in cli.COMMANDS.items():
        assert (ROOT / "scripts" / f"{stem}.py").is_file(), command
        line = next(row for row in out.stdout.splitlines() if row.split()[:1] == [command])
        assert cli.summary(ROOT / "scripts" / f"{stem}.py") in line and line.strip() != command


def test_a_command_runs_its_script_from_any_directory(tmp_path):
    out = _run(["-m", "vla_rl.cli", "train", "--help"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("usage: train.py"), out.stderr
    out = _run(["-m", "vla_rl.cli", "sft-rl", "--help"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("usage: sft_rl.py"), out.stderr
    direct = _run([str(ROOT / "scripts" / "train.py"), "--help"], tmp_path)
    assert direct.returncode == 0 and direct.stdout.startswith("usage: train.py"), direct.stderr


def test_an_unknown_command_is_one_line_naming_the_closest(tmp_path):
    out = _run(["-m", "vla_rl.cli", "trian"], tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "vla-rl: error: unknown command 'trian'; did you mean train? run vla-rl --help for the commands\n"


def _edits_sys_path(path: Path) -> bool:
    """Whether the script changes ``sys.path``: calls one of its list methods, or assigns it or a slice of it."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and ast.unparse(node.func.value) == "sys.path"
                and node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear")):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        if any(ast.unparse(t).startswith("sys.path") for t in targets):
            return True
    return False


def test_no_script_edits_sys_path(tmp_path):
    """Scripts, the GPU machine's under scripts/device included, find the project through the installation or
    ``PYTHONPATH`` (scripts/device/gpu_env.sh), never by editing ``sys.path``."""
    assert [str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").rglob("*.py")) if _edits_sys_path(p)] == []
    for edit in ("sys.path.insert(0, str(Path(__file__).resolve().parent.parent))",  # the old 14-line preamble's
                 "sys.path[:0] = [str(ROOT), str(ROOT / 'scripts')]", "sys.path.append(os.getcwd())",
                 "sys.path += ['scripts']"):
        planted = tmp_path / "old.py"
        planted.write_text(f"import os, sys\nfrom pathlib import Path\n\n{edit}\n")
        assert _edits_sys_path(planted), edit
    planted.write_text("import sys\n\nprint(sys.path[0])\nparts = list(sys.path)\n")  # reading it is fine
    assert not _edits_sys_path(planted)


def test_a_script_that_imports_mujoco_first_still_renders_headless(tmp_path):
    """bench_sims imports mujoco before any sims module: its ``import sims`` first keeps EGL (not GLFW)."""
    out = _run(["-c", PROBE, str(ROOT / "scripts" / "bench_sims.py")], tmp_path, headless_defaults=False)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "mujoco.egl", out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_script_leaves_mujoco_on_egl_without_any_environment(tmp_path, path):
    out = _run(["-c", PROBE, str(path)], tmp_path, headless_defaults=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] in ("mujoco.egl", "no mujoco"), out.stdout
