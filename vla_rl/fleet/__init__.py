"""The training job on a Ray fleet: simulator shards, a batching inference server and the trainer,
placed by ``infra``'s scheduler in co-located, disaggregated or pipelined mode (see docs/fleet.md).

Importing this package starts nothing and needs no Ray; :func:`run_fleet_job` does.
"""

from __future__ import annotations

from typing import Any

from vla_rl.fleet.checks import validate_fleet
from vla_rl.fleet.section import FleetConfig, resolved_placement


def run_fleet_job(cfg: Any, resume: bool = False) -> dict[str, Any]:
    """Run the training job ``cfg`` on Ray as ``cfg.fleet`` says; returns the trainer's summary.

    See :func:`vla_rl.fleet.job.run_fleet_job`.
    """
    from vla_rl.fleet.job import run_fleet_job as _run

    return _run(cfg, resume=resume)


__all__ = ["FleetConfig", "resolved_placement", "run_fleet_job", "validate_fleet"]
