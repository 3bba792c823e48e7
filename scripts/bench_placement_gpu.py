#!/usr/bin/env python
"""Pipelined vs co-located placement on one GPU (prepared for one H200; needs CUDA).

    python scripts/bench_placement_gpu.py --json runs/bench_placement_gpu.json
    python scripts/bench_placement_gpu.py --iterations 8 env.num_envs=512 fleet.shards=8

Runs :mod:`scripts.bench_placement` in the ``colocated`` and ``pipelined`` modes with the policy on
the GPU (``device=cuda``), the Ray cluster declared as one node with one GPU of model ``H200`` and
16 CPUs, and more environments per shard than the CPU benchmark, then reports the ratio of their
env-steps/s (``ratio_pipelined_vs_colocated``; RLinf-VLA reports 1.6x and more for its hybrid,
pipelined placement on GPU simulators). Extra ``key=value`` overrides go after these defaults and
win over them.
"""

from __future__ import annotations

import sys

import bench_placement

GPU_OVERRIDES = [
    "device=cuda",
    "torch_threads=4",
    "env.num_envs=256",
    "fleet.shards=4",
    "fleet.stages=2",
    "fleet.cluster.nodes=1",
    "fleet.cluster.gpus=1",
    "fleet.cluster.gpu_model=H200",
    "fleet.cluster.cpus=16",
    "fleet.cluster.memory_mib=65536",
    "fleet.server.threads=4",
]
"""The job on one GPU: policy and inference on CUDA, four shards of 64 environments."""


def main(argv: list[str] | None = None) -> int:
    """Check for CUDA, then run the CPU benchmark's code on the GPU configuration."""
    import torch

    if not torch.cuda.is_available():
        print("error: bench_placement_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
              "on a CPU machine run scripts/bench_placement.py", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = [a for a in argv if "=" not in a or a.startswith("--")]
    overrides = [a for a in argv if a not in flags]
    return bench_placement.main(["--modes", "colocated,pipelined", "--iterations", "6", *flags,
                                 *GPU_OVERRIDES, *overrides])


if __name__ == "__main__":
    sys.exit(main())
