"""Running observation normalisation whose statistics checkpoint with the model.

The statistics (``mean``, ``var``, ``count``) are buffers, so they travel in the policy's
``state_dict`` and move with ``.to(device)``. They change only when :meth:`RunningNorm.update`
is called, never in ``forward``: PPO's update epochs evaluate the same batch many times and
must not shift the statistics under their own feet.
"""

from __future__ import annotations

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Normalise features by a running mean and variance (Chan et al.'s parallel update).

    ``forward(x)`` returns ``clip((x - mean) / sqrt(var + eps), -clip, clip)`` in ``x``'s dtype.
    Statistics are kept in float64 so that millions of samples do not lose precision.

    Args:
        shape: feature shape (without the batch dimensions), e.g. ``(S,)``.
        clip: bound on the normalised value; ``None`` or ``0`` for no clipping.
        eps: added to the variance before the square root.
    """

    def __init__(self, shape: int | tuple[int, ...], clip: float | None = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape = shape
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch ``x`` of shape ``[..., *shape]`` into the running statistics."""
        if tuple(x.shape[x.dim() - len(self.shape) :]) != self.shape:
            raise ValueError(
                f"RunningNorm.update got a tensor of shape {tuple(x.shape)}; its trailing dimensions "
                f"must be the feature shape {self.shape}. Pass observations of the key this "
                f"normaliser was built for."
            )
        batch = x.detach().reshape(-1, *self.shape).to(torch.float64)
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan, Golub & LeVeque: combine the two sets' sums of squared deviations.
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (any leading dimensions) with the current statistics."""
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + self.eps).to(x.dtype)
        y = (x - mean) / std
        if self.clip:
            y = y.clamp(-self.clip, self.clip)
        return y

    def extra_repr(self) -> str:
        return f"shape={self.shape}, clip={self.clip}"
