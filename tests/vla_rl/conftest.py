"""Small threads for the shared CI machine, and a bounded wait for conditions other processes make true."""

import time

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _eventually(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def eventually():
    """``eventually(condition, timeout_s=60)``: poll ``condition`` until it holds; False after the timeout."""
    return _eventually
