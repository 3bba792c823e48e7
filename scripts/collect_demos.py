"""Record scripted-expert demonstrations as a LeRobot v3.0 dataset (docs/demos.md).

    python scripts/collect_demos.py --task suite --episodes 200 --out runs/demos/suite
    python scripts/collect_demos.py --task lift --episodes 50 --out runs/demos/lift-dart --noise 0.1
    python scripts/collect_demos.py --task libero_spatial --episodes 100 --num-envs 10 --out runs/demos/libero_spatial
    python scripts/collect_demos.py --task libero_spatial --episodes 100 --num-envs 10 --out runs/demos/osc \
        --suite-settings controller=osc starts=regions

The experts act in ``--num-envs`` rendering environments of the ``train`` split; successful episodes
are kept (``--keep-failures``: all). ``--noise SIGMA`` executes the expert's action plus Gaussian
noise and records the clean action as the label (DART). A LIBERO task (``libero_spatial``,
``libero_spatial/3``) is demonstrated by its suite's experts (``sims.libero.expert.expert_for``) from the
``train`` split's starts (LIBERO's region sampler; ``--suite-settings starts=jitter``, an opt-in: the fixed
initial states shifted) with its arm controller (``controller=osc``: LIBERO's OSC_POSE), both cameras at 128 x 128 by default (``sims.suite_of(task).frames``). Read the folder back with
``vla_rl.demos.DemoDataset(DIR)`` or with LeRobot's ``LeRobotDataset(repo_id, root=DIR)``.
"""

from __future__ import annotations

import argparse
import sys

import yaml
from bench_report import output_path

import sims
from vla_rl.demos import CollectConfig, collect_demos


def main(argv: list[str] | None = None) -> None:
    defaults = CollectConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True,
                        help=f"{', '.join(sims.TASK_NAMES)}, suite, or a LIBERO task: libero_<suite>[/<i>]")
    parser.add_argument("--episodes", required=True, type=int, help="episodes to keep")
    parser.add_argument("--out", required=True, type=output_path, help="dataset folder to create (new or empty)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="base seed of the training episodes")
    parser.add_argument("--noise", type=float, default=defaults.noise, metavar="SIGMA",
                        help="std of Gaussian noise on the executed actions; labels stay the expert's (default 0)")
    parser.add_argument("--keep-failures", action="store_true", help="keep episodes the expert failed too")
    parser.add_argument("--image-size", type=int, default=None,
                        help="frame height and width, pixels (default: the suite's, 64; LIBERO 128)")
    parser.add_argument("--num-envs", type=int, default=defaults.num_envs, help="environments stepped together")
    parser.add_argument("--cameras", nargs="+", default=None,
                        choices=list(dict.fromkeys(c for suite in sims.suites() for c in suite.cameras)),
                        help="default: the suite's (front; LIBERO: agentview robot0_eye_in_hand)")
    parser.add_argument("--per-task", type=int, default=None,
                        help="keep at most this many episodes of each task (few-shot demonstrations; default: no cap)")
    parser.add_argument("--max-steps", type=int, default=None, help="LIBERO: episode limit (default: LIBERO's)")
    parser.add_argument("--episodes-per-file", type=int, default=defaults.episodes_per_file,
                        help="episodes per data parquet and mp4")
    parser.add_argument("--crf", type=int, default=defaults.crf, help="H.264 quality: 0 lossless, 23 ffmpeg's default")
    parser.add_argument("--num-threads", type=int, default=None, help="physics and render threads (default: all cores)")
    parser.add_argument("--task-weights", nargs="+", default=[], metavar="TASK=W",
                        help="sample these tasks of the suite W times as often (others weigh 1), e.g. push=3 stack=3")
    parser.add_argument("--suite-settings", nargs="+", default=[], metavar="KEY=VALUE",
                        help="the suite's own env settings (a run's env.suite), e.g. LIBERO's controller=osc starts=regions")
    args = parser.parse_args(argv)
    try:
        weights = {k: float(v) for k, v in (item.split("=", 1) for item in args.task_weights)}
    except ValueError:
        parser.error(f"--task-weights {' '.join(args.task_weights)}: give TASK=WEIGHT pairs, e.g. push=3 stack=3")
    if bad := [item for item in args.suite_settings if "=" not in item]:
        parser.error(f"--suite-settings {' '.join(bad)}: give KEY=VALUE pairs, e.g. controller=osc starts=regions")
    settings = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.suite_settings)}
    try:
        frames = sims.suite_of(args.task).frames  # the suite's default frames
    except ValueError as exc:
        parser.error(str(exc))
    if frames is None:
        parser.error(f"--task {args.task}: its suite renders no frames, and a dataset's episodes hold camera frames")
    cameras = args.cameras or frames.cameras
    size = args.image_size or frames.height
    cfg = CollectConfig(task=args.task, episodes=args.episodes, out=args.out, seed=args.seed, noise=args.noise,
                        keep_failures=args.keep_failures, image_size=size, num_envs=args.num_envs,
                        cameras=tuple(cameras), episodes_per_file=args.episodes_per_file, crf=args.crf,
                        num_threads=args.num_threads, task_weights=weights, max_steps=args.max_steps, per_task=args.per_task,
                        suite_settings=settings)
    try:
        cfg.validate()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        info = collect_demos(cfg)
    except (ValueError, RuntimeError) as exc:  # e.g. no expert for a LIBERO suite, or too few episodes kept
        sys.exit(f"error: {exc}")
    source = info["source"]
    print(f"wrote {args.out}: {info['total_episodes']} episodes, {info['total_frames']} frames at {info['fps']} fps, "
          f"{info['total_tasks']} instructions; the expert succeeded in {source['succeeded']} of "
          f"{source['attempted']} episodes")


if __name__ == "__main__":
    main()
