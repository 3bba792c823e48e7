"""The RL math both trainers share (rlcore.losses) on hand examples, a plain loop and a Monte Carlo KL."""

import pytest
import torch

from rlcore.losses import (
    clipped,
    clipped_surrogate,
    group_advantages,
    group_keep_mask,
    grpo_loss,
    kl_k3,
    surrogate_loss,
)


def test_surrogate_clips_the_ratio_in_the_pessimistic_direction():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    adv = torch.tensor([1.0, -1.0])
    loss, stats = surrogate_loss(new, old, adv, clip_coef=0.2)
    # positive advantage: min(1.5, 1.2) * 1 = 1.2; negative: min(-0.5, -0.8) = -0.8 -> mean objective 0.2
    assert loss.item() == pytest.approx(-0.2)
    assert stats["clip_frac"].item() == pytest.approx(1.0)


def test_clipped_surrogate_has_no_gradient_where_the_ratio_is_clipped():
    ratio = torch.tensor([1.5, 1.1, 0.5], requires_grad=True)
    clipped_surrogate(ratio, torch.tensor([1.0, 1.0, -1.0]), 0.2).sum().backward()
    assert ratio.grad.tolist() == [0.0, -1.0, 0.0]  # only the ratio inside [0.8, 1.2] is pushed


def test_clip_higher_clips_the_ratio_asymmetrically():
    ratio = torch.tensor([0.7, 0.85, 1.1, 1.25, 1.35, 0.7, 1.25], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    loss = clipped_surrogate(ratio, adv, 0.2, clip_coef_high=0.28)
    # A > 0: -min(r, clip(r, 0.8, 1.28)); A < 0: max(r, clip(r, 0.8, 1.28))
    assert loss.tolist() == pytest.approx([-0.7, -0.85, -1.1, -1.25, -1.28, 0.8, 1.25])
    loss.sum().backward()
    # 1.25 is inside the higher clip (the symmetric 0.2 would cut it); 1.35 and the negative-advantage 0.7 are cut.
    assert ratio.grad.tolist() == [-1.0, -1.0, -1.0, -1.0, 0.0, 0.0, 1.0]
    symmetric = clipped_surrogate(ratio.detach(), adv, 0.2)
    assert symmetric[3].item() == pytest.approx(-1.2) and symmetric[6].item() == pytest.approx(1.25)
    assert clipped(ratio.detach(), 0.2, 0.28).tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert clipped(ratio.detach(), 0.2).tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_dynamic_sampling_keeps_exactly_the_groups_inside_the_band():
    # Four groups of four: success rates 0, 0.25, 0.75, 1.
    success = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    keep = group_keep_mask(success, 4, 0.1, 0.9)
    assert keep.tolist() == [False] * 4 + [True] * 8 + [False] * 4
    assert group_keep_mask(success, 4, 0.25, 0.75).tolist() == keep.tolist()  # the band's edges are kept
    assert group_keep_mask(success, 4, 0.3, 0.9).tolist() == [False] * 8 + [True] * 4 + [False] * 4
    assert group_keep_mask(success, 4, 0.0, 1.0).all()  # the default band drops nothing
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        group_keep_mask(success, 3, 0.1, 0.9)


def test_group_advantages_normalise_within_each_group():
    returns = torch.tensor([1.0, 3.0, 5.0, 5.0])
    adv = group_advantages(returns, group_size=2, eps=0.0)
    assert torch.allclose(adv[:2], torch.tensor([-1.0, 1.0]))  # mean 2, population std 1
    assert torch.isnan(adv[2:]).all()  # eps=0 with equal returns divides 0 by 0
    adv = group_advantages(returns, group_size=2)
    assert torch.equal(adv[2:], torch.zeros(2))  # no signal from a group whose samples all scored alike


def test_group_advantages_against_loop():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(r, group_size=4)
    for g in range(3):
        row = r[4 * g : 4 * g + 4].tolist()
        mean = sum(row) / 4
        std = (sum((x - mean) ** 2 for x in row) / 4) ** 0.5
        for i in range(4):
            assert adv[4 * g + i].item() == pytest.approx((row[i] - mean) / (std + 1e-6), abs=1e-5)


def test_group_advantages_reject_ragged_groups():
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        group_advantages(torch.zeros(4), group_size=3)
    with pytest.raises(ValueError, match=r"must be \[E\]"):
        group_advantages(torch.zeros(2, 3), group_size=3)


def test_k3_estimates_the_kl_of_two_gaussians():
    # x ~ q = N(0, 1), p = N(mu, 1): KL(q || p) = mu^2 / 2; log r = log p(x) - log q(x)
    mu = 0.5
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    log_r = -0.5 * (x - mu) ** 2 + 0.5 * x**2
    k3 = kl_k3(log_r)
    assert (k3 >= 0).all()  # non-negative for every sample, unlike log(q / p)
    assert k3.mean().item() == pytest.approx(mu**2 / 2, rel=0.02)
    assert kl_k3(torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]


def test_grpo_loss_clips_and_kl_is_zero_at_reference():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5]]))  # ratio 2 on the first token, 1 on the second
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(logp, old, logp, torch.tensor([1.0]), mask, clip_coef=0.2, ref_kl_coef=0.1)
    # Positive advantage: the ratio-2 token is clipped to 1.2; KL is 0 when the reference equals the policy.
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_grpo_loss_is_the_surrogate_over_counted_tokens_plus_the_kl_term():
    g = torch.Generator().manual_seed(1)
    logp, old, ref = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3 for _ in range(3))
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    loss, stats = grpo_loss(logp, old, ref, adv, mask, clip_coef=0.2, ref_kl_coef=0.3)
    tok_adv = adv[:, None].expand(3, 5)
    pg, _ = surrogate_loss(logp[mask], old[mask], tok_adv[mask], clip_coef=0.2)  # the same tokens, flattened
    kl = kl_k3(ref[mask] - logp[mask]).mean()
    assert stats["pg_loss"] == pytest.approx(pg.item(), rel=1e-12)
    assert loss.item() == pytest.approx((pg + 0.3 * kl).item(), rel=1e-12)
