"""The service's identities in process (no Ray): kept in its own journal, fixed to its first admin.

Tokens issued and revoked survive a restart from the journal alone; a start under another admin, or
a fresh start over a journal that holds a plan, is refused without touching the journal; a tenant
reusing the name of another tenant's live gang takes nothing of it (owner, tenant, reads).
"""

import asyncio

import pytest

from infra.scheduler import GPU, Bundle, GangRequest, Node, RequestError
from infra.service.actor import SchedulerService, ServiceRefused, token_digest

ADMIN, OTHER = "admin-token", "another-admin-token"


def _service(store, admin: str = ADMIN, **kw) -> SchedulerService:
    svc = SchedulerService(store=str(store), admin_sha256=token_digest(admin), **kw)
    svc._follow_nodes = svc._adopt_groups = lambda: None  # no Ray here
    return svc


def _run(coro):
    return asyncio.run(coro)


def test_tokens_issued_and_revoked_survive_a_restart_from_the_journal(tmp_path):
    svc = _service(tmp_path)
    alice, bob = _run(svc.issue_token("alice", cred=ADMIN)), _run(svc.issue_token("bob", cred=ADMIN))
    assert _run(svc.revoke_tokens("bob", cred=ADMIN)) == 1
    again = _service(tmp_path)
    assert again.credentials.who(alice) == "alice"
    with pytest.raises(PermissionError, match="no valid scheduler credential"):
        again.credentials.who(bob)
    assert alice not in (tmp_path / "journal.jsonl").read_text()  # digests only


def test_a_start_under_another_admin_is_refused_and_changes_nothing(tmp_path):
    svc = _service(tmp_path)
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),)), 0.0)
    before = (tmp_path / "journal.jsonl").read_bytes()
    with pytest.raises(PermissionError, match=r"journal belongs to another admin .*python -m infra\.service reset"):
        _service(tmp_path, admin=OTHER)
    assert (tmp_path / "journal.jsonl").read_bytes() == before
    assert _service(tmp_path).sched.cluster.nodes[0].name == "n0"  # its own admin recovers it


def test_a_fresh_start_over_a_journal_with_a_plan_is_refused(tmp_path):
    _service(tmp_path / "empty", fresh=True)  # an empty journal: allowed (the first connect)
    svc = _service(tmp_path / "used")
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),)), 0.0)
    before = (tmp_path / "used" / "journal.jsonl").read_bytes()
    with pytest.raises(ServiceRefused, match=r"holds a plan up to record 2: recover it with `python -m infra\.service start`"):
        _service(tmp_path / "used", fresh=True)
    assert (tmp_path / "used" / "journal.jsonl").read_bytes() == before


def test_a_tenant_reusing_a_live_gangs_name_takes_nothing_of_it(tmp_path):
    svc = _service(tmp_path)
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),) * 2), 0.0)
    alice, bob = _run(svc.issue_token("alice", cred=ADMIN)), _run(svc.issue_token("bob", cred=ADMIN))
    job = GangRequest("train", (Bundle(100, 64, gpus=1),), tenant="alice")
    _run(svc.submit(job, owner="alice-driver", cred=alice))
    with pytest.raises(RequestError, match="already in use"):
        _run(svc.submit(GangRequest("train", (Bundle(100, 64),), tenant="bob"), owner="bob-driver", cred=bob))
    assert svc.owner_of["train"] == "alice-driver" and svc.tenant_of["train"] == "alice"
    with pytest.raises(PermissionError, match="tenant 'bob' may not read gang 'train'"):
        _run(svc.gang("train", cred=bob))
    assert _run(svc.gangs(cred=bob)) == [] and [g.name for g in _run(svc.gangs(cred=alice))] == ["train"]
    assert [g.name for g in _run(svc.queue(cred=bob))] == []
    assert all(e.gang in ("", None) for e in _run(svc.events(cred=bob)))
    st = _run(svc.status(cred=bob))
    assert st.counts == {} and not any(n.gangs for n in st.nodes) and not st.problems
    assert sum(_run(svc.status(cred=alice)).counts.values()) == 1
