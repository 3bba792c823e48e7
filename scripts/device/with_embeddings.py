"""Run a project script with precomputed instruction embeddings preloaded (a machine without MiniLM).

    python scripts/device/with_embeddings.py FILE scripts/sft_rl.py --json out.json key=value ...

FILE is written by ``scripts/device/embed_instructions.py`` where MiniLM is installed; the script then
runs as ``python SCRIPT ARGS...`` would, in this process, with those strings never reaching the encoder.
SCRIPT's folder must be on ``PYTHONPATH`` (``python SCRIPT`` puts it first on the path, running it here
does not): ``scripts/gpu_recipe.sh`` puts ``scripts/`` there, whose ``sft_rl.py`` imports ``bench_report``.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from policies.embedding_file import preload_embeddings


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: with_embeddings.py FILE SCRIPT [ARGS...]")
    folder = Path(argv[1]).resolve().parent
    if folder not in {Path(p or os.curdir).resolve() for p in sys.path}:
        sys.exit(f"with_embeddings: {folder} (where {argv[1]} imports its neighbours from) is not on the path: "
                 f"run with PYTHONPATH={folder}")
    count = preload_embeddings(argv[0])
    print(f"with_embeddings: {count} instructions preloaded from {argv[0]}", flush=True)
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
