"""A GPU group: the GPUs of one node hosting one rollout and one trainer service that several jobs
share, and the bytes per model parameter that size a job's state on it.

The multiplexer (:mod:`infra.llm.multiplex`) admits jobs to groups and slices their GPUs; the service
plane (:mod:`infra.llm.service_plane`) places the groups on the cluster and sizes their memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.llm.handles import ServiceHandle

BYTES_PER_PARAM_WEIGHTS = 2
"""bf16 weights on the device (what generation needs)."""
BYTES_PER_PARAM_TRAIN_STATE = 16
"""bf16 weights + bf16 grads + fp32 master weights and two Adam moments (mixed-precision Adam)."""


@dataclass
class GPUGroup:
    """GPUs of one node hosting a rollout and a trainer service shared by the admitted jobs."""

    name: str
    node: str
    gpu_memory_mib: int
    """Memory of each GPU of the group."""
    num_gpus: int
    host_memory_mib: int
    """Host memory available for resident job state."""
    rollout: ServiceHandle
    trainer: ServiceHandle
    jobs: list[str] = field(default_factory=list)
    host_used_mib: int = 0
