"""Simulators: the language-conditioned tabletop suite on batched MuJoCo, with in-loop rendering.

Public API: :func:`make_vec_env` / :class:`SimVectorEnv` (gymnasium ``VectorEnv`` + TensorDict
view), :class:`RenderConfig`, the suite registry (:func:`suite_of`: the gantry tasks of :mod:`sims.gantry`,
LIBERO's of :mod:`sims.libero`, registered on import), the gantry task table (:data:`TASK_NAMES`), and the
single-environment gymnasium ids registered by :mod:`sims.single` (``sims/Reach-v0``, ...).

LIBERO's suites (``libero_<suite>[/<i>]`` tasks of :func:`make_vec_env`) live in :mod:`sims.libero`:
its runtime (scene, simulation, controller, predicates, experts, vector env) at the top, and the
toolchain that fills its task cache (installer, export, mesh decimation, bundles) in
:mod:`sims.libero.toolchain`.
"""

import os

# Headless rendering by default: MuJoCo picks its GL backend when it is first imported.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
# Mesa's software rasteriser: no helper threads per context; the renderer's own pool of contexts
# runs in parallel instead (measured fastest for 64x64 tiles, see docs/sims.md).
os.environ.setdefault("LP_NUM_THREADS", "0")
# JAX (the MJX backend) takes GPU memory as it needs it rather than 75 % of it up front, so that
# several simulator shards, the inference server and the trainer share one GPU
# (XLA_PYTHON_CLIENT_MEM_FRACTION caps a process instead). Effective before JAX's first use.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# MJX on the CPU: XLA's concurrency-optimised scheduler deadlocks an executable holding two or more
# MJX steps at 16 or more environments (every thread parked, docs/sims.md); the plain one does not.
if "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()

from sims import gantry as _gantry  # noqa: F401  (registers the gantry suite)
from sims.libero import plugin as _libero  # noqa: F401  (registers the libero suite)
from sims.registry import Suite, register, suite_of, suites
from sims.render import BatchRenderer, RenderConfig
from sims.single import SingleEnv, gym_id, register_all
from sims.tasks import TASK_NAMES, TASKS
from sims.vec_env import (
    REWARDS,
    EnvConfig,
    SharedSettings,
    SimVectorEnv,
    VecEnvConfig,
    make_vec_env,
    shared_settings,
    suite_settings,
)

register_all()

__all__ = ["REWARDS", "TASKS", "TASK_NAMES", "BatchRenderer", "EnvConfig", "RenderConfig", "SharedSettings",
           "SimVectorEnv", "SingleEnv", "Suite", "VecEnvConfig", "gym_id", "make_vec_env", "register", "shared_settings", "suite_of", "suite_settings",
           "suites"]
