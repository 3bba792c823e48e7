"""Plumbing shared by the scheduler, the LLM jobs and the VLA trainer: typed YAML configs
(``typed_config``) and atomic, sealed files (``files``). Imports nothing of the project."""
