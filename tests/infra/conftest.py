"""Shared fixtures of the scheduler tests: small clusters and the path of the Alibaba trace."""

import time
from pathlib import Path

import pytest

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
def trace_dir() -> Path:
    if not TRACE_DIR.is_dir():
        pytest.skip(f"trace not found at {TRACE_DIR}")
    return TRACE_DIR


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
