"""Bad inputs get a one-line error before anything is built or written (issue 36, "bounded work, early errors").

Each test names the input, and the old behaviour it replaces is in docs/training.md's table of input errors.
Inputs that used to hang or eat memory are tried where the old code could not start them (a patched
``make_env``, a subprocess with a timeout), so a regression fails instead of taking the machine.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from vla_rl.config import CONFIG_DIR, ConfigError, TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
STATE = CONFIG_DIR / "reach_state_ppo.yaml"
TINY = ["total_env_steps=64", "env.num_envs=2", "ppo.rollout_steps=16", "ppo.optim.num_minibatches=1",
        "ppo.optim.epochs=1", "eval.every=0", "checkpoint_every=1", "log.wandb=disabled", "log.progress=false",
        "log.video=false"]
UNWRITABLE = "/proc/nope"  # refused even to root


def _one_line(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text, text
    return text


# ----------------------------------------------------------------------------- config numbers


def _numbers(cls: type, prefix: str = "") -> list[tuple[str, bool]]:
    """Dotted keys of every numeric field of a config dataclass, with whether it is a tuple."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _numbers(tp, f"{prefix}{f.name}.")
            continue
        args = [a for a in typing.get_args(tp) if a not in (type(None), Ellipsis)] or [tp]
        if typing.get_origin(tp) is tuple and args[0] in (int, float):
            out.append((prefix + f.name, True))
        elif any(a in (int, float) for a in args) and typing.get_origin(tp) is not dict:
            out.append((prefix + f.name, False))
    return out


def _all_numbers() -> list[tuple[str, bool]]:
    import policies

    keys = _numbers(TrainConfig)
    for cls in policies.MODELS.values():
        keys += [(f"policy.{k}", t) for k, t in _numbers(cls) if (f"policy.{k}", t) not in keys]
    return keys


NEGATIVE_OK = {"init_log_std", "policy.head.init_log_std", "fleet.priority"}


@pytest.mark.parametrize(("key", "is_tuple"), _all_numbers(), ids=lambda v: str(v))
def test_nan_and_negative_numbers_are_refused_in_every_config_section(key, is_tuple):
    config = STATE if key == "policy.hidden_sizes" else None  # the MLP's own field
    for bad in (".nan", "-1"):
        if bad == "-1" and key in NEGATIVE_OK:
            continue
        value = f"[{bad}]" if is_tuple else bad
        with pytest.raises(ConfigError) as err:
            load_config(config, [f"{key}={value}"])  # fleet.mode=inprocess: fleet numbers are checked too
        assert key in str(err.value), err.value


# ----------------------------------------------------------------------------- memory


def test_num_envs_beyond_memory_is_refused_before_any_environment(tmp_path, capsys, script, monkeypatch):
    import vla_rl.trainer

    def no_env(*args, **kwargs):
        raise AssertionError("an environment was built")

    monkeypatch.setattr(vla_rl.trainer, "make_env", no_env)
    argv = [f"out_dir={tmp_path}", "env.num_envs=100000000", "log.wandb=disabled"]
    assert script("train").main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    assert "env.num_envs=100000000 needs at least" in err and "lower env.num_envs to at most about" in err
    assert list(tmp_path.iterdir()) == []


def test_memory_estimate_counts_envs_frames_and_buffer_and_names_what_fits():
    from vla_rl.config.train import check_run_memory, estimate_run

    cfg = load_config(None, ["env.num_envs=1000"])
    need, fixed = estimate_run(cfg)
    frame = 3 * 64 * 64
    assert fixed == 2 * 32 * (220 * 1024 + 150 * 1024 + frame)  # two evaluation splits x 32 environments
    assert need.buffer == cfg.ppo.rollout_steps * 1000 * (frame + 512)
    assert need.envs > 1000 * 200_000 and need.frames > 1000 * frame
    check_run_memory(cfg, available=need.total)  # exactly enough: fine
    with pytest.raises(ConfigError, match=r"lower env.num_envs to at most about (\d+)") as err:
        check_run_memory(cfg, available=need.total // 2)
    fits = int(err.value.args[0].rsplit(" ", 1)[-1])
    assert 400 < fits < 500  # half the memory, less the evaluation envs' share
    check_run_memory(load_config(None, [f"env.num_envs={fits}"]), available=need.total // 2)


def test_eval_num_envs_beyond_memory_is_refused(monkeypatch):
    import vla_rl.memory
    from vla_rl.memory import check_memory, estimate_envs

    monkeypatch.setattr(vla_rl.memory, "available_bytes", lambda: 2**30)
    env = load_config(None, []).env
    with pytest.raises(ConfigError, match="num_envs=100000000 needs at least"):
        check_memory(estimate_envs(env, 100_000_000), "num_envs", 100_000_000)


# ----------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("flags", [["--json", f"{UNWRITABLE}/x.json"], ["--video", f"{UNWRITABLE}/v.mp4"],
                                   ["--num-envs", "0"], ["--episodes", "0"]])
def test_eval_refuses_bad_outputs_and_counts_before_evaluating(script, monkeypatch, capsys, flags):
    module = script("eval")
    monkeypatch.setattr(module, "evaluate_checkpoint", lambda *a, **k: pytest.fail("evaluated"))
    with pytest.raises(SystemExit) as stop:
        module.main(["--checkpoint", "runs/x", *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flags[0] in err and (flags[1] in err or "at least 1" in err), err


def test_eval_writes_json_into_new_folders(script, monkeypatch, tmp_path):
    module = script("eval")
    ran = []

    class Result:
        config, seed, frames, steps_per_s = load_config(None, []), 7, [], 1.0

        def report(self):
            return {"success": 0.5, "ci95": [0.1, 0.9], "episodes": 2, "tasks": {}, "instructions": {}}

    monkeypatch.setattr(module, "evaluate_checkpoint", lambda *a, **k: ran.append(1) or Result())
    out = tmp_path / "new" / "dir" / "x.json"
    assert module.main(["--checkpoint", "runs/x", "--json", str(out)]) == 0
    assert ran and out.is_file()


def test_training_into_an_unwritable_out_dir_fails_before_building(tmp_path, capsys, script, monkeypatch):
    import vla_rl.trainer

    monkeypatch.setattr(vla_rl.trainer, "make_env", lambda *a, **k: pytest.fail("an environment was built"))
    assert script("train").main([f"out_dir={UNWRITABLE}", "log.wandb=disabled"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"out_dir='{UNWRITABLE}'" in err and "writable" in err


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        load_config(None, [f"out_dir={tmp_path / 'file'}"]).check()


OUTPUT_FLAGS = {"--json", "--out", "--out-dir", "--video", "--png", "--md"}


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_every_script_checks_its_output_paths_when_parsing(path):
    """Each output option is parsed by ``bench_report.output_path``, which refuses an unwritable path."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            flag = getattr(node.args[0], "value", None)
            if flag in OUTPUT_FLAGS:
                kinds = {k.arg: getattr(k.value, "id", None) for k in node.keywords}
                assert kinds.get("type") == "output_path", f"{path.name} {flag}"


def test_output_path_refuses_unwritable_and_accepts_new_folders(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_report import output_path
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    import argparse

    assert output_path(str(tmp_path / "a" / "b.json")) == tmp_path / "a" / "b.json"
    assert not (tmp_path / "a").exists()  # nothing created by the check
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be written"):
        output_path(f"{UNWRITABLE}/x.json")


# ----------------------------------------------------------------------------- recipe


def test_recipe_validates_every_stage_before_the_demonstrations(tmp_path, monkeypatch, capsys, script):
    import vla_rl.recipe

    monkeypatch.setattr(vla_rl.recipe, "collect_demos", lambda *a, **k: pytest.fail("demonstrations collected"))
    argv = ["--config", str(CONFIG_DIR / "reach_sft_rl.yaml"), "--json", str(tmp_path / "r.json"),
            f"out_dir={tmp_path}", "sft.policy.image_size=32"]
    assert script("sft_rl").main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    assert "recipe stage sft" in err and "policy.image_size=32" in err
    assert list(tmp_path.iterdir()) == []


def test_recipe_with_an_unwritable_out_dir_fails_before_the_demonstrations(tmp_path, monkeypatch):
    import vla_rl.recipe

    monkeypatch.setattr(vla_rl.recipe, "collect_demos", lambda *a, **k: pytest.fail("demonstrations collected"))
    recipe = vla_rl.recipe.load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", [f"out_dir={UNWRITABLE}"])
    with pytest.raises(ConfigError, match="out_dir="):
        vla_rl.recipe.run_recipe(recipe)


@pytest.mark.parametrize("override", ["demos.episodes=0", "demos.noise=.nan", "test.num_envs=-1"])
def test_recipe_numbers_are_checked(override):
    from vla_rl.recipe import load_recipe

    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", [override])


# ----------------------------------------------------------------------------- datasets


def test_truncated_video_in_a_dataset_is_a_one_line_error_naming_it(tmp_path):
    from vla_rl.demos import CollectConfig, DatasetError, DemoDataset, collect

    root = tmp_path / "demos"
    collect.collect_demos(CollectConfig(task="reach", episodes=2, num_envs=2, image_size=16, out=root,
                                        num_threads=1), progress=False)
    video = next((root / "videos").rglob("*.mp4"))
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    with pytest.raises(DatasetError) as err:
        DemoDataset(root)
    message = _one_line(str(err.value))
    assert str(video) in message and "truncated or damaged" in message


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def state_run(tmp_path_factory):
    """Two iterations of the state MLP on reach: a checkpoint whose policy is not a VLA."""
    from vla_rl.trainer import Trainer

    out = tmp_path_factory.mktemp("runs")
    trainer = Trainer(load_config(STATE, [f"out_dir={out}", "name=state", *TINY]))
    trainer.train()
    trainer.close()
    return out / "state"


def test_state_checkpoint_init_from_into_a_vla_is_one_line(state_run, tmp_path, capsys, script):
    argv = [f"out_dir={tmp_path}", f"init_from={state_run}", "log.wandb=disabled", "env.num_envs=2"]
    assert script("train").main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    assert "holds a 'mlp' policy and this run's policy.name='vla'" in err


def test_checkpoint_of_another_shape_is_one_line(state_run, tmp_path, capsys, script):
    argv = ["--config", str(STATE), f"out_dir={tmp_path}", f"init_from={state_run}", "policy.hidden_sizes=[32]",
            *TINY]
    assert script("train").main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    assert "of another shape (first:" in err and len(err) < 400


def test_moved_run_directory_resumes(state_run, tmp_path):
    from vla_rl.trainer import Trainer

    moved = tmp_path / "elsewhere"
    shutil.copytree(state_run, moved / "renamed")
    (moved / "renamed" / "summary.json").unlink()  # as if it had stopped before its end
    cfg = load_config(STATE, [f"out_dir={moved}", "name=renamed", *TINY, "total_env_steps=96"])
    trainer = Trainer(cfg, resume=True)
    try:
        assert trainer.iteration == 2
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["iterations"] == 3 and (moved / "renamed" / "summary.json").is_file()


def test_paths_inside_the_run_directory_move_with_it():
    from vla_rl.config import run_relative

    a = {"out_dir": "/old/recipe", "init_from": "/old/recipe/sft", "sft": {"dataset": "/old/recipe/demos"}}
    b = {"out_dir": "/new/place", "init_from": "/new/place/sft", "sft": {"dataset": "/new/place/demos"}}
    assert run_relative(a) == {**run_relative(b), "out_dir": "/old/recipe"}
    assert run_relative({"out_dir": "/x", "init_from": "/y/ckpt"})["init_from"] == "/y/ckpt"  # outside: kept


# ----------------------------------------------------------------------------- trace replay

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,32000,65536,0,\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,500,\np1,2000,2048,1,1000,\n"


def _replay(tmp_path: Path, script, nodes: str = NODES, pods: str = PODS, *extra: str) -> int:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text(pods)
    argv = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--seeds", "1",
            "--policies", "bestfit", *extra]
    return script("replay_trace").main(argv)


@pytest.mark.parametrize("inflate", ["nan", "inf", "0.5", "1e9"])
def test_replay_inflate_out_of_range_is_refused(tmp_path, script, capsys, inflate):
    with pytest.raises(SystemExit) as stop:
        _replay(tmp_path, script, NODES, PODS, "--inflate", inflate)
    assert stop.value.code == 2 and "--inflate" in capsys.readouterr().err


@pytest.mark.parametrize(("nodes", "pods", "message"), [
    (NODES, PODS.replace("p1,2000", "p1,abc"), "pods.csv:3: cpu_milli='abc' is not an integer"),
    (NODES, PODS.replace("p0,1000,1024,1", "p0,1000,1024,-3"), "pods.csv:2: num_gpu=-3 must be at least 0"),
    (NODES.replace("2,T4", "2,"), PODS, "nodes.csv:2: gpu=2 but no model"),
    (NODES.replace(",2,T4", ""), PODS, "nodes.csv:2: the row has no value for ['gpu', 'model']"),
], ids=["cpu_milli=abc", "num_gpu=-3", "gpus without model", "short row"])
def test_replay_row_errors_name_the_file_and_row(tmp_path, script, capsys, nodes, pods, message):
    assert _replay(tmp_path, script, nodes, pods) == 2
    assert message in _one_line(capsys.readouterr().err)


def test_replay_runs_on_good_files(tmp_path, script):
    assert _replay(tmp_path, script, NODES, PODS, "--inflate", "1.3") == 0


@pytest.mark.parametrize(("pods", "inflate"), [
    (PODS, math.nan), (PODS.replace(",1,500,", ",0,0,").replace(",1,1000,", ",0,0,"), 1.3),
], ids=["inflate nan", "no GPU pods"])
def test_arrival_sequence_refuses_what_would_never_end(tmp_path, pods, inflate):
    (tmp_path / "pods.csv").write_text(pods)
    code = ("from infra.replay.trace import read_pods, arrival_sequence\n"
            f"try:\n    arrival_sequence(read_pods({str(tmp_path / 'pods.csv')!r}), 2000, float({str(inflate)!r}), 0)\n"
            "except ValueError as exc:\n    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("refused:"), done.stdout + done.stderr


def test_fleet_numbers_checked_without_a_fleet():
    with pytest.raises(ConfigError, match=r"fleet.trainer.cpus=nan"):
        load_config(None, ["fleet.trainer.cpus=.nan"])
    assert np.isfinite(load_config(None, []).fleet.grace_s)
