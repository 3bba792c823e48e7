"""The co-located hot loop (env.backend=warp, the policy on the env's device) reads the device a fixed
number of times per iteration, however long the rollout: counted on Warp's CPU device, where the same
code path runs with CPU tensors (vla_rl.host_syncs), and the validity checks it defers still fail."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mujoco_warp")

from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.host_syncs import count_host_syncs, host_side
from vla_rl.rollout import END_CHECKS
from vla_rl.trainer import Trainer


def test_the_counter_sees_each_kind_of_read_on_its_device_only():
    x = torch.arange(6.0)
    with count_host_syncs("cpu") as counter:
        bool(x.any()), x.sum().item(), x.tolist(), x.numpy(), x[x > 2], x.nonzero()
        x[x > 4] = 0.0
        x + 1, x[1:3], x.clone()  # no read: stays on the device
        with host_side():
            bool(x.any())  # the host's own copy: not counted
    assert counter.count == 7, counter.sites
    assert any("test_host_syncs.py" in site and "mask assignment" in site for site in counter.sites)
    with count_host_syncs("cuda:0") if torch.cuda.is_available() else count_host_syncs("meta") as other:
        bool(x.any())
    assert other.count == 0  # a tensor on another device


def _syncs_per_iteration(tmp_path, rollout_steps: int, extra: tuple[str, ...] = (), num_envs: int = 4) -> tuple[int, dict]:
    cfg = load_config(CONFIG_DIR / "reach_state_ppo.yaml", [
        f"out_dir={tmp_path}", f"name=t{rollout_steps}", "env.backend=warp", "env.warp_device=cpu", "device=cpu",
        f"env.num_envs={num_envs}", f"ppo.rollout_steps={rollout_steps}",
        f"total_env_steps={3 * num_envs * rollout_steps}",
        "eval.every=0", "log.wandb=disabled", "log.progress=false", "log.video=false", *extra])
    trainer = Trainer(cfg)
    try:
        trainer.step()  # the first iteration builds what is built once
        with count_host_syncs("cpu") as counter:
            trainer.step()
    finally:
        trainer.close()
    return counter.count, dict(counter.sites)


@pytest.mark.parametrize("terminate", [False, True])
def test_colocated_iteration_reads_the_device_a_fixed_number_of_times(tmp_path, terminate):
    # Without the KL early stop (a read per minibatch, a count set by the config, not by the rollout).
    fixed = ("ppo.optim.target_kl=null", "ppo.optim.kl_adaptive_lr=false",
             f"env.terminate_on_success={str(terminate).lower()}")
    short, sites = _syncs_per_iteration(tmp_path, 16, fixed)
    long, long_sites = _syncs_per_iteration(tmp_path, 64, fixed)
    assert long == short, (sites, long_sites)
    # Ending episodes at success: the loop reads which episodes ended to restart them END_CHECKS times per
    # rollout (the env's deferred restarts), not once per control step, and the kept steps' index once.
    # Else the deferred validity checks (one read) and the update's statistics (one read).
    assert short <= (END_CHECKS + 1 if terminate else 0) + 2, sites


@pytest.mark.parametrize("terminate", [False, True])
def test_grpo_iteration_reads_the_device_a_fixed_number_of_times(tmp_path, terminate):
    # GRPO runs each environment's first episode to its end: reach's limit is 50 control steps, lift's 100.
    grpo = ("algo=grpo", "grpo.group_size=2", "total_env_steps=100000", "grpo.optim.target_kl=null", "grpo.optim.kl_adaptive_lr=false",
            f"env.terminate_on_success={str(terminate).lower()}")
    short, sites = _syncs_per_iteration(tmp_path, 4, (*grpo, "env.task=reach", "name=reach"))
    long, long_sites = _syncs_per_iteration(tmp_path, 4, (*grpo, "env.task=lift", "name=lift"))
    # The loop asks "has every episode ended" at most END_CHECKS times per episode limit (7 or 8 at these
    # limits), not per step, and an episode that ends at success restarts nothing (sims' first_episodes):
    # success is not read back per step. Else: the deferred checks, the kept steps' index, the update's statistics.
    assert abs(long - short) <= 1, (sites, long_sites)
    assert short <= END_CHECKS + 3, sites


@pytest.mark.slow  # mujoco_warp compiles a LIBERO scene's kernels once per machine (about 5 minutes, then cached)
@pytest.mark.parametrize(("controller", "terminate"), [("servo", False), ("osc", False), ("servo", True)])
def test_colocated_libero_iteration_reads_the_device_a_fixed_number_of_times(tmp_path, controller, terminate):
    from sims.libero.toolchain.install import ensure_tasks
    from sims.libero.toolchain.region_starts import ensure_region_starts

    ensure_tasks(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)
    libero = ("env.task=libero_spatial/0", f"env.terminate_on_success={str(terminate).lower()}",
              f"env.suite.controller={controller}", "ppo.optim.target_kl=null", "ppo.optim.kl_adaptive_lr=false")
    short, sites = _syncs_per_iteration(tmp_path, 8, libero, num_envs=2)
    long, long_sites = _syncs_per_iteration(tmp_path, 16, libero, num_envs=2)
    assert long == short, (sites, long_sites)
    # Ending episodes at success: END_CHECKS reads of the ended episodes per rollout and the kept steps' index
    # (deferred restarts). Else the deferred checks (every task's overflow flags with the actions') and the
    # update's statistics.
    assert short <= (END_CHECKS + 1 if terminate else 0) + 3, sites


def test_deferred_checks_raise_at_the_end_of_the_block(tmp_path):
    import sims

    env = sims.make_vec_env("reach", 3, seed=1, backend="warp", warp_device="cpu")
    env.reset_td(seed=1)
    bad = torch.zeros(3, 4)
    bad[2, 0] = torch.nan
    with pytest.raises(ValueError, match=r"NaN or inf for environments \[2\] at a step of this block"), \
            env.deferred_checks():
        env.step_td(bad)  # no error yet: read at the end
        stepped = env._steps.copy()
    assert stepped.tolist() == [1, 1, 1]
    env.reset_td(seed=1)
    capacity = env._backend._capacity
    with pytest.raises(RuntimeError, match=r"overflow in worlds \[1\] .*NCONMAX / NJMAX"), env.deferred_checks():
        env._backend._overflow[1] = capacity & -capacity  # one overflow flag of a capacity buffer
        env.step_td(torch.zeros(3, 4))
    env._backend._overflow.zero_()
    with env.deferred_checks():  # a clean block raises nothing
        env.step_td(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"NaN or inf for environments \[2\]"):  # outside: at once
        env.step_td(bad)
    env.close()
