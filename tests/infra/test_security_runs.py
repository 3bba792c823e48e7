"""One run per folder: run names stay one safe path component, and a second process on a run directory
that a run holds is refused with the holder's PID, before it removes, reads or writes anything there
(both trainers: the VLA ``Trainer`` and the LLM ``run_rlvr``)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.common.run_dir import LOCK_FILE, RunDirBusy, RunDirLock, check_run_name
from infra.common.typed_config import ConfigError, apply_overrides

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
HOLD = ("import sys; from infra.common.run_dir import RunDirLock; lock = RunDirLock(sys.argv[1]); "
        "print('held', flush=True); sys.stdin.readline()")


@pytest.fixture
def holder(tmp_path):
    """Start a process holding the lock of a directory; yields (start(dir) -> Popen)."""
    procs = []

    def start(run_dir: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("name", ["../../escape_run", "a/b", "..", ".", "", "-rf", "x" * 129, "na\nme", "/abs"])
def test_unsafe_run_names_are_refused(name):
    with pytest.raises(ConfigError, match="is not a run name"):
        check_run_name(name)


def test_a_safe_run_name_passes():
    check_run_name("reach-ppo-vla-s0")
    check_run_name("HalfCheetah-v5-ppo_mlp.s1")


def test_the_llm_job_refuses_a_name_that_leaves_its_folder(tmp_path):
    from infra.llm.rlvr import RLVRConfig, run_rlvr

    with pytest.raises(ConfigError, match=r"name='\.\./\.\./escape_run' is not a run name"):
        run_rlvr(apply_overrides(RLVRConfig(), [f"out_dir={tmp_path / 'a' / 'b'}", "name=../../escape_run"]))
    assert list(tmp_path.iterdir()) == []


def test_the_vla_job_refuses_a_name_that_leaves_its_folder(tmp_path):
    from vla_rl.config import load_config

    with pytest.raises(ConfigError, match="is not a run name"):
        load_config(ROOT / "configs" / "reach_state_ppo.yaml", [f"out_dir={tmp_path}", "name=../escape"])


def test_a_second_process_is_refused_with_the_holders_pid_and_a_killed_holder_frees_it(tmp_path, holder):
    run_dir = tmp_path / "run"
    p = holder(run_dir)
    with pytest.raises(RunDirBusy, match=rf"{run_dir} is in use by process {p.pid} .*choose another name="):
        RunDirLock(run_dir)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert (run_dir / LOCK_FILE).exists()  # left by the killed run: not stale, the kernel dropped its lock
    with RunDirLock(run_dir):
        assert str(os.getpid()) in (run_dir / LOCK_FILE).read_text()
    assert not run_dir.exists() or not (run_dir / LOCK_FILE).exists()


def test_a_lock_refused_or_released_leaves_no_directory_behind(tmp_path):
    RunDirLock(tmp_path / "fresh").release()
    assert list(tmp_path.iterdir()) == []


def test_a_second_vla_trainer_on_a_running_directory_touches_nothing(tmp_path, holder):
    from vla_rl.config import load_config
    from vla_rl.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "reach_state_ppo.yaml",
                      [f"out_dir={tmp_path}", "name=race", "log.wandb=disabled", "env.num_envs=2"])
    run_dir = tmp_path / "race"
    partial = run_dir / "checkpoints" / "iter_3.pt.abc.tmp"  # the first run's checkpoint, being written
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half")
    p = holder(run_dir)
    with pytest.raises(RunDirBusy, match=f"in use by process {p.pid}"):
        Trainer(cfg)  # used to start a second run beside the first, writing the same files
    assert partial.read_bytes() == b"half"
    assert sorted(x.name for x in run_dir.iterdir()) == [LOCK_FILE, "checkpoints"]


def test_a_second_llm_job_on_a_running_directory_writes_nothing(tmp_path, holder):
    from infra.llm.rlvr import RLVRConfig, run_rlvr

    run_dir = tmp_path / "runs" / "job"
    p = holder(run_dir)
    cfg = apply_overrides(RLVRConfig(), ["model.kind=char", "model.max_len=16", "model.d_model=32", "model.n_heads=2",
                                         "model.n_layers=1", "threads=1", f"out_dir={tmp_path / 'runs'}", "name=job"])
    with pytest.raises(RunDirBusy, match=f"in use by process {p.pid}"):
        run_rlvr(cfg)
    assert [x.name for x in run_dir.iterdir()] == [LOCK_FILE]


def _script(name: str):
    import importlib.util

    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["train", "llm_rlvr"])
def test_both_scripts_refuse_a_busy_run_directory_in_one_line(tmp_path, holder, capsys, name):
    run_dir = tmp_path / "race"
    p = holder(run_dir)
    if name == "train":
        argv = ["--config", str(ROOT / "configs" / "reach_state_ppo.yaml"), f"out_dir={tmp_path}", "name=race",
                "log.wandb=disabled", "env.num_envs=2"]
    else:
        argv = ["model.kind=char", "model.max_len=16", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
                "threads=1", f"out_dir={tmp_path}", "name=race"]
    assert _script(name).main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: run directory {run_dir} is in use by process {p.pid} (-c {run_dir}): wait for it to end " \
                  "or stop it, or choose another name=", err
    assert [x.name for x in run_dir.iterdir()] == [LOCK_FILE]
