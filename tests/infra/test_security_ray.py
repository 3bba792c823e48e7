"""Attacks on the scheduler service from code on the cluster, on a local Ray cluster (loopback).

bob, a tenant, tries what any Ray client can do: write a token digest labelled "alice" into Ray's
KV store and kill the service so that it restarts; start a new service under his own admin token
over the old journal (through ``connect`` and as ``python -m infra.service start`` would); read
alice's gangs. Each is refused, and alice's gang, its placement groups and the admin's token are
untouched. A journal damaged while the service is down costs the plan its record, but no running
placement group is removed until the admin prunes.
"""

import os

import pytest

ray = pytest.importorskip("ray")

from infra.ray_cluster.realize import GROUP_PREFIX  # noqa: E402
from infra.scheduler.requests import Bundle, GangRequest  # noqa: E402
from infra.service.actor import (  # noqa: E402
    NAMESPACE,
    SERVICE_NAME,
    HandleState,
    ServiceRefused,
    ensure_admin_token,
    start,
    token_digest,
)
from infra.service.client import SchedulerClient, connect  # noqa: E402
from tests.infra.service_cluster import admin_ray_cluster, tenant_client  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node local cluster whose service the admin (this process, its own config dir) started."""
    with admin_ray_cluster(tmp_path_factory.mktemp("admin-config"), num_cpus=4) as admin:
        yield admin


def _groups() -> set[str]:
    return {p["name"] for p in ray.util.placement_group_table().values()
            if p["name"].startswith(GROUP_PREFIX) and p["state"] != "REMOVED"}


def _kill(hard: bool, eventually) -> None:
    ray.kill(ray.get_actor(SERVICE_NAME, namespace=NAMESPACE), no_restart=hard)
    if hard:
        assert eventually(lambda: not _service_alive(), 60)


def _restart_as_admin() -> SchedulerClient:
    """``python -m infra.service start`` by the admin: recovers the journal."""
    start(admin_sha256=token_digest(ensure_admin_token()), poll_s=0.2, owner_lease_s=600)
    return connect(start_service=False)


def test_a_tenant_cannot_become_another_through_ray_kv_or_a_new_service(cluster, tmp_path, monkeypatch, eventually):
    from ray.experimental import internal_kv

    admin = cluster
    alice, bob = tenant_client(admin, tmp_path, "alice"), tenant_client(admin, tmp_path, "bob")
    train = alice.submit(GangRequest("alice-train", (Bundle(100, 64),)), tenant="alice")
    train.wait(timeout_s=60)
    groups = _groups()
    assert groups

    # bob reads: only his own
    with pytest.raises(PermissionError, match="tenant 'bob' may not read gang 'alice-train'"):
        bob.gang("alice-train")
    assert bob.gangs() == [] and all(e.gang != "alice-train" for e in bob.events(limit=1000))
    seen = bob.status()
    assert seen.counts == {} and not seen.problems and not any(n.gangs for n in seen.nodes)

    # 1. a digest of bob's token labelled "alice" in Ray's KV store, then a crash Ray restarts
    bob_digest = token_digest(bob.cred)
    internal_kv._internal_kv_put(b"infra-scheduler-tokens", f'{{"{bob_digest}": "alice"}}'.encode(), overwrite=True)
    _kill(False, eventually)
    with pytest.raises(PermissionError, match="tenant 'bob' may not release gang 'alice-train'"):
        bob.cancel("alice-train")
    assert alice.gang("alice-train").state is HandleState.PLACED

    # 2. the service stopped; bob, with an admin token of his own, starts one over the journal
    _kill(True, eventually)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "bob-config"))
    with pytest.raises(ServiceRefused, match=r"journal .* holds a plan .*python -m infra.service reset"):
        connect()
    with pytest.raises(PermissionError, match="journal belongs to another admin"):
        start(admin_sha256=token_digest(ensure_admin_token()))
    monkeypatch.undo()
    assert _groups() == groups, "a refused start removed placement groups"

    # the real admin recovers everything; its token still works, bob's still does not reach alice's gang
    admin = _restart_as_admin()
    assert admin.gang("alice-train").state is HandleState.PLACED and _groups() == groups
    bob = SchedulerClient(admin.actor, bob.cred, timeout_s=30)
    with pytest.raises(PermissionError, match="may not release gang 'alice-train'"):
        bob.cancel("alice-train")
    assert admin.cancel("alice-train").state is HandleState.CANCELLED


def test_a_damaged_journal_keeps_every_placement_group_until_the_admin_prunes(cluster, tmp_path, eventually):
    admin = connect(start_service=False)
    admin.submit(GangRequest("kept-running", (Bundle(100, 64),))).wait(timeout_s=60)
    groups = _groups()
    _kill(True, eventually)
    store = os.path.join(ray._private.worker.global_worker.node.get_session_dir_path(), SERVICE_NAME)
    path = os.path.join(store, "journal.jsonl")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    hit = next(i for i, line in enumerate(lines) if b'"kept-running"' in line and b'"submit"' in line)
    lines[hit] = lines[hit].replace(b"kept-running", b"kept-runninG")  # checksum no longer matches
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    admin = _restart_as_admin()
    st = admin.status()
    assert "kept-running" not in {g.name for g in admin.gangs()}
    assert any("checksum or format mismatch" in p for p in st.problems)
    assert any("not in the recovered plan are kept" in p for p in st.problems)
    assert _groups() == groups, "a damaged journal removed a running gang's placement group"
    assert admin.prune_groups() == len(groups)
    assert eventually(lambda: not _groups(), 30)


def test_the_one_cli_stops_and_starts_the_service_as_its_admin(cluster, eventually):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    address = ray.get_runtime_context().gcs_address
    admin = connect(start_service=False)
    admin.submit(GangRequest("cli-kept", (Bundle(100, 64),))).wait(timeout_s=60)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "infra.service", *args, "--address", address, "--timeout", "120"],
                              capture_output=True, text=True, timeout=200, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})

    stopped = run("stop")
    assert stopped.returncode == 0 and "journal is kept" in stopped.stdout, stopped.stderr[-2000:]
    assert eventually(lambda: not _service_alive(), 60)
    started = run("start")
    assert started.returncode == 0 and "running" in started.stdout, started.stderr[-2000:]
    assert connect(start_service=False).gang("cli-kept").state is HandleState.PLACED


def _service_alive() -> bool:
    try:
        ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
        return True
    except ValueError:
        return False
