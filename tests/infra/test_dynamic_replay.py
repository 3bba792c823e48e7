"""The dynamic replay: the trace's arrivals and departures through Scheduler.submit/release
(on the real openb trace where present, else on the synthetic one: ``trace_dir`` in conftest)."""

import csv
import dataclasses
from collections import Counter

import numpy as np

from infra.replay.dynamic import read_timed_pods, replay_dynamic
from infra.scheduler.resources import Cluster


def _small(trace_dir, speedup):
    """About 30 GPU nodes (every 40th of openb's) and 1,000 pods (every 8th of openb's)."""
    cluster = Cluster.from_csv(trace_dir / "openb_node_list_gpu_node.csv")
    cluster = Cluster(cluster.nodes[:: len(cluster.nodes) // 30])
    pods = read_timed_pods(trace_dir / "openb_pod_list_default.csv", speedup)
    return cluster, pods[:: max(1, len(pods) // 1000)]


def test_every_pod_is_accounted_for_and_allocation_stays_within_capacity(trace_dir):
    cluster, pods = _small(trace_dir, speedup=20000.0)
    r = replay_dynamic(cluster, pods, seed=42)
    placed = sum(d.size for d in r.delays_s.values())
    assert placed + r.invalid + r.timed_out + r.never_ran == len(pods)
    assert (r.alloc_pct >= 0).all() and (r.alloc_pct <= 100.0 + 1e-9).all() and r.alloc_pct.max() > 50
    assert all((d >= 0).all() for d in r.delays_s.values())
    assert any((d > 0).any() for d in r.delays_s.values()), "an overloaded cluster must queue some pods"
    assert r.preemptions > 0, "high QoS classes preempt best-effort pods when the cluster is full"
    again = replay_dynamic(cluster, pods, seed=42)
    assert np.array_equal(again.alloc_pct, r.alloc_pct) and again.preemptions == r.preemptions


def test_a_timeout_fails_pods_that_wait_too_long(trace_dir):
    cluster, pods = _small(trace_dir, speedup=20000.0)
    r = replay_dynamic(cluster, pods, seed=42, timeout_s=1.0)
    assert r.timed_out > 0
    summary = r.summary()
    assert summary["timed_out"] == r.timed_out and "class0_delay_p99_s" in summary


def test_priorities_come_from_the_qos_classes(trace_dir):
    pods = read_timed_pods(trace_dir / "openb_pod_list_default.csv")
    by_class = Counter(t.priority for t in pods)
    qos = Counter(r["qos"] for r in csv.DictReader((trace_dir / "openb_pod_list_default.csv").open()))
    # openb: {0: 3398, 1: 100, 2: 4647, 3: 7}
    assert by_class == {0: qos["BE"], 1: qos["Burstable"], 2: qos["LS"], 3: qos["Guaranteed"]}
    assert all(by_class[c] > 0 for c in range(4)), "every QoS class must occur for the test to check it"
    assert all(t.runtime >= 1 for t in pods) and pods == sorted(pods, key=lambda t: (t.arrival, t.pod.name))
    fast = read_timed_pods(trace_dir / "openb_pod_list_default.csv", 10.0)
    span = lambda ps: ps[-1].arrival - ps[0].arrival  # noqa: E731
    assert abs(span(fast) * 10 - span(pods)) < 1e-3 * span(pods)
    assert [dataclasses.replace(t, arrival=0) for t in fast[:5]] == [dataclasses.replace(t, arrival=0) for t in pods[:5]]
