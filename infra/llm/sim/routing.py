"""Request routing across rollout instances: a discrete-event simulation of the routers of
:mod:`infra.llm.router` over engines with continuous batching and chunked prefill."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from infra.llm.router import EngineCost, InstanceLoad, Router


@dataclass(frozen=True)
class RouterWorkload:
    """Requests to a pool of rollout instances (Poisson arrivals)."""

    requests: int = 4000
    rate_per_s: float = 40.0
    short_prompt_median: float = 300.0
    long_prompt_median: float = 6000.0
    long_fraction: float = 0.15
    """Share of requests with a long prompt (multi-turn agent contexts)."""
    out_median: float = 400.0
    out_sigma: float = 1.0
    out_cap: int = 8192


class RouteEvent(IntEnum):
    """Events of :func:`simulate_routing`; at equal times an arrival comes before a step's end."""

    ARRIVAL = 0
    STEP_END = 1


class _Engines:
    """The instances' queues (requests still prefilling) and running requests (decoding)."""

    def __init__(self, instances: int, cost: EngineCost, events: list[tuple[float, RouteEvent, int]]) -> None:
        self.cost, self.events = cost, events
        self.queue: list[list[list[int]]] = [[] for _ in range(instances)]  # [request, prompt tokens left]
        self.running: list[dict[int, int]] = [{} for _ in range(instances)]  # request -> tokens left
        self.step_end = [np.inf] * instances
        self.step_plan: list[tuple[list[tuple[int, int]], list[int]]] = [([], [])] * instances

    def load(self, k: int) -> InstanceLoad:
        """What the router sees of instance ``k``."""
        q = self.queue[k]
        return InstanceLoad(
            len(q) + len(self.running[k]), int(sum(item[1] for item in q)), len(self.running[k])
        )

    def start_step(self, k: int, t: float) -> None:
        """Plan instance ``k``'s next step: up to ``chunk_tokens`` of queued prefill plus one token of each running request."""
        budget, plan = self.cost.chunk_tokens, []
        for item in self.queue[k]:
            if budget == 0:
                break
            take = min(budget, item[1])
            plan.append((item[0], take))
            budget -= take
        decoding = list(self.running[k])
        if not plan and not decoding:
            self.step_end[k] = np.inf
            return
        self.step_plan[k] = (plan, decoding)
        self.step_end[k] = t + self.cost.step_time(self.cost.chunk_tokens - budget, len(decoding))
        heapq.heappush(self.events, (self.step_end[k], RouteEvent.STEP_END, k))


def simulate_routing(
    router: Router, instances: int, wl: RouterWorkload, cost: EngineCost, seed: int
) -> dict[str, float]:
    """Route ``wl`` over ``instances`` engines with continuous batching and chunked prefill (see
    :mod:`infra.llm.router`); returns TTFT percentiles and mean end-to-end latency."""
    rng = np.random.default_rng(seed)
    n = wl.requests
    arrivals = np.cumsum(rng.exponential(1.0 / wl.rate_per_s, n))
    long = rng.random(n) < wl.long_fraction
    prompt = np.where(long, wl.long_prompt_median, wl.short_prompt_median) * np.exp(
        0.5 * rng.standard_normal(n)
    )
    prompt = np.maximum(1, prompt).astype(np.int64)
    out = np.clip(wl.out_median * np.exp(wl.out_sigma * rng.standard_normal(n)), 1, wl.out_cap).astype(
        np.int64
    )
    ttft = np.zeros(n)
    finish = np.zeros(n)
    events = [
        (float(arrivals[i]), RouteEvent.ARRIVAL, i) for i in range(n)
    ]  # (time, kind, request or instance)
    heapq.heapify(events)
    eng = _Engines(instances, cost, events)
    while events:
        t, kind, i = heapq.heappop(events)
        if kind is RouteEvent.ARRIVAL:
            k = router.choose(int(prompt[i]), [eng.load(j) for j in range(instances)])
            eng.queue[k].append([i, int(prompt[i])])
            if eng.step_end[k] == np.inf:
                eng.start_step(k, t)
            continue
        k = i
        plan, decoding = eng.step_plan[k]
        for r in decoding:
            eng.running[k][r] -= 1
            if eng.running[k][r] == 0:
                del eng.running[k][r]
                finish[r] = t
        for r, take in plan:
            item = next(q for q in eng.queue[k] if q[0] == r)
            item[1] -= take
            if item[1] == 0:
                eng.queue[k].remove(item)
                ttft[r] = t - arrivals[r]  # the prefill step emits the first token
                if out[r] > 1:
                    eng.running[k][r] = int(out[r]) - 1
                else:
                    finish[r] = t
        eng.start_step(k, t)
    return {
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_mean_s": float(ttft.mean()),
        "e2e_mean_s": float((finish - arrivals).mean()),
    }
