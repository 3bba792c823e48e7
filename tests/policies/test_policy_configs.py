"""The policies' config dataclasses check themselves: a hand-built config gets the checks a YAML one gets."""

import dataclasses
import math
import typing

import pytest

import policies
from policies import ActionHeadConfig, MLPPolicyConfig, VLAConfig, VLAPolicy
from policies.heads import HEAD_RANGES, make_head


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (VLAConfig(image_size=64, patch_size=3), r"^image_size=64 must be a multiple of patch_size=3$"),
        (VLAConfig(image_size=4), r"^image_size=4 must be in \[8, 1024\]$"),
        (VLAConfig(conv_channels=()), r"^conv_channels is empty"),
        (VLAConfig(conv_channels=(32, 0)), r"^conv_channels\[1\]=0 must be at least 1$"),
        (VLAConfig(conv_stride=0), r"^conv_stride=0 must be at least 1$"),
        (VLAConfig(width=math.nan), r"^width=nan must be at least 1$"),
        (VLAConfig(language_tokens=2), r"^language_tokens=2 must be in \[3, 512\]$"),
        (VLAConfig(aux_loss_coef=-1.0), r"^aux_loss_coef=-1.0 must be at least 0$"),
        (VLAConfig(readout="mean"), r"^readout='mean' is unknown; valid choices: flatten, attention$"),
        (VLAConfig(language="words"), r"^language='words' is unknown; valid choices: sentence, tokens$"),
        (VLAConfig(activation="swish"), r"^activation='swish' is unknown; valid choices: tanh, elu, relu, gelu$"),
        (VLAConfig(attention_target_keys=("goal_pixel",)), r"^attention_target_keys=\['goal_pixel'\] train the "
                                                            r"attention readout; set readout: attention"),
        (VLAConfig(readout="attention", attention_heads=1, attention_target_keys=("a", "b")),
         r"need as many heads; raise attention_heads \(it is 1\)"),
        (VLAConfig(head=ActionHeadConfig(chunk=0)), r"^head.chunk=0 must be at least 1$"),
        (VLAConfig(head=ActionHeadConfig(kind="beta")), r"^head.kind='beta' is unknown; valid choices: gaussian, binned$"),
        (MLPPolicyConfig(obs_keys=()), r"^obs_keys is empty; name at least one observation key"),
        (MLPPolicyConfig(hidden_sizes=(64, 0)), r"^hidden_sizes\[1\]=0 must be at least 1$"),
        (MLPPolicyConfig(obs_clip=-1.0), r"^obs_clip=-1.0 must be at least 0$"),
        (MLPPolicyConfig(activation="swish"), r"^activation='swish' is unknown"),
        (MLPPolicyConfig(head=ActionHeadConfig(bins=1)), r"^head.bins=1 must be at least 2$"),
        (ActionHeadConfig(chunk=0), r"^chunk=0 must be at least 1$"),
        (ActionHeadConfig(init_log_std=math.inf), r"^init_log_std=inf must be a finite number$"),
        (ActionHeadConfig(kind="beta"), r"^kind='beta' is unknown; valid choices: gaussian, binned$"),
    ],
)
def test_a_hand_built_config_names_its_bad_field(cfg, message) -> None:
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_the_defaults_and_the_edges_of_each_range_pass() -> None:
    for cfg in (VLAConfig(), MLPPolicyConfig(), ActionHeadConfig()):
        cfg.validate()
    VLAConfig(image_size=8, patch_size=8, language_tokens=3, conv_stride=1, obs_clip=0.0, aux_loss_coef=0.0).validate()
    VLAConfig(readout="attention", attention_heads=2, attention_target_keys=("a", "b")).validate()
    ActionHeadConfig(kind="binned", bins=2, init_log_std=-5.0).validate()  # a negative log-std is a valid std
    MLPPolicyConfig(hidden_sizes=(), obs_clip=0.0).validate()


def _numeric(tp) -> bool:
    """Whether an annotation holds numbers (int, float, a tuple of them, or one of them or None)."""
    return tp in (int, float) or any(_numeric(a) for a in typing.get_args(tp) if a not in (type(None), Ellipsis))


def _numeric_fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _numeric_fields(hints[f.name], f"{prefix}{f.name}.")
        elif _numeric(hints[f.name]):
            yield f"{prefix}{f.name}"


def test_every_numeric_field_has_a_range() -> None:
    for name, cls in policies.MODELS.items():
        assert sorted(set(_numeric_fields(cls)) - set(cls.RANGES)) == [], name
    assert sorted(set(_numeric_fields(ActionHeadConfig)) - set(HEAD_RANGES)) == []


def test_building_a_policy_refuses_a_bad_hand_built_config_before_any_layer() -> None:
    spec = {"rgb": (1, 3, 64, 64), "proprio": (3,)}
    with pytest.raises(ValueError, match=r"^image_size=64 must be a multiple of patch_size=3$"):
        VLAPolicy(VLAConfig(patch_size=3), spec, action_dim=2)
    with pytest.raises(ValueError, match=r"^hidden_sizes\[0\]=0 must be at least 1$"):
        policies.make_policy(MLPPolicyConfig(hidden_sizes=(0,)), {"state": (4,)}, action_dim=2)
    with pytest.raises(ValueError, match=r"^bins=1 must be at least 2$"):
        make_head(ActionHeadConfig(kind="binned", bins=1), in_features=8, action_dim=2)
