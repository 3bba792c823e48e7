"""Small threads for the shared CI machine, a bounded wait for conditions other processes make true, and a reach
policy that succeeds where a test asks."""

import contextlib
import os
import time
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _eventually(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _processes(title: str) -> list[int]:
    """Pids of this test process's descendants (Ray's workers among them) whose title starts with ``title``."""
    parent, titles = {}, {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):  # not a process, or one that ended while we looked
            pid = int(entry.name)
            parent[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            titles[pid] = (entry / "cmdline").read_bytes()
    mine = {os.getpid()}
    for _ in range(8):  # the depth of the process tree below this one (raylet, then its workers)
        mine |= {pid for pid, ppid in parent.items() if ppid in mine}
    return [pid for pid in mine if titles.get(pid, b"").startswith(title.encode())]


@pytest.fixture
def processes():
    """``processes(title)``: pids of this test process's descendants (Ray's workers) whose title starts with ``title``."""
    return _processes


@pytest.fixture
def eventually():
    """``eventually(condition, timeout_s=60)``: poll ``condition`` until it holds; False after the timeout."""
    return _eventually


class Interrupt(Exception):
    """Raised by :func:`interrupted_training` in place of an iteration: a crash mid-run."""


@pytest.fixture
def interrupted_training(monkeypatch):
    """``interrupted_training(trainer, after)``: train until ``after`` iterations ran, then crash (Interrupt)."""
    from vla_rl.trainer import Trainer

    def run(trainer, after: int) -> None:
        step = Trainer.step

        def step_or_crash(self):
            if self.iteration >= after:
                raise Interrupt
            return step(self)

        monkeypatch.setattr(Trainer, "step", step_or_crash)
        try:
            with pytest.raises(Interrupt):
                trainer.train()
        finally:
            monkeypatch.setattr(Trainer, "step", step)

    return run


@pytest.fixture
def scripted_reach():
    """``scripted_reach(trainer, envs)``: the trainer's policy heads straight for the goal (and succeeds) in the
    environments of the bool mask ``envs`` [N], and samples as before in the others (reach, state observations)."""

    def script(trainer, envs: torch.Tensor) -> None:
        sampled = trainer.policy.act

        def act(obs, deterministic=False):
            out = sampled(obs, deterministic)
            scripted = torch.cat([(obs["state"][:, :3] / 0.03).clamp(-1, 1), -torch.ones(len(obs), 1)], 1)
            out["action"][envs] = scripted[envs]
            return out

        trainer.policy.act = act

    return script
