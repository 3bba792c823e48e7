"""Write the instruction embeddings a recipe's runs will ask for, for a machine without MiniLM.

    python scripts/device/embed_instructions.py .dev2/instruction_embeddings.pt              # suite_sft_rl.yaml
    python scripts/device/embed_instructions.py OUT.pt --config configs/reach_sft_rl.yaml

Every instruction of every split of the recipe's tasks (train, validation, paraphrase, composition),
sentence and, where a stage reads tokens, token embeddings (``policies.embedding_file``). The GPU
machine's recipe call runs ``scripts/device/with_embeddings.py`` with this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from policies.embedding_file import save_embeddings
from sims import tasks as T
from vla_rl.config import CONFIG_DIR
from vla_rl.recipe import load_recipe, stage_configs


def recipe_strings(config: Path) -> tuple[list[str], int | None]:
    """Every instruction string of the recipe's tasks, and the token rows its stages read (None: sentences only)."""
    stages = stage_configs(load_recipe(config, []))
    names = T.resolve_tasks(stages["sft"].env.task)
    strings: set[str] = set()
    for split in T.SPLITS:
        if split != "composition" or T.composition_tasks(names):
            strings.update(T.instruction_table(names, split))
    tokens = {c.policy.language_tokens for c in stages.values() if c.policy.language == "tokens"}
    return sorted(strings), max(tokens) if tokens else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "suite_sft_rl.yaml")
    args = parser.parse_args(argv)
    strings, tokens = recipe_strings(args.config)
    written = save_embeddings(args.out, strings, tokens)
    print(f"{args.out}: {written['strings']} instructions, tokens {tokens}, {written['bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
