#!/usr/bin/env python
"""Ray's actor-call round trip on this machine, against the fleet's same-node socket channel.

    python scripts/bench_ray_latency.py --json docs/figures/bench/bench_ray_latency.json

A fleet step costs a shard one call to the inference server. This measures, on a local Ray
instance (loopback) and without any model, the round trip of such a call in three situations:

- ``back_to_back``: a caller that does nothing else (Ray's threads stay awake);
- ``after_work``: a caller that first spins ``--work-ms`` on the CPU, as a shard simulating does
  (the threads that carry the call have gone to sleep and must be woken);
- ``batched``: ``--shards`` such callers, each sending ``--envs`` 64x64 RGB observations to one
  asyncio actor that answers once every shard's request is in, as the server batches them;
- ``batched_socket``: the same, over the actor's Unix socket (``vla_rl.fleet.channel``, what
  shards on the server's node use, ``fleet.server.transport=socket``).

Medians over ``--calls`` calls, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
from bench_report import BenchReport, output_path

from vla_rl.fleet.channel import SocketClient, SocketServer


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Echo:
    """Answers at once with an action per observation."""

    def call(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.zeros((len(obs["rgb"]), 7), np.float32)


class Batcher:
    """Answers a call once ``group`` calls wait, as the inference server answers a full batch."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.waiting: list[asyncio.Future] = []
        self.socket = SocketServer(self.call)

    async def socket_path(self) -> str:
        return await self.socket.start()

    async def close_socket(self) -> None:
        self.socket.close()

    async def call(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        if len(self.waiting) == self.group:
            for f in self.waiting:
                f.set_result(np.zeros((len(obs["rgb"]), 7), np.float32))
            self.waiting = []
        return await future


class Caller:
    """Times calls to ``target`` after ``work_s`` of CPU work each."""

    def __init__(self, target: object, socket_path: str = "") -> None:
        self.target = target
        self.client = SocketClient(socket_path) if socket_path else None

    def run(self, calls: int, work_s: float, envs: int) -> float:
        obs = {"rgb": np.random.randint(0, 255, (envs, 64, 64, 3), np.uint8), "proprio": np.zeros((envs, 20), np.float32)}
        times = []
        for ticket in range(calls):
            _spin(work_s)
            start = time.perf_counter()
            if self.client is None:
                ray.get(self.target.call.remote(obs))
            else:
                self.client.send(ticket, obs)
                self.client.receive()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Measure the three round trips, print them, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--work-ms", type=float, default=12.0, help="CPU work before each call (a shard's step)")
    parser.add_argument("--shards", type=int, default=2, help="callers batched together")
    parser.add_argument("--envs", type=int, default=32, help="observations per call (64x64 RGB)")
    parser.add_argument("--json", type=output_path, default=None, help="write machine/config/results as JSON")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.shards < 1 or args.envs < 1 or args.work_ms < 0:
        parser.error("--calls, --shards and --envs must be >= 1 and --work-ms >= 0")

    ray.init(num_cpus=args.shards + 2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             _system_config={"max_direct_call_object_size": 1 << 20})  # as the fleet's local cluster
    report = BenchReport(args.json, vars(args))
    try:
        caller = ray.remote(Caller).remote(ray.remote(Echo).remote())
        ray.get(caller.run.remote(10, 0.0, args.envs))  # warm-up
        report.add("back_to_back_ms", ray.get(caller.run.remote(args.calls, 0.0, args.envs)))
        report.add("after_work_ms", ray.get(caller.run.remote(args.calls, args.work_ms / 1e3, args.envs)))
        batcher = ray.remote(max_concurrency=4 * args.shards)(Batcher).remote(args.shards)
        path = ray.get(batcher.socket_path.remote())
        for key, socket_path in (("batched_ms", ""), ("batched_socket_ms", path)):
            callers = [ray.remote(Caller).remote(batcher, socket_path) for _ in range(args.shards)]
            ray.get([c.run.remote(10, args.work_ms / 1e3, args.envs) for c in callers])
            per_shard = ray.get([c.run.remote(args.calls, args.work_ms / 1e3, args.envs) for c in callers])
            report.add(key, statistics.median(per_shard))
            for c in callers:
                ray.kill(c)
        ray.get(batcher.close_socket.remote())
    finally:
        ray.shutdown()
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
