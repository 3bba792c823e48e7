"""MJX backend: same task code, same episodes; agrees with mujoco.batch over a short horizon.

One module-scoped MJX environment keeps the (slow) XLA compilation to a single one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# Halves MJX's XLA compile time on the CPU (effective if no test initialised XLA before); the six
# steps run here do not care about the slower code. Appended: ``import sims`` sets a flag of its own.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

from sims.vec_env import ACTION_DIM, make_vec_env  # noqa: E402

pytest.importorskip("jax")

# 16 environments: with XLA's concurrency-optimised CPU scheduler (off since sims/__init__.py turns
# it off) an MJX step of 16 or more environments never finished here.
NUM_ENVS, STEPS = 16, 6
# Tolerances over 6 control steps (48 substeps): MJX and MuJoCo C solve contacts with different
# code (and float32 vs float64 on some paths); the gantry is contact-free while it moves in the air.
ARM_TOL_M = 1e-4
OBJECT_TOL_M = 1e-3


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (STEPS, NUM_ENVS, ACTION_DIM)).astype(np.float32)
    out = {}
    for backend in ("batch", "mjx"):
        env = make_vec_env("suite", NUM_ENVS, seed=9, backend=backend, num_threads=1)
        trace = [env.reset_arrays()]
        for a in actions:
            step = env.step_arrays(a)
            trace.append({**step["observation"], "reward": step["reward"]})
        # One more step at the episodes' step limits: every environment truncates and autoresets.
        env._steps[:] = env._max_steps[env._task] - 1
        last = env.step_arrays(actions[0])
        trace.append({**last["observation"], "reward": last["reward"], "truncated": last["truncated"]})
        out[backend] = trace
    return out


def test_backends_start_identically(runs) -> None:
    for key in ("instruction", "task"):
        np.testing.assert_array_equal(runs["batch"][0][key], runs["mjx"][0][key])
    for key in ("proprio", "state"):  # JAX computes in float32
        np.testing.assert_allclose(runs["batch"][0][key], runs["mjx"][0][key], atol=1e-6)


def test_backends_autoreset_alike(runs) -> None:
    ref, got = runs["batch"][-1], runs["mjx"][-1]
    assert ref["truncated"].all() and got["truncated"].all()
    for key in ("instruction", "task"):
        np.testing.assert_array_equal(got[key], ref[key])
    np.testing.assert_allclose(got["state"], ref["state"], atol=1e-6)


def test_backends_agree_over_short_horizon(runs) -> None:
    for t, (ref, got) in enumerate(zip(runs["batch"][:-1], runs["mjx"][:-1])):
        np.testing.assert_allclose(got["proprio"][:, :3], ref["proprio"][:, :3], atol=ARM_TOL_M,
                                   err_msg=f"arm position, step {t}")
        np.testing.assert_allclose(got["state"][:, 9:], ref["state"][:, 9:], atol=OBJECT_TOL_M,
                                   err_msg=f"entity positions, step {t}")
        if t:
            np.testing.assert_allclose(got["reward"], ref["reward"], atol=1e-3, err_msg=f"reward, step {t}")
