"""Exact resume of the default VLA job, checkpoints that survive SIGKILL, SIGTERM that resumes by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from vla_rl.checkpoint import load_checkpoint
from vla_rl.config import load_config
from vla_rl.trainer import Trainer, unfinished

ROOT = Path(__file__).resolve().parents[2]
ITERATION_STEPS = 64 * 50  # configs/default.yaml: 64 envs x 50 decisions

# The default job as shipped (pixels, VLA, asymmetric critic, auxiliary losses), three iterations long.
SHORT = [f"total_env_steps={3 * ITERATION_STEPS}", "checkpoint_every=1", "eval.every=2", "eval.episodes=8",
         "eval.num_envs=8", "log.wandb=disabled", "log.progress=false", "log.video=false"]


def _default_job(out_dir: Path, name: str):
    return load_config(ROOT / "configs" / "default.yaml", [*SHORT, f"out_dir={out_dir}", f"name={name}"])


def _assert_same_training_state(a: Trainer, b: Trainer) -> None:
    weights_a, weights_b = a.policy.state_dict(), b.policy.state_dict()
    unequal = [k for k in weights_a if not torch.equal(weights_a[k], weights_b[k])]
    assert not unequal, f"{len(unequal)} of {len(weights_a)} policy tensors differ: {unequal[:5]}"
    opt_a, opt_b = a.algorithm.updater.optimizer.state_dict()["state"], b.algorithm.updater.optimizer.state_dict()["state"]
    for idx in opt_a:
        assert torch.equal(opt_a[idx]["exp_avg_sq"], opt_b[idx]["exp_avg_sq"])
    assert (a.collector.obs == b.collector.obs).all()


def test_resumed_default_vla_job_equals_the_uninterrupted_run(tmp_path, interrupted_training):
    straight = Trainer(_default_job(tmp_path, "straight"))
    straight.train()
    straight.close()

    first = Trainer(_default_job(tmp_path, "resumed"))
    interrupted_training(first, after=2)
    first.close()
    cfg = _default_job(tmp_path, "resumed")
    assert unfinished(cfg)
    with warnings.catch_warnings(record=True) as caught:  # a sims env snapshots: no re-reset warning
        warnings.simplefilter("always")
        resumed = Trainer(cfg, resume=True)
    assert not [w for w in caught if "not bit-identical" in str(w.message)]
    assert resumed.iteration == 2
    resumed.train()
    resumed.close()
    assert resumed.iteration == straight.iteration == 3
    _assert_same_training_state(straight, resumed)
    row_a, row_b = straight.log.rows[-1], resumed.log.rows[-1]
    for key in ("policy_loss", "value_loss", "approx_kl", "eval/validation/success", "eval/train/return"):
        assert row_a[key] == row_b[key], key
    assert not unfinished(cfg)


def _train_command(out_dir: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), *SHORT, f"out_dir={out_dir}", f"name={name}", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "HF_HUB_OFFLINE": "1"}


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"training exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "timed out waiting for the training process"
        time.sleep(0.05)


# Makes the training process stop inside the second checkpoint write, after half the bytes are on disk.
STALL_SECOND_WRITE = """
import runpy, sys, time
from pathlib import Path
import vla_rl.checkpoint as ckpt
original, calls = ckpt.write_atomic, {"n": 0}
def stalling(path, blob):
    calls["n"] += 1
    if calls["n"] == 3:  # iteration 2's iter_*.pt (each save writes iter_*.pt, then latest.pt)
        (path.parent / (path.name + ".stall.tmp")).write_bytes(blob[: len(blob) // 2])
        Path(marker).write_text("writing")
        time.sleep(600)
    original(path, blob)
ckpt.write_atomic = stalling
marker, sys.argv = sys.argv[1], sys.argv[2:]  # python -c THIS MARKER scripts/train.py ARGS...
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_sigkill_while_writing_a_checkpoint_resumes_from_the_last_good_one(tmp_path):
    marker = tmp_path / "writing"
    command = _train_command(tmp_path, "killed")
    proc = subprocess.Popen([sys.executable, "-c", STALL_SECOND_WRITE, str(marker), *command[1:]], env=_env(),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(marker.exists, 300, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    ckpt_dir = tmp_path / "killed" / "checkpoints"
    assert list(ckpt_dir.glob("*.tmp")), "the process should have died with a partial checkpoint on disk"
    assert load_checkpoint(ckpt_dir / "latest.pt")["iteration"] == 1  # the last good one

    relaunch = subprocess.run(command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert relaunch.returncode == 0, relaunch.stderr[-2000:]
    assert "holds an unfinished run: resuming it" in relaunch.stdout
    assert not list(ckpt_dir.glob("*.tmp"))
    final = load_checkpoint(ckpt_dir / "latest.pt")
    assert final["iteration"] == 3

    straight = subprocess.run(_train_command(tmp_path, "straight"), env=_env(), cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr[-2000:]
    reference = load_checkpoint(tmp_path / "straight" / "checkpoints" / "latest.pt")
    for key, value in reference["policy"].items():
        assert torch.equal(value, final["policy"][key]), key


def test_sigterm_checkpoints_exits_cleanly_and_the_same_command_resumes(tmp_path):
    command = _train_command(tmp_path, "preempted")
    proc = subprocess.Popen(command, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latest = tmp_path / "preempted" / "checkpoints" / "latest.pt"
    try:
        _wait_for(latest.exists, 300, proc)  # iteration 1 is checkpointed; iteration 2 is under way
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped by SIGTERM" in out
    saved = load_checkpoint(latest)["iteration"]
    assert 1 <= saved < 3, "SIGTERM must stop the run before its end"
    assert not (tmp_path / "preempted" / "summary.json").exists()

    relaunch = subprocess.run(command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert relaunch.returncode == 0, relaunch.stderr[-2000:]
    assert "resuming it" in relaunch.stdout
    assert load_checkpoint(latest)["iteration"] == 3
    assert (tmp_path / "preempted" / "summary.json").exists()
