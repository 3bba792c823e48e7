"""Shared fixtures of the scheduler tests: small clusters and the trace the replay tests read.

``trace_dir`` is the Alibaba openb trace in ../shared when present (never copied into the project),
else a synthetic trace in the same format made by ``infra.replay.synthetic`` (a clean clone, CI), so
the replay tests always run; ``real_trace_dir`` is for the tests that compare with the FGD authors'
``expected_*.csv`` and skips without the real trace."""

import time
from pathlib import Path

import pytest

from infra.replay.synthetic import write_synthetic_trace
from infra.scheduler import GPU, Cluster, Node

ROOT = Path(__file__).resolve().parents[2]
TRACE_DIR = ROOT.parent / "shared" / "traces" / "alibaba-openb-2023"


def small_cluster() -> Cluster:
    """Three nodes: two with 4 T4s, one with 2 A10s."""
    return Cluster(
        (
            Node("n0", 32000, 131072, (GPU("T4", 16384),) * 4),
            Node("n1", 32000, 131072, (GPU("T4", 16384),) * 4),
            Node("n2", 16000, 65536, (GPU("A10", 24576),) * 2),
        )
    )


@pytest.fixture
def cluster() -> Cluster:
    return small_cluster()


@pytest.fixture(scope="session")
def real_trace_dir() -> Path:
    """The real openb trace; skips where it is absent."""
    if not TRACE_DIR.is_dir():
        pytest.skip(f"the FGD authors' expected_*.csv need the real trace at {TRACE_DIR}")
    return TRACE_DIR


@pytest.fixture(scope="session")
def trace_dir(tmp_path_factory) -> Path:
    """A directory with ``openb_node_list_gpu_node.csv`` and ``openb_pod_list_default.csv``: the real
    trace where present, else a seeded synthetic one (400 GPU nodes, 2,000 pods)."""
    if TRACE_DIR.is_dir():
        return TRACE_DIR
    out = tmp_path_factory.mktemp("synthetic-openb")
    write_synthetic_trace(out, seed=0)
    return out


def _subsample(cluster: Cluster, nodes: int) -> Cluster:
    return Cluster(cluster.nodes[:: max(1, len(cluster.nodes) // nodes)])


@pytest.fixture(scope="session")
def subsample():
    """``subsample(cluster, n)``: every k-th node, k = len // n (12 for n = 100 on the openb 1,213 nodes),
    so a test's cluster has about the same size on the real and on the synthetic trace."""
    return _subsample


def _eventually(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def eventually():
    """``eventually(condition, timeout_s=60)``: poll ``condition`` until it holds; False after the timeout."""
    return _eventually

