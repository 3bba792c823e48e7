"""The cluster scheduler's core: resource model, requests, placement policies, queue, preemption.

Engine-free (no Ray): ``Scheduler`` decides, the service (``infra.service``) and its Ray realisation
(``infra.ray_cluster``) carry the decisions out. The names below are the small, stable surface.
"""

from infra.scheduler.core import Scheduler
from infra.scheduler.events import Event, EventKind
from infra.scheduler.gang_book import GangState
from infra.scheduler.gang_placer import Assignment, Placement
from infra.scheduler.quota import Quota
from infra.scheduler.requests import (
    Bundle,
    DifferentNodes,
    GangRequest,
    PinGPUs,
    RequestError,
    SameGPU,
    SameNode,
)
from infra.scheduler.resources import GPU, Alloc, Cluster, Node

__all__ = [
    "GPU",
    "Alloc",
    "Assignment",
    "Bundle",
    "Cluster",
    "DifferentNodes",
    "Event",
    "EventKind",
    "GangRequest",
    "GangState",
    "Node",
    "PinGPUs",
    "Placement",
    "Quota",
    "RequestError",
    "SameGPU",
    "SameNode",
    "Scheduler",
]
