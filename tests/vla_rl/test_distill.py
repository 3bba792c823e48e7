"""Distillation: the student's likelihood of the teacher's actions rises; a missing teacher is a config error."""

import pytest

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError, build_config
from vla_rl.distill import label
from vla_rl.trainer import Trainer

BASE = {
    "seed": 1, "checkpoint_every": 1,
    "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 4},
    "ppo": {"rollout_steps": 32},
    "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
    "eval": {"every": 0},
    "log": {"wandb": "disabled", "progress": False, "video": False},
}


def test_student_imitates_teacher(tmp_path):
    teacher_cfg = {**BASE, "out_dir": str(tmp_path), "name": "teacher", "total_env_steps": 512,
                   "ppo": {"rollout_steps": 32, "optim": {"lr": 0.03, "anneal_lr": False}}}
    Trainer(build_config(teacher_cfg)).train()
    student = Trainer(build_config({
        **BASE, "out_dir": str(tmp_path), "name": "student", "algo": "distill", "total_env_steps": 10**6,
        "distill": {"teacher": str(tmp_path / "teacher"), "rollout_steps": 32, "updates": 50, "batch_size": 64},
    }))
    obs = student.collector.obs

    def error():
        mine = student.policy.act(obs, deterministic=True)["action"]
        return float(((mine - label(student.algorithm.teacher, obs)) ** 2).mean())

    before = error()
    assert float((label(student.algorithm.teacher, obs) ** 2).mean()) > 0.01  # the teacher's actions are not ~0
    for _ in range(5):
        student.step()
    assert error() < 0.25 * before


def test_distill_needs_a_usable_teacher(tmp_path):
    with pytest.raises(ConfigError, match=r"algo=distill needs distill\.teacher=PATH"):
        build_config({**BASE, "algo": "distill"})
    cfg = build_config({**BASE, "out_dir": str(tmp_path), "algo": "distill", "distill": {"teacher": str(tmp_path / "none")}})
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Trainer(cfg)
