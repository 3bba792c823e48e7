"""Keep policy tests light on the shared 2-core machine."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
