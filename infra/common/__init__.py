"""Plumbing shared by the scheduler, the LLM jobs and the VLA trainer: typed YAML configs
(``typed_config``), atomic, sealed files (``files``) and a run's output directory (``runlog``).
Imports nothing of the project."""
