"""Cluster infrastructure, knowing nothing of robots.

- ``infra.scheduler``: the scheduler core (resource model, requests, placement policies, queue);
- ``infra.service``: the scheduler service on Ray (actor, client, CLI, journal);
- ``infra.ray_cluster``: plans realised as Ray placement groups, local multi-node clusters;
- ``infra.replay``: trace replay (allocation, fragmentation, decision latency);
- ``infra.llm``: LLM RLVR jobs as services placed by the scheduler (its simulator in ``infra.llm.sim``);
- ``infra.common``: plumbing every side shares (typed YAML configs, atomic sealed files).
"""
