"""Every benchmark script README.md or docs/results.md cites runs at its smoke size with all its parts on
(the Warp CPU device included) and writes a JSON holding the keys the docs quote, with its provenance
(issue 48). Scripts smoke-run by another test are named with that test; this file checks it exists."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.replay.synthetic import write_synthetic_trace

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "results.md"]
GPU_OWNED = re.compile(r"_gpu\.(py|sh)$|^bench_gpu\.sh$")  # run on the GPU machine (tests/vla_rl/test_bench_gpu.py)


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]
    keys: tuple[str, ...]
    """Dotted result keys the docs quote (or their smoke-size counterparts)."""
    slow: bool = False


@dataclass(frozen=True)
class Elsewhere:
    test: str
    """``path::test`` of the test that smoke-runs the script with its parts on and checks its figures."""


SIM_KEYS = ("full_step_steps_per_s", "raw_physics_steps_per_s", "ratio_full_step_vs_raw_physics",
            "gym_async_steps_per_s", "ratio_full_step_vs_gym_async", "render_frames_per_s",
            "default_renderer_frames_per_s", "ratio_render_vs_default_renderer", "full_step_render_steps_per_s",
            "render_frames_per_s_sweep.contexts_2_lp_2", "mjx_cpu_steps_per_s", "mjx_cpu_compile_s",
            "warp_cpu_physics_steps_per_s", "warp_cpu_env_steps_per_s", "warp_cpu_frames_per_s",
            "warp_cpu_env_render_steps_per_s")
POLICY_KEYS = ("decision_latency_p50_ms", "decision_latency_p99_ms", "replay_seconds_per_seed", "alloc_pct_at_100_mean")
TRACE = ("--pods", "{trace}/openb_pod_list_default.csv", "--nodes", "{trace}/openb_node_list_gpu_node.csv")
TINY_JOB = ("env.num_envs=2", "ppo.rollout_steps=8", "ppo.optim.epochs=1", "ppo.optim.num_minibatches=1",
            "eval.every=0", "log.wandb=disabled", "log.progress=false", "log.video=false")

CITED: dict[str, Smoke | Elsewhere] = {
    "bench_sims.py": Smoke(("--envs", "4", "--threads", "1", "--seconds", "0.05", "--gym-copies", "2",
                            "--mjx-envs", "2", "--warp-steps", "1"), SIM_KEYS, slow=True),  # MJX's compile: ~30 s
    "bench_scheduler.py": Smoke((*TRACE, "--waiting", "5", "--releases", "5"), (
        "fill.submit_latency_p99_ms", "fill.ratio_submit_latency_p99_ms_vs_fgd", "fill.baseline_fgd.submit_latency_p99_ms",
        "release.release_latency_p99_ms", "release.ratio_release_latency_p99_ms_vs_fgd",
        "dynamic.speedup_1.wall_s", "dynamic.speedup_1.ratio_wall_s_vs_fgd")),
    "replay_trace.py": Smoke((*TRACE, "--policies", "fgd,fgd-strand", "--seeds", "42", "--inflate", "1.3"),
                             tuple(f"{p}.{k}" for p in ("fgd", "fgd-strand") for k in POLICY_KEYS)),
    "bench_ray_latency.py": Smoke(("--calls", "3", "--envs", "2", "--work-ms", "1"), (
        "back_to_back_ms", "after_work_ms", "batched_ms", "batched_socket_ms")),
    "bench_multiplex.py": Smoke(("--jobs", "2", "--gpus", "12", "--iterations", "1", "--slowdowns", "1.1,3",
                                 "--router-requests", "200"), ("multiplex", "router", "services", "targets")),
    "bench_placement.py": Smoke(("--iterations", "2", "--rounds", "1", *TINY_JOB, "env.num_envs=4"), (  # 2 per shard: pipelined splits them
        "inprocess.env_steps_per_s", "colocated.env_steps_per_s", "disaggregated.env_steps_per_s",
        "pipelined.env_steps_per_s", "comparisons.ray_overhead_pct_colocated",
        "comparisons.ratio_pipelined_vs_colocated"), slow=True),
    "bench_experts.py": Elsewhere("tests/sims/test_tasks.py::test_bench_experts_writes_each_tasks_success_with_an_interval"),
    "bench_libero.py": Elsewhere("tests/sims/test_bench_libero.py::test_robosuite_side_and_ratios"),
    "bench_seeds.py": Elsewhere("tests/vla_rl/test_bench_seeds.py::test_seeds_train_evaluate_and_read_back"),
    "bench_halfcheetah.py": Elsewhere("tests/vla_rl/test_bench_halfcheetah.py::test_commands_run_the_shipped_jobs_pinned_to_cores"),
    "bench_language_dev.py": Smoke(("--checkpoint", "{checkpoint}", "--phrasings", "{phrasings}", "--episodes", "2"),
                                   ("success", "ci95", "episodes", "tasks.reach.success"), slow=True),  # trains first
}
"""How each cited benchmark is smoke-run."""
MODES: dict[str, Smoke] = {
    "bench_multiplex.py --real": Smoke(("--real", "--real-jobs", "2", "--real-iterations", "1"), (
        "real.gpu_hours_saved_pct", "real.max_slowdown", "sim_vs_real_error_pct"), slow=True),  # a local Ray cluster
}
"""Second modes of a cited benchmark that docs/results.md quotes (``SCRIPT --flag``), each smoke-run too."""


def cited_scripts() -> set[str]:
    text = "\n".join(doc.read_text() for doc in DOCS)
    return {name for name in re.findall(r"scripts/(\w+\.(?:py|sh))", text)
            if name.startswith("bench_") or name == "replay_trace.py"}


def test_every_cited_benchmark_has_a_smoke_run():
    cited = {name for name in cited_scripts() if not GPU_OWNED.search(name)}
    assert cited == set(CITED), f"cited but not smoke-run: {cited - set(CITED)}; smoke-run but not cited: {set(CITED) - cited}"
    for name, how in CITED.items():
        if isinstance(how, Elsewhere):
            path, test = how.test.split("::")
            text = (ROOT / path).read_text()
            assert f"def {test}(" in text and name in text, f"{how.test} does not run scripts/{name}"


def value_at(results: dict, dotted: str):
    for part in dotted.split("."):
        assert isinstance(results, dict) and part in results, f"no {dotted!r} in results (missing {part!r})"
        results = results[part]
    return results


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    trace = tmp_path_factory.mktemp("trace")
    write_synthetic_trace(trace, seed=0, num_nodes=40, num_pods=300)
    phrasings = trace / "phrasings.yaml"  # one task of configs/language_dev.yaml: the smoke evaluates reach only
    phrasings.write_text('reach: ["head toward the {a}"]\n')
    return {"trace": str(trace), "phrasings": str(phrasings)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """One PPO iteration of the default VLA job on reach: a checkpoint bench_language_dev can read."""
    from vla_rl.config import CONFIG_DIR, load_config
    from vla_rl.trainer import Trainer

    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(CONFIG_DIR / "default.yaml", [f"out_dir={out}", "name=dev", "env.task=reach",
                                                    "total_env_steps=16", *TINY_JOB])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    return str(out / "dev")


def _params() -> list:
    return [pytest.param(name, how, id=name, marks=[pytest.mark.slow] if how.slow else [])
            for name, how in (*CITED.items(), *MODES.items()) if isinstance(how, Smoke)]


@pytest.mark.parametrize(("name", "smoke"), _params())
def test_cited_benchmark_writes_the_quoted_keys(name, smoke, inputs, request, tmp_path):
    values = dict(inputs)
    if any("{checkpoint}" in a for a in smoke.args):
        values["checkpoint"] = request.getfixturevalue("checkpoint")
    out = tmp_path / "out.json"
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # this checkout
    cmd = [sys.executable, str(ROOT / "scripts" / name.split()[0]), *(a.format(**values) for a in smoke.args), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    report = json.loads(out.read_text())
    results = report["results"]
    assert "errors" not in results, results.get("errors")
    for key in smoke.keys:
        value = value_at(results, key)
        assert value is not None and (not isinstance(value, float) or value == value), (key, value)  # not NaN
    assert {"git", "machine", "config"} <= set(report) and report["machine"]["load_average_at_end"]


def printed(value: float, shown: str) -> bool:
    """``value`` rounded to the digits of ``shown`` is ``shown``."""
    digits = len(shown.partition(".")[2])
    return abs(value - float(shown.replace(",", ""))) <= 0.5 * 10**-digits + 1e-9


def test_readme_simulators_row_quotes_the_ratios_first_and_equals_the_json():
    row = next(line for line in DOCS[0].read_text().splitlines() if line.startswith("| [Simulators]"))
    full, gym, frames, rate, cpu = re.search(
        r"\| (\S+)x raw physics \((\S+)x gymnasium's .*?; frames (\S+)x \((\S+) frames/s on a 2-core (.+?), load", row
    ).groups()
    report = json.loads((ROOT / "docs" / "figures" / "bench" / "bench_sims_quiet.json").read_text())
    r = report["results"]
    assert printed(r["ratio_full_step_vs_raw_physics"], full) and printed(r["ratio_full_step_vs_gym_async"], gym)
    assert printed(r["ratio_render_vs_default_renderer"], frames) and printed(r["render_frames_per_s"], rate)
    assert report["machine"]["cores"] == 2 and report["machine"]["cpu_model"] == cpu
