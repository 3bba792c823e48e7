"""The synthetic openb trace: the format of the real one, the pod kinds the replay tests need, seeded."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from infra.replay.dynamic import read_timed_pods
from infra.replay.synthetic import write_synthetic_trace
from infra.replay.trace import read_pods
from infra.scheduler.resources import Cluster

ROOT = Path(__file__).resolve().parents[2]
NODE_COLUMNS = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
POD_COLUMNS = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time"]
"""The openb trace's headers (its README); checked against the real files where present."""


def header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def test_same_columns_as_the_openb_trace(tmp_path, trace_dir):
    nodes, pods = write_synthetic_trace(tmp_path, seed=0, num_nodes=40, num_pods=300)
    assert (nodes.name, pods.name) == ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv")
    assert header(nodes) == NODE_COLUMNS and header(pods) == POD_COLUMNS
    # On a checkout with the real trace (or the synthetic one the fixture made), the headers agree.
    assert header(trace_dir / nodes.name) == NODE_COLUMNS and header(trace_dir / pods.name) == POD_COLUMNS


def test_the_pod_kinds_the_replay_tests_need(tmp_path):
    nodes, pod_path = write_synthetic_trace(tmp_path, seed=0)  # the trace_dir fixture's arguments
    cluster = Cluster.from_csv(nodes)
    pods = read_pods(pod_path)
    models = {g.model for n in cluster.nodes for g in n.gpus}
    assert len(cluster.nodes) == 400 and len(pods) == 2000 and len(models) >= 5
    gpu = [p for p in pods if p.num_gpu]
    assert 0.05 < 1 - len(gpu) / len(pods) < 0.25  # CPU-only pods
    assert 0.3 < sum(p.gpu_milli < 1000 for p in gpu) / len(gpu) < 0.6  # GPU sharing
    multi = [p for p in gpu if p.num_gpu > 1]
    assert {p.num_gpu for p in multi} == {2, 4, 8} and all(p.cpu >= 8000 * p.num_gpu for p in multi)
    specs = [p.models for p in gpu if p.models]
    assert 0.02 < len(specs) / len(gpu) < 0.08 and all(s <= models for s in specs)
    assert any(len(s) == 1 for s in specs) and any(len(s) > 1 for s in specs)
    assert not any(p.models for p in pods if not p.num_gpu)
    timed = read_timed_pods(pod_path)
    assert {t.priority for t in timed} == {0, 1, 2, 3} and all(t.runtime >= 1 for t in timed)


def test_seeded_and_the_cli_writes_the_same_bytes(tmp_path):
    a = write_synthetic_trace(tmp_path / "a", seed=3, num_nodes=30, num_pods=200)
    b = write_synthetic_trace(tmp_path / "b", seed=3, num_nodes=30, num_pods=200)
    c = write_synthetic_trace(tmp_path / "c", seed=4, num_nodes=30, num_pods=200)
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))
    assert a[1].read_bytes() != c[1].read_bytes()
    subprocess.run([sys.executable, "-m", "infra.replay.synthetic", "--out", str(tmp_path / "cli"), "--seed", "3",
                    "--nodes", "30", "--pods", "200"], check=True, capture_output=True, cwd=ROOT)
    assert all(x.read_bytes() == (tmp_path / "cli" / x.name).read_bytes() for x in a)


def test_bad_arguments_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="need >= 10 nodes"):
        write_synthetic_trace(tmp_path, num_nodes=3)
    with pytest.raises(ValueError, match="spec_share"):
        write_synthetic_trace(tmp_path, spec_share=1.5)
