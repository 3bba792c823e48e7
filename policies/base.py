"""The actor-critic contract every policy implements, and the small pieces policies share.

A policy maps an observation TensorDict (batch ``[N]``) to an action distribution and a value:

- ``act(obs, deterministic=False) -> TensorDict`` with ``action`` ``[N, A]`` (``[N, K, A]`` with
  action chunks), ``log_prob`` ``[N]`` and ``value`` ``[N]``; runs without gradients;
- ``evaluate_actions(obs, action) -> (log_prob [N], entropy [N], value [N])`` with gradients;
  ``evaluate_terms(obs) -> PolicyTerms(dist, value, aux)``, from the same forward pass: the
  action distribution (for log-probabilities, entropy and a closed-form KL), the value and the
  policy's auxiliary loss (``None`` without one), which the update adds to its loss;
- ``value(obs) -> [N]``;
- ``update_normalization(obs)`` merges a batch into the running observation statistics
  (the trainer calls it once per collected batch; ``forward`` never changes them);
- ``prepare_update_batch(obs)`` returns an update batch's observations as the minibatch epochs
  read them (a policy with a frozen encoder computes its output once there);
- ``set_instructions(list[str])`` tells a language-conditioned policy what the ``instruction``
  indices mean (a no-op for policies that ignore language);
- ``actor() -> PolicyActor``: the actor alone, an ``nn.Module`` from plain tensors (named by
  ``actor_input_names``) to the mode action, for deployment and export; it holds no critic or
  auxiliary head and reads no privileged key. ``act(obs, deterministic=True)["action"]`` is the
  same computation: ``head(actor_features(*actor_inputs(obs))).mode()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from policies.heads import ActionDistribution, ActionHead
from rlcore.update_config import check_choice

ObsSpec = Mapping[str, Sequence[int]] | TensorDictBase
"""Per-key feature shapes without batch dimensions (``{"state": (17,)}``), or a sample TensorDict."""


class PolicyTerms(NamedTuple):
    """What an update needs from one forward pass over a batch ``[N]``."""

    dist: ActionDistribution
    value: torch.Tensor
    """``[N]``."""
    aux: torch.Tensor | None
    """The weighted auxiliary loss (a scalar), or ``None``."""


Activation = Literal["tanh", "elu", "relu", "gelu"]
"""Names of the hidden activations."""
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU, "gelu": nn.GELU}


def spec_shapes(obs_spec: ObsSpec) -> dict[str, tuple[int, ...]]:
    """Normalise an observation spec to ``{key: feature shape}`` (batch dimensions stripped)."""
    if isinstance(obs_spec, TensorDictBase):
        return {k: tuple(v.shape[obs_spec.batch_dims :]) for k, v in obs_spec.items()}
    if isinstance(obs_spec, Mapping):
        return {k: tuple(int(d) for d in v) for k, v in obs_spec.items()}
    raise TypeError(
        f"obs_spec is a {type(obs_spec).__name__}; pass a mapping {{key: feature shape}} such as "
        f"{{'state': (17,)}}, or a sample observation TensorDict."
    )


def require_key(shapes: Mapping[str, tuple[int, ...]], key: str, rank: int, policy: str) -> tuple[int, ...]:
    """The feature shape of ``key`` in an observation spec, checked to have ``rank`` dimensions."""
    if key not in shapes:
        raise KeyError(
            f"{policy} reads observation key {key!r}, which the observation spec lacks "
            f"(it has: {', '.join(sorted(shapes)) or 'nothing'}). Set the policy config's observation "
            f"key(s) to one of those, or enable the environment output that provides {key!r}."
        )
    shape = shapes[key]
    if len(shape) != rank:
        raise ValueError(
            f"observation {key!r} has feature shape {shape}; {policy} expects {rank} dimension(s)."
        )
    return shape


def obs_entry(obs: TensorDictBase, key: str) -> torch.Tensor:
    """``obs[key]`` with an error that lists the keys present when it is missing."""
    if key not in obs:
        raise KeyError(
            f"observation TensorDict has no key {key!r} (it has: {', '.join(sorted(obs.keys()))}). "
            f"The policy was built for an observation spec containing {key!r}."
        )
    return obs[key]


def build_mlp(in_features: int, hidden_sizes: Sequence[int], activation: str) -> nn.Sequential:
    """Linear + activation layers with orthogonal init (gain sqrt(2)) and zero biases."""
    check_choice("activation", activation, ACTIVATIONS)
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden_sizes:
        linear = nn.Linear(width, size)
        nn.init.orthogonal_(linear.weight, gain=math.sqrt(2.0))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers)


def value_layer(in_features: int) -> nn.Linear:
    """The final critic layer: orthogonal init with gain 1, as in CleanRL's PPO."""
    linear = nn.Linear(in_features, 1)
    nn.init.orthogonal_(linear.weight, gain=1.0)
    nn.init.zeros_(linear.bias)
    return linear


class ActorCritic(nn.Module):
    """Base class: subclasses build ``self.head`` and ``self.value_head``, implement :meth:`features`
    (and may override :meth:`critic_features` when the critic can skip the actor), and describe their
    actor with ``actor_input_names``, ``actor_module_names`` and :meth:`actor_features`.
    """

    head: ActionHead
    value_head: nn.Linear
    actor_input_names: tuple[str, ...]
    """Names of the actor's input tensors, in the order :meth:`actor_features` takes them."""
    actor_module_names: tuple[str, ...]
    """Submodules the actor uses (``head`` included): what :meth:`actor` holds and exports."""

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load a ``state_dict`` whose keys and shapes are exactly this policy's (nothing is loaded otherwise).

        Raises:
            ValueError: One line: how many keys are missing, unexpected or of another shape, with the
                first of each (``load_state_dict``'s own message lists every key, hundreds of lines).
        """
        own = self.state_dict()
        missing = [k for k in own if k not in weights]
        unexpected = [k for k in weights if k not in own]
        reshaped = [f"{k} {list(weights[k].shape)} vs {list(own[k].shape)}" for k in own
                    if k in weights and weights[k].shape != own[k].shape]
        problems = [f"{len(keys)} {what} (first: {keys[0]})" for what, keys in
                    (("missing", missing), ("unexpected", unexpected), ("of another shape", reshaped)) if keys]
        if problems:
            raise ValueError(f"the weights do not fit this {type(self).__name__}: {'; '.join(problems)}")
        self.load_state_dict(weights)

    def actor_inputs(self, obs: TensorDictBase) -> tuple[torch.Tensor, ...]:
        """The actor's input tensors from an observation batch (default: the keys of ``actor_input_names``)."""
        return tuple(obs_entry(obs, k) for k in self.actor_input_names)

    def actor_features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Actor features ``[N, F_a]`` from the tensors of :meth:`actor_inputs`."""
        raise NotImplementedError

    def actor(self) -> PolicyActor:
        """The actor alone (weights shared with this policy, not copied); see :class:`PolicyActor`."""
        return PolicyActor(self)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """``(A,)`` or ``(K, A)`` with action chunks."""
        return self.head.action_shape

    def features(self, obs: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor features ``[N, F_a]`` and critic features ``[N, F_c]`` of an observation batch."""
        raise NotImplementedError

    def critic_features(self, obs: TensorDictBase) -> torch.Tensor:
        """Critic features alone; the default computes both and keeps the critic's."""
        return self.features(obs)[1]

    @property
    def critic_obs_keys(self) -> tuple[str, ...] | None:
        """The observation keys :meth:`value` reads, or None where it may read any (the default: a critic
        sharing the actor's features reads what the actor reads, images included)."""
        return None

    def update_normalization(self, obs: TensorDictBase) -> None:
        """Merge a batch of observations into the running statistics (default: nothing to update)."""

    def set_instructions(self, instructions: Sequence[str]) -> None:
        """Tell the policy what the ``instruction`` indices mean (default: the policy ignores language)."""

    def prepare_update_batch(self, obs: TensorDictBase) -> TensorDictBase:
        """The observations ``[B]`` of an update batch as the minibatch epochs should read them: a policy
        with a frozen part may replace inputs by that part's output, computed once (default: unchanged)."""
        return obs

    def distribution(self, obs: TensorDictBase) -> tuple[ActionDistribution, torch.Tensor]:
        """The action distribution and the value ``[N]`` of an observation batch."""
        actor, critic = self.features(obs)
        return self.head(actor), self.value_head(critic).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: TensorDictBase, deterministic: bool = False) -> TensorDict:
        """Sample (or, with ``deterministic``, take the mode of) an action for each observation."""
        dist, value = self.distribution(obs)
        action = dist.mode() if deterministic else dist.sample()
        return TensorDict(
            {"action": action, "log_prob": dist.log_prob(action), "value": value},
            batch_size=[action.shape[0]],
        )

    def evaluate_actions(
        self, obs: TensorDictBase, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability ``[N]`` of ``action``, entropy ``[N]`` and value ``[N]``, with gradients."""
        dist, value, _ = self.evaluate_terms(obs)
        return dist.log_prob(action), dist.entropy(), value

    def evaluate_terms(self, obs: TensorDictBase) -> PolicyTerms:
        """The distribution, value and weighted auxiliary loss (``None`` here: the base class has
        none) of a batch, from one forward pass, with gradients."""
        dist, value = self.distribution(obs)
        return PolicyTerms(dist, value, None)

    def value(self, obs: TensorDictBase) -> torch.Tensor:
        """State value ``[N]``."""
        return self.value_head(self.critic_features(obs)).squeeze(-1)


class PolicyActor(nn.Module):
    """A policy's actor alone: ``forward(*inputs) -> action`` (the mode), for deployment and export.

    The inputs are plain tensors named by ``input_names`` (the policy's ``actor_input_names``), each
    with a leading batch dimension ``[N, ...]``; the output is the mode action ``[N, A]`` (``[N, K, A]``
    with action chunks). Only the actor's submodules are registered, so ``state_dict``, ``.to`` and a
    traced or exported graph hold no critic, no auxiliary head and no privileged observation key; the
    weights are the policy's own objects, so training the policy updates its actor.

    Args:
        policy: the actor-critic whose actor this is.
    """

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        self.input_names = tuple(policy.actor_input_names)
        for name in policy.actor_module_names:
            module = getattr(policy, name)
            if module is not None:
                self.add_module(name, module)
        # Not registered as a submodule (that would bring the critic along); its actor parts are above.
        self.__dict__["policy"] = policy

    def distribution(self, *inputs: torch.Tensor) -> ActionDistribution:
        """The action distribution of the inputs (``sample()`` for stochastic acting)."""
        return self.policy.head(self.policy.actor_features(*inputs))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The mode action ``[N, A]`` (or ``[N, K, A]``) of the inputs."""
        return self.distribution(*inputs).mode()
