"""An embodied job and an LLM job share one scheduler service on a real local multi-node Ray cluster.

The high-priority LLM job preempts the embodied job: its trainer gets the notice (SIGTERM), ends
the iteration with a checkpoint and reports stopped; the LLM job runs on the freed GPU; meanwhile
the service actor is killed for real and comes back with the same placements; when the LLM job
ends, the embodied job is placed again and resumes exactly: its final weights equal those of the
same run in process.
"""

from __future__ import annotations

import threading

import pytest
import torch

ray = pytest.importorskip("ray")

from infra.llm.grpo_trainer import llm_grpo_config  # noqa: E402
from infra.llm.model import ModelConfig  # noqa: E402
from infra.llm.rlvr import RLVRConfig, run_rlvr  # noqa: E402
from infra.llm.verifiable_tasks import VOCAB_SIZE  # noqa: E402
from infra.ray_cluster.realize import start_local_cluster  # noqa: E402
from infra.scheduler import GPU, Cluster, EventKind, Node  # noqa: E402
from infra.service.actor import NAMESPACE, SERVICE_NAME, HandleState  # noqa: E402
from infra.service.client import connect  # noqa: E402
from vla_rl.checkpoint import LATEST, load_checkpoint  # noqa: E402
from vla_rl.config import build_config  # noqa: E402
from vla_rl.fleet.job import run_fleet_job  # noqa: E402
from vla_rl.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ITERATIONS = 8


def _embodied(tmp_path, name):
    return build_config({
        "out_dir": str(tmp_path), "name": name, "seed": 3, "total_env_steps": ITERATIONS * 32, "checkpoint_every": 1,
        "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 4, "max_episode_steps": 7},
        "ppo": {"rollout_steps": 8, "normalize_reward": True, "optim": {"epochs": 2, "num_minibatches": 2}},
        "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
        "eval": {"every": 0},
        "log": {"wandb": "disabled", "progress": False, "video": False},
        "fleet": {"mode": "colocated", "shards": 2, "priority": 0, "grace_s": 120.0},
    })


def _llm(tmp_path):
    model = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)
    return RLVRConfig(name="llm", task="sort", task_size=3, seed=1, iterations=3, prompts_per_iter=4, grpo=llm_grpo_config(group_size=4),
                      warmup_steps=2, warmup_batch=8, eval_prompts=8, eval_every=100, model=model, threads=1,
                      out_dir=str(tmp_path), ray=True, priority=10, tenant="default")


def test_llm_job_preempts_the_embodied_job_which_resumes_exactly(tmp_path, eventually):
    local = Trainer(_embodied(tmp_path, "local"))
    local.train()
    local.close()

    cluster = Cluster((Node("gpu0", 6000, 8192, (GPU("logical", 16384),)), Node("cpu0", 2000, 4096)))
    lc = start_local_cluster(cluster)
    try:
        client = connect(poll_s=0.2)
        cfg = _embodied(tmp_path, "robot")
        latest = tmp_path / "robot" / "checkpoints" / LATEST
        out: dict = {}
        job = threading.Thread(target=lambda: out.setdefault("robot", run_fleet_job(cfg)), daemon=True)
        job.start()
        assert eventually(lambda: latest.exists() and load_checkpoint(latest)["iteration"] >= 2, 240)

        llm = threading.Thread(target=lambda: out.setdefault("llm", run_rlvr(_llm(tmp_path))), daemon=True)
        llm.start()
        assert eventually(lambda: _happened(client, EventKind.PREEMPT_NOTICE, "robot"), 180), "no preemption"
        assert eventually(lambda: _happened(client, EventKind.READY, "-group0"), 180), "the LLM job was not placed"

        # Snapshot once the LLM gang has moved in: its READY event comes before its PLACED state.
        assert eventually(lambda: any(g.name.endswith("-group0") and g.state is HandleState.PLACED
                                      for g in client.gangs()), 120), "the LLM gang never became placed"
        before = {g.name: (g.state, g.placement) for g in client.gangs()}
        ray.kill(ray.get_actor(SERVICE_NAME, namespace=NAMESPACE), no_restart=False)  # Ray restarts it
        after = {g.name: (g.state, g.placement) for g in client.gangs()}
        # The LLM job keeps submitting its other services meanwhile: what must hold is that no gang
        # placed before the kill lost or changed its placement.
        placed = {n: v for n, v in before.items() if v[0] is HandleState.PLACED}
        assert placed and all(after.get(n) == v for n, v in placed.items()), "the restarted service lost a placement"

        llm.join(timeout=300)
        job.join(timeout=300)
        assert "llm" in out and "robot" in out, f"a job did not finish: {sorted(out)}"
    finally:
        events = client.events(limit=2000)
        lc.shutdown()

    robot = [e for e in events if e.gang == "robot"]
    notice = next(e for e in robot if e.kind is EventKind.PREEMPT_NOTICE)
    assert notice.detail["by"].endswith("-group0") and notice.detail["by_priority"] == 10
    assert any(e.kind is EventKind.PREEMPTED and e.detail["stop"] == "acknowledged" for e in robot)
    assert [e.detail["epoch"] for e in robot if e.kind is EventKind.PLACED] == [1, 2]
    assert out["robot"]["iterations"] == ITERATIONS
    assert 0.0 <= out["llm"]["mean_reward_last_iters"] <= 1.0
    want = load_checkpoint(tmp_path / "local" / "checkpoints" / LATEST)["policy"]
    got = load_checkpoint(latest)["policy"]
    for key, value in want.items():
        assert torch.equal(got[key], value), f"{key} differs from the in-process run after preemption and resume"


def _happened(client, kind, gang_suffix):
    return any(e.kind is kind and e.gang.endswith(gang_suffix) for e in client.events(limit=2000))
