"""Config loading: defaults, overrides, round trip, and errors that name the valid choices."""

import pytest

from vla_rl.config import CONFIG_DIR, ConfigError, build_config, load_config, parse_overrides, to_dict

GYM = ["env.kind=gym", "env.task=Pendulum-v1", "policy.name=mlp"]


def test_overrides_are_typed_and_nested():
    cfg = load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", ["ppo.optim.lr=1e-3", "env.num_envs=4", "eval.sets=[train]"])
    assert cfg.ppo.optim.lr == 1e-3 and isinstance(cfg.ppo.optim.lr, float)
    assert cfg.env.num_envs == 4 and cfg.eval.sets == ("train",)
    assert cfg.policy.hidden_sizes == (64, 64)


def test_round_trip_through_dict():
    cfg = load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", ["ppo.optim.target_kl=0.02"])
    assert build_config(to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ppo.optim.lrr=1"], r"unknown config key\(s\) \['lrr'\] in section 'ppo.optim'; valid keys: lr, anneal_lr"),
        (["bogus=1"], r"unknown config key\(s\) \['bogus'\]; valid keys: name, out_dir"),
        (["algo=sac"], r"algo='sac' is not a valid choice; valid: ppo, grpo"),
        (["policy.name=transformer"], r"policy.name='transformer' is not a known model; valid: .*mlp"),
        (["ppo.rollout_steps=abc"], r"ppo.rollout_steps='abc' must be an integer"),
        (["env.task=HalfCheeta-v5"], r"not a registered gymnasium id; did you mean HalfCheetah-v"),
        (["ppo.optim.kl_adaptive_lr=true"], r"needs ppo.optim.target_kl"),
        (["env.num_envs=0"], r"env.num_envs=0 must be at least 1"),
        (["eval.sets=[train,test]"], r"unknown instruction set\(s\) \['test'\]; valid: train, heldout"),
    ],
)
def test_bad_values_name_the_valid_choices(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", GYM + overrides)


def test_unknown_sims_task_lists_tasks():
    with pytest.raises(ConfigError, match=r"env.task='reachh' is not a sims task; valid: reach, .*suite"):
        build_config({"env": {"kind": "sims", "task": "reachh"}, "policy": {"name": "mlp"}})


def test_grpo_needs_whole_groups():
    with pytest.raises(ConfigError, match=r"must be a multiple of grpo\.group_size=8"):
        build_config({"algo": "grpo", "env": {"num_envs": 12}, "policy": {"name": "mlp"}})


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="must look like key=value"):
        parse_overrides(["ppo.optim.lr"])
    with pytest.raises(ConfigError, match=r"not found; configs shipped in .*halfcheetah_ppo.yaml"):
        load_config("no/such/file.yaml")


def test_train_script_takes_overrides_after_the_ray_address(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_script", CONFIG_DIR.parent / "scripts" / "train.py")
    train_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_script)
    # The bad mode is reported by the config loader: argparse took the override after "--ray local".
    assert train_script.main(["--ray", "local", "fleet.mode=ring"]) == 2
    assert "fleet.mode='ring' is not a valid choice" in capsys.readouterr().err
