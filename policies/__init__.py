"""Neural policies: the VLA, the state MLP actor-critic, encoders, action heads, normalisation.

Build one by name with :func:`load` or from a config dataclass with :func:`make_policy`.
"""

from policies.base import ActorCritic
from policies.encoders import ConvEncoder, SentenceCache, shared_sentence_cache
from policies.heads import ActionHeadConfig, BinnedHead, GaussianHead
from policies.mlp import MLPActorCritic, MLPPolicyConfig
from policies.normalization import RunningNorm
from policies.registry import MODELS, POLICIES, config_class, load, make_policy, parameter_count
from policies.vla import VLAConfig, VLAPolicy

__all__ = [
    "MODELS",
    "POLICIES",
    "ActionHeadConfig",
    "ActorCritic",
    "BinnedHead",
    "ConvEncoder",
    "GaussianHead",
    "MLPActorCritic",
    "MLPPolicyConfig",
    "RunningNorm",
    "SentenceCache",
    "VLAConfig",
    "VLAPolicy",
    "config_class",
    "load",
    "make_policy",
    "parameter_count",
    "shared_sentence_cache",
]
