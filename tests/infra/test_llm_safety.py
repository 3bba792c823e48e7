"""LLM jobs that keep their work (issue 36 item 4) and refuse bad sampling input early (item 5).

Each test reproduces one fault or input on the tiny character model: the same run name again, a
model save killed midway, a reward of 1e308, a trainer call that makes the weights NaN, reward
calls that mostly fail, a reward module whose import hangs or is slow, a reward that reads stdin
and prints to stdout, and sampling fields out of range.
"""

import importlib.util
import os
import time
from pathlib import Path

import pytest

from infra.common.runlog import read_metrics
from infra.common.typed_config import apply_overrides
from infra.llm import trainer_checkpoint as ckpt
from infra.llm.grpo_trainer import llm_grpo_config
from infra.llm.model import ModelConfig
from infra.llm.reward import RewardRunner
from infra.llm.rlvr import RLVRConfig, run_rlvr, save_model
from infra.llm.service_actors import JobStopped, TrainerService
from infra.llm.trainer_checkpoint import CheckpointError, CheckpointSpec
from infra.llm.verifiable_tasks import VOCAB_SIZE

ROOT = Path(__file__).resolve().parents[2]
SMALL = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)
TINY = ["model.kind=char", "model.max_len=16", "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "task=sort",
        "task_size=3", "seed=5", "iterations=3", "prompts_per_iter=4", "grpo.group_size=4", "warmup_steps=2",
        "warmup_batch=8", "eval_prompts=8", "eval_every=2", "threads=1"]
"""A job of a few seconds: 2 warm-up steps, 3 GRPO iterations of 16 completions."""

REWARDS = '''
import os, sys, time
print("reward module imported")  # a print at import time
if os.environ.get("SLOW_IMPORT_S"):
    time.sleep(float(os.environ["SLOW_IMPORT_S"]))

def huge(prompt, completion, answer):
    return 1e308

def broken(prompt, completion, answer):
    raise RuntimeError("no scorer")

def noisy(prompt, completion, answer):
    print('{"score": 99.0}')             # protocol-shaped text on stdout
    os.write(1, b"not json at all\\n")   # raw bytes on file descriptor 1
    sys.stdin.read()                     # reads stdin to its end
    return 1.0
'''


@pytest.fixture
def rewards(tmp_path, monkeypatch) -> str:
    (tmp_path / "job_rewards.py").write_text(REWARDS)
    (tmp_path / "hanging_rewards.py").write_text("import time\ntime.sleep(120)\ndef r(p, c, a):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "job_rewards"


def _cfg(tmp_path: Path, *extra: str) -> RLVRConfig:
    return apply_overrides(RLVRConfig(), [*TINY, f"out_dir={tmp_path / 'runs'}", "name=job", *extra])


def _script_main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("llm_rlvr_script", ROOT / "scripts" / "llm_rlvr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def _metrics(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


# ---------------------------------------------------------------- same name again, resume


@pytest.mark.timeout(240)
def test_the_same_name_again_is_refused_and_resume_continues_as_if_never_stopped(tmp_path, monkeypatch) -> None:
    from infra.llm import rlvr

    reference = run_rlvr(_cfg(tmp_path / "ref"))
    cfg = _cfg(tmp_path)
    real_score, calls = rlvr.score, []

    def dies_in_iteration_1(*args, **kwargs):  # scores: eval 0, iteration 0, then the driver dies
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_score(*args, **kwargs)

    monkeypatch.setattr(rlvr, "score", dies_in_iteration_1)
    with pytest.raises(KeyboardInterrupt):
        run_rlvr(cfg)
    monkeypatch.setattr(rlvr, "score", real_score)
    path = ckpt.checkpoint_path(rlvr.checkpoint_spec(cfg).dir)
    kept = path.read_bytes()
    assert ckpt.read_info(path.parent, "job").step == 2 + 1 + 1  # warm-up, its end, iteration 0's update

    with pytest.raises(ValueError, match=r"run 'job' already exists .*pass resume=true") as again:
        run_rlvr(cfg)
    assert "\n" not in str(again.value) and path.read_bytes() == kept  # nothing overwritten
    with pytest.raises(ValueError, match=r"resume=true but \['seed'\] differ"):
        run_rlvr(_cfg(tmp_path, "resume=true", "seed=6"))
    with pytest.raises(ValueError, match="holds no trainer checkpoint"):
        run_rlvr(_cfg(tmp_path, "resume=true", "name=other"))

    resumed = run_rlvr(_cfg(tmp_path, "resume=true"))
    out, ref_out = Path(resumed["out_dir"]), Path(reference["out_dir"])
    # The remaining iterations ran as they would have without the interruption: same rows, same model.
    assert _metrics(read_metrics(out)) == _metrics(read_metrics(ref_out))
    assert [r["iteration"] for r in read_metrics(out)] == [0, 1, 2, 3]
    assert (out / "model" / "model.safetensors").read_bytes() == (ref_out / "model" / "model.safetensors").read_bytes()
    assert ckpt.read_info(path.parent, "job").step == 2 + 1 + 3
    # The run directory has the VLA trainer's layout (infra.common.runlog), plus the job's model; no frames, no videos/.
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.csv", "model", "summary.json"]


def test_a_trainer_never_overwrites_a_checkpoint_with_a_fresh_registration(tmp_path) -> None:
    spec = CheckpointSpec(str(tmp_path / "j"))
    svc = TrainerService()
    svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec)
    svc.supervised("j", [[4, 5, 6]], [[7, 2]], 0)
    kept = ckpt.checkpoint_path(spec.dir).read_bytes()
    with pytest.raises(CheckpointError, match=r"already holds a trainer checkpoint.*resume=true") as err:
        TrainerService().register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec)
    assert "\n" not in str(err.value) and ckpt.checkpoint_path(spec.dir).read_bytes() == kept
    assert TrainerService().register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec, resume=True) == 1


# ---------------------------------------------------------------- atomic model saves


def test_a_model_save_that_dies_midway_leaves_the_previous_model(tmp_path, monkeypatch) -> None:
    cfg = _cfg(tmp_path)
    from infra.llm.lm import build_model

    first = build_model(cfg.model, 0).state_dict()
    save_model(tmp_path / "model", cfg, first)
    before = {f.name: f.read_bytes() for f in (tmp_path / "model").iterdir()}

    def dies(*args, **kwargs):  # the process is killed at the first rename of the save
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(OSError, match="killed"):
        save_model(tmp_path / "model", cfg, build_model(cfg.model, 1).state_dict())
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in (tmp_path / "model").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging folder or temporary file left

    nan = {k: v.clone().fill_(float("nan")) if v.is_floating_point() else v for k, v in first.items()}
    with pytest.raises(JobStopped, match=r"not finite; the model in .* was left as it was"):
        save_model(tmp_path / "model", cfg, nan)
    assert {f.name: f.read_bytes() for f in (tmp_path / "model").iterdir()} == before


# ---------------------------------------------------------------- non-finite rewards, losses, weights


@pytest.mark.timeout(120)
def test_a_reward_of_1e308_stops_the_job_nonzero_before_anything_is_saved(tmp_path, rewards, capsys) -> None:
    code = _script_main([*TINY, f"out_dir={tmp_path}", "name=job", f"reward={rewards}:huge"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert err.startswith("error: job 'job' iteration 0: the reward returned values up to 1e+308") and "Scale" in err
    assert not (tmp_path / "job" / "model").exists()
    # The checkpoint holds the last finite state: the warm-up and its end, no GRPO update.
    assert ckpt.read_info(tmp_path / "job" / "checkpoints", "job").step == 2 + 1


def test_a_trainer_call_that_makes_the_weights_nan_raises_and_keeps_the_last_checkpoint(tmp_path) -> None:
    spec = CheckpointSpec(str(tmp_path / "j"))
    svc = TrainerService()
    svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec)
    prompts, comps = [[4, 5, 6]] * 8, [[7, 8, 2]] * 8
    svc.train("j", prompts, comps, [1.0, 0.0, 0.0, 1.0] * 2, 0)
    kept = ckpt.checkpoint_path(spec.dir).read_bytes()
    # A caller that skips the driver's reward check: the update itself goes NaN.
    with pytest.raises(JobStopped, match=r"train \(state-changing call 1\) made the loss or weights non-finite"):
        svc.train("j", prompts, comps, [1e308, 0.0, 0.0, 1.0] * 2, 1)
    assert ckpt.checkpoint_path(spec.dir).read_bytes() == kept
    assert ckpt.read_info(spec.dir, "j").step == 1


# ---------------------------------------------------------------- failing, hanging and noisy rewards


@pytest.mark.timeout(120)
def test_a_job_whose_reward_calls_mostly_fail_exits_nonzero(tmp_path, rewards, capsys) -> None:
    code = _script_main([*TINY, f"out_dir={tmp_path}", "name=job", f"reward={rewards}:broken"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert err.startswith("error: job 'job': 24 of its 24 reward calls failed, more than reward_max_failed_share=0.5")
    assert "raised RuntimeError: no scorer" in err
    assert not (tmp_path / "job" / "model").exists()


@pytest.mark.timeout(60)
def test_a_reward_whose_import_hangs_is_a_one_line_error_within_the_import_limit(tmp_path, rewards) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"did not finish importing within reward_import_timeout_s=2\.0 s") as err:
        _cfg(tmp_path, "reward=hanging_rewards:r", "reward_import_timeout_s=2").check()
    assert time.monotonic() - start < 30 and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(60)
def test_a_reward_import_slower_than_the_call_limit_is_waited_for_once(rewards, monkeypatch) -> None:
    monkeypatch.setenv("SLOW_IMPORT_S", "2")
    runner = RewardRunner(f"{rewards}:noisy", timeout_s=0.5, import_timeout_s=30)
    try:
        batch = runner.score(["p"] * 4, ["c"] * 4, ["a"] * 4)
        assert (batch.scores, batch.errors, batch.timeouts) == ([1.0] * 4, 0, 0)
        assert runner.restarts == 0 and runner.import_s >= 2
    finally:
        runner.close()


@pytest.mark.timeout(60)
def test_a_reward_that_prints_and_reads_stdin_does_not_touch_the_protocol(rewards) -> None:
    runner = RewardRunner(f"{rewards}:noisy", timeout_s=5)
    try:
        batch = runner.score(["p1", "p2", "p3"], ["c"] * 3, ["a"] * 3)
        assert (batch.scores, batch.errors, batch.timeouts, runner.restarts) == ([1.0] * 3, 0, 0, 0)
    finally:
        runner.close()


# ---------------------------------------------------------------- sampling fields, memory


def test_sampling_and_reward_fields_are_range_checked_before_anything_is_created(tmp_path, capsys) -> None:
    for extra, message in [
        ("temperature=-1", r"temperature=-1.0 must be a finite number >= 0"),
        ("temperature=.nan", r"temperature=nan must be a finite number >= 0"),
        ("temperature=.inf", r"temperature=inf must be a finite number >= 0"),
        ("max_new_tokens=-1", r"max_new_tokens=-1 must be >= 0"),
        ("prompts_per_iter=0", r"prompts_per_iter=0 must be >= 1"),
        ("seed=-1", r"seed=-1 must be >= 0"),
        ("warmup_steps=-1", r"warmup_steps=-1 must be >= 0"),
        ("reward_timeout_s=.nan", r"reward_timeout_s=nan must be > 0"),
        ("reward_import_timeout_s=0", r"reward_import_timeout_s=0.0 must be > 0"),
        ("reward_max_failed_share=.nan", r"reward_max_failed_share=nan must be in \[0, 1\]"),
        ("reward_max_failed_share=1.5", r"reward_max_failed_share=1.5 must be in \[0, 1\]"),
        ("prompts_per_iter=100000000", r"prompts_per_iter=100000000 x grpo.group_size=4 = 400000000 sequences of up "
                                       r"to \d+ tokens need at least [\d.]+ GiB .* but this machine has [\d.]+ GiB; "
                                       r"lower prompts_per_iter to at most \d+"),
        ("eval_prompts=100000000", r"eval_prompts=100000000 = 100000000 sequences .* lower eval_prompts to at most"),
    ]:
        with pytest.raises(ValueError, match=message) as err:
            _cfg(tmp_path, extra).check()
        assert "\n" not in str(err.value)
    assert _script_main([*TINY, f"out_dir={tmp_path / 'runs'}", "temperature=.nan"]) == 2
    assert "error: temperature=nan" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any file or service was created
