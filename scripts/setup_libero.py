"""Install LIBERO's export toolchain and build the four suites' tasks into the cache (once).

    python scripts/setup_libero.py                      # all 40 tasks of Spatial, Object, Goal, 10
    python scripts/setup_libero.py --tasks spatial/0 10/3 --cache /tmp/libero
    python scripts/setup_libero.py --reinstall          # reinstall the toolchain first
    python scripts/setup_libero.py --tasks spatial/0 --region-starts 200   # and LIBERO's region-sampled starts

Each task's LIBERO-PRO ``_lan`` variant (its instruction and initial states) is written beside it.
Training never imports robosuite or libero: it loads what this writes (see docs/sims.md, LIBERO).
Prints one JSON line: tasks exported, seconds, cache size in MB.
"""

from __future__ import annotations

import argparse
import json
import sys

from sims.libero.suites import all_task_ids, cache_dir
from sims.libero.toolchain.install import ensure_lan, ensure_tasks, ensure_toolchain, folder_size
from sims.libero.toolchain.region_starts import ensure_region_starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=None, help="cache folder (default $VLA_RL_LIBERO_CACHE or ~/.cache/vla-rl/libero)")
    parser.add_argument("--tasks", nargs="+", default=None, help="task ids like spatial/0 (default: all 40)")
    parser.add_argument("--reinstall", action="store_true", help="reinstall the export toolchain")
    parser.add_argument("--region-starts", type=int, default=0, metavar="K",
                        help="also write K starts per task sampled by LIBERO's placement rules (sims.libero.regions)")
    args = parser.parse_args()
    root = cache_dir(args.cache)
    try:
        if args.reinstall:
            ensure_toolchain(root, reinstall=True)
        result = ensure_tasks(args.tasks or all_task_ids(), root)
        lan = ensure_lan(args.tasks or all_task_ids(), root)  # LIBERO-PRO's _lan variants: text and numpy only
        if args.region_starts > 0:
            ensure_region_starts(args.tasks or all_task_ids(), args.region_starts, root)
    except (ValueError, RuntimeError) as err:
        sys.exit(f"setup_libero: {err}")
    tasks = [p for p in root.glob("*/*/task.json")]
    print(json.dumps({"cache": str(root), "exported": len(result["exported"]), "seconds": result["seconds"],
                      "lan_exported": len(lan),
                      "tasks_cached": len(tasks),
                      "tasks_mb": round(sum(folder_size(p.parent) for p in tasks) / 2**20, 1),
                      "assets_mb": round(folder_size(root / "assets") / 2**20, 1) if (root / "assets").exists() else 0,
                      "toolchain_mb": round(folder_size(root / "toolchain") / 2**20, 1)}))


if __name__ == "__main__":
    main()
