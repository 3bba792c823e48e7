"""Policy-gradient losses of PPO and GRPO as pure functions over tensors, shapes in the docstrings.

The clipped surrogate is PPO's (Schulman et al. 2017); group-relative advantages are GRPO's (Shao et
al. 2024, DeepSeekMath): each sample's reward against the other samples of its group, no critic.
KL terms use Schulman's "k3" estimator; the clip may be asymmetric (DAPO's clip-higher), and
:func:`group_keep_mask` is DAPO's dynamic sampling (groups that all succeed or all fail dropped).
:func:`surrogate_loss` averages over a batch of decisions (the VLA trainer's minibatches);
:func:`grpo_loss` over the counted tokens of a batch of completions, with the KL penalty against a
frozen reference (the LLM trainer).
"""

from __future__ import annotations

import torch


def group_advantages(returns: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Normalise returns within consecutive groups.

    Args:
        returns: ``[E]`` returns (episodes or completions); consecutive blocks of ``group_size``
            share an initial state or prompt.
        group_size: G, the samples per group; ``E`` must be a multiple of it.
        eps: Added to the group's standard deviation (a group of equal returns gets advantage 0).

    Returns:
        ``[E]`` advantages ``(R_i - mean_group) / (std_group + eps)`` with the population std.
    """
    if returns.dim() != 1 or returns.shape[0] % group_size:
        raise ValueError(
            f"returns must be [E] with E a multiple of group_size={group_size}, got {tuple(returns.shape)}"
        )
    groups = returns.reshape(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, correction=0)
    return ((groups - mean) / (std + eps)).reshape(-1)


def clipped_surrogate(
    ratio: torch.Tensor, advantage: torch.Tensor, clip_coef: float, clip_coef_high: float | None = None
) -> torch.Tensor:
    """PPO's clipped surrogate, negated to minimise, per element (inputs broadcast together).

    ``ratio`` is ``pi_theta(a|s) / pi_old(a|s)``; ``clip_coef`` the epsilon of the ratio clip below 1 and,
    unless ``clip_coef_high`` is given, above it too. DAPO's clip-higher (Yu et al. 2025) clips to
    ``[1 - clip_coef, 1 + clip_coef_high]`` with a larger upper epsilon, so that an action the old policy
    found unlikely can gain more probability in one update than a symmetric clip allows.
    """
    high = clip_coef if clip_coef_high is None else clip_coef_high
    # L^CLIP = E[min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)]
    pg_loss1 = -advantage * ratio
    pg_loss2 = -advantage * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + high)
    return torch.max(pg_loss1, pg_loss2)


def clipped(ratio: torch.Tensor, clip_coef: float, clip_coef_high: float | None = None) -> torch.Tensor:
    """1.0 where the ratio lies outside ``[1 - clip_coef, 1 + clip_coef_high]`` (``clip_coef_high`` ``None``:
    ``clip_coef``), else 0.0."""
    high = clip_coef if clip_coef_high is None else clip_coef_high
    return ((ratio < 1.0 - clip_coef) | (ratio > 1.0 + high)).float()


def group_keep_mask(success: torch.Tensor, group_size: int, low: float, high: float) -> torch.Tensor:
    """Which samples belong to a group whose success rate lies in ``[low, high]`` (DAPO's dynamic sampling).

    A group whose G samples all succeed or all fail gives every sample the same return, so its
    group-relative advantages are zero and it adds nothing but weight to the mean loss; with
    ``[0.1, 0.9]`` and G=8 exactly those groups are dropped (SimpleVLA-RL's filter).

    Args:
        success: ``[E]`` bool or float in ``[0, 1]``; consecutive blocks of ``group_size`` are groups.
        group_size: G; ``E`` must be a multiple of it.
        low, high: The band of group success rates kept, ``0 <= low <= high <= 1`` (``[0, 1]`` keeps all).

    Returns:
        ``[E]`` bool, True for each sample of a kept group.
    """
    if success.dim() != 1 or success.shape[0] % group_size:
        raise ValueError(
            f"success must be [E] with E a multiple of group_size={group_size}, got {tuple(success.shape)}"
        )
    rate = success.float().reshape(-1, group_size).mean(dim=1)
    keep = (rate >= low) & (rate <= high)
    return keep.repeat_interleave(group_size)


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """KL estimate per sample, Schulman's "k3": ``(r - 1) - log r`` with ``log r = log p(x) - log q(x)``.

    For ``x`` drawn from ``q`` it is non-negative and unbiased for ``KL(q || p)``: with ``log r =
    log pi - log pi_old`` it is PPO's ``approx_kl``; with ``log r = log ref - log pi``, GRPO's
    penalty ``KL(pi || ref)``.
    """
    return (log_ratio.exp() - 1.0) - log_ratio


def surrogate_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor, clip_coef: float,
    clip_coef_high: float | None = None, weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate objective over a batch (negated, to minimise), and its diagnostics.

    Args:
        log_prob: ``[B]`` log pi_theta(a|s) under the current parameters.
        old_log_prob: ``[B]`` log pi_old(a|s) stored at collection time.
        advantage: ``[B]`` advantage estimates.
        clip_coef: epsilon of the ratio clip (below 1, and above it unless ``clip_coef_high`` is given).
        clip_coef_high: epsilon above 1 (clip-higher, :func:`clipped_surrogate`); ``None``: ``clip_coef``.
        weight: ``[B]`` 1 for a sample of the objective, 0 for one that is not (GRPO's anchor states, which only a
            KL term reads); the loss and diagnostics are means over the weighted samples. ``None``: all count.

    Returns:
        The scalar loss and ``approx_kl`` (:func:`kl_k3` of pi_old to pi) and ``clip_frac``.
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    if weight is None:
        mean = torch.mean
    else:
        total = weight.sum().clamp_min(1.0)  # a minibatch of anchors alone: no objective, a zero loss

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * weight).sum() / total

    loss = mean(clipped_surrogate(ratio, advantage, clip_coef, clip_coef_high))
    with torch.no_grad():
        stats = {"approx_kl": mean(kl_k3(log_ratio)), "clip_frac": mean(clipped(ratio, clip_coef, clip_coef_high))}
    return loss, stats


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_coef: float,
    ref_kl_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss over completion tokens (a scalar to minimise) and diagnostics.

    Args:
        logp, old_logp, ref_logp: ``[B, C]`` token log-probs under the current, behaviour and
            reference policies.
        advantages: ``[B]`` one per completion (:func:`group_advantages`), shared by its tokens.
        mask: ``[B, C]`` True at completion tokens that count (up to and including EOS).
        clip_coef: epsilon of the ratio clip.
        ref_kl_coef: weight beta of ``KL(pi || ref)``.

    Returns:
        The loss ``mean(surrogate) + beta * mean(KL)``, both averaged over all counted tokens of the
        batch, and ``pg_loss``, ``kl``, ``clip_frac``.
    """
    ratio = torch.exp(logp - old_logp)
    pg = clipped_surrogate(ratio, advantages[:, None], clip_coef)
    kl = kl_k3(ref_logp - logp)
    m = mask.float()
    n = m.sum().clamp(min=1)
    pg_term = (pg * m).sum() / n
    kl_term = (kl * m).sum() / n
    loss = pg_term + ref_kl_coef * kl_term
    clip_frac = (clipped(ratio, clip_coef) * m).sum() / n
    stats = {"pg_loss": pg_term.item(), "kl": kl_term.item(), "clip_frac": clip_frac.item()}
    return loss, stats
