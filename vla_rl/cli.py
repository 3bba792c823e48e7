"""``vla-rl COMMAND [ARGS ...]``: the project's commands from any directory (``pyproject.toml``'s entry point).

Each command runs the checkout's script of that name with the same arguments, in this process's
place (``os.execv``: signals, exit status and resuming a run are the script's own), so
``vla-rl train --config configs/suite.yaml seed=1`` is ``python scripts/train.py --config
configs/suite.yaml seed=1``. The scripts are the one implementation of each command; they find the
project's packages through the editable install (``scripts/setup_env.sh``) and the simulators' headless
GL defaults through ``sims`` (set when it is imported, before MuJoCo loads). ``vla-rl`` with no command,
or ``--help``, lists the commands with the first paragraph of each script's docstring. Benchmarks
(``scripts/bench_*.py``) are run as scripts.
"""

from __future__ import annotations

import ast
import difflib
import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
"""The checkout's ``scripts/`` folder (an editable install's source tree)."""
COMMANDS: dict[str, str] = {
    "train": "train", "eval": "eval", "sft-rl": "sft_rl", "eval-libero": "eval_libero",
    "collect-demos": "collect_demos", "export": "export_policy", "render-video": "render_video",
    "render-libero": "render_libero", "recipe-report": "recipe_report", "setup-libero": "setup_libero",
    "convert-checkpoint": "convert_checkpoint", "llm-rlvr": "llm_rlvr", "replay-trace": "replay_trace",
}
"""Command name -> script stem in :data:`SCRIPTS`."""


def script_path(command: str) -> Path:
    """The script that runs ``command``.

    Raises:
        KeyError: ``command`` is not one of :data:`COMMANDS` (the message names the closest ones).
        FileNotFoundError: the package is not installed from a checkout (no ``scripts/`` beside it).
    """
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise KeyError(f"unknown command {command!r}; {hint}run vla-rl --help for the commands")
    path = SCRIPTS / f"{COMMANDS[command]}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: vla-rl runs the scripts of a source checkout; install the "
                                "project from one with pip install -e . (scripts/setup_env.sh does)")
    return path


def summary(path: Path) -> str:
    """The first sentence of the module docstring of the script at ``path`` (read, not imported), on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def usage() -> str:
    """The command list ``vla-rl --help`` prints."""
    width = max(map(len, COMMANDS))
    rows = []
    for command, stem in COMMANDS.items():
        path = SCRIPTS / f"{stem}.py"
        rows.append(f"  {command:<{width}}  {summary(path) if path.is_file() else '(script missing)'}")
    return ("usage: vla-rl COMMAND [ARGS ...]   (vla-rl COMMAND --help: the command's own options)\n\n"
            "commands (each runs scripts/<name>.py of the checkout with the same arguments):\n" + "\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    """Run ``vla-rl``: replace this process by the command's script, or print the commands (status 0) or a
    one-line error (status 2)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    try:
        path = script_path(args[0])
    except (KeyError, FileNotFoundError) as exc:
        print(f"vla-rl: error: {exc.args[0]}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, str(path), *args[1:]])
    return 0  # not reached: execv does not return


if __name__ == "__main__":
    sys.exit(main())
