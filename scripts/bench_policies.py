"""Parameter counts and forward / forward+backward times of the policies on this machine.

Run: ``python scripts/bench_policies.py [--batch 256] [--threads 2] [--json PATH]``.

"forward" is ``act`` (sampling, no gradient), as in a rollout; "forward+backward" is
``evaluate`` plus a PPO-shaped loss and ``backward``, as in one minibatch of an update
(the optimiser step is not included). Times are medians over ``--repeats`` calls after warm-up,
both wall-clock (``*_ms``) and process CPU time (``*_cpu_ms``, all threads together). On a shared
machine the CPU time is the steadier figure: with ``--threads 1`` it is what the call takes on an
idle core, whatever else runs beside it.
The language encoder is replaced by a random stand-in here: MiniLM never runs per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_report import output_path, write_report
from tensordict import TensorDict

from policies.base import ActorCritic
from policies.encoders import SentenceCache
from policies.heads import ActionHeadConfig
from policies.mlp import MLPActorCritic, MLPPolicyConfig
from policies.vla import VLAConfig, VLAPolicy

INSTRUCTIONS = [f"instruction {i}" for i in range(16)]


def _random_sentences() -> SentenceCache:
    return SentenceCache(lambda strings: F.normalize(torch.randn(len(strings), 384), dim=-1))


def _vla_obs(n: int, cameras: int, size: int) -> TensorDict:
    return TensorDict(
        {
            "rgb": torch.randint(0, 256, (n, cameras, 3, size, size), dtype=torch.uint8),
            "proprio": torch.randn(n, 18),
            "instruction": torch.randint(0, len(INSTRUCTIONS), (n,)),
        },
        batch_size=[n],
    )


def cases(batch: int) -> dict[str, tuple[ActorCritic, TensorDict]]:
    """The benchmarked policies (name -> policy, observation batch)."""
    out: dict[str, tuple[ActorCritic, TensorDict]] = {}
    state = TensorDict({"state": torch.randn(batch, 17)}, batch_size=[batch])
    out["mlp 64x64 (HalfCheetah, 17 -> 6)"] = (MLPActorCritic(MLPPolicyConfig(), state, 6), state)
    for label, cameras, head in [
        ("vla 1 cam 64x64, gaussian", 1, ActionHeadConfig()),
        ("vla 2 cams 64x64, gaussian", 2, ActionHeadConfig()),
        ("vla 1 cam 64x64, binned 256 x chunk 4", 1, ActionHeadConfig(kind="binned", bins=256, chunk=4)),
    ]:
        obs = _vla_obs(batch, cameras, 64)
        policy = VLAPolicy(VLAConfig(head=head), obs, 7, sentences=_random_sentences())
        policy.set_instructions(INSTRUCTIONS)
        out[label] = (policy, obs)
    return out


def _median_ms(fn: Callable[[], None], repeats: int) -> tuple[float, float]:
    """Median wall-clock and process-CPU milliseconds of ``fn`` over ``repeats`` calls."""
    for _ in range(3):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000.0 * statistics.median(wall), 1000.0 * statistics.median(cpu)


def measure(policy: ActorCritic, obs: TensorDict, repeats: int) -> dict[str, float]:
    """Parameter count and median wall/CPU times (ms) of ``act`` and of ``evaluate`` + ``backward``."""
    action = policy.act(obs)["action"]

    def update() -> None:
        log_prob, entropy, value = policy.evaluate_actions(obs, action)
        (-log_prob.mean() - 0.01 * entropy.mean() + 0.5 * value.square().mean()).backward()
        policy.zero_grad(set_to_none=True)

    act_ms, act_cpu_ms = _median_ms(lambda: policy.act(obs), repeats)
    update_ms, update_cpu_ms = _median_ms(update, repeats)
    return {
        "params": sum(p.numel() for p in policy.parameters()),
        "act_ms": act_ms,
        "act_cpu_ms": act_cpu_ms,
        "forward_backward_ms": update_ms,
        "forward_backward_cpu_ms": update_cpu_ms,
    }


def parameter_breakdown(policy: ActorCritic) -> dict[str, int]:
    """Parameters per top-level submodule (and loose parameters such as ``head.log_std``)."""
    return {name: sum(p.numel() for p in child.parameters()) for name, child in policy.named_children()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="observations per call")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per figure")
    parser.add_argument("--json", type=output_path, default=None, help="write the figures to this JSON file")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    breakdown: dict[str, dict[str, int]] = {}
    print(f"batch {args.batch}, {args.threads} torch thread(s), median of {args.repeats} calls")
    config = {"batch": args.batch, "repeats": args.repeats, "threads": args.threads}
    for label, (policy, obs) in cases(args.batch).items():
        results[label] = measure(policy, obs, args.repeats)
        breakdown[label] = parameter_breakdown(policy)
        r = results[label]
        print(
            f"{label:40s} params {r['params']:>9,d}  act {r['act_ms']:6.1f} ms (cpu {r['act_cpu_ms']:6.1f})  "
            f"forward+backward {r['forward_backward_ms']:6.1f} ms (cpu {r['forward_backward_cpu_ms']:6.1f})",
            flush=True,
        )
        if args.json:  # after each policy: a failure later keeps the rows before it
            write_report(args.json, config, {"per_policy": results, "params_by_module": breakdown})


if __name__ == "__main__":
    main()
