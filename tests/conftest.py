"""Test-wide environment: loopback-only Ray, headless rendering, offline hubs and wandb."""

import os

# Set before Ray, MuJoCo or any hub client is imported by a test module.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
