"""The service's write-ahead journal: a restarted service rebuilds exactly the plan it had, from the
snapshot and the records after it, ignoring a record torn by a crash mid-write (no Ray needed)."""

import contextlib

import numpy as np
import pytest

from infra.scheduler import GPU, Bundle, GangRequest, Node, RequestError, SameNode
from infra.service.actor import SchedulerService
from infra.service.journal import FileStore, Journal, decode_records, encode_record


def _plan(svc: SchedulerService):
    s = svc.sched
    st = s.state
    return (
        {n: (s.gang_state(n), s.placement(n)) for n in s.gangs()}, s.queue,
        st.cpu_free.tolist(), st.gpu_free.tolist(), st.gpu_mem_free.tolist(), dict(svc.terminal),
        s.reservation.gang if s.reservation else None,
    )


def _drive(svc: SchedulerService, rng: np.random.Generator, steps: int) -> None:
    """Verbs as the service journals them: nodes join, gangs come and go, a node dies and returns."""
    for i in range(4):
        svc._do("add_node", Node(f"n{i}", 16000, 65536, (GPU("L4", 24576),) * 4), float(i))
    for k in range(steps):
        t = 10.0 + k
        names = svc.sched.gangs()
        r = rng.random()
        if r < 0.55 or not names:
            gpus = int(rng.integers(1, 5))
            bundles = (Bundle(1000, 1024, gpus=gpus), Bundle(500, 512, gpu_fraction=250))
            req = GangRequest(f"g{k}", bundles, constraints=(SameNode((0, 1)),), priority=int(rng.integers(0, 3)),
                              grace_s=float(rng.choice([0.0, 5.0])), timeout_s=float(rng.choice([30.0, 1e6])))
            with contextlib.suppress(RequestError):  # every node lost: refused (and journalled as refused)
                svc._do("submit", req, "owner", t)
        elif r < 0.85:
            svc._do("release", names[int(rng.integers(len(names)))], t, "released")
        elif r < 0.92:
            svc._do("tick", t)
        elif r < 0.96:
            svc._do("remove_node", f"n{int(rng.integers(4))}", t)
        else:
            svc._do("restore_node", f"n{int(rng.integers(4))}", t)


@pytest.mark.parametrize("snapshot_every", [1000, 7])
def test_a_restarted_service_rebuilds_the_same_plan(tmp_path, snapshot_every):
    store = tmp_path / "journal"
    live = SchedulerService(store=str(store))
    live.journal.snapshot_every = snapshot_every
    _drive(live, np.random.default_rng(3), 300)
    assert any(e.kind.value == "preempt_notice" for e in live.sched.events), "the stream should preempt"
    again = SchedulerService(store=str(store))
    assert _plan(again) == _plan(live)
    assert again.journal.seq == live.journal.seq


def test_a_torn_record_at_the_end_is_ignored(tmp_path):
    live = SchedulerService(store=str(tmp_path))
    _drive(live, np.random.default_rng(5), 40)
    want = _plan(live)
    with open(tmp_path / "journal.log", "ab") as f:  # a crash in the middle of the next append
        f.write(encode_record(b"x" * 100)[:57])
    assert _plan(SchedulerService(store=str(tmp_path))) == want


def test_records_decode_up_to_the_first_corrupt_one():
    data = encode_record(b"one") + encode_record(b"two")
    assert decode_records(data) == [b"one", b"two"]
    broken = bytearray(data)
    broken[-1] ^= 0xFF
    assert decode_records(bytes(broken)) == [b"one"]


def test_snapshot_replaces_the_records_before_it(tmp_path):
    j = Journal(FileStore(tmp_path), snapshot_every=2)
    for i in range(3):
        j.log("op", i)
    j.snapshot({"state": 3})
    j.log("op", 3)
    again = Journal(FileStore(tmp_path))
    state, ops = again.recover()
    assert state == {"state": 3} and ops == [("op", (3,))] and again.seq == 4


def test_replay_in_another_process_with_another_hash_seed(tmp_path):
    """Decisions never depend on set or dict order of strings (Python salts their hashes per process)."""
    import os
    import pickle
    import subprocess
    import sys

    code = (
        "import pickle, sys, numpy as np; sys.path.insert(0, sys.argv[2]);"
        "from test_journal import _drive, _plan; from infra.service.actor import SchedulerService;"
        "s = SchedulerService(store=sys.argv[1]); s.journal.snapshot_every = 10**9;"
        "_drive(s, np.random.default_rng(3), 400); pickle.dump(_plan(s), open(sys.argv[1] + '/plan.pkl', 'wb'))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = {**os.environ, "PYTHONHASHSEED": "1", "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code, str(tmp_path), here], check=True, env=env, timeout=120)
    with open(tmp_path / "plan.pkl", "rb") as f:
        assert _plan(SchedulerService(store=str(tmp_path))) == pickle.load(f)


def test_the_gangs_of_a_silent_owner_are_released(tmp_path):
    from infra.service.actor import HandleState

    svc = SchedulerService(store=str(tmp_path), owner_lease_s=60)
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),)), 0.0)
    svc._do("submit", GangRequest("kept", (Bundle(1000, 1024, gpus=1),)), "alive", 1.0)
    svc._do("submit", GangRequest("orphan", (Bundle(1000, 1024),)), "gone", 1.0)
    svc._owners_seen = {"alive": 100.0, "gone": 1.0}
    svc._expire_owners(100.0)
    assert svc.sched.gangs() == ["kept"]
    state, why = svc.terminal["orphan"]
    assert state is HandleState.FAILED and "owner gone silent" in why
