"""Who may do what to the scheduler service, and the CLI's bounded network calls.

A tenant's token submits only as that tenant and acts only on that tenant's gangs; the admin token
does everything and issues tenant tokens; a forged, revoked or missing token is refused; token files
are private. The CLI ends within ``--timeout`` with one line naming the address when no Ray cluster
answers. A local multi-node cluster started after ``import ray`` binds loopback and refuses a client
without Ray's token (slow).
"""

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from infra.scheduler.requests import Bundle, GangRequest  # noqa: E402
from infra.service import cli  # noqa: E402
from infra.service.actor import TOKEN_FILE_ENV, HandleState, read_token, write_token  # noqa: E402
from infra.service.client import SchedulerClient, check_reachable, credential  # noqa: E402
from tests.infra.service_cluster import admin_ray_cluster, tenant_client  # noqa: E402

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    """A one-node local cluster (loopback, Ray's token on) whose service this process started: the admin."""
    with admin_ray_cluster(tmp_path_factory.mktemp("admin-config"), num_cpus=2) as admin:
        yield admin


def _gang(name: str) -> GangRequest:
    return GangRequest(name, (Bundle(100, 64),))


def test_a_tenant_acts_as_itself_and_on_its_own_gangs_only(admin, tmp_path):
    alice, bob = tenant_client(admin, tmp_path, "alice"), tenant_client(admin, tmp_path, "bob")
    train = alice.submit(_gang("alice-train"), tenant="alice")
    train.wait(timeout_s=60)
    with pytest.raises(PermissionError, match="tenant 'bob' may not submit as tenant 'alice'"):
        bob.submit(_gang("bob-as-alice"), tenant="alice")
    with pytest.raises(PermissionError, match="tenant 'bob' may not release gang 'alice-train'"):
        bob.cancel("alice-train")
    with pytest.raises(PermissionError, match="may not release gang 'alice-train'"):
        bob.release("alice-train")
    with pytest.raises(PermissionError, match="may not resize gang 'alice-train'"):
        bob._call("resize", "alice-train", 2, bob.owner)
    with pytest.raises(PermissionError, match="may not report stopped for gang 'alice-train'"):
        bob._call("stopped", "alice-train", bob.owner)
    assert alice.gang("alice-train").state is HandleState.PLACED
    assert "bob-as-alice" not in {g.name for g in admin.gangs()}
    own = bob.submit(_gang("bob-eval"), tenant="bob")  # his own tenant: allowed, and he may cancel it
    assert bob.cancel(own.name).state is HandleState.CANCELLED
    assert admin.cancel("alice-train").state is HandleState.CANCELLED  # the admin may do all
    train.release()


def test_forged_missing_and_revoked_tokens_are_refused(admin, tmp_path):
    carol = tenant_client(admin, tmp_path, "carol")
    carol.status()
    for cred in ("forged", ""):
        with pytest.raises(PermissionError, match="no valid scheduler credential"):
            SchedulerClient(admin.actor, cred, timeout_s=30).status()
    with pytest.raises(PermissionError, match="tenant 'carol' may not issue tokens for any tenant"):
        carol.issue_token("carol")
    assert admin.revoke_tokens("carol") == 1
    with pytest.raises(PermissionError, match="no valid scheduler credential"):
        carol.gangs()


def test_cli_issues_a_private_token_and_checks_cancel(admin, tmp_path, capsys):
    dave = tmp_path / "dave.token"
    assert cli.main(["token", "issue", "dave", "--out", str(dave)]) == 0
    assert stat.S_IMODE(dave.stat().st_mode) == 0o600
    admin.submit(_gang("erin-job"), tenant="erin")
    capsys.readouterr()
    assert cli.main(["cancel", "erin-job", "--token-file", str(dave)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: tenant 'dave' may not release gang 'erin-job' of tenant 'erin': "
                   "present that tenant's token or the admin's"), err
    assert admin.gang("erin-job").state is not HandleState.CANCELLED
    admin.cancel("erin-job")


def test_token_files_are_private(tmp_path, monkeypatch):
    path = tmp_path / "t" / "x.token"
    write_token(path, "secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_token(path) == "secret"
    path.chmod(0o644)
    with pytest.raises(PermissionError, match=re.escape(f"run `chmod 600 {path}`")):
        read_token(path)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing.token"))
    with pytest.raises(FileNotFoundError, match=r"missing\.token does not exist"):
        credential()


def test_an_address_where_nothing_listens_fails_at_once():
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no Ray cluster answers at 127\.0\.0\.1:1.*: Connection refused; pass .*--address HOST:PORT"):
        check_reachable("127.0.0.1:1", 2.0)
    assert time.monotonic() - start < 5


def _cli(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "infra.service.cli", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=timeout)
    return out, time.monotonic() - start


def test_cli_names_an_unreachable_address_in_one_line():
    out, took = _cli("status", "--address", "127.0.0.1:1", "--timeout", "5")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("error: no Ray cluster answers at 127.0.0.1:1"), out.stderr[-2000:]
    assert "--address" in last and took < 60


def test_cli_gives_up_on_an_address_that_never_answers_as_ray():
    """A port that accepts connections but never speaks Ray's protocol: Ray would retry for minutes."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        out, took = _cli("gangs", "--address", address, "--timeout", "4")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith(f"error: no answer from the Ray cluster at {address} within 4 s")
    assert took < 60, took


@pytest.mark.slow
def test_a_local_cluster_started_after_import_ray_binds_loopback_and_requires_the_token(tmp_path):
    """As vla_rl.fleet.job does: ``import ray`` first, then a multi-node local cluster. Every node is on
    127.0.0.1 and a client without Ray's token is refused; Ray's token file is 0600."""
    code = (
        "import json, os, subprocess, sys\n"
        "import ray\n"
        "from infra.ray_cluster.realize import start_local_cluster\n"
        "from infra.scheduler.resources import Cluster, Node\n"
        "lc = start_local_cluster(Cluster((Node('a', 1000, 1024, ()),)))\n"
        "env = {k: v for k, v in os.environ.items() if not k.startswith('RAY_AUTH')}\n"
        "env['RAY_AUTH_MODE'] = 'disabled'\n"
        "probe = subprocess.run([sys.executable, '-c', f'import ray; ray.init(address={lc.ray_cluster.address!r})'],\n"
        "                       env=env, capture_output=True, text=True, timeout=120)\n"
        "print(json.dumps({'ips': sorted({n['NodeManagerAddress'] for n in ray.nodes()}),\n"
        "                  'stranger': [probe.returncode, probe.stderr[-3000:]]}))\n"
        "lc.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ENABLE_WINDOWS"))}
    env.update(HOME=str(tmp_path), OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ips"] == ["127.0.0.1"], got
    rc, err = got["stranger"]
    assert rc != 0 and "token" in err.lower(), err
    assert stat.S_IMODE((tmp_path / ".ray" / "auth_token").stat().st_mode) == 0o600
