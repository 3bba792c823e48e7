"""PPO's value loss and GRPO's episode batch on hand examples (the shared policy-gradient math is
tested in tests/rlcore)."""

import pytest
import torch

from vla_rl.grpo import episode_batch
from vla_rl.ppo import value_loss


def test_value_clipping_takes_the_larger_error():
    value, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([2.0])
    assert value_loss(value, old, ret, None).item() == pytest.approx(0.0)
    # clipped prediction 0.5 -> error 1.5^2; max(0, 2.25) / 2
    assert value_loss(value, old, ret, 0.5).item() == pytest.approx(1.125)


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
