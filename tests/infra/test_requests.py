"""Validation at submission: every bad request gets a clear error, nothing placed, nothing leaked."""

import numpy as np
import pytest

from infra.scheduler import (
    Bundle,
    DifferentNodes,
    GangRequest,
    PinGPUs,
    RequestError,
    SameGPU,
    SameNode,
    Scheduler,
)


def gang(*bundles, **kw):
    return GangRequest(kw.pop("name", "g"), tuple(bundles), **kw)


BAD = [
    (gang(Bundle(64000, 1024)), "largest live node"),
    (gang(Bundle(1000, 1024, gpus=5)), "no live node has that many"),
    (gang(Bundle(1000, 1024, gpus=1, gpu_models=frozenset({"H100"}))), "unknown GPU model"),
    (gang(Bundle(0, 1024)), "must be positive"),
    (gang(Bundle(1000, -5)), "must be positive"),
    (gang(Bundle(1000, 1024, gpus=-1)), "negative GPU amount"),
    (gang(Bundle(1000, 1024, gpus=1, gpu_fraction=500)), "not both"),
    (gang(Bundle(1000, 1024, gpu_fraction=1500)), "whole GPU or more"),
    (gang(Bundle(1000, 1024, gpus=1, gpu_memory_mib=40000)), "GPU memory"),
    (
        gang(Bundle(1000, 1024), Bundle(1000, 1024), constraints=(SameNode((0, 1)), DifferentNodes((0, 1)))),
        "different nodes",
    ),
    (gang(Bundle(1000, 1024), constraints=(SameNode((0, 3)),)), "valid indices"),
    (
        gang(Bundle(1000, 1024, gpus=1), Bundle(1000, 1024, gpus=1), constraints=(SameGPU((0, 1)),)),
        "GPU fractions",
    ),
    (
        gang(
            Bundle(1000, 1024, gpu_fraction=600),
            Bundle(1000, 1024, gpu_fraction=600),
            constraints=(SameGPU((0, 1)),),
        ),
        "more than one whole GPU",
    ),
    (gang(Bundle(1000, 1024, gpus=1), constraints=(PinGPUs(0, "n2", (0, 5)),)), "valid indices"),
    (gang(Bundle(1000, 1024, gpus=2), constraints=(PinGPUs(0, "n0", (1,)),)), "widen the range"),
    (
        gang(
            Bundle(1000, 1024, gpus=1),
            Bundle(1000, 1024, gpus=1),
            constraints=(SameNode((0, 1)), PinGPUs(0, "n0", (0,)), PinGPUs(1, "n1", (0,))),
        ),
        "share a node",
    ),
    (gang(Bundle(1000, 1024), constraints=(SameNode((0,), service="ghost/0"),)), "not placed"),
    (gang(Bundle(1000, 1024), min_bundles=2), "min_bundles"),
    (GangRequest("g", ()), "no bundles"),
]


@pytest.mark.parametrize(("req", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_request_is_refused_with_a_clear_error_and_nothing_placed(cluster, req, message):
    s = Scheduler(cluster, policy="bestfit")
    before = (s.state.cpu_free.copy(), s.state.mem_free.copy(), s.state.gpu_free.copy())
    with pytest.raises(RequestError, match=message):
        s.submit(req)
    assert np.array_equal(before[0], s.state.cpu_free)
    assert np.array_equal(before[1], s.state.mem_free)
    assert np.array_equal(before[2], s.state.gpu_free)
    assert s.placements == {} and s.queue == []


def test_duplicate_gang_name_is_refused(cluster):
    s = Scheduler(cluster)
    s.submit(gang(Bundle(1000, 1024)))
    with pytest.raises(RequestError, match="already in use"):
        s.submit(gang(Bundle(1000, 1024)))
