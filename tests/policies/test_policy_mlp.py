"""State MLP actor-critic: shapes, act/evaluate consistency, registry errors, normalisation wiring."""

import pytest
import torch
from tensordict import TensorDict

import policies
from policies import ActionHeadConfig, MLPActorCritic, MLPPolicyConfig


def _obs(n: int = 8, s: int = 5, p: int = 3) -> TensorDict:
    return TensorDict({"state": torch.randn(n, s), "proprio": torch.randn(n, p)}, batch_size=[n])


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("head", "chunk"), [("gaussian", 1), ("gaussian", 4), ("binned", 1), ("binned", 3)])
def test_shapes_and_act_evaluate_agree(shared: bool, head: str, chunk: int) -> None:
    torch.manual_seed(0)
    cfg = MLPPolicyConfig(
        obs_keys=("proprio", "state"), shared_trunk=shared, head=ActionHeadConfig(kind=head, chunk=chunk)
    )
    policy = policies.make_policy(cfg, {"state": (5,), "proprio": (3,)}, action_dim=2)
    obs = _obs()
    out = policy.act(obs)
    expected = (8, 2) if chunk == 1 else (8, chunk, 2)
    assert out["action"].shape == expected
    assert out["log_prob"].shape == out["value"].shape == (8,)
    log_prob, entropy, value = policy.evaluate_actions(obs, out["action"])
    assert torch.allclose(log_prob, out["log_prob"], atol=1e-5)
    assert torch.allclose(value, out["value"], atol=1e-6)
    assert torch.allclose(policy.value(obs), value, atol=1e-6)
    assert entropy.shape == (8,) and torch.isfinite(entropy).all()
    (-log_prob.mean() - entropy.mean() + value.square().mean()).backward()
    assert all(p.grad is not None for p in policy.parameters())


def test_gaussian_log_prob_matches_closed_form() -> None:
    policy = policies.load("mlp", {"state": (4,)}, 3, head=ActionHeadConfig(init_log_std=-0.5))
    obs = TensorDict({"state": torch.randn(6, 4)}, batch_size=[6])
    action = torch.randn(6, 3)
    log_prob, entropy, _ = policy.evaluate_actions(obs, action)
    mean = policy.act(obs, deterministic=True)["action"]
    std = torch.exp(torch.tensor(-0.5))
    manual = (
        -0.5 * ((action - mean) / std) ** 2 - torch.log(std) - 0.5 * torch.log(torch.tensor(2 * torch.pi))
    ).sum(-1)
    assert torch.allclose(log_prob, manual, atol=1e-5)
    assert torch.allclose(
        entropy, torch.full((6,), 3 * (0.5 + 0.5 * torch.log(torch.tensor(2 * torch.pi)).item() - 0.5))
    )


def test_update_normalization_changes_inputs_not_forward() -> None:
    policy = policies.load("mlp", {"state": (5,)}, 2)
    obs = TensorDict({"state": 3.0 + 2.0 * torch.randn(512, 5)}, batch_size=[512])
    before = policy.value(obs)
    assert torch.equal(policy.value(obs), before)  # forward never moves the statistics
    policy.update_normalization(obs)
    assert torch.allclose(policy.normalizer.mean.float(), obs["state"].mean(0), atol=1e-4)
    assert not torch.allclose(policy.value(obs), before)
    clone = policies.load("mlp", {"state": (5,)}, 2)
    clone.load_state_dict(policy.state_dict())
    assert torch.equal(clone.value(obs), policy.value(obs))


def test_registry_and_input_errors() -> None:
    with pytest.raises(ValueError, match=r"valid choices: .*mlp"):
        policies.load("nope", {"state": (4,)}, 2)
    with pytest.raises(ValueError, match="valid fields"):
        policies.load("mlp", {"state": (4,)}, 2, hidden=(3,))
    with pytest.raises(KeyError, match="observation spec lacks"):
        policies.load("mlp", {"observation": (4,)}, 2)
    with pytest.raises(ValueError, match="valid choices: tanh"):
        policies.load("mlp", {"state": (4,)}, 2, activation="swishy")
    with pytest.raises(ValueError, match="valid choices: gaussian, binned"):
        policies.load("mlp", {"state": (4,)}, 2, head=ActionHeadConfig(kind="beta"))
    with pytest.raises(TypeError, match="MLPPolicyConfig"):
        policies.make_policy(object(), {"state": (4,)}, 2)
    policy = MLPActorCritic(MLPPolicyConfig(), {"state": (4,)}, 2)
    obs = TensorDict({"state": torch.randn(3, 4)}, batch_size=[3])
    with pytest.raises(ValueError, match=r"expected \(3, 2\)"):
        policy.evaluate_actions(obs, torch.zeros(3, 5))
    with pytest.raises(KeyError, match="has no key 'state'"):
        policy.act(TensorDict({"proprio": torch.randn(3, 4)}, batch_size=[3]))
