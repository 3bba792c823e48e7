"""One pool of shared LLM services, as both the running pool and its simulation read it.

:class:`PoolShape` is the one description: how many GPUs the rollout and the trainer service may hold,
how many hosts keep each job's weights, and when an idle GPU goes back to the cluster. The running
pool (:class:`infra.llm.elastic.PoolConfig`, for :class:`~infra.llm.elastic.ElasticPool`) adds what
only Ray needs (router, tenant, lease timeout); the simulation (``infra.llm.sim.service_pool.ServicePool``)
adds what only its cost model needs (node size, KV capacity, start-up time). Both hold a
``PoolShape`` rather than repeating its fields, so a benchmark builds one shape and runs it on both.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.common.typed_config import ConfigError


@dataclass(frozen=True)
class PoolShape:
    """Sizes, job affinity and keep-alive of one pool of rollout and trainer services."""

    rollout_gpus: int
    """GPUs the rollout service may hold at once: one slot process each in the running pool (a slot leases
    at most one GPU), one single-GPU engine instance each in the simulation."""
    trainer_gpus: int
    """GPUs the trainer service may hold at once (the running pool: one slot process each; the simulation:
    cut into gangs of the jobs' GPUs)."""
    rollout_homes: int = 2
    """Rollout hosts whose host memory holds a job's weights; its generate requests go only there (a host:
    a slot of the running pool, a node of ``node_gpus`` GPUs in the simulation)."""
    keep_alive_s: float | None = None
    """Idle seconds before a GPU is handed back to the cluster (an *elastic* pool); None: every GPU is
    kept until the pool closes (the simulation: held from the first arrival to the last job's end)."""

    @property
    def elastic(self) -> bool:
        """GPUs are taken and handed back as calls need them (``keep_alive_s`` set)."""
        return self.keep_alive_s is not None

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field and the fix."""
        for name in ("rollout_gpus", "trainer_gpus", "rollout_homes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"shape.{name}={getattr(self, name)} must be >= 1.")
        if self.keep_alive_s is not None and not self.keep_alive_s >= 0:  # NaN fails too
            raise ConfigError(f"shape.keep_alive_s={self.keep_alive_s} must be >= 0 seconds "
                              "(or None to keep every GPU until the pool closes).")
