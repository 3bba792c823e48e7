"""Action heads (binned round trip, chunked log-probs) and the running normaliser (against numpy)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import BinnedHead, GaussianHead, RunningNorm
from policies.heads import BinnedActions, GaussianActions


@pytest.mark.parametrize("bins", [2, 5, 21, 256])
def test_binned_actions_round_trip_bins(bins: int) -> None:
    head = BinnedHead(8, action_dim=3, chunk=2, bins=bins)
    dist = head(torch.randn(4, 8))
    index = torch.randint(0, bins, (4, 2, 3))
    action = dist.to_action(index)
    assert action.min() >= -1 and action.max() <= 1
    assert torch.equal(dist.to_index(action), index)
    assert torch.equal(dist.to_action(torch.tensor([0, bins - 1])), torch.tensor([-1.0, 1.0]))
    # Any action maps to its nearest bin centre.
    continuous = torch.rand(4, 2, 3) * 2 - 1
    nearest = (continuous.unsqueeze(-1) - dist.to_action(torch.arange(bins))).abs().argmin(-1)
    assert torch.equal(dist.to_index(continuous), nearest)


def test_binned_log_prob_is_sum_of_per_dimension_categoricals() -> None:
    logits = torch.randn(5, 2, 3, 7)
    dist = BinnedActions(logits)
    action = dist.sample()
    assert action.shape == (5, 2, 3)
    per_dim = torch.log_softmax(logits, -1).gather(-1, dist.to_index(action).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(dist.log_prob(action), per_dim.sum((1, 2)), atol=1e-5)
    assert torch.allclose(dist.mode(), dist.to_action(logits.argmax(-1)))


def test_gaussian_chunk_log_prob_sums_over_chunk_and_dims() -> None:
    head = GaussianHead(8, action_dim=2, chunk=3, init_log_std=-1.0)
    dist = head(torch.randn(4, 8))
    action = dist.sample()
    assert action.shape == (4, 3, 2) and head.log_std.shape == (3, 2)
    normal = torch.distributions.Normal(dist.mode(), torch.exp(torch.tensor(-1.0)))
    assert torch.allclose(dist.log_prob(action), normal.log_prob(action).sum((1, 2)), atol=1e-5)


def test_closed_form_kl_matches_torch_and_stays_finite_far_from_the_reference() -> None:
    mean, ref_mean = torch.randn(6, 3, 2), torch.randn(6, 3, 2)
    log_std, ref_log_std = 0.3 * torch.randn(3, 2), 0.3 * torch.randn(3, 2)
    got = GaussianActions(mean, log_std).kl(GaussianActions(ref_mean, ref_log_std))
    normal = torch.distributions.Normal
    want = torch.distributions.kl_divergence(normal(mean, log_std.exp().expand_as(mean)),
                                             normal(ref_mean, ref_log_std.exp().expand_as(mean))).sum((1, 2))
    assert torch.allclose(got, want, atol=1e-5)
    logits, ref_logits = torch.randn(6, 3, 2, 9), torch.randn(6, 3, 2, 9)
    got = BinnedActions(logits).kl(BinnedActions(ref_logits))
    categorical = torch.distributions.Categorical
    want = torch.distributions.kl_divergence(categorical(logits=logits), categorical(logits=ref_logits)).sum((1, 2))
    assert torch.allclose(got, want, atol=1e-5)
    # A mean 40 reference stds away over 8 dims: the sampled "k3" estimate overflows, the closed form is 6,400.
    log_02 = torch.full((8,), math.log(0.2))
    far = GaussianActions(torch.full((1, 8), 8.0), log_02).kl(GaussianActions(torch.zeros(1, 8), log_02))
    k3_log_ratio = 8 * 0.5 * 40.0**2
    assert torch.isinf(torch.exp(torch.tensor(k3_log_ratio))) and torch.allclose(far, torch.tensor([6400.0]), rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    scale=st.floats(0.01, 100.0),
    offset=st.floats(-1000.0, 1000.0),
)
def test_running_norm_matches_numpy_over_batches(sizes: list[int], scale: float, offset: float) -> None:
    rng = np.random.default_rng(len(sizes))
    batches = [offset + scale * rng.standard_normal((n, 3)) for n in sizes]
    norm = RunningNorm(3)
    for b in batches:
        norm.update(torch.from_numpy(b).float())
    data = np.concatenate([b.astype(np.float32) for b in batches]).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-9, atol=1e-9 * abs(offset) + 1e-12)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-6, atol=1e-9)
    assert norm.count.item() == len(data)


def test_running_norm_state_dict_round_trip_and_clip() -> None:
    norm = RunningNorm((2, 2), clip=3.0)
    norm.update(torch.randn(100, 2, 2) * 4 + 1)
    norm.update(torch.randn(7, 2, 2))
    restored = RunningNorm((2, 2), clip=3.0)
    restored.load_state_dict(norm.state_dict())
    assert set(norm.state_dict()) == {"mean", "var", "count"}
    x = torch.randn(9, 2, 2) * 50
    assert torch.equal(restored(x), norm(x))
    assert norm(x).abs().max() <= 3.0
    with pytest.raises(ValueError, match="feature shape"):
        norm.update(torch.randn(4, 3))
