"""Config loading: defaults, overrides, round trip, and errors that name the valid choices."""

import dataclasses
import re
import typing

import numpy as np
import pytest
import torch

import sims
from vla_rl.config import (
    CONFIG_DIR,
    ConfigError,
    TrainConfig,
    build_config,
    load_config,
    parse_overrides,
    to_dict,
)

GYM = ["env.kind=gym", "env.task=Pendulum-v1", "policy.name=mlp"]


def test_overrides_are_typed_and_nested():
    cfg = load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", ["ppo.optim.lr=1e-3", "env.num_envs=4", "eval.splits=[train]"])
    assert cfg.ppo.optim.lr == 1e-3 and isinstance(cfg.ppo.optim.lr, float)
    assert cfg.env.num_envs == 4 and cfg.eval.splits == ("train",)
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
        (["ppo.optim.kl_adaptive_lr=true"], r"needs ppo.optim.target_kl"),
        (["env.num_envs=0"], r"env.num_envs=0 must be at least 1"),
        (["eval.splits=[train,test]"], r"unknown split\(s\) \['test'\]; valid: train, validation, paraphrase"),
    ],
)
def test_bad_values_name_the_valid_choices(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", GYM + overrides)


def test_an_unregistered_gymnasium_id_is_refused_where_the_run_starts(tmp_path):
    # gymnasium's registry depends on the packages of this machine: TrainConfig.check reads it, validate does not.
    cfg = load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", [*GYM, "env.task=HalfCheeta-v5", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"not a registered gymnasium id; did you mean HalfCheetah-v"):
        cfg.check()
    assert list(tmp_path.iterdir()) == []


def test_stopping_reads_only_the_validation_split():
    with pytest.raises(ConfigError, match=r"stop_success reads the validation split"):
        load_config(CONFIG_DIR / "default.yaml", ["eval.splits=[train,paraphrase]"])


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


DEFAULT, HALFCHEETAH = "default.yaml", "halfcheetah_ppo.yaml"


@pytest.mark.parametrize(
    ("config", "override", "message"),
    [
        (HALFCHEETAH, "ppo.optim.lr=-1", r"ppo.optim.lr=-1.0 must be in \(0, 1\]"),
        (HALFCHEETAH, "ppo.optim.lr=.inf", r"ppo.optim.lr=inf must be in \(0, 1\]"),
        (DEFAULT, "env.frames.width=7", r"env.frames.width=7: a frame's width and height must be in \[8, 1024\]$"),
        (DEFAULT, "policy.image_size=32", r"policy.image_size=32 must equal env.frames.width=64 and env.frames.height=64"),
        (DEFAULT, "env.frames.height=32", r"policy.image_size=64 must equal env.frames.width=64 and env.frames.height=32"),
        (DEFAULT, "policy.patch_size=3", r"policy.image_size=64 must be a multiple of patch_size=3"),
        (DEFAULT, "env.frames.cameras=[front,top]", r"env.frames.cameras=\['front', 'top'\]: unknown camera\(s\) "
                                                    r"\['top'\]; valid: front, wrist$"),
        (DEFAULT, "env.frames.cameras=[front,front]", r"env.frames.cameras=\['front', 'front'\] must name distinct"),
        (DEFAULT, "env.frames=null", r"policy.name=vla reads camera images: it needs env.kind=sims and env.frames "),
        (DEFAULT, "env.backend=gpu", r"env.backend='gpu' is not a sims backend; valid: batch, mjx"),
        (DEFAULT, "policy.attention_heads=0", r"policy.attention_heads=0 must be at least 1"),
        (DEFAULT, "policy.readout=flatten", r"policy.attention_target_keys=\['goal_pixel'\] train the attention readout; set readout: attention"),
        (DEFAULT, "policy.critic_obs_keys=[proprio,pixels]", r"policy.critic_obs_keys=\['pixels'\] are not sims"),
        (HALFCHEETAH, "seed=-1", r"seed=-1 must be in \[0, 2147483647\]"),
        (HALFCHEETAH, "total_env_steps=0", r"total_env_steps=0 must be at least 1"),
        (HALFCHEETAH, "stop_success=1.5", r"stop_success=1.5 must be in \[0, 1\]"),
        (HALFCHEETAH, "checkpoint_every=0", r"checkpoint_every=0 must be at least 1"),
        (HALFCHEETAH, "torch_threads=0", r"torch_threads=0 must be at least 1"),
        (HALFCHEETAH, "device=gpu", r"device='gpu' is not a torch device; valid: cpu, cuda"),
        (HALFCHEETAH, "name=a/b", r"name='a/b'.*one directory name"),
        (HALFCHEETAH, "env.max_episode_steps=0", r"env.max_episode_steps=0 must be at least 1"),
        (HALFCHEETAH, "ppo.gamma=1.5", r"ppo.gamma=1.5 must be in \[0, 1\]"),
        (HALFCHEETAH, "ppo.gae_lambda=-0.1", r"ppo.gae_lambda=-0.1 must be in \[0, 1\]"),
        (HALFCHEETAH, "ppo.vf_coef=-1", r"ppo.vf_coef=-1.0 must be at least 0"),
        (HALFCHEETAH, "ppo.optim.clip_coef=0", r"ppo.optim.clip_coef=0.0 must be in \(0, 1\]"),
        (HALFCHEETAH, "ppo.optim.epochs=0", r"ppo.optim.epochs=0 must be at least 1"),
        (HALFCHEETAH, "ppo.optim.ent_coef=-0.01", r"ppo.optim.ent_coef=-0.01 must be at least 0"),
        (HALFCHEETAH, "ppo.optim.max_grad_norm=0", r"ppo.optim.max_grad_norm=0.0 must be greater than 0"),
        (HALFCHEETAH, "ppo.optim.target_kl=0", r"ppo.optim.target_kl=0.0 must be greater than 0"),
        (HALFCHEETAH, "ppo.optim.num_minibatches=4096", r"num_minibatches=4096 must be at most .* = 2048"),
        (HALFCHEETAH, "grpo.group_size=1", r"grpo.group_size=1 must be at least 2"),
        (HALFCHEETAH, "grpo.std_eps=0", r"grpo.std_eps=0.0 must be greater than 0"),
        (HALFCHEETAH, "distill.buffer_size=0", r"distill.buffer_size=0 must be at least 1"),
        (HALFCHEETAH, "distill.teacher_iterations=-1", r"distill.teacher_iterations=-1 must be at least 0"),
        (HALFCHEETAH, "eval.every=-1", r"eval.every=-1 must be at least 0"),
        (HALFCHEETAH, "eval.episodes=0", r"eval.episodes=0 must be at least 1"),
        (HALFCHEETAH, "eval.splits=[]", r"eval.splits is empty; valid: train, validation"),
        (HALFCHEETAH, "log.video_every=0", r"log.video_every=0 must be at least 1"),
        (HALFCHEETAH, "log.wandb_project=", r"log.wandb_project must not be empty"),
        (HALFCHEETAH, "policy.hidden_sizes=[64,0]", r"policy.hidden_sizes\[1\]=0 must be at least 1"),
        (HALFCHEETAH, "policy.obs_clip=-1", r"policy.obs_clip=-1.0 must be at least 0"),
        (HALFCHEETAH, "policy.obs_keys=[]", r"policy.obs_keys is empty"),
        (HALFCHEETAH, "policy.head.chunk=0", r"policy.head.chunk=0 must be at least 1"),
        (HALFCHEETAH, "policy.head.bins=1", r"policy.head.bins=1 must be at least 2"),
        (DEFAULT, "env.kind=gym env.task=Pendulum-v1", r"policy.name=vla reads camera images: it needs env.kind=sims"),
        (HALFCHEETAH, "ppo.task_adv_norm=true", r"ppo.task_adv_norm normalises advantages per sims task"),
        (HALFCHEETAH, "env.success_bonus=-1", r"env.success_bonus=-1.0 must be in \[0, 100\]"),
        (DEFAULT, "env.suite.reward=sparse", r"env.suite.reward='sparse'; valid rewards: dense, progress, success"),
        (DEFAULT, "env.suite.task_weights.push=2", r"env.suite.task_weights=\{'push': 2\}: task weights name \['push'\], not "
                                                    r"tasks of 'reach'; valid: reach"),
        (DEFAULT, "env.suite.task_weights.reach=-1", r"each weight must be a number >= 0"),
        (HALFCHEETAH, "env.suite.task_weights.x=1", r"env.suite=.* sets a sims suite's own settings; env.kind='gym' has none"),
        (DEFAULT, "env.reward=success", r"env.reward is a suite's own setting \(gantry\): write env.suite.reward=success"),
        (DEFAULT, "env.image_size=32", r"env.image_size is a frame setting, now under env.frames: write "
                                       r"env.frames.width=32 env.frames.height=32 "),
        (DEFAULT, "env.suite.num_envs=4", r"env.suite has unknown key\(s\) \['num_envs'\] .*; write env.num_envs"),
        (DEFAULT, "env.max_episode_steps=10", r"env.max_episode_steps=10 limits gymnasium episodes; a sims suite's own "
                                              r"settings go under env.suite \(the gantry suite's: .*reward"),
        (HALFCHEETAH, "algo=sft sft.dataset=x sft.instruction_noise=3", r"sft.instruction_noise=3.0 must be in"),
    ],
)
def test_bad_value_is_a_one_line_error_naming_the_key_before_any_run_directory(
    tmp_path, capsys, config, override, message, script
):
    argv = ["--config", str(CONFIG_DIR / config), *override.split(), f"out_dir={tmp_path}", "log.wandb=disabled"]
    assert script("train").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert re.search(message, err), err
    assert list(tmp_path.iterdir()) == [], "a run directory was created for a bad config"


def _numeric(tp) -> bool:
    """Whether a field annotation holds numbers (int or float, optional, or a tuple of them). A mapping
    (``env.task_weights``) is checked by its own validator, tested with the bad values above."""
    if typing.get_origin(tp) is dict:
        return False
    args = typing.get_args(tp)
    return tp in (int, float) or any(_numeric(a) for a in args if a is not type(None) and a is not Ellipsis)


def _numeric_fields(cls, prefix=""):
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{prefix}{f.name}.")
        elif _numeric(tp):
            yield f"{prefix}{f.name}"


def test_every_numeric_field_has_a_valid_range():
    import policies
    from vla_rl.config import RANGES, TrainConfig

    train = [k for k in _numeric_fields(TrainConfig) if not k.startswith("fleet.")]  # validate_fleet's
    assert sorted(set(train) - set(RANGES)) == []
    for name, cls in policies.MODELS.items():
        assert sorted(set(_numeric_fields(cls)) - set(cls.RANGES)) == [], name


def test_render_knobs_reach_the_environment():
    from vla_rl.envs import make_env

    cfg = load_config(CONFIG_DIR / DEFAULT, ["env.frames.cameras=[front,wrist]", "env.frames.depth=true",
                                                    "env.frames.width=32", "env.frames.height=32", "policy.image_size=32"])
    env = make_env(cfg.env, seed=0, num_envs=2, num_threads=1)
    try:
        obs = env.reset_td(seed=0)
    finally:
        env.close()
    assert obs["rgb"].shape == (2, 2, 3, 32, 32) and obs["depth"].shape == (2, 2, 32, 32)


def test_reward_knobs_reach_the_environment():
    from vla_rl.envs import make_env

    cfg = load_config(CONFIG_DIR / DEFAULT, ["env.suite.reward=success", "env.success_bonus=2"])
    env = make_env(cfg.env, seed=0, num_envs=2, num_threads=1)
    try:
        env.reset_td(seed=0)
        reward = env.step_td(torch.zeros(2, 4))["reward"]
    finally:
        env.close()
    assert (env.config.reward, env.config.success_bonus) == ("success", 2.0)
    assert torch.equal(reward, torch.zeros(2))  # nothing succeeds at the first step: success pays 0


def test_warp_determinism_knobs_reach_the_backend():
    pytest.importorskip("mujoco_warp")
    from vla_rl.envs import make_env

    cfg = load_config(CONFIG_DIR / "suite.yaml", ["env.backend=warp", "env.warp_device=cpu",
                                                  "env.suite.warp_deterministic=true", "env.suite.warp_uncaptured=true"])
    env = make_env(cfg.env, seed=0, num_envs=2, num_threads=1)
    env.close()
    backend = env._backend
    assert backend.deterministic and not backend.m.is_sparse and not backend._capture
    default = make_env(load_config(CONFIG_DIR / "suite.yaml", []).env, seed=0, num_envs=2, num_threads=1)
    default.close()
    assert (default.config.warp_deterministic, default.config.warp_uncaptured) == (False, False)


def test_task_weights_reach_the_training_environment_in_task_order():
    from vla_rl.envs import make_env

    cfg = load_config(CONFIG_DIR / "suite.yaml", ["env.suite.task_weights={stack: 3, reach: 0}"])
    env = make_env(cfg.env, seed=0, num_envs=2, num_threads=1)
    env.close()
    assert env.config.task_weights == {"stack": 3, "reach": 0}
    p = np.asarray([3.0 if n == "stack" else 0.0 if n == "reach" else 1.0 for n in env.task_names])
    np.testing.assert_allclose(env._task_p, p / p.sum())  # the train split's task probabilities, in task order



@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_cuda_is_a_config_error_before_the_run_directory(tmp_path, capsys, script):
    argv = ["--config", str(CONFIG_DIR / HALFCHEETAH), "device=cuda", f"out_dir={tmp_path}", "log.wandb=disabled"]
    assert script("train").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "device='cuda'" in err and "CUDA is not available" in err
    assert list(tmp_path.iterdir()) == []


def _flat(cfg: TrainConfig, frames: bool = True, **old) -> dict:
    """``cfg`` as ``config.yaml`` held it before the suite's settings nested under ``env.suite``: every suite's
    setting at the top of ``env`` (the other suites' at the old section's defaults), and (``frames``) the frame
    settings too (:func:`_flat_frames`)."""
    data = to_dict(cfg)
    data["env"] = {k: v for k, v in data["env"].items() if k != "suite"} | {
        "reward": "dense", "task_weights": {}, "warp_deterministic": False, "warp_uncaptured": False,
        "visual_faces": 2000, "instructions": "original", "controller": "servo", "starts": "jitter", **old}
    if frames:
        data["env"] = _flat_frames(data["env"])
    return data


def _flat_frames(env: dict) -> dict:
    """An ``env`` section as ``config.yaml`` held it before the frames nested under ``env.frames``: ``render``
    (on/off), the square ``image_size``, ``cameras`` and ``depth`` at its top (the old defaults when off)."""
    frames = env["frames"] or {"height": 64, "cameras": ["front"], "depth": False}
    return {k: v for k, v in env.items() if k != "frames"} | {
        "render": env["frames"] is not None, "image_size": frames["height"], "cameras": frames["cameras"],
        "depth": frames["depth"]}


def test_a_checkpoint_saved_with_a_flat_env_section_loads_nested_and_a_yaml_one_is_refused(tmp_path):
    """A checkpoint written before ``env.suite`` existed loads with its suite's settings moved there (those at their
    defaults, and the other suites', dropped), so it evaluates and resumes as before (a LIBERO run of that time
    started from the jittered fixed states, then the default, and keeps them); a YAML file or override in the old
    form is a one-line error naming the new key."""
    from vla_rl.checkpoint import load_checkpoint, save_checkpoint

    gantry = load_config(CONFIG_DIR / "suite.yaml", ["env.suite.reward=progress", "env.suite.task_weights={push: 3}"])
    libero = load_config(CONFIG_DIR / "libero.yaml", ["env.suite.controller=servo", "env.suite.max_steps=30"])
    for cfg, old, kept in ((gantry, {"reward": "progress", "task_weights": {"push": 3}}, {}),
                           (libero, {"controller": "servo", "max_episode_steps": 30, "reward": "success"},
                            {"starts": "jitter"})):
        flat = _flat(cfg, **old)
        suite = sims.suite_of(cfg.env.task).name  # the task's own suite's keys are named first
        with pytest.raises(ConfigError, match=rf"^env\.(\w+) is a suite's own setting \({suite}(, \w+)*\): write "
                                              r"env\.suite\.\1="):
            build_config(_flat(cfg, frames=False, **old))
        save_checkpoint({"config": flat}, tmp_path / cfg.env.task, iteration=1)
        loaded = load_checkpoint(tmp_path / cfg.env.task)["config"]
        assert loaded["env"]["suite"] == cfg.env.suite | kept
        assert build_config(loaded) == dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, suite=cfg.env.suite | kept))


def test_a_checkpoint_saved_with_flat_frame_settings_loads_them_under_env_frames(tmp_path):
    """A checkpoint written before the frames nested under ``env.frames`` (``env.render``, ``env.image_size``,
    ``env.cameras``, ``env.depth``) loads with them there, frames off as ``frames: null``; the same keys in a
    YAML file are refused, naming the new key."""
    from vla_rl.checkpoint import load_checkpoint, save_checkpoint

    rendered = load_config(CONFIG_DIR / DEFAULT, ["env.frames.cameras=[front,wrist]", "env.frames.depth=true",
                                                  "env.frames.width=32", "env.frames.height=32", "policy.image_size=32"])
    for name, cfg in (("on", rendered), ("off", load_config(CONFIG_DIR / "reach_state_ppo.yaml"))):
        data = to_dict(cfg)
        data["env"] = _flat_frames(data["env"])
        with pytest.raises(ConfigError, match=r"^env\.render is a frame setting, now under env\.frames: "):
            build_config(data)
        save_checkpoint({"config": data}, tmp_path / name, iteration=1)
        loaded = load_checkpoint(tmp_path / name)["config"]
        assert loaded["env"]["frames"] == (to_dict(cfg)["env"]["frames"] if name == "off" else
                                           {"width": 32, "height": 32, "cameras": ["front", "wrist"], "depth": True})
        assert build_config(loaded) == cfg


@pytest.mark.parametrize(("override", "new"), [
    ("env.image_size=32", "write env.frames.width=32 env.frames.height=32 (YAML: env: {frames: {width: 32, height: 32}})"),
    ("env.cameras=[front,wrist]", "write env.frames.cameras=[front,wrist] (YAML: env: {frames: {cameras: [front,wrist]}})"),
    ("env.depth=true", "write env.frames.depth=true (YAML: env: {frames: {depth: true}})"),
    ("env.render=false", "write env.frames=null (YAML: env: {frames: null})"),
    ("env.render=true", "frames are on unless env.frames=null: remove env.render"),
])
def test_an_old_flat_frame_key_is_a_one_line_error_naming_its_new_key(override, new):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} is a frame setting, now under env.frames: {re.escape(new)}$"):
        load_config(CONFIG_DIR / DEFAULT, [override])
