"""Success of the scripted experts per task: the ceiling of demonstrations and of SFT on them.

    python scripts/bench_experts.py --split validation --episodes 256 --json runs/bench_experts.json
    python scripts/bench_experts.py --suite libero_spatial --json docs/figures/libero/experts_spatial.json
    python scripts/bench_experts.py --suite libero_spatial --tasks 0 6 --backend warp --warp-device cpu
    python scripts/bench_experts.py --suite libero_spatial --controller servo --json OUT
    python scripts/bench_experts.py --suite libero_spatial --tasks 4 --starts regions --states 100

Gantry tasks (the default): each task runs alone (``make_vec_env(task)``) with the clean expert
(no DART noise), on fresh episodes of ``--split``. LIBERO (``--suite``): the suite's expert
(``sims.libero.expert``) from LIBERO's fixed initial states (``--states``, all 50 by default: the
LIBERO protocol) or, with ``--starts regions``, from the first ``--states`` region-sampled starts (LIBERO's
training distribution, ``sims.libero.regions``: what an expert is tuned on; the fixed states are test data), one ``LiberoSim`` per task holding every episode, on the batch backend or
(``--backend warp``) on MuJoCo Warp's ``--warp-device``, the arm driven by ``--controller`` (``osc``:
LIBERO's OSC_POSE on its torque motors, the default; ``servo``: the joint servos); a Goal task without
an expert (goal/5, the plate push) is reported as such. Success per task with its 95 %
Wilson interval.
"""

from __future__ import annotations

import argparse

from bench_report import BenchReport, output_path, write_report
from tqdm import tqdm

from sims.experts import run_expert
from sims.libero.regions import DEFAULT_COUNT, missing_region_starts
from sims.tasks import SPLITS, TASK_NAMES
from sims.vec_env import make_vec_env
from vla_rl.evaluate import wilson_interval

LIBERO_EXPERT_SUITES = {"libero_spatial": "spatial", "libero_object": "object", "libero_goal": "goal", "libero_10": "10"}


def _result(k: int, n: int) -> dict:
    return {"success": k / n, "ci95": wilson_interval(k, n), "episodes": n}


def bench_libero(report: BenchReport, suite: str, tasks: list[int], states: int, threads: int | None,
                 backend: str = "batch", warp_device: str = "auto", controller: str = "osc",
                 starts: str = "fixed") -> None:
    """The suite's expert on tasks ``tasks`` from initial states ``0..states-1`` (``starts``: ``fixed``, LIBERO's,
    or ``regions``, the region-sampled ones) on ``backend``, the arm driven by ``controller`` (a name of
    :data:`sims.libero.vec_env.CONTROLLERS`); each task's result added to ``report`` (written after each) under its
    id."""
    import time

    import numpy as np

    from sims.libero.expert import run_episodes
    from sims.libero.regions import load_region_starts
    from sims.libero.scene import load_task
    from sims.libero.sim import LiberoSim
    from sims.libero.vec_env import CONTROLLERS

    for index in tasks:
        task_id = f"{LIBERO_EXPERT_SUITES[suite]}/{index}"
        start = time.perf_counter()
        sim = LiberoSim(load_task(task_id), states, backend=backend, warp_device=warp_device, num_threads=threads,
                        arm=CONTROLLERS[controller])
        try:
            regions = load_region_starts(task_id) if starts == "regions" else None
            success = run_episodes(sim, np.arange(states), regions=regions)
        except ValueError as exc:  # a Goal task without an expert (goal/5)
            report.add(task_id, {"expert": None, "reason": str(exc)})
            continue
        finally:
            sim.close()
        k = int(success.sum())
        report.add(task_id, {**_result(k, states), "failed_states": np.flatnonzero(~success).tolist(),
                             "seconds": round(time.perf_counter() - start, 1)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="validation", choices=SPLITS)
    parser.add_argument("--episodes", type=int, default=256, help="episodes per task (a multiple of --num-envs)")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1_000_003)
    parser.add_argument("--tasks", nargs="+", default=None,
                        help=f"gantry tasks ({', '.join(TASK_NAMES)}; default all) or, with --suite, task "
                             "indices 0..9 (default all)")
    parser.add_argument("--suite", choices=sorted(LIBERO_EXPERT_SUITES), help="a LIBERO suite instead of the gantry")
    parser.add_argument("--states", type=int, default=50, help="LIBERO: initial states 0..STATES-1 per task")
    parser.add_argument("--starts", default="fixed", choices=("fixed", "regions"),
                        help="LIBERO: LIBERO's fixed initial states (test data) or its region-sampled starts")
    parser.add_argument("--threads", type=int, default=None, help="LIBERO: physics threads (default: all cores)")
    parser.add_argument("--backend", default="batch", choices=("batch", "warp"), help="LIBERO: the simulator backend")
    parser.add_argument("--warp-device", default="auto", help="LIBERO, --backend warp: cpu, cuda:N or auto")
    parser.add_argument("--controller", default="osc", choices=("osc", "servo"),
                        help="LIBERO: the arm's controller (LIBERO's OSC_POSE, or the joint servos)")
    parser.add_argument("--json", type=output_path, help="write {git, machine, config, results}")
    args = parser.parse_args()
    if args.suite is not None:
        try:
            args.tasks = [int(t) for t in args.tasks] if args.tasks else list(range(10))
        except ValueError:
            parser.error(f"--tasks {' '.join(args.tasks)}: with --suite give task indices 0..9")
        most = 50 if args.starts == "fixed" else DEFAULT_COUNT
        if not all(0 <= t < 10 for t in args.tasks) or not 1 <= args.states <= most:
            parser.error(f"--tasks {args.tasks} / --states {args.states}: task indices are 0..9, states 1..{most}")
        if args.starts == "regions" and args.backend != "batch":
            parser.error("--starts regions re-places LIBERO's fixtures per start, which runs on --backend batch only")
        ids = [f"{LIBERO_EXPERT_SUITES[args.suite]}/{t}" for t in args.tasks]
        if args.starts == "regions" and (missing := missing_region_starts(ids)):
            parser.error(missing)
        config = {k: getattr(args, k) for k in ("suite", "tasks", "states", "starts", "threads", "backend",
                                                "warp_device", "controller")}
        bench_libero(BenchReport(args.json, config), args.suite, args.tasks, args.states, args.threads, args.backend,
                     args.warp_device, args.controller, args.starts)
        return
    args.tasks = args.tasks or list(TASK_NAMES)
    unknown = sorted(set(args.tasks) - set(TASK_NAMES))
    if unknown:
        parser.error(f"unknown tasks {unknown}; valid: {', '.join(TASK_NAMES)} (LIBERO: --suite)")
    if args.episodes < args.num_envs or args.episodes % args.num_envs:
        parser.error(f"--episodes {args.episodes} must be a positive multiple of --num-envs {args.num_envs}")

    results = {}
    for task in tqdm(args.tasks, desc="experts"):
        env = make_vec_env(task, args.num_envs, seed=args.seed, split=args.split)
        try:
            success = run_expert(env, args.episodes // args.num_envs, seed=args.seed)
        finally:
            env.close()
        k, n = int(success.sum()), int(success.size)
        results[task] = _result(k, n)
        low, high = results[task]["ci95"]
        tqdm.write(f"{task:8s} {k / n:6.1%}  [{low:.1%}, {high:.1%}]  n={n}")
    if args.json is not None:
        write_report(args.json, vars(args), results)


if __name__ == "__main__":
    main()
