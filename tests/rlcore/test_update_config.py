"""rlcore's update settings check their own ranges, hand-built or read from a config."""

import math

import pytest

from rlcore.update_config import GRPOConfig, OptimConfig, check_choice


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (OptimConfig(lr=0.0), r"^lr=0.0 must be in \(0, 1\]$"),
        (OptimConfig(lr=math.nan), r"^lr=nan must be in \(0, 1\]$"),
        (OptimConfig(epochs=0), r"^epochs=0 must be at least 1$"),
        (OptimConfig(num_minibatches=0), r"^num_minibatches=0 must be at least 1$"),
        (OptimConfig(clip_coef=1.5), r"^clip_coef=1.5 must be in \(0, 1\]$"),
        (OptimConfig(ent_coef=-0.1), r"^ent_coef=-0.1 must be at least 0$"),
        (OptimConfig(max_grad_norm=0.0), r"^max_grad_norm=0.0 must be greater than 0$"),
        (OptimConfig(target_kl=0.0), r"^target_kl=0.0 must be greater than 0$"),
        (OptimConfig(ref_kl_coef=-1.0), r"^ref_kl_coef=-1.0 must be at least 0$"),
        (OptimConfig(critic_warmup_iterations=-1), r"^critic_warmup_iterations=-1 must be at least 0$"),
        (OptimConfig(clip_coef_high=0.0), r"^clip_coef_high=0.0 must be in \(0, 1\]$"),
        (OptimConfig(rollout_temperature=0.0), r"^rollout_temperature=0.0 must be in \(0, 10\]$"),
        (GRPOConfig(min_group_success=-0.1), r"^min_group_success=-0.1 must be in \[0, 1\]$"),
        (GRPOConfig(max_group_success=1.5), r"^max_group_success=1.5 must be in \[0, 1\]$"),
        (GRPOConfig(min_group_success=0.9, max_group_success=0.1),
         r"^min_group_success=0.9 is above max_group_success=0.1: no group would be kept; use e.g. 0.1 and 0.9$"),
        (GRPOConfig(group_size=1), r"^group_size=1 must be at least 2$"),
        (GRPOConfig(std_eps=0.0), r"^std_eps=0.0 must be greater than 0$"),
        (GRPOConfig(optim=OptimConfig(lr=2.0)), r"^optim.lr=2.0 must be in \(0, 1\]$"),
    ],
)
def test_a_value_out_of_range_names_its_field(cfg, message) -> None:
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_the_defaults_and_the_edges_pass() -> None:
    OptimConfig().validate()
    GRPOConfig().validate()
    OptimConfig(lr=1.0, clip_coef=1.0, ent_coef=0.0, target_kl=1e-9, critic_warmup_iterations=0).validate()
    GRPOConfig(group_size=2, std_eps=1e-12).validate()
    OptimConfig(clip_coef_high=0.28, rollout_temperature=1.6).validate()
    GRPOConfig(min_group_success=0.5, max_group_success=0.5).validate()  # one rate kept: an edge, not an error


def test_a_choice_outside_its_set_names_the_valid_ones() -> None:
    check_choice("kind", "a", ("a", "b"))
    with pytest.raises(ValueError, match=r"^kind='c' is unknown; valid choices: a, b$"):
        check_choice("kind", "c", ("a", "b"))
