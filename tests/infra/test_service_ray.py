"""The scheduler service on a real multi-node Ray cluster on this machine (loopback, logical GPUs).

Actors run on the planned GPUs with Ray's own accounting agreeing; a preemption goes notice ->
grace -> forced stop (or an acknowledged stop) and the victim is started again when capacity
returns; the service actor is killed for real and comes back with every placement, the queue and
the live placement groups; nodes joining and dying are followed; the CLI prints the tables.
"""

import os
import subprocess
import sys
import threading

import pytest
import torch

ray = pytest.importorskip("ray")

from infra.ray_cluster.realize import GROUP_PREFIX, ray_gpu_choice, start_local_cluster  # noqa: E402
from infra.scheduler import GPU, Bundle, Cluster, EventKind, GangRequest, Node, PinGPUs  # noqa: E402
from infra.service.actor import (  # noqa: E402
    NAMESPACE,
    SERVICE_NAME,
    HandleState,
    ensure_admin_token,
    start,
    token_digest,
)
from infra.service.client import GangBackend, connect  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@ray.remote(num_cpus=0)
class Probe:
    """Reports where it runs and what Ray gave it."""

    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES"), [str(g) for g in ray.get_gpu_ids()]


@ray.remote(num_cpus=0)
def foreign_gpu():
    """Ray work that does not go through the scheduler."""
    return [str(g) for g in ray.get_gpu_ids()]


@pytest.fixture(scope="module")
def cluster():
    nodes = (Node("w0", 2000, 2048, (GPU("L4", 24576),) * 2), Node("w1", 2000, 2048, (GPU("L4", 24576),) * 2))
    lc = start_local_cluster(Cluster(nodes))
    client = connect(poll_s=0.2, owner_lease_s=600)
    yield lc, client
    lc.shutdown()


def _cleanup(client):
    for g in client.gangs():
        client.release(g.name)


def test_ray_instance_rule_matches_the_mirror(cluster):
    """The rule the realisation relies on: whole GPUs lowest free first, a fraction on the fullest that fits."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    lc, _ = cluster
    node = lc.node_id("w0")
    used = [0, 0]
    groups = []
    for amount in (0.5, 0.3, 1.0, 0.2):
        pg = placement_group([{"GPU": amount}], bundle_label_selector=[{"ray.io/node-id": node}])
        ray.get(pg.ready(), timeout=60)
        groups.append(pg)
        got = ray.get(foreign_gpu.options(num_gpus=amount, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote())
        want = ray_gpu_choice(used, round(amount * 1000), 1)
        assert [str(g) for g in want] == got, (amount, used)
        used[want[0]] += round(amount * 1000)
    for pg in groups:
        remove_placement_group(pg)


def test_actors_run_on_the_planned_gpus_and_ray_accounting_agrees(cluster):
    lc, client = cluster
    ids = {n: lc.node_id(n) for n in ("w0", "w1")}
    # Planned GPUs that Ray would not pick by itself: a fraction on GPU 1 of an empty node, a whole GPU 1.
    gang = client.submit(GangRequest("pinned", (
        Bundle(500, 256, gpu_fraction=300), Bundle(500, 256, gpus=1),
    ), constraints=(PinGPUs(0, "w0", (1,)), PinGPUs(1, "w1", (1,)))))
    gang.wait(timeout_s=60)
    backend = GangBackend(gang)
    a, b = backend.start_actor(0, Probe), backend.start_actor(1, Probe)
    assert ray.get(a.where.remote(), timeout=60) == (ids["w0"], "1", ["1"])
    assert ray.get(b.where.remote(), timeout=60) == (ids["w1"], "1", ["1"])
    assert ray.available_resources()["GPU"] == pytest.approx(4 - 1.3)
    # Ray keeps other work off the planned whole GPU: a foreign task on w1 gets GPU 0.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    on_w1 = NodeAffinitySchedulingStrategy(ids["w1"], soft=False)
    assert ray.get(foreign_gpu.options(num_gpus=1, scheduling_strategy=on_w1).remote(), timeout=60) == ["0"]
    table = ray.util.placement_group_table()
    assert not [p for p in table.values() if p["name"].startswith("infra-blocker") and p["state"] != "REMOVED"]
    gang.release()
    _cleanup(client)


def test_preemption_notice_grace_forced_stop_and_restart(cluster, eventually):
    _, client = cluster
    low = client.submit(GangRequest("low", (Bundle(500, 256, gpus=2),) * 2), grace_s=2.0, priority=0)
    low.wait(timeout_s=60)
    restarted = threading.Event()
    backend = GangBackend(low, on_restart=lambda _: restarted.set())
    actors = [backend.start_actor(b, Probe) for b in (0, 1)]
    notices = []
    low.on_notice(notices.append)

    high = client.submit(GangRequest("high", (Bundle(500, 256, gpus=2),), priority=5))
    assert eventually(lambda: notices, 30), "no notice reached the victim"
    assert notices[0].deadline is not None and "high" in notices[0].reason
    assert high.refresh().state is HandleState.WAITING  # until the victim stops
    high.wait(timeout_s=30)  # nobody acknowledged: the grace ran out and the victim was stopped
    kinds = [e.kind for e in client.events(limit=200) if e.gang == "low"]
    assert EventKind.PREEMPT_NOTICE in kinds and EventKind.FORCED_STOP in kinds
    assert eventually(lambda: _dead(actors[0]) or _dead(actors[1]), 30), "the victim's actors survived the forced stop"
    assert low.refresh().state in (HandleState.PREEMPTED, HandleState.PLACED)

    high.release()
    assert eventually(restarted.is_set, 60), "the victim was not started again when capacity returned"
    assert ray.get(backend.actor(0).where.remote(), timeout=60)[2] != []

    # The acknowledged path: the victim stops itself within its grace.
    low.on_notice(lambda status: low.stopped())
    urgent = client.submit(GangRequest("urgent", (Bundle(500, 256, gpus=2),), priority=9))
    urgent.wait(timeout_s=30)
    stops = [e.detail.get("stop") for e in client.events(limit=200) if e.gang == "low" and e.kind is EventKind.PREEMPTED]
    assert "acknowledged" in stops
    _cleanup(client)


def _dead(actor) -> bool:
    try:
        ray.get(actor.where.remote(), timeout=10)
        return False
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return True


def test_killing_the_service_loses_no_placement(cluster, eventually):
    _, client = cluster
    a = client.submit(GangRequest("keep-a", (Bundle(500, 256, gpus=1), Bundle(500, 256, gpu_fraction=500))))
    b = client.submit(GangRequest("keep-b", (Bundle(500, 256, gpus=2),)))
    a.wait(timeout_s=60)
    b.wait(timeout_s=60)
    waiting = client.submit(GangRequest("keep-waiting", (Bundle(500, 256, gpus=2),)))
    backend = GangBackend(a)
    actor = backend.start_actor(0, Probe)
    before = {g.name: (g.state, g.placement) for g in client.gangs()}
    groups_before = _our_groups()
    assert waiting.status.state is HandleState.WAITING

    for hard in (False, True):  # a crash Ray restarts, then a stop and a fresh start (python -m infra.service start)
        service = ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
        ray.kill(service, no_restart=hard)
        if hard:
            assert eventually(lambda: not _alive(), 30)
            start(admin_sha256=token_digest(ensure_admin_token()), poll_s=0.2, owner_lease_s=600)  # connect() would refuse
            client = connect()
        after = {g.name: (g.state, g.placement) for g in client.gangs()}
        assert after == before, "the restarted service lost or changed a placement"
        assert _our_groups() == groups_before, "placement groups were duplicated or lost"
        assert ray.get(actor.where.remote(), timeout=30)[1] == ",".join(map(str, a.status.placement.assignments[0].gpus))
    assert [g.name for g in client.queue()] == ["keep-waiting"]
    _cleanup(client)


def _alive() -> bool:
    try:
        ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
        return True
    except ValueError:
        return False


def _our_groups() -> set[str]:
    return {p["name"] for p in ray.util.placement_group_table().values()
            if p["name"].startswith(GROUP_PREFIX) and p["state"] != "REMOVED"}


def test_nodes_joining_and_dying_are_followed(cluster, eventually):
    lc, client = cluster
    big = client.submit(GangRequest("big", (Bundle(500, 256, gpus=2),) * 3))  # 6 GPUs: waits for a node
    assert big.status.state is HandleState.WAITING
    lc.add(Node("w2", 2000, 2048, (GPU("L4", 24576),) * 2))
    big.wait(timeout_s=60)
    assert {x.node for x in big.status.placement.assignments} == {"w0", "w1", "w2"}
    lc.remove("w2")
    assert eventually(lambda: big.refresh().state is not HandleState.PLACED, 60), "node loss not followed"
    assert any(e.kind is EventKind.NODE_LOST for e in client.events(limit=200))
    _cleanup(client)


def test_cli_prints_status_queue_and_events(cluster):
    lc, client = cluster
    client.submit(GangRequest("shown", (Bundle(500, 256, gpus=1),))).wait(timeout_s=60)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for cmd, text in (("status", "w0"), ("gangs", "shown"), ("events", "placed"), ("queue", "queue")):
        out = subprocess.run([sys.executable, "-m", "infra.service.cli", cmd, "--address", lc.ray_cluster.address],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        assert out.returncode == 0 and text in out.stdout, out.stderr[-2000:]
    _cleanup(client)


def test_a_preempted_llm_job_resumes_from_its_trainer_checkpoint(cluster, eventually, tmp_path):
    """A low-priority LLM job loses its GPU group to a pinned high-priority gang mid-run; its gang is
    requeued and placed again when the gang leaves, its services restart there, and the trainer
    continues from its checkpoint: the job ends with every GRPO update applied once, weights equal
    to an undisturbed run of the same job and to its last checkpoint."""
    from infra.llm.grpo_trainer import llm_grpo_config
    from infra.llm.handles import JobServices
    from infra.llm.model import ModelConfig
    from infra.llm.rlvr import RLVRConfig, checkpoint_spec, run_job
    from infra.llm.service_plane import ServiceSizes, place_services
    from infra.llm.trainer_checkpoint import checkpoint_path, load
    from infra.llm.verifiable_tasks import VOCAB_SIZE

    _, client = cluster
    model = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)
    sizes = ServiceSizes(rollout_memory_mib=256, trainer_memory_mib=512, reward_memory_mib=128)
    plane = place_services(client, model, sizes=sizes, priority=0, timeout_s=120, wait_s=180)
    try:
        group, gang = plane.groups[0], plane.gangs[0]
        svc = JobServices(rollout=group.rollout, reward=plane.reward, trainer=group.trainer)

        def cfg(name):
            return RLVRConfig(name=name, task="sort", task_size=3, seed=5, iterations=6, prompts_per_iter=4,
                              grpo=llm_grpo_config(group_size=4), warmup_steps=2, warmup_batch=8, eval_prompts=8, eval_every=100,
                              model=model, out_dir=str(tmp_path))

        reference = run_job("undisturbed", cfg("undisturbed"), svc)
        job = cfg("preempted")
        where = checkpoint_spec(job).dir
        out = {}
        runner = threading.Thread(target=lambda: out.setdefault("result", run_job("preempted", job, svc)), daemon=True)
        runner.start()
        # Two GRPO updates in (warm-up steps, the end of the warm-up, then updates are steps).
        assert eventually(lambda: _step(where) >= job.warmup_steps + 3, 180), "the job made no progress"
        spot = gang.refresh().placement.assignments[-1]
        high = client.submit(GangRequest("pinned", (Bundle(500, 256, gpus=1),), (PinGPUs(0, spot.node, spot.gpus),)),
                             priority=10)
        high.wait(timeout_s=60)
        assert any(e.kind is EventKind.PREEMPT_NOTICE and e.gang == gang.name for e in client.events(limit=500))
        high.release()
        runner.join(timeout=240)
        assert "result" in out, "the preempted job did not finish"
    finally:
        events = client.events(limit=1000)
        plane.close()
        _cleanup(client)

    result = out["result"]
    assert [e.detail["epoch"] for e in events if e.gang == gang.name and e.kind is EventKind.PLACED] == [1, 2]
    assert group.trainer.restarts >= 1, "the trainer was never started again: nothing was preempted"
    assert result.version == job.iterations == reference.version  # every update once, none from scratch
    final = load(checkpoint_path(where), "preempted")
    assert final["version"] == job.iterations
    for k, v in reference.weights.items():
        assert torch.equal(result.weights[k], v), f"{k} differs from the undisturbed run after preemption and resume"
        assert torch.equal(final["model"][k], v), f"{k} differs from the job's last checkpoint"


def _step(where: str) -> int:
    """The preempted job's checkpointed step (-1 before its first checkpoint)."""
    from infra.llm.trainer_checkpoint import CheckpointError, read_info

    try:
        return read_info(where, "preempted").step
    except CheckpointError:
        return -1
