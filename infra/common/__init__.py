"""Plumbing shared by the scheduler, the LLM jobs and the VLA trainer: typed YAML configs
(``typed_config``), atomic, sealed files (``files``), a run's output directory (``runlog``) and the
one restart policy (``supervisor``).
Imports nothing of the project."""
