"""The anchors' RL options, default off: rollout temperature, critic warm-up that holds the actor, GRPO's
dynamic sampling in a real run and the anchors for its dropped groups, the KL early stop as an option, their config
checks, and the refusal of LIBERO's fixed-state splits."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

import policies
from infra.common.typed_config import ConfigError
from policies import ActionHeadConfig, MLPPolicyConfig
from rlcore.losses import group_keep_mask
from rlcore.update_config import GRPOConfig, OptimConfig
from vla_rl.config import CONFIG_DIR, build_config, load_config
from vla_rl.grpo import GRPO, episode_batch
from vla_rl.ppo import ClippedUpdate, LossWeights
from vla_rl.rollout import Timer
from vla_rl.trainer import Trainer

QUIET = ["log.wandb=disabled", "log.progress=false", "log.video=false"]


def _reach(out_dir, *overrides: str):
    return load_config(CONFIG_DIR / "reach_state_ppo.yaml",
                       [f"out_dir={out_dir}", "name=options", "env.num_envs=4", "eval.every=0", *QUIET, *overrides])


@pytest.mark.parametrize("head", ["gaussian", "binned"])
def test_rollout_temperature_widens_collection_but_not_evaluation(tmp_path, head):
    trainer = Trainer(_reach(tmp_path, "ppo.optim.rollout_temperature=2.0", f"policy.head.kind={head}"))
    policy = trainer.policy
    assert policy.head.temperature == 2.0  # set by the algorithm, for collection and the update alike
    if head == "binned":  # a fresh head's logits are near 0 (uniform bins, which no temperature widens): peak them
        with torch.no_grad():
            policy.head.logits.bias.copy_(torch.randn(policy.head.logits.bias.shape) * 3.0)
    batch = trainer.collector.collect(policy, 8, Timer()).reshape(-1)
    trainer.close()
    cold = copy.deepcopy(policy)
    cold.head.temperature = 1.0
    obs = batch["obs"]
    tempered, untempered = policy.distribution(obs)[0], cold.distribution(obs)[0]
    assert (tempered.entropy() > untempered.entropy() + 0.5).all()
    # The stored log-probabilities are the tempered distribution's: the update's first ratios are 1.
    assert torch.allclose(tempered.log_prob(batch["action"]), batch["log_prob"], atol=1e-5)
    assert not torch.allclose(untempered.log_prob(batch["action"]), batch["log_prob"], atol=1e-2)
    # Evaluation acts on the mode, which the temperature leaves where it was.
    assert torch.equal(policy.act(obs, deterministic=True)["action"], cold.act(obs, deterministic=True)["action"])


def test_the_default_temperature_leaves_the_heads_as_they_were():
    torch.manual_seed(0)
    obs = TensorDict({"state": torch.randn(16, 5)}, batch_size=[16])
    for kind in ("gaussian", "binned"):
        policy = policies.make_policy(MLPPolicyConfig(obs_keys=("state",), head=ActionHeadConfig(kind=kind)),
                                      {"state": (5,)}, action_dim=2)
        before = policy.distribution(obs)[0].entropy()
        ClippedUpdate(policy, OptimConfig(), LossWeights())
        assert policy.head.temperature == 1.0 and torch.equal(policy.distribution(obs)[0].entropy(), before)


def _warmup_batch(policy, n: int = 256) -> TensorDict:
    torch.manual_seed(1)
    obs = TensorDict({"state": torch.randn(n, 5)}, batch_size=[n])
    out = policy.act(obs)
    returns = obs["state"][:, 0] * 3.0 + 1.0  # a value the critic can learn from the state
    return TensorDict({"obs": obs, "action": out["action"], "log_prob": out["log_prob"], "value": out["value"],
                       "advantage": torch.randn(n), "returns": returns}, batch_size=[n])


def test_critic_warmup_holds_the_actor_a_shared_trunk_included_while_the_value_loss_falls():
    torch.manual_seed(0)
    cfg = MLPPolicyConfig(obs_keys=("state",), hidden_sizes=(32,), shared_trunk=True)
    policy = policies.make_policy(cfg, {"state": (5,)}, action_dim=2)
    batch = _warmup_batch(policy)
    actor_before = copy.deepcopy(policy.actor().state_dict())
    value_before = policy.value_head.weight.detach().clone()
    updater = ClippedUpdate(policy, OptimConfig(lr=3e-3, anneal_lr=False, epochs=2), LossWeights())
    losses = [updater.update(batch, critic_only=True)["value_loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    actor_after = policy.actor().state_dict()
    assert all(torch.equal(actor_before[k], actor_after[k]) for k in actor_before)
    assert not torch.equal(policy.value_head.weight, value_before)
    # Without warm-up the same value loss moves the shared trunk: the hold above is what kept it still.
    updater.update(batch)
    assert not torch.equal(actor_before["actor_trunk.0.weight"], policy.actor().state_dict()["actor_trunk.0.weight"])


@pytest.mark.parametrize("early_stop", [True, False])
def test_kl_early_stop_cuts_the_epochs_only_when_asked(early_stop):
    torch.manual_seed(0)
    policy = policies.make_policy(MLPPolicyConfig(obs_keys=("state",), hidden_sizes=(32,)), {"state": (5,)},
                                  action_dim=2)
    batch = _warmup_batch(policy)
    # A KL target far below what one step of this rate moves: the second minibatch (the first after a step; the
    # first one's ratios are all 1) passes 1.5 x target.
    optim = OptimConfig(lr=1e-2, anneal_lr=False, epochs=2, num_minibatches=4, target_kl=1e-6,
                        kl_adaptive_lr=True, kl_early_stop=early_stop)
    updater = ClippedUpdate(policy, optim, LossWeights())
    out = updater.update(batch)
    assert out["minibatch_steps"] == (2 if early_stop else 8) and out["early_stop"] == float(early_stop)
    assert updater.lr_scale == pytest.approx(1 / 1.5)  # the KL still steers the rate either way


GROUP, NUM_ENVS = 4, 16


def _grpo(tmp_path, **grpo):
    return build_config({
        "out_dir": str(tmp_path), "name": "grpo", "algo": "grpo", "seed": 1, "total_env_steps": 10**9,
        "env": {"kind": "sims", "task": "reach", "num_envs": NUM_ENVS, "frames": None, "terminate_on_success": True},
        "grpo": {"group_size": GROUP, "optim": {"epochs": 1, "num_minibatches": 1}, **grpo},
        "policy": {"name": "mlp", "hidden_sizes": [16], "obs_keys": ["proprio", "state"]},
        "eval": {"every": 0}, "log": {"wandb": "disabled", "progress": False, "video": False},
    })


def test_dynamic_sampling_drops_the_groups_outside_the_band_from_a_real_update(tmp_path, scripted_reach):
    trainer = Trainer(_grpo(tmp_path, min_group_success=0.1, max_group_success=0.9,
                            optim={"epochs": 1, "num_minibatches": 1, "clip_coef_high": 0.28,
                                   "rollout_temperature": 1.5}))
    scripted_groups = torch.arange(NUM_ENVS) // GROUP
    leaders = (torch.arange(NUM_ENVS) % GROUP == 0) & (scripted_groups < 2)  # groups 0 and 1: one member reaches
    everyone = scripted_groups == 3  # group 3: all members reach
    scripted_reach(trainer, leaders | everyone)
    seen = []
    collect = trainer.collector.collect_episodes

    def recording(*args, **kwargs):
        batch, returns, success = collect(*args, **kwargs)
        seen.append((batch["alive"].clone(), success.clone()))
        return batch, returns, success

    trainer.collector.collect_episodes = recording
    experience = trainer.algorithm.collect(trainer.collector, trainer.stats, 0, Timer())
    metrics = trainer.algorithm.update(experience.batch)
    trainer.close()
    alive, success = seen[0]
    rates = success.float().reshape(-1, GROUP).mean(1)
    assert rates[3] == 1.0 and rates[0] >= 0.25 and rates[1] >= 0.25  # the script worked
    keep = group_keep_mask(success, GROUP, 0.1, 0.9)
    kept_groups = int(((rates >= 0.1) & (rates <= 0.9)).sum())
    assert 2 <= kept_groups < NUM_ENVS // GROUP  # group 3 (all succeeded) is dropped, groups 0 and 1 kept
    assert experience.metrics == {"grpo/groups_kept": float(kept_groups),
                                  "grpo/groups_dropped": float(NUM_ENVS // GROUP - kept_groups)}
    assert experience.batch.batch_size[0] == int(alive[:, keep].sum())  # exactly the kept groups' steps
    assert experience.env_steps == alive.numel()  # every episode still counts as played
    assert metrics["minibatch_steps"] == 1.0 and "clip_frac" in metrics


def test_dynamic_sampling_that_drops_every_group_takes_no_step(tmp_path):
    trainer = Trainer(_grpo(tmp_path, min_group_success=0.5))  # a random policy on reach: no group half succeeds
    before = copy.deepcopy(trainer.policy.state_dict())
    experience = trainer.algorithm.collect(trainer.collector, trainer.stats, 0, Timer())
    assert experience.metrics["grpo/groups_kept"] == 0.0  # the premise (seed 1: no random group half succeeds)
    metrics = trainer.algorithm.update(experience.batch)
    trainer.close()
    assert experience.batch.batch_size[0] == 0 and metrics["minibatch_steps"] == 0.0
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in before.items())


def test_the_fill_holds_kept_groups_until_enough_then_updates_on_all_of_them(tmp_path, scripted_reach):
    trainer = Trainer(_grpo(tmp_path, min_group_success=0.1, max_group_success=0.9, min_groups_per_update=3))
    leaders = (torch.arange(NUM_ENVS) % GROUP == 0) & (torch.arange(NUM_ENVS) // GROUP < 2)  # groups 0, 1: one reaches
    scripted_reach(trainer, leaders)
    kept_steps = []
    collect = trainer.collector.collect_episodes

    def recording(*args, **kwargs):
        batch, returns, success = collect(*args, **kwargs)
        kept_steps.append(int(batch["alive"][:, group_keep_mask(success, GROUP, 0.1, 0.9)].sum()))
        return batch, returns, success

    trainer.collector.collect_episodes = recording
    before = copy.deepcopy(trainer.policy.state_dict())
    first = trainer.step()
    unchanged = all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in before.items())
    second = trainer.step()
    trainer.close()
    assert first["grpo/groups_kept"] == 2.0 and second["grpo/groups_kept"] >= 1.0  # the premise
    # Two groups are fewer than three: held, no step, the policy that collected them unchanged.
    assert (first["grpo/groups_held"], first["minibatch_steps"], first["samples_per_s"]) == (2.0, 0.0, 0.0)
    assert unchanged
    # Once three or more have gathered, one update over every held step of both collections.
    assert second["grpo/groups_held"] == 0.0 and second["minibatch_steps"] == 1.0
    assert second["samples_per_s"] * second["time/iteration"] == pytest.approx(sum(kept_steps))
    assert any(not torch.equal(v, trainer.policy.state_dict()[k]) for k, v in before.items())


def _episodes(steps: int = 5, envs: int = 8) -> TensorDict:
    """A ``[T, N]`` episode batch whose every step says where it came from (``obs.state[..., 0]`` = env index)."""
    state = torch.arange(envs, dtype=torch.float32)[None, :, None].expand(steps, envs, 5).clone()
    alive = torch.ones(steps, envs, dtype=torch.bool)
    alive[3:, 1] = False  # env 1's episode ended after three steps
    return TensorDict({"obs": {"state": state}, "action": torch.zeros(steps, envs, 2),
                       "log_prob": torch.zeros(steps, envs), "alive": alive}, batch_size=[steps, envs])


def test_anchors_join_the_dropped_groups_steps_with_no_weight_and_draw_the_same_for_a_seed():
    batch, advantage = _episodes(), torch.arange(8, dtype=torch.float32) - 3.5
    keep = torch.tensor([True, True, False, False, True, True, False, False])
    plain = episode_batch(batch, advantage, keep)
    everything = episode_batch(batch, advantage, keep, anchors=1.0, generator=torch.Generator().manual_seed(0))
    assert plain.get("weight", None) is None and len(plain) == 5 + 3 + 5 + 5  # env 1 lived 3 steps
    env = everything["obs", "state"][:, 0].long()
    kept = keep[env]
    assert len(everything) == len(plain) + 4 * 5 and torch.equal(everything["weight"], kept.float())
    assert torch.equal(everything["advantage"][kept], plain["advantage"])
    assert (everything["advantage"][~kept] == 0).all()  # an anchor carries no objective
    halves = [episode_batch(batch, advantage, keep, 0.5, torch.Generator().manual_seed(s)) for s in (3, 3, 4)]
    assert 0 < len(halves[0]) - len(plain) < 20 and torch.equal(halves[0]["obs", "state"], halves[1]["obs", "state"])
    assert not torch.equal(halves[0]["obs", "state"][len(plain):], halves[2]["obs", "state"][len(plain):])


def test_the_fill_with_anchors_skips_a_collection_that_kept_nothing():
    """Held over collections with the fill: one that kept no group (so no anchors, no ``weight``) adds nothing, and
    the release concatenates the others' kept and anchor steps alike."""
    batch, advantage = _episodes(), torch.arange(8, dtype=torch.float32) - 3.5
    keep = torch.tensor([True, True, False, False, False, False, False, False])
    fill = GRPO.__new__(GRPO)  # the fill's own state only: no policy or collector is needed
    fill.cfg, fill.held, fill.held_groups = GRPOConfig(group_size=2, min_groups_per_update=2), [], 0
    first = episode_batch(batch, advantage, keep, 0.5, torch.Generator().manual_seed(0))
    nothing = episode_batch(batch, advantage, torch.zeros(8, dtype=torch.bool))
    assert len(fill._fill(first, 1)) == 0 and len(fill._fill(nothing, 0)) == 0 and fill.held_groups == 1
    released = fill._fill(first, 1)
    assert len(released) == 2 * len(first) and int(released["weight"].sum()) == 2 * (5 + 3)
    assert (fill.held, fill.held_groups) == ([], 0)


def test_anchors_hold_the_dropped_states_where_the_reference_has_them():
    """The same update with and without anchors: the surrogate reads only the kept states (the weighted loss equals
    the loss on those rows alone), and the anchored states stay nearer the reference policy."""
    torch.manual_seed(0)
    policy = policies.make_policy(MLPPolicyConfig(obs_keys=("state",), hidden_sizes=(32,)), {"state": (5,)},
                                  action_dim=2)
    reference = copy.deepcopy(policy)
    kept = _warmup_batch(policy).exclude("value", "returns")
    dropped = kept.clone()
    dropped["obs", "state"] = dropped["obs", "state"] + 2.0  # other states, which no objective speaks of
    dropped["advantage"] = torch.zeros(len(dropped))
    anchored = torch.cat([kept.clone().set("weight", torch.ones(len(kept))),
                          dropped.set("weight", torch.zeros(len(kept)))])
    optim = OptimConfig(lr=1e-2, anneal_lr=False, epochs=4, num_minibatches=1, ref_kl_coef=1.0)
    weights = LossWeights(vf_coef=0.0, norm_adv=False)

    def drift(batch: TensorDict) -> float:  # KL(pi || reference) on the dropped states after the update
        moved = copy.deepcopy(policy)
        ClippedUpdate(moved, optim, weights, reference).update(batch)
        with torch.no_grad():
            return float(moved.distribution(dropped["obs"])[0].kl(reference.distribution(dropped["obs"])[0]).mean())

    free, held = drift(kept), drift(anchored)
    assert held < 0.5 * free, (held, free)

    def first_loss(batch: TensorDict) -> float:  # one step: the ratios are 1, the loss is the objective's mean
        update = ClippedUpdate(copy.deepcopy(policy), OptimConfig(epochs=1, num_minibatches=1), weights)
        return update.update(batch)["policy_loss"]

    assert first_loss(anchored) == pytest.approx(first_loss(kept), abs=1e-6) and first_loss(kept) != 0


def test_anchors_without_a_kl_term_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"anchor_fraction=0\.25 needs optim\.ref_kl_coef > 0"):
        _grpo(tmp_path, anchor_fraction=0.25)


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo=sft", "sft.dataset=x", "sft.optim.rollout_temperature=2"],
     r"^sft\.optim\.rollout_temperature acts in the clipped RL update \(algo=ppo or grpo\); leave it at 1\.0"),
    (["ppo.optim.clip_coef_high=1.5"], r"^ppo\.optim\.clip_coef_high=1\.5 must be in \(0, 1\]$"),
    (["ppo.optim.rollout_temperature=-1"], r"^ppo\.optim\.rollout_temperature=-1\.0 must be in \(0, 10\]$"),
])
def test_the_options_refuse_bad_values_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _reach(tmp_path, *overrides)


def test_an_inverted_success_band_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^grpo\.min_group_success=0\.9 is above max_group_success=0\.1"):
        _grpo(tmp_path, min_group_success=0.9, max_group_success=0.1)


@pytest.mark.parametrize("split", ["fixed", "lan", "paraphrase"])
def test_libero_fixed_state_splits_are_refused_for_evaluation_during_training(tmp_path, split):
    with pytest.raises(ConfigError, match=rf"^eval\.splits holds \['{split}'\]: libero_spatial's test states, "
                                          r"never evaluated during training; remove them"):
        load_config(CONFIG_DIR / "libero.yaml", [f"out_dir={tmp_path}", f"eval.splits=[validation,{split}]"])
    load_config(CONFIG_DIR / "libero.yaml", [f"out_dir={tmp_path}"])  # the shipped config evaluates validation only
