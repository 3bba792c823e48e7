"""The service's write-ahead journal: a restarted service rebuilds exactly the plan it had, from the
snapshot and the records after it, ignoring a record torn by a crash mid-write (no Ray needed)."""

import contextlib
import os

import numpy as np
import pytest

from infra.scheduler import GPU, Bundle, GangRequest, Node, RequestError, SameNode
from infra.service.actor import JOURNAL_CODEC, Credentials, SchedulerService, token_digest
from infra.service.journal import FileStore, Journal, decode_records, encode_record

ADMIN = "journal-tests-admin-token"
"""The admin credential of the services these tests read (status and events need one)."""


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
    with open(tmp_path / "journal.jsonl", "ab") as f:  # a crash in the middle of the next append
        f.write(encode_record({"seq": 10**6, "op": "tick", "args": []})[:30])
    again = SchedulerService(store=str(tmp_path))
    assert _plan(again) == want
    assert again.problems and "checksum or format mismatch" in again.problems[0][1]
    again._do("tick", 99.0)  # the next append starts a line of its own: every record stays readable
    assert SchedulerService(store=str(tmp_path)).journal.seq == again.journal.seq


def test_records_decode_around_a_corrupt_one():
    data = encode_record({"n": 1}) + encode_record({"n": 2}) + encode_record({"n": 3})
    assert decode_records(data) == ([{"n": 1}, {"n": 2}, {"n": 3}], [])
    broken = bytearray(data)
    broken[len(data) // 2] ^= 0x01
    docs, damage = decode_records(bytes(broken))
    assert docs == [{"n": 1}, {"n": 3}] and len(damage) == 1 and "offset 17" in damage[0]


def test_snapshot_replaces_the_records_before_it(tmp_path):
    j = Journal(FileStore(tmp_path), JOURNAL_CODEC, snapshot_every=2)
    for i in range(3):
        j.log("op", i)
    j.snapshot({"state": 3})
    j.log("op", 3)
    again = Journal(FileStore(tmp_path), JOURNAL_CODEC)
    state, ops = again.recover()
    assert state == {"state": 3} and ops == [(4, "op", (3,))] and again.seq == 4


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
        assert _plan(SchedulerService(store=str(tmp_path))) == pickle.load(f)  # noqa: S301 (the file this test just wrote)


def test_the_gangs_of_a_silent_owner_are_released(tmp_path):
    from infra.service.actor import HandleState

    svc = SchedulerService(store=str(tmp_path), owner_lease_s=60)
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),)), 0.0)
    svc._do("submit", GangRequest("kept", (Bundle(1000, 1024, gpus=1),)), "alive", 1.0)
    svc._do("submit", GangRequest("orphan", (Bundle(1000, 1024),)), "gone", 1.0)
    svc._owners_seen = {"alive": 100.0, "gone": 1.0}
    svc._expire_owners(100.0)
    assert svc.sched.gangs() == ["kept"]
    state, why, tenant = svc.terminal["orphan"]
    assert state is HandleState.FAILED and "owner gone silent" in why and tenant == "default"


# ---------------------------------------------------------------- damage (issue 36): recover, report, never run code
def _six_records(store) -> SchedulerService:
    """The admin, a node and five one-GPU gangs: seven journal records, no snapshot."""
    svc = SchedulerService(store=str(store))
    svc._do("add_node", Node("n0", 64000, 65536, (GPU("L4"),) * 8), 0.0)
    for k in range(5):
        svc._do("submit", GangRequest(f"g{k}", (Bundle(1000, 1024, gpus=1),)), "owner", 1.0 + k)
    return svc


def _status(svc: SchedulerService):
    """``status()`` and ``events()`` without Ray: node discovery and group adoption stubbed out."""
    import asyncio

    svc._follow_nodes = svc._adopt_groups = lambda: None
    svc.credentials = Credentials(token_digest(ADMIN))
    return asyncio.run(_status_and_events(svc))


async def _status_and_events(svc):
    return await svc.status(cred=ADMIN), await svc.events(cred=ADMIN)


def test_a_flipped_byte_in_a_middle_record_loses_that_record_only_and_says_so(tmp_path):
    _six_records(tmp_path)
    path = tmp_path / "journal.jsonl"
    lines = path.read_bytes().split(b"\n")
    fourth = bytearray(lines[3])
    fourth[len(fourth) // 2] ^= 0x04
    lines[3] = bytes(fourth)
    path.write_bytes(b"\n".join(lines))
    again = SchedulerService(store=str(tmp_path))
    assert again.sched.gangs() == ["g0", "g2", "g3", "g4"]  # record 4 submitted g1 (record 1 fixed the admin)
    st, events = _status(again)
    assert len(st.problems) == 1 and "checksum or format mismatch" in st.problems[0]
    assert [e.detail["problem"] for e in events if e.kind.value == "service_problem"] == list(st.problems)


def test_zeros_appended_keep_every_record_and_the_next_appends(tmp_path):
    _six_records(tmp_path)
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(bytes(4096))
    again = SchedulerService(store=str(tmp_path))
    assert again.sched.gangs() == [f"g{k}" for k in range(5)]
    assert again.problems and "4096 unreadable bytes" in again.problems[0][1] and "zeros" in again.problems[0][1]
    again._do("submit", GangRequest("after", (Bundle(1000, 1024, gpus=1),)), "owner", 9.0)
    assert "after" in SchedulerService(store=str(tmp_path)).sched.gangs()  # not glued to the zeros


def test_a_garbage_snapshot_falls_back_to_the_generation_before_it(tmp_path):
    svc = _six_records(tmp_path)
    svc.journal.snapshot(svc._state())
    svc._do("submit", GangRequest("late", (Bundle(1000, 1024),)), "owner", 9.0)
    (tmp_path / "snapshot.json").write_bytes(np.random.default_rng(0).bytes(3000))
    again = SchedulerService(store=str(tmp_path))  # used to die in __init__, then to lose the plan
    assert _plan(again) == _plan(svc)  # the previous journal replays what the snapshot held
    st, _ = _status(again)
    assert any("snapshot: skipped" in p for p in st.problems)


@pytest.mark.parametrize("shape", ["short tuple", "wrong types", "not a tuple"])
def test_a_snapshot_of_the_wrong_shape_is_refused_not_unpacked(tmp_path, shape):
    svc = _six_records(tmp_path)
    svc.journal.snapshot(svc._state())
    svc._do("submit", GangRequest("late", (Bundle(1000, 1024),)), "owner", 9.0)
    state = {"short tuple": (1, 2), "wrong types": ({}, {}, {}, -1, {}, "", {}), "not a tuple": [1, 2, 3]}[shape]
    (tmp_path / "snapshot.json").write_bytes(encode_record({"seq": 8, "state": JOURNAL_CODEC.encode(state)}))
    again = SchedulerService(store=str(tmp_path))  # the checksum passes: used to die with "not enough values"
    assert _plan(again) == _plan(svc)
    assert any("snapshot not used" in p for _, p in again.problems)


def test_empty_and_zero_records_are_refused():
    import zlib

    assert zlib.crc32(b"") == 0  # why an all-zero length+crc header used to pass
    docs, damage = decode_records(b"00000000 \n" + bytes(8) + b"\n" + b"00000000 {}x\n")
    assert docs == [] and len(damage) == 3


@pytest.mark.parametrize("planted", ["pickle", "function", "class"])
def test_a_crafted_record_with_a_valid_checksum_runs_no_code(tmp_path, planted):
    import pickle

    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    _six_records(tmp_path)
    if planted == "pickle":  # the old record format, checksummed the old way
        import struct
        import zlib

        def record(pad: str) -> bytes:
            body = pickle.dumps((7, "tick", (Boom(),), pad))
            return struct.pack("<II", len(body), zlib.crc32(body)) + body

        # One damaged record: a newline byte in the binary length, checksum or body would make two.
        line = next(r for r in map(record, ("", "x", "xx", "xxx", "xxxx")) if b"\n" not in r)
    else:
        args = ({"$fn": "os.system"} if planted == "function"
                else {"$obj": ["subprocess.Popen", {"args": f"touch {marker}"}]})
        line = encode_record({"seq": 7, "op": "tick", "args": {"$tuple": [args]}})
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(line)
    again = SchedulerService(store=str(tmp_path))
    assert not marker.exists()
    assert again.sched.gangs() == [f"g{k}" for k in range(5)] and len(again.problems) == 1


def test_a_verb_that_fails_on_replay_only_is_reported(tmp_path):
    svc = _six_records(tmp_path)
    svc.journal.log("release", "never-submitted", 7.0, "released")  # fails on replay, was never applied live
    again = SchedulerService(store=str(tmp_path))
    assert [p for _, p in again.problems] and "record 8 (release) failed on replay" in again.problems[0][1]
    assert not SchedulerService(store=str(_drive_and_return(tmp_path / "clean"))).problems  # refusals live: quiet


def _drive_and_return(store):
    _drive(SchedulerService(store=str(store)), np.random.default_rng(3), 100)
    return store


def test_background_loop_errors_show_in_status(tmp_path):
    import asyncio

    svc = _six_records(tmp_path)
    svc.credentials = Credentials(token_digest(ADMIN))
    svc.poll_s = 0.01
    svc._follow_nodes = svc._adopt_groups = lambda: None

    async def run():
        await svc.start()
        svc._expire_owners = lambda now: (_ for _ in ()).throw(RuntimeError("boom"))
        for _ in range(200):  # bounded: 2 s at most
            await asyncio.sleep(0.01)
            if svc._errors.get("service"):
                break
        svc._task.cancel()
        return await svc.status(cred=ADMIN)

    st = asyncio.run(run())
    assert any("background loop" in p and "boom" in p for p in st.problems)


def test_reset_clears_the_directory_it_names(tmp_path, monkeypatch):
    import ray

    from infra.service import cli

    _six_records(tmp_path)
    (tmp_path / "snapshot.pkl").write_bytes(b"old format")
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "get_actor", lambda *a, **kw: (_ for _ in ()).throw(ValueError("no service")))
    monkeypatch.setattr(cli, "check_reachable", lambda address, timeout_s: None)
    assert cli.main(["reset", "--store", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.jsonl"] and not (tmp_path / "journal.jsonl").read_bytes()
    assert SchedulerService(store=str(tmp_path)).sched.gangs() == []


def test_an_old_pickle_journal_is_reported_not_read(tmp_path):
    (tmp_path / "journal.log").write_bytes(b"\x05\x00\x00\x00old")
    assert "earlier pickle format" in SchedulerService(store=str(tmp_path)).problems[0][1]
