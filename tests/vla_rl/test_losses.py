"""PPO's surrogate and value losses, and GRPO's group-relative advantages, on hand examples."""

import pytest
import torch

from vla_rl.grpo import episode_batch, group_advantages
from vla_rl.ppo import surrogate_loss, value_loss


def test_surrogate_clips_the_ratio_in_the_pessimistic_direction():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    adv = torch.tensor([1.0, -1.0])
    loss, stats = surrogate_loss(new, old, adv, clip_coef=0.2)
    # positive advantage: min(1.5, 1.2) * 1 = 1.2; negative: min(-0.5, -0.8) = -0.8 -> mean objective 0.2
    assert loss.item() == pytest.approx(-0.2)
    assert stats["clip_frac"].item() == pytest.approx(1.0)


def test_value_clipping_takes_the_larger_error():
    value, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([2.0])
    assert value_loss(value, old, ret, None).item() == pytest.approx(0.0)
    # clipped prediction 0.5 -> error 1.5^2; max(0, 2.25) / 2
    assert value_loss(value, old, ret, 0.5).item() == pytest.approx(1.125)


def test_group_advantages_normalise_within_each_group():
    returns = torch.tensor([1.0, 3.0, 5.0, 5.0])
    adv = group_advantages(returns, group_size=2, eps=0.0)
    assert torch.allclose(adv[:2], torch.tensor([-1.0, 1.0]))  # mean 2, population std 1
    assert torch.isnan(adv[2:]).all()  # eps=0 with equal returns divides 0 by 0
    adv = group_advantages(returns, group_size=2)
    assert torch.equal(adv[2:], torch.zeros(2))  # no signal from a group whose episodes all scored alike


def test_group_advantages_reject_ragged_groups():
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        group_advantages(torch.zeros(4), group_size=3)


def test_episode_batch_keeps_live_steps_with_their_episode_advantage():
    from tensordict import TensorDict

    alive = torch.tensor([[True, True], [True, False], [False, False]])  # [T=3, N=2]
    batch = TensorDict(
        {"obs": TensorDict({"state": torch.arange(6.0).reshape(3, 2, 1)}, [3, 2]),
         "action": torch.zeros(3, 2, 1), "log_prob": torch.zeros(3, 2), "alive": alive},
        batch_size=[3, 2],
    )
    flat = episode_batch(batch, torch.tensor([0.5, -0.5]))
    assert flat.batch_size == torch.Size([3])
    assert flat["advantage"].tolist() == [0.5, -0.5, 0.5]
    assert flat["obs", "state"].flatten().tolist() == [0.0, 1.0, 2.0]
