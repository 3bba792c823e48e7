"""What the GPU machine's one session needs here first: the recipe's test stage on the stage's device with
its JSON after every stage, and the benchmark importing without the packages it never calls into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


