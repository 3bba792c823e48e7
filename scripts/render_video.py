"""Render a few seconds of a task to a video, for people to look at.

    python scripts/render_video.py --task stack --out runs/videos/stack.mp4
    python scripts/render_video.py --task suite --out suite.gif --envs 4 --policy random

The scripted expert (``sims.experts``) acts by default, so the video shows the task being done;
``--policy random`` shows random actions. With several environments the frames are tiled side by
side. The instruction of each episode is printed as it starts.
"""

from __future__ import annotations

import argparse

import imageio.v2 as imageio
import numpy as np
from bench_report import output_path
from tqdm import tqdm

import sims
from infra.common.files import atomic_path
from sims.experts import ScriptedExpert
from sims.render import RenderConfig
from sims.scene import CAMERAS
from sims.tasks import SPLITS
from sims.vec_env import ACTION_DIM, make_vec_env

CONTROL_FPS = 25  # one frame per control step of 40 ms: real time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=[*sims.TASK_NAMES, "suite"])
    parser.add_argument("--out", required=True, type=output_path, help="a .mp4 or .gif path")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=256, help="frame width and height, pixels")
    parser.add_argument("--camera", default="front", choices=CAMERAS)
    parser.add_argument("--envs", type=int, default=1, help="environments tiled side by side")
    parser.add_argument("--policy", default="expert", choices=["expert", "random"])
    parser.add_argument("--split", default="train", choices=list(SPLITS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.suffix not in (".mp4", ".gif"):
        parser.error(f"--out {args.out}: the file must end in .mp4 or .gif")

    env = make_vec_env(args.task, args.envs, seed=args.seed, split=args.split, num_threads=1,
                       render=RenderConfig(width=args.size, height=args.size, cameras=(args.camera,)))
    expert = ScriptedExpert(env)
    rng = np.random.default_rng(args.seed)
    obs = env.reset_arrays()
    for i in range(args.envs):
        print(f"env {i}: {env.instructions[obs['instruction'][i]]}")
    frames = []
    for _ in tqdm(range(int(args.seconds * CONTROL_FPS)), desc=f"rendering {args.task}"):
        frames.append(np.concatenate(list(obs["rgb"][:, 0].transpose(0, 2, 3, 1)), axis=1))
        if args.policy == "expert":
            action = expert.act(obs)
        else:
            action = rng.uniform(-1, 1, (args.envs, ACTION_DIM)).astype(np.float32)
        out = env.step_arrays(action)
        obs = out["observation"]
        done = out["terminated"] | out["truncated"]
        expert.reset(done)
        for i in np.flatnonzero(done):
            result = "success" if out["success"][i] else "time out"
            print(f"env {i}: {result}; next: {env.instructions[obs['instruction'][i]]}")
    env.close()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out) as tmp:
        if args.out.suffix == ".gif":
            imageio.mimsave(tmp, frames, duration=1000 / CONTROL_FPS, loop=0)
        else:
            imageio.mimsave(tmp, frames, fps=CONTROL_FPS, macro_block_size=1)
    print(f"wrote {args.out} ({len(frames)} frames)")


if __name__ == "__main__":
    main()
