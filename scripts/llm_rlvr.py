"""Train the tiny causal transformer with RLVR (GRPO on a verifiable task) on CPU.

    python scripts/llm_rlvr.py [key=value ...]     e.g. iterations=60 task=add task_size=2 ray=true

``ray=true`` places the services on a one-node Ray cluster started here, ``ray=auto`` (or
``ray=HOST:PORT``) on a running cluster through its scheduler service, shared with the other jobs
there (``priority=``, ``tenant=``).

Keys are the fields of infra.llm.rlvr.RLVRConfig (nested: model.d_model=64, grpo.lr=3e-4).
Writes runs/NAME/{config.json, metrics.csv, curve.png, summary.json}.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from infra.llm.rlvr import RLVRConfig, run_rlvr
from infra.typed_config import apply_overrides


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        cfg = apply_overrides(RLVRConfig(), argv)
        cfg.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = run_rlvr(cfg)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
