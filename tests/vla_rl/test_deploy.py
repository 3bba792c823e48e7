"""Deployment: a checkpoint of a real (one-iteration) VLA run acts from camera, instruction text and
proprioception alone; its ONNX and TorchScript exports match the eager actor; eval.py's --device."""

import json

import numpy as np
import onnxruntime
import pytest
import torch
from tensordict import TensorDict

import policies
from vla_rl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vla_rl.config import CONFIG_DIR, build_config, load_config
from vla_rl.deploy import load_policy
from vla_rl.envs import make_env
from vla_rl.trainer import Trainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One PPO iteration of the default job (the VLA with asymmetric critic and auxiliary losses)."""
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(CONFIG_DIR / "default.yaml", [
        f"out_dir={out}", "name=deploy", "total_env_steps=16", "torch_threads=1", "env.num_envs=2",
        "ppo.rollout_steps=8", "ppo.optim.epochs=1", "ppo.optim.num_minibatches=1", "eval.every=0",
        "eval.episodes=2", "eval.num_envs=2", "log.wandb=disabled", "log.progress=false", "log.video=false",
    ])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    return out / "deploy"


@pytest.fixture(scope="module")
def observation(run_dir):
    """A full simulator observation ``[3]`` (privileged keys included) and the env's instruction list."""
    cfg = build_config(load_checkpoint(run_dir)["config"])
    env = make_env(cfg.env, seed=5, num_envs=3, split="paraphrase")
    obs = env.reset_td(seed=5)
    env.close()
    return obs, list(env.instructions)


def _texts(obs, instructions) -> list[str]:
    return [instructions[i] for i in obs["instruction"].tolist()]


def _robot_inputs(obs, instructions) -> dict:
    """What a robot has: camera frames, instruction text, proprioception (no state, no goal_pixel)."""
    return {"rgb": obs["rgb"].numpy(), "instruction": _texts(obs, instructions), "proprio": obs["proprio"].numpy()}


def test_loaded_policy_acts_without_privileged_keys(run_dir, observation):
    obs, instructions = observation
    deployed = load_policy(run_dir)
    assert deployed.input_names == ("rgb", "instruction", "proprio")
    action = deployed.act(**_robot_inputs(obs, instructions))
    assert action.shape == (3, 4) and action.dtype == np.float32

    # The same action as the training policy's act(deterministic=True) on the full observation.
    state = load_checkpoint(run_dir)
    policy = policies.make_policy(build_config(state["config"]).policy, obs, 4)
    policy.load_state_dict(state["policy"])
    policy.set_instructions(instructions)
    np.testing.assert_array_equal(policy.act(obs, deterministic=True)["action"].numpy(), action)

    exported = {k.split(".")[0] for k in deployed.actor.state_dict()}
    assert not exported & {"critic_trunk", "critic_norm", "value_head", "target_head", "target_norm"}
    one = _robot_inputs(obs[:1], instructions) | {"instruction": instructions[0]}
    sampled = deployed.act(deterministic=False, **one)
    assert sampled.shape == (1, 4) and np.isfinite(sampled).all()


def test_act_names_missing_and_misshapen_inputs(run_dir, observation):
    obs, instructions = observation
    deployed = load_policy(run_dir)
    inputs = _robot_inputs(obs, instructions)
    with pytest.raises(ValueError, match=r"missing \['proprio'\], unknown \['state'\]"):
        deployed.act(rgb=inputs["rgb"], instruction=inputs["instruction"], state=obs["state"])
    with pytest.raises(ValueError, match=r"trained on \[N, 1, 3, 64, 64\]"):
        deployed.act(**(inputs | {"rgb": inputs["rgb"][:, :, :, :32, :32]}))
    with pytest.raises(ValueError, match=r"must be torch\.uint8"):
        deployed.act(**(inputs | {"rgb": inputs["rgb"].astype(np.float32)}))
    with pytest.raises(ValueError, match="2 instructions for a batch of 3"):
        deployed.act(**(inputs | {"instruction": inputs["instruction"][:2]}))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_exported_actor_matches_eager(run_dir, observation, tmp_path, fmt):
    obs, instructions = observation
    deployed = load_policy(run_dir)
    eager = deployed.act(**_robot_inputs(obs, instructions))
    path = deployed.export(tmp_path / f"actor.{fmt}", format=fmt)
    rgb, embedding, proprio = (t.numpy() for t in deployed.actor_inputs(**_robot_inputs(obs, instructions)))
    assert embedding.shape == (3, 384)  # the sentence embedding is an input, computed outside the graph
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(path))
        assert [i.name for i in session.get_inputs()] == ["rgb", "instruction_embedding", "proprio"]
        (action,) = session.run(["action"], {"rgb": rgb, "instruction_embedding": embedding, "proprio": proprio})
        meta = json.loads(session.get_modelmeta().custom_metadata_map["deploy"])
    else:
        files = {"deploy.json": ""}
        module = torch.jit.load(str(path), _extra_files=files)
        with torch.no_grad():
            action = module(*(torch.from_numpy(x) for x in (rgb, embedding, proprio))).numpy()
        meta = json.loads(files["deploy.json"])
    np.testing.assert_allclose(action, eager, atol=1e-5)  # batch 3: the trace's batch of 2 is not baked in
    assert meta["inputs"]["proprio"] == {"shape": ["N", 13], "dtype": "torch.float32"}
    assert "state" not in meta["inputs"] and "goal_pixel" not in meta["inputs"]


def test_export_script_writes_a_file(run_dir, tmp_path, capsys, script):
    out = tmp_path / "actor.pt"
    assert script("export_policy").main(["--checkpoint", str(run_dir), "--format", "torchscript", "--out", str(out)]) == 0
    assert out.is_file() and "instruction_embedding" in capsys.readouterr().out


def test_checkpoint_without_obs_spec_is_refused(run_dir, tmp_path):
    payload = load_checkpoint(run_dir)
    del payload["obs_spec"]
    save_checkpoint(payload, tmp_path, iteration=1)
    with pytest.raises(CheckpointError, match="checkpoint predates obs_spec; re-save it"):
        load_policy(tmp_path)


def test_eval_script_on_cpu_writes_json(run_dir, tmp_path, script):
    out = tmp_path / "eval.json"
    status = script("eval").main([
        "--checkpoint", str(run_dir), "--episodes", "2", "--num-envs", "2", "--device", "cpu", "--json", str(out),
    ])
    assert status == 0
    figures = json.loads(out.read_text())
    assert figures["config"]["device"] == "cpu"
    assert figures["results"]["episodes"] == 2 and 0.0 <= figures["results"]["success"] <= 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_eval_script_refuses_unavailable_cuda(run_dir, capsys, script):
    assert script("eval").main(["--checkpoint", str(run_dir), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA is not available" in err


def test_mlp_actor_is_act_deterministic_without_the_critic():
    policy = policies.load("mlp", {"proprio": (5,), "state": (7,)}, 3, obs_keys=("proprio",))
    obs = TensorDict({"proprio": torch.randn(4, 5) * 3}, batch_size=[4])
    policy.update_normalization(obs)
    actor = policy.actor()
    assert "critic_trunk.0.weight" not in actor.state_dict()
    with torch.no_grad():
        assert torch.equal(actor(*policy.actor_inputs(obs)), policy.act(obs, deterministic=True)["action"])
