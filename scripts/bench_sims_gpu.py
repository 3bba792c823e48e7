"""Simulator throughput on one GPU: the Warp backend (physics, full step, frames) and MJX, 1,024-8,192 worlds.

    scripts/bench_gpu.sh                        # the prepared command (at most 8 minutes, one JSON)
    python scripts/bench_sims_gpu.py --device cpu --envs 8,16 --steps 2 --json /tmp/b.json   # exercise on a CPU

Per number of worlds N (the suite scene, ``frame_skip`` substeps per control step, 64x64 RGB from the
front camera), ``results["envs_N"]`` holds

- ``warp_physics_steps_per_s``: physics substeps x worlds per second of the Warp backend's step alone
  (the issue's "physics steps");
- ``warp_env_steps_per_s``: control steps x worlds per second of ``SimVectorEnv.step_arrays`` with
  state observations (physics, task code on the device, autoresets);
- ``warp_frames_per_s``: frames per second of the device renderer alone (BVH refit, ray tracing,
  uint8 ``[N, 1, 3, 64, 64]`` on the device);
- ``warp_env_render_steps_per_s``: control steps x worlds per second of the full step with RGB;
- ``warp_setup_s``: building the env (kernel compilation at the first size, a cache load after);
- ``warp_determinism`` (``"off"``, the default, or ``"all"`` with ``--deterministic``) and
  ``warp_graphs_captured`` (``{"step": ..., "render": ...}``: whether the substeps and the render
  pass ran as CUDA graphs); a size that fails (a refused size, a failed capture) is recorded as
  ``warp_failed`` with its error and the next size runs;
- at the first size, ``warp_deterministic_physics_steps_per_s`` and ``warp_deterministic_env_steps_per_s``:
  the same figures with ``env.suite.warp_deterministic`` (what run-to-run determinism costs), or
  ``warp_deterministic_failed`` with why it did not run (``--no-det-cost`` leaves them out);
- at the sizes of ``--mjx-envs``: ``mjx_steps_per_s`` and ``mjx_compile_s``, the MJX backend's full step
  (or ``mjx_failed`` with its error);
- at the first size, ``warp_capture_check`` (:func:`sims.capture_check.compare_captured_and_eager`: one
  step and render from one state as captured graphs and as eager launches, their largest differences);
- ``failed_checks``: on CUDA a pass that did not run as a captured graph, or a capture check that did not
  match; such a row's figures are not the ones to report, and the script exits 4 after writing the JSON.

After the first size, ``results["training"]`` (``scripts/bench_train_device.py``; ``--no-train``: none): VLA
PPO env-steps/s of the default job at ``--train-envs`` environments, in process (batch sims on the
CPU, policy on the device) against co-located (``env.backend=warp`` on the same device, one
process), and with ``--train-fleet`` and Ray installed, pipelined against co-located on Ray; then
``results["host_syncs"]`` (``--no-syncs``: none): the host syncs of one co-located iteration at
``--train-steps`` and twice as many rollout steps (:mod:`vla_rl.host_syncs`; on CUDA torch's sync debug
mode), ``constant`` when they are equal, and ``results["host_syncs_terminate"]`` the same with
``env.terminate_on_success`` (at least ``END_CHECKS`` rollout steps: the deferred restarts' reads).

The JSON is rewritten after every part (each size's Warp figures, its deterministic and MJX figures,
training, host syncs), so a run cut short keeps what it measured, and a part that fails is recorded
with its error while the others run; once ``--budget-s`` seconds are spent, the remaining sizes are
skipped (and listed as skipped).
``--smoke`` runs everything at toy sizes on Warp's CPU device (a check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_report import device_sync, output_path, write_report
from bench_train_device import _stand_in_embeddings, measure_training, train_config

from sims.capture_check import compare_captured_and_eager
from sims.render import RenderConfig
from sims.vec_env import ACTION_DIM, EnvConfig, make_vec_env


def _rate(fn, calls: int, device: torch.device | None) -> float:
    """Calls per second of ``fn`` over ``calls`` calls, after one warm-up call, device synchronised."""
    fn()
    device_sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    device_sync(device)
    return calls / (time.perf_counter() - start)


def _physics_and_step(task: str, n: int, device: str, steps: int, deterministic: bool) -> dict[str, Any]:
    """Physics substeps x worlds/s and control steps x worlds/s of ``n`` worlds, state observations."""
    start = time.perf_counter()
    env = make_vec_env(task, n, seed=0, backend="warp", warp_device=device, warp_deterministic=deterministic)
    env.reset_arrays(seed=0)
    setup = time.perf_counter() - start
    dev, backend, frame_skip = env.device, env._backend, env.config.frame_skip
    actions = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (4, n, ACTION_DIM)), dtype=torch.float32,
                              device=dev)
    k = iter(range(1 << 30))
    ctrl = env._control(actions[0])
    return {"setup_s": setup, "physics_steps_per_s": _rate(lambda: backend.step(ctrl), steps, dev) * n * frame_skip,
            "env_steps_per_s": _rate(lambda: env.step_arrays(actions[next(k) % 4]), steps, dev) * n,
            "determinism": "all" if backend.deterministic else "off", "graphs_captured": backend.graphs_captured}


def measure_warp(task: str, n: int, device: str, steps: int, deterministic: bool = False,
                 check_capture: bool = False) -> dict[str, Any]:
    """The Warp backend's figures for ``n`` worlds on ``device`` (see the module docstring); with
    ``check_capture``, :func:`sims.capture_check.compare_captured_and_eager` on its render env."""
    out = {f"warp_{k}": v for k, v in _physics_and_step(task, n, device, steps, deterministic).items()}
    env = make_vec_env(task, n, seed=0, backend="warp", warp_device=device, render=RenderConfig(),
                       warp_deterministic=deterministic)
    env.reset_arrays(seed=0)
    dev = env.device
    actions = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (4, n, ACTION_DIM)), dtype=torch.float32,
                              device=dev)
    k = iter(range(1 << 30))
    out["warp_frames_per_s"] = _rate(env._backend.render, steps, dev) * n
    out["warp_env_render_steps_per_s"] = _rate(lambda: env.step_arrays(actions[next(k) % 4]), steps, dev) * n
    out["warp_graphs_captured"] = {"step": out["warp_graphs_captured"]["step"] and env._backend.graphs_captured["step"],
                                   "render": env._backend.graphs_captured["render"]}
    if check_capture:
        out["warp_capture_check"] = compare_captured_and_eager(env._backend, env._control(actions[0]))
    out["failed_checks"] = capture_failures(out, device)
    return out


def capture_failures(row: dict[str, Any], device: str) -> list[str]:
    """What makes a row's figures wrong to report: on CUDA, a pass not run as a captured graph (the
    figure would be of eager launches, ~100x slower) or a graph that computes other than eager launches."""
    failed = []
    if device.startswith("cuda"):
        failed += [f"{k} pass not captured as a CUDA graph" for k, ok in row["warp_graphs_captured"].items() if not ok]
    check = row.get("warp_capture_check")
    if check is not None and not check["match"]:
        failed.append(f"captured and eager launches differ (qpos {check['qpos_max_abs_diff']:.2g}, "
                      f"pixels {check['pixel_max_abs_diff']:.0f})")
    return failed


def measure_host_syncs(device: str, num_envs: int, steps: int, terminate: bool = False) -> dict[str, Any]:
    """Host syncs of one co-located VLA PPO iteration (vla_rl.host_syncs) at ``steps`` and twice as many
    rollout steps, without the KL early stop (a read per minibatch, set by the config): equal when
    nothing in the hot loop reads the device per step. ``terminate``: with ``env.terminate_on_success``, whose
    deferred restarts read the ended episodes ``END_CHECKS`` times per rollout of at least that many steps."""
    from vla_rl.host_syncs import count_host_syncs
    from vla_rl.rollout import END_CHECKS
    from vla_rl.trainer import Trainer

    steps = max(steps, END_CHECKS) if terminate else steps
    out: dict[str, Any] = {"num_envs": num_envs, "kl_early_stop": "off (one read per minibatch when on)",
                           "terminate_on_success": terminate}
    for t in (steps, 2 * steps):
        cfg = train_config("colocated", device, num_envs, t, 3, Path(tempfile.mkdtemp(prefix="bench_syncs_")),
                           ("ppo.optim.target_kl=null", "ppo.optim.kl_adaptive_lr=false",
                            f"env.terminate_on_success={str(terminate).lower()}"))
        out["embeddings"] = _stand_in_embeddings(cfg)  # without MiniLM (the GPU machine): never read per step
        trainer = Trainer(cfg)
        try:
            trainer.step()
            with count_host_syncs(device) as counter:
                trainer.step()
        finally:
            trainer.close()
            shutil.rmtree(cfg.out_dir, ignore_errors=True)
        out[f"rollout_{t}"] = {"syncs": counter.count, "sites": dict(counter.sites.most_common(12))}
    out["constant"] = out[f"rollout_{steps}"]["syncs"] == out[f"rollout_{2 * steps}"]["syncs"]
    return out


def measure_determinism_cost(task: str, n: int, device: str, steps: int) -> dict[str, Any]:
    """Physics and state-step figures with ``env.suite.warp_deterministic``, or why ``n`` worlds do not fit."""
    try:
        row = _physics_and_step(task, n, device, steps, deterministic=True)
    except (ValueError, RuntimeError) as exc:  # refused by the size check, or its capture failed: record it
        return {"warp_deterministic_failed": f"{type(exc).__name__}: {exc}"}
    return {"warp_deterministic_physics_steps_per_s": row["physics_steps_per_s"],
            "warp_deterministic_env_steps_per_s": row["env_steps_per_s"],
            "warp_deterministic_setup_s": row["setup_s"], "warp_deterministic_graphs_captured": row["graphs_captured"]}


def measure_mjx(task: str, n: int, steps: int) -> dict[str, float]:
    """The MJX backend's full step (compilation timed apart)."""
    start = time.perf_counter()
    env = make_vec_env(task, n, seed=0, backend="mjx")
    env.reset_arrays()
    zero = np.zeros((n, ACTION_DIM), np.float32)
    env.step_arrays(zero)
    compile_s = time.perf_counter() - start
    return {"mjx_steps_per_s": _rate(lambda: env.step_arrays(zero), steps, env.device) * n, "mjx_compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=output_path, required=True, help="write the figures here (after every size)")
    parser.add_argument("--task", default="suite")
    parser.add_argument("--device", default="cuda:0", help='Warp device: "cuda:N", or "cpu" to exercise the script')
    parser.add_argument("--envs", default="1024,2048,4096,8192", help="comma-separated numbers of worlds")
    parser.add_argument("--steps", type=int, default=20, help="timed calls per figure")
    parser.add_argument("--mjx-envs", default="", help="comma-separated sizes at which to time MJX too (JAX, same GPU)")
    parser.add_argument("--deterministic", action="store_true", help="run every figure with env.suite.warp_deterministic")
    parser.add_argument("--no-det-cost", action="store_true",
                        help="leave out the deterministic figures at the first size")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip the sizes left after this long")
    parser.add_argument("--no-train", action="store_true", help="leave out the training figures")
    parser.add_argument("--train-envs", type=int, default=1024, help="environments of the training job")
    parser.add_argument("--train-steps", type=int, default=16, help="PPO rollout steps per iteration")
    parser.add_argument("--train-iterations", type=int, default=3, help="PPO iterations per mode (first: warm-up)")
    parser.add_argument("--train-fleet", action="store_true", help="also pipelined vs co-located on Ray, if installed")
    parser.add_argument("--no-syncs", action="store_true", help="leave out the host syncs per co-located iteration")
    parser.add_argument("--train-modes", default="inprocess,colocated",
                        help="training modes (inprocess: batch sims + EGL frames; colocated: warp on the device)")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes on Warp's CPU device: exercises every part of the script, measures nothing")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.envs, args.steps, args.mjx_envs, args.no_det_cost = "cpu", "4", 2, "", True
        args.train_envs, args.train_steps, args.train_iterations, args.train_fleet = 4, 4, 2, False
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: torch sees no GPU here; pass --device cpu to exercise the script")

    began = time.perf_counter()
    config = {k: v for k, v in vars(args).items() if k != "json"}
    config.update(frame_skip=EnvConfig.frame_skip, image="64x64 RGB, front camera",
                  versions={p: importlib.metadata.version(p) for p in ("mujoco-warp", "warp-lang")},
                  determinism="all" if args.deterministic else "off")
    results: dict = {}

    def write() -> None:  # after every part: a run cut short keeps what it measured
        results["wall_s"] = time.perf_counter() - began
        write_report(args.json, config, results)

    for i, n in enumerate(int(x) for x in args.envs.split(",")):
        if time.perf_counter() - began > args.budget_s:
            results[f"envs_{n}"] = {"skipped": f"budget of {args.budget_s:.0f} s spent"}
            continue
        _size(args, i, n, results, write)
        if i == 0 and not args.no_train:  # see _training
            _training(args, results, write)
    failed = {k: v["failed_checks"] for k, v in results.items() if isinstance(v, dict) and v.get("failed_checks")}
    results["failed_checks"] = failed
    write()
    print(f"wrote {args.json} after {results['wall_s']:.0f} s" + (f"; FAILED CHECKS: {failed}" if failed else ""))
    if failed:
        sys.exit(4)


def _guarded(row: dict[str, Any], key: str, fn, *fn_args) -> None:
    """``row.update(fn(*fn_args))``, or ``row[key]`` = the error: one failure never costs the other figures."""
    try:
        row.update(fn(*fn_args))
    except Exception as exc:  # an unattended run on a rare machine: record it, go on
        row[key] = f"{type(exc).__name__}: {str(exc)[:500]}"


def _size(args: argparse.Namespace, i: int, n: int, results: dict, write) -> None:
    """Every simulator figure of ``n`` worlds into ``results["envs_<n>"]``, the JSON written after each part."""
    row = results[f"envs_{n}"] = {}
    _guarded(row, "warp_failed", measure_warp, args.task, n, args.device, args.steps, args.deterministic, i == 0)
    print(n, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    write()
    if i == 0 and not (args.no_det_cost or args.deterministic):
        _guarded(row, "warp_deterministic_failed", measure_determinism_cost, args.task, n, args.device, args.steps)
        write()
    if str(n) in args.mjx_envs.split(","):
        _guarded(row, "mjx_failed", measure_mjx, args.task, n, max(2, args.steps // 4))
        write()


def _training(args: argparse.Namespace, results: dict, write) -> None:
    """Training right after the first size: its kernels are compiled by then, and the budget (or the
    shell's hard stop) can only cut larger simulator sizes, never the training figures."""
    try:
        results["training"] = measure_training(args.device, args.train_envs, args.train_steps,
                                               args.train_iterations, fleet=args.train_fleet,
                                               modes=tuple(args.train_modes.split(",")))
    except Exception as exc:  # recorded, as a failed size is
        results["training"] = {"failed": f"{type(exc).__name__}: {str(exc)[:500]}"}
    print("training", {k: v for k, v in results["training"].items() if not isinstance(v, dict)}, flush=True)
    write()
    if not args.no_syncs:
        for key, terminate in (("host_syncs", False), ("host_syncs_terminate", True)):
            results[key] = {}
            _guarded(results[key], "failed", measure_host_syncs, args.device, args.train_envs, args.train_steps,
                     terminate)
            print(key, {k: v.get("syncs", v) if isinstance(v, dict) else v for k, v in results[key].items()},
                  flush=True)
            write()


if __name__ == "__main__":
    main()
