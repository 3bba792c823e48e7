"""Run a project script with precomputed instruction embeddings preloaded (a machine without MiniLM).

    python scripts/device/with_embeddings.py FILE scripts/sft_rl.py --json out.json key=value ...

FILE is written by ``scripts/device/embed_instructions.py`` where MiniLM is installed; the script then
runs as ``python SCRIPT ARGS...`` would, in this process, with those strings never reaching the encoder.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from policies.embedding_file import preload_embeddings


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: with_embeddings.py FILE SCRIPT [ARGS...]")
    count = preload_embeddings(argv[0])
    print(f"with_embeddings: {count} instructions preloaded from {argv[0]}", flush=True)
    sys.argv = argv[1:]
    sys.path.insert(0, str(Path(argv[1]).resolve().parent))
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
