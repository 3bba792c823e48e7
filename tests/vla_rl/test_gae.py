"""GAE against a hand-computed example and against a plain per-environment loop."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_rl.ppo import compute_gae


def _col(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype)[:, None]


def test_terminal_episode_matches_hand_computation():
    # gamma = lam = 0.5; the episode terminates at t=2 (no bootstrap).
    # delta = [1 + .5*1 - .5, 2 + .5*1.5 - 1, 3 - 1.5] = [1, 1.75, 1.5]
    # A2 = 1.5; A1 = 1.75 + .25*1.5 = 2.125; A0 = 1 + .25*2.125 = 1.53125
    adv, ret = compute_gae(
        _col(1.0, 2.0, 3.0), _col(0.5, 1.0, 1.5), _col(1.0, 1.5, 2.0),
        _col(False, False, True, dtype=torch.bool), _col(False, False, True, dtype=torch.bool), 0.5, 0.5,
    )
    assert torch.allclose(adv[:, 0], torch.tensor([1.53125, 2.125, 1.5]))
    assert torch.allclose(ret[:, 0], torch.tensor([2.03125, 3.125, 3.0]))


def test_truncation_bootstraps_from_final_observation_value():
    # Truncated at t=1 with V(final obs) = 4: delta1 = 2 + .5*4 - 1 = 3 and the recursion restarts.
    # delta = [1, 3, 3 + .5*2 - 1.5 = 2.5]; A = [1 + .25*3, 3, 2.5]
    adv, _ = compute_gae(
        _col(1.0, 2.0, 3.0), _col(0.5, 1.0, 1.5), _col(1.0, 4.0, 2.0),
        _col(False, False, False, dtype=torch.bool), _col(False, True, False, dtype=torch.bool), 0.5, 0.5,
    )
    assert torch.allclose(adv[:, 0], torch.tensor([1.75, 3.0, 2.5]))


def _loop_gae(r, v, nv, term, done, gamma, lam):
    t_len, n = r.shape
    adv = np.zeros((t_len, n))
    for env in range(n):
        last = 0.0
        for t in reversed(range(t_len)):
            nonterminal = 0.0 if term[t, env] else 1.0
            delta = r[t, env] + gamma * nv[t, env] * nonterminal - v[t, env]
            last = delta + gamma * lam * (0.0 if done[t, env] else 1.0) * last
            adv[t, env] = last
    return adv


@settings(max_examples=30, deadline=None)
@given(
    t_len=st.integers(1, 12), n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
    gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0),
)
def test_matches_plain_loop(t_len, n, seed, gamma, lam):
    rng = np.random.default_rng(seed)
    r, v, nv = (rng.normal(size=(t_len, n)) for _ in range(3))
    term = rng.random((t_len, n)) < 0.2
    done = term | (rng.random((t_len, n)) < 0.2)
    adv, ret = compute_gae(*(torch.tensor(x, dtype=torch.float64) for x in (r, v, nv)),
                           torch.tensor(term), torch.tensor(done), gamma, lam)
    expected = _loop_gae(r, v, nv, term, done, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ret.numpy(), expected + v, rtol=1e-9, atol=1e-9)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"one shape \[T, N\]"):
        compute_gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3, 2, dtype=torch.bool),
                    torch.zeros(3, 2, dtype=torch.bool), 0.9, 0.9)


def test_per_task_normalisation_gives_each_task_zero_mean_and_unit_std():
    from vla_rl.ppo import per_task_normalized

    gen = torch.Generator().manual_seed(0)
    task = torch.randint(0, 3, (40, 6), generator=gen)
    advantage = torch.randn(40, 6, generator=gen) * (1.0 + 10.0 * task) + 5.0 * task
    out = per_task_normalized(advantage, task)
    for t in range(3):
        group = out[task == t]
        assert abs(float(group.mean())) < 1e-5 and abs(float(group.std()) - 1.0) < 1e-4
        # Within a task the order of advantages is kept.
        assert torch.equal(torch.argsort(group), torch.argsort(advantage[task == t]))
