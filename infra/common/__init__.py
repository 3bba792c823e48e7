"""Plumbing shared by the scheduler, the LLM jobs and the VLA trainer: typed YAML configs
(``typed_config``), atomic, sealed files (``files``), a run's output directory (``runlog``), the
one restart policy (``supervisor``) and what every result JSON records of its making (``provenance``).
Imports nothing of the project."""
