"""Train a causal LM with RLVR (GRPO against a verifiable reward).

    python scripts/llm_rlvr.py model.path=DIR data.path=FILE reward=module:fn [key=value ...]
    python scripts/llm_rlvr.py model.kind=char [key=value ...]   the tiny character model on a built-in
                                                                 task (e.g. task=add task_size=2), on CPU

model.path: a Hugging Face causal LM folder (save_pretrained, with its tokenizer). data.path: JSONL
or parquet rows with `question` and `answer` (the reference answer after `####`; see data.*).
reward: `module:function(prompt, completion, answer) -> float` (a module on PYTHONPATH or in the working
directory) or `path/to/file.py:function`, run under reward_timeout_s; a call that raises or times out
scores 0 and is counted (reward_errors, reward_timeouts). Without data.path
the built-in `task` is used; without reward, exact match against the reference answer.

``ray=true`` places the services on a one-node Ray cluster started here, ``ray=auto`` (or
``ray=HOST:PORT``) on a running cluster through its scheduler service, shared with the other jobs
there (``priority=``, ``tenant=``).

The same name= again is refused while its run exists (outputs and trainer checkpoint are never
overwritten); resume=true continues it from its checkpoint. Exit status: 0 done, 2 a config error
(one line, nothing created), 1 the job stopped itself (non-finite rewards, loss or weights, too many
failed reward calls, a reward that cannot be imported): one line, nothing saved over its model.

Keys are the fields of infra.llm.rlvr.RLVRConfig (nested: model.d_model=64, grpo.optim.lr=3e-4, grpo.group_size=4).
Writes runs/NAME/{config.yaml, metrics.csv, curves.png, summary.json, model/, checkpoints/} (model/: the trained
model and its tokenizer, loadable with AutoModelForCausalLM.from_pretrained).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from infra.common.run_dir import RunDirBusy
from infra.common.typed_config import apply_overrides
from infra.llm.reward import RewardUnavailable
from infra.llm.rlvr import RLVRConfig, run_rlvr
from infra.llm.service_actors import JobStopped
from infra.llm.trainer_checkpoint import CheckpointError


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
    try:
        summary = run_rlvr(cfg)
    except RunDirBusy as e:  # another process runs in this directory (the check above cannot know)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (JobStopped, RewardUnavailable, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
