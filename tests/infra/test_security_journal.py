"""The service's journal against a full disk, a damaged snapshot and files that are not files (no Ray).

Each case asserts the refusal and that nothing was lost or brought back: an append refused under an
exhausted file-size limit never returns after a restart, the verbs after it are refused until the
disk takes writes again, and a FIFO or a directory in place of the journal is refused at once.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from infra.service.actor import SchedulerService
from infra.service.journal import JOURNAL_FILE, SNAPSHOT_FILE, JournalRefused

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(120)

FULL_DISK = textwrap.dedent('''
    import json, resource, sys
    from infra.scheduler import GPU, Bundle, GangRequest, Node
    from infra.service.actor import SchedulerService
    from infra.service.journal import JournalUnwritable

    svc = SchedulerService(store=sys.argv[1])
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),) * 4), 0.0)
    svc._do("submit", GangRequest("before", (Bundle(1000, 1024, gpus=1),)), "o", 1.0)
    size = (svc.journal.store.dir / "journal.jsonl").stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, hard))  # room for a torn half record only
    refused = []
    for name in ("lost", "lost-too"):
        try:
            svc._do("submit", GangRequest(name, (Bundle(1000, 1024, gpus=1),)), "o", 2.0)
        except JournalUnwritable as exc:
            refused.append(str(exc))
    on_disk = (svc.journal.store.dir / "journal.jsonl").stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # the disk takes writes again
    svc._do("submit", GangRequest("after", (Bundle(1000, 1024, gpus=1),)), "o", 3.0)
    print(json.dumps({"refused": refused, "live": svc.sched.gangs(), "size": size, "on_disk": on_disk,
                      "seq": svc.journal.seq}))
''')


def test_an_append_refused_by_a_full_disk_never_comes_back(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=90, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(got["refused"]) == 2 and all("free space or raise the file-size limit" in r for r in got["refused"])
    assert got["on_disk"] == got["size"], "the torn part of a refused append stayed in the journal"
    assert got["live"] == ["before", "after"]  # the refused verbs changed nothing live
    again = SchedulerService(store=str(tmp_path))
    assert again.sched.gangs() == ["before", "after"], "a refused record came back after the restart"
    assert again.journal.seq == got["seq"] and not again.problems  # no gap, no damage: it was cut back whole


def test_a_failed_snapshot_keeps_the_previous_generation(tmp_path, monkeypatch):
    from infra.scheduler import GPU, Bundle, GangRequest, Node

    svc = SchedulerService(store=str(tmp_path))
    svc.journal.snapshot_every = 3
    svc._do("add_node", Node("n0", 8000, 8192, (GPU("L4"),) * 4), 0.0)
    monkeypatch.setattr(svc.journal.store, "put_snapshot", lambda seq, line: (_ for _ in ()).throw(OSError("disk full")))
    for k in range(3):
        svc._do("submit", GangRequest(f"g{k}", (Bundle(1000, 1024, gpus=1),)), "o", 1.0 + k)
    assert "snapshot not written" in svc._errors["snapshot"]  # reported in status, the verbs went through
    monkeypatch.undo()
    svc._do("tick", 9.0)  # the next verb writes the snapshot
    assert "snapshot" not in svc._errors and (tmp_path / SNAPSHOT_FILE).exists()
    assert SchedulerService(store=str(tmp_path)).sched.gangs() == ["g0", "g1", "g2"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
@pytest.mark.parametrize("name", [JOURNAL_FILE, SNAPSHOT_FILE])
def test_a_journal_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind, name):
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)  # used to block the service forever
    elif kind == "directory":
        path.mkdir()  # used to crash it
    else:
        (tmp_path / "elsewhere").write_bytes(b"")
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(JournalRefused, match=f"{name}.*(not a regular file|cannot be read).*pick another --store"):
        SchedulerService(store=str(tmp_path))
    assert {p.name for p in tmp_path.iterdir()} <= {name, "elsewhere"}, "a journal was created beside the refused path"


class _FakeKV:
    """Ray's internal KV API over a dict (the calls ``KVStore`` makes)."""

    def __init__(self):
        self.data: dict[bytes, bytes] = {}

    def _internal_kv_get(self, key):
        return self.data.get(key)

    def _internal_kv_put(self, key, value, overwrite=True):
        self.data[key] = value

    def _internal_kv_list(self, prefix):
        return [k for k in self.data if k.startswith(prefix)]

    def _internal_kv_del(self, key):
        self.data.pop(key, None)


def test_the_kv_store_keeps_the_previous_generation_until_the_next_snapshot():
    from infra.service.actor import JOURNAL_CODEC
    from infra.service.journal import Journal, KVStore

    store = KVStore()
    store.kv = _FakeKV()
    j = Journal(store, JOURNAL_CODEC)
    for i in range(3):
        j.log("op", i)
    j.snapshot({"at": 3})
    j.log("op", 3)
    j.snapshot({"at": 4})
    j.log("op", 4)
    assert sorted(store.kv._internal_kv_list(b"infra-scheduler/log/")) == [
        b"infra-scheduler/log/000000000004", b"infra-scheduler/log/000000000005"]
    store.kv.data[b"infra-scheduler/snapshot"] = b"garbage"
    again = Journal(store, JOURNAL_CODEC)
    state, ops = again.recover()
    assert state == {"at": 3} and [seq for seq, _, _ in ops] == [4, 5] and again.damage
