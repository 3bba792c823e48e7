"""What the GPU machine's one session needs here first: the recipe's test stage on the stage's device with
its JSON after every stage, and the benchmark importing without the packages it never calls into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vla_rl import recipe as R
from vla_rl.config import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_imports  # noqa: E402


def test_recipe_tests_each_checkpoint_on_its_stage_device_and_reports_after_every_stage(tmp_path, monkeypatch):
    evaluated: list[tuple[str, str, str]] = []

    def evaluate(path, split, episodes, num_envs, device="cpu", record=True, **_):
        evaluated.append((Path(path).name, split, device))
        report = {"success": 0.5, "ci95": [0.1, 0.9], "episodes": episodes, "tasks": {}}
        return type("Eval", (), {"report": lambda self: report})()

    def demos(cfg):
        (cfg.out / "meta").mkdir(parents=True)
        (cfg.out / "meta" / "info.json").write_text("{}")

    monkeypatch.setattr(R, "evaluate_checkpoint", evaluate)
    monkeypatch.setattr(R, "collect_demos", demos)
    monkeypatch.setattr(R, "_train", lambda cfg: {"wall_time_s": 1.0})
    recipe = R.load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", [f"out_dir={tmp_path}", "sft.device=cpu",
                                                              "rl.device=cuda:0", "test.splits=[train,paraphrase]"])
    reports: list[dict] = []
    out = R.run_recipe(recipe, on_stage=lambda r: reports.append(json.loads(json.dumps(r, default=str))))
    assert evaluated == [("sft", "train", "cpu"), ("sft", "paraphrase", "cpu"),
                         ("rl", "train", "cuda:0"), ("rl", "paraphrase", "cuda:0")]
    # After SFT's training, after its test, after RL's training (SFT's figures kept), after RL's test.
    assert [sorted(r["results"]) for r in reports] == [["sft"], ["sft"], ["rl", "sft"], ["rl", "sft"]]
    assert "train" not in reports[0]["results"]["sft"] and reports[1]["results"]["sft"]["train"]["success"] == 0.5
    assert "train" not in reports[2]["results"]["rl"] and reports[3]["results"] == out["results"]


def test_a_lazy_module_is_needed_only_where_imported_at_module_level(tmp_path, monkeypatch, capsys):
    bench = [ROOT / "scripts" / "bench_sims_gpu.py"]
    assert "imageio_ffmpeg" in check_imports.required_modules(bench)  # the demonstrations' reader and writer
    assert "imageio_ffmpeg" not in check_imports.required_modules(bench, frozenset({"imageio_ffmpeg"}))
    eager = tmp_path / "eager.py"
    eager.write_text("import imageio_ffmpeg\n\n\ndef f():\n    import tensordict\n")
    monkeypatch.setattr(check_imports, "ROOT", tmp_path)
    assert set(check_imports.required_modules([eager], frozenset({"imageio_ffmpeg", "tensordict"}))) == {
        "imageio_ffmpeg"}
    real = check_imports.importlib.util.find_spec
    monkeypatch.setattr(check_imports.importlib.util, "find_spec",
                        lambda name, *a: None if name == "imageio_ffmpeg" else real(name))
    assert check_imports.main(["--lazy", "imageio_ffmpeg", str(eager)]) == 1
    assert "imageio_ffmpeg (imported by eager.py, at module level: import it inside" in capsys.readouterr().err


def test_the_benchmark_and_the_trainers_import_without_ffmpeg():
    """The GPU machine's first calls bring no ffmpeg; importing the trainers must not need it."""
    code = ("import sys; sys.modules['imageio_ffmpeg'] = None; sys.path.insert(0, 'scripts'); "
            "import bench_sims_gpu, vla_rl.algorithm, vla_rl.sft, vla_rl.demos; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]




sys.path.insert(0, str(ROOT / "scripts" / "device"))
import preflight  # noqa: E402


def test_preflight_says_what_it_found_and_the_fix():
    assert preflight.check_tensordict("2.11.0+cu130", ">=2.11.0a0", None) == (
        True, "requires torch >=2.11.0a0, found 2.11.0+cu130")
    ok, message = preflight.check_tensordict("2.10.1", ">=2.11.0a0", None)
    assert not ok and "needs torch >=2.11.0a0, this machine has 2.10.1: bring an older tensordict wheel" in message
    ok, message = preflight.check_tensordict("2.11.0", ">=2.11.0a0", "tensordict._C: ImportError: undefined symbol")
    assert not ok and "compiled extension does not load with torch 2.11.0 (tensordict._C: ImportError" in message
    assert preflight.check_minimum("transformers", "5.25.0", "5.24") == (True, "5.25.0 (>= 5.24)")
    assert preflight.check_minimum("transformers", "4.57.1", "5.24")[1] == (
        "transformers 4.57.1 is older than the project's minimum 5.24: bring a newer wheel")
    assert not preflight.check_minimum("transformers", None, "5.24")[0]
    assert preflight.check_mujoco_gl("egl") == (True, "egl")
    assert preflight.check_mujoco_gl(None)[1].startswith("MUJOCO_GL=None: set MUJOCO_GL=egl")
    h100 = "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"  # another image's place: found there
    assert preflight.check_egl_vendor(None, exists=lambda p: p == h100) == (True, h100, h100)
    ok, message, _ = preflight.check_egl_vendor("/nowhere.json", exists=lambda p: False)
    assert not ok and message.startswith("__EGL_VENDOR_LIBRARY_FILENAMES=/nowhere.json does not exist")
    assert not preflight.check_egl_vendor(None, exists=lambda p: False)[0]
    assert preflight._project_minimum("transformers") == "5.24"


def test_embeddings_file_stands_in_for_minilm(tmp_path, monkeypatch):
    from policies import embedding_file, encoders

    strings = ["put the red block on the blue block", "push the green block to the left"]
    written = embedding_file.save_embeddings(tmp_path / "e.pt", strings, 24)
    want_sentence = encoders.shared_sentence_cache()(strings)
    want_tokens = encoders.shared_token_cache(24)(strings)
    # A fresh process's caches, whose encoder must never run: every string comes from the file.
    fresh = {"sentence": encoders.SentenceCache(encode=lambda s: pytest.fail(f"encoded {s}")),
             "tokens": encoders.SentenceCache(encode=lambda s: pytest.fail(f"encoded {s}"))}
    monkeypatch.setattr(embedding_file, "shared_sentence_cache", lambda: fresh["sentence"])
    monkeypatch.setattr(embedding_file, "shared_token_cache", lambda n: fresh["tokens"])
    assert written["strings"] == 2 and embedding_file.preload_embeddings(tmp_path / "e.pt") == 2
    assert torch.allclose(fresh["sentence"](strings), want_sentence, atol=1e-3)
    tokens = fresh["tokens"](strings)
    assert tokens.shape == want_tokens.shape and torch.allclose(tokens, want_tokens, atol=1e-3)
    assert torch.equal(tokens.abs().sum(-1) == 0, want_tokens.abs().sum(-1) == 0)  # the padding rows stay zero
    with pytest.raises(ValueError, match="not an instruction-embeddings file"):
        torch.save({"x": 1}, tmp_path / "bad.pt")
        embedding_file.preload_embeddings(tmp_path / "bad.pt")


def test_rehearsal_fast_part_passes():
    run = subprocess.run(["bash", str(ROOT / "scripts" / "device" / "rehearse.sh"), "--quick"], cwd=ROOT,
                         env={**os.environ, "PYTHON": sys.executable, "MUJOCO_GL": "egl"}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "rehearse --quick: ok" in run.stdout, run.stderr[-2000:]


@pytest.mark.slow  # two processes, each a VLA trainer on Warp's CPU device: minutes on 2 cores
def test_two_ranks_share_one_device_through_gloo(tmp_path):
    out = tmp_path / "dp.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "device" / "dp_one_gpu.py"), "--device", "cpu",
                          "--iterations", "1", "--json", str(out), "env.num_envs=4", "ppo.rollout_steps=4"],
                         cwd=ROOT, env={**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"},
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ranks"] == 2 and report["backend"] == "gloo" and report["weights_equal"] is True
    assert len(report["env_steps_per_s_per_rank"]) == 2 and min(report["env_steps_per_s_per_rank"]) > 0
    assert "env.backend=warp" in report["overrides"] and "device=cpu" in report["overrides"]
