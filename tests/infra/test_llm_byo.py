"""Bring your own model, data and reward: a tiny Hugging Face model, a JSONL/parquet file, a
``module:function`` reward, and the one command that trains them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra.common.typed_config import ConfigError, apply_overrides
from infra.llm.data import DataConfig, load_examples
from infra.llm.engine import left_pad, load_engine
from infra.llm.grpo_trainer import GRPOTrainer, llm_grpo_config
from infra.llm.lm import build_model, load_codec
from infra.llm.model import ModelConfig
from infra.llm.reward import RewardRunner, check_reward, resolve_reward
from infra.llm.rlvr import RLVRConfig

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from llm_tiny_model import make_tiny_hf  # noqa: E402  (the script that writes a tiny model folder)

REWARDS = '''
import os, time

def exact(prompt, completion, answer):
    print("a reward that prints does not disturb the protocol")
    return completion.strip() == answer.strip()

def flaky(prompt, completion, answer):
    if prompt.startswith("boom"):
        raise RuntimeError("no answer for " + prompt)
    if prompt.startswith("slow"):
        time.sleep(60)
    if prompt.startswith("text"):
        return "high"
    if prompt.startswith("die"):
        os._exit(3)
    return float(completion.strip() == answer.strip())

def two_args(prompt, completion):
    return 0.0
'''


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture
def rewards(tmp_path, monkeypatch) -> str:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def _sharpened(cfg: ModelConfig):
    model = build_model(cfg, 0).eval()
    with torch.no_grad():  # larger weights than the init so that greedy outputs vary across prompts
        for p in model.parameters():
            p.mul_(4.0)
    return model


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hf_generation_is_cached_left_padded_seeded_and_stops_at_eos(tmp_path, arch) -> None:
    cfg = ModelConfig(path=str(make_tiny_hf(tmp_path, arch)))
    codec, model = load_codec(cfg), _sharpened(cfg)
    prompts = [codec.encode("12+7="), codec.encode("s:9031="), codec.encode("3+4=")]
    tokens, mask = left_pad(prompts, codec.pad_id)
    cached = model.generate(tokens, mask, 10, eos_id=codec.eos_id, temperature=0.0)
    assert torch.equal(cached, model.generate(tokens, mask, 10, eos_id=codec.eos_id, temperature=0.0, use_cache=False))
    alone = model.generate(*left_pad([prompts[2]], codec.pad_id), 10, eos_id=codec.eos_id, temperature=0.0)
    assert torch.equal(cached[2], alone[0])  # a left-padded row generates what it generates alone
    assert len({tuple(r) for r in cached.tolist()}) > 1

    many, many_mask = left_pad(prompts * 8, codec.pad_id)
    def draw(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return model.generate(many, many_mask, 12, eos_id=codec.eos_id, temperature=1.0, generator=gen)
    first = draw(3)
    assert torch.equal(first, draw(3)) and not torch.equal(first, draw(4))
    stopped = 0
    for row in first.tolist():
        if codec.eos_id in row:
            stopped += 1
            assert set(row[row.index(codec.eos_id):]) == {codec.eos_id}
    assert stopped > 0
    # The greedy token is the argmax, so its log-prob is the max over the vocabulary at each step.
    logp = model.logprobs(tokens, mask, cached)
    full_mask = torch.cat([mask, torch.ones_like(cached, dtype=torch.bool)], 1)
    logits = model._logits(torch.cat([tokens, cached], 1), full_mask)[:, tokens.shape[1] - 1 : -1]
    assert torch.allclose(logp, torch.log_softmax(logits, -1).max(-1).values, atol=1e-5)


def test_hf_trainer_and_engine_share_weights_and_grpo_moves_the_policy(hf_dir) -> None:
    cfg = ModelConfig(path=str(hf_dir))
    codec = load_codec(cfg)
    trainer = GRPOTrainer.from_config(cfg, llm_grpo_config(group_size=4, lr=3e-2), seed=0)
    prompts = [codec.encode("2+1=")] * 4
    good, bad = codec.encode_answer("3"), codec.encode_answer("21")
    comps = [good, bad, good, bad]
    p_tok, p_mask = left_pad(prompts[:1], codec.pad_id)

    def logp_good() -> float:
        return trainer.model.logprobs(p_tok, p_mask, torch.tensor([good])).sum().item()

    before = logp_good()
    for _ in range(5):
        trainer.update(prompts, comps, [1.0, 0.0, 1.0, 0.0])
    assert logp_good() > before + 2.0 and trainer.version == 5
    # The reference stays the loaded model; the engine (the default for an hf model) serves the new weights.
    ref_logp = trainer.ref.logprobs(p_tok, p_mask, torch.tensor([good])).sum().item()
    assert ref_logp == pytest.approx(before, abs=1e-5)
    engine = load_engine(None, cfg)
    engine.load_weights(trainer.model.state_dict())
    want = trainer.model.generate(p_tok, p_mask, 4, eos_id=codec.eos_id, temperature=0.0)
    got = engine.generate(prompts[:1], 4, temperature=0.0, seed=0)[0]
    assert got == want[0].tolist()[: len(got)] and got[0] == good[0]


def test_data_files_gsm8k_style_and_their_errors(tmp_path) -> None:
    rows = [{"question": "1+1=", "answer": "one and one #### 2"}, {"question": "2+2=", "answer": "#### 4"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    cfg = DataConfig(prompt_template="Q: {} A:")
    for path in (jsonl, tmp_path / "d.parquet"):
        examples = load_examples(str(path), cfg)
        assert [(e.prompt, e.answer) for e in examples] == [("Q: 1+1= A:", "2"), ("Q: 2+2= A:", "4")]
    renamed = tmp_path / "r.jsonl"
    renamed.write_text(json.dumps({"q": "x", "a": 7}) + "\n")
    assert load_examples(str(renamed), DataConfig(prompt_field="q", answer_field="a", answer_delimiter=""))[0].answer == "7"

    bad = tmp_path / "bad.jsonl"
    cases = [
        ('{"question": "x", "answer": "#### 1"}\n{"question": \n', r"line 2 is not valid JSON"),
        ('{"prompt": "x", "answer": "#### 1"}\n', r"row 1 has no field 'question' \(it has \['answer', 'prompt'\]\)"),
        ('{"question": "x", "answer": "1"}\n', r"row 1: its 'answer' has no '####'"),
        ('["x", "1"]\n', r"row 1 is a list, not an object"),
        ('{"question": null, "answer": "#### 1"}\n', r"field 'question' is None"),
        ("\n", r"has no rows"),
    ]
    for text, message in cases:
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_examples(str(bad), DataConfig())
    with pytest.raises(ValueError, match=r"unknown format; use one of \['.jsonl', '.json', '.parquet'\]"):
        load_examples(str(tmp_path / "d.csv"), DataConfig())
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        load_examples(str(tmp_path / "broken.parquet"), DataConfig())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.path=prompts.csv"], r"^data.path='prompts.csv' has an unknown format; use one of \['.jsonl'"),
        (["data.path=a.jsonl", "data.eval_path=b.txt"], r"^data.eval_path='b.txt' has an unknown format"),
        (["data.eval_path=b.jsonl"], r"^data.eval_path='b.jsonl' holds out rows of a file but data.path is empty"),
        (["data.prompt_field="], r"^data.prompt_field is empty; name the field"),
        (["data.answer_field="], r"^data.answer_field is empty"),
        (["data.prompt_template=Question"], r"^data.prompt_template='Question' has no '\{\}' where the prompt goes"),
    ],
)
def test_a_data_section_is_checked_where_it_enters(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_overrides(RLVRConfig(), overrides)
    assert apply_overrides(RLVRConfig(), ["data.path=a.parquet", "data.eval_path=b.jsonl"]).data.eval_path == "b.jsonl"
    with pytest.raises(ConfigError, match=r"^data.prompt_template='Q:'"):  # hand-built: load_examples checks it
        load_examples("a.jsonl", DataConfig(prompt_template="Q:"))


def test_reward_specs_are_checked_before_anything_runs(rewards) -> None:
    assert resolve_reward(f"{rewards}:exact")("p", " 3 ", "3") is True
    for spec, message in [
        ("my_rewards", r"is not 'module:function'"),
        ("no_such_module_xyz:f", r"module 'no_such_module_xyz' cannot be imported \(ModuleNotFoundError.*"
                                 r"or give its file \(reward=path/to/file.py:f\)"),
        (f"{rewards}:missing", r"my_rewards has no function 'missing'"),
        (f"{rewards}:two_args", r"two_args\(prompt, completion\) cannot be called as two_args\(prompt, completion, answer\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolve_reward(spec)


def test_a_reward_file_is_named_by_its_path(tmp_path, monkeypatch) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "json.py").write_text("def score(prompt, completion, answer):\n    return len(answer)\n")
    (tmp_path / "mine" / "broken.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.chdir(tmp_path)  # a relative path is read from the working directory
    assert resolve_reward("mine/json.py:score")("p", "c", "abc") == 3
    assert resolve_reward(f"{tmp_path / 'mine' / 'json.py'}:score")("p", "c", "ab") == 2
    assert json.dumps([1]) == "[1]" and sys.modules["json"] is json  # the file named json.py shadows nothing
    check_reward("mine/json.py:score", import_timeout_s=60)  # the worker process finds it the same way
    for spec, message in [
        ("mine/none.py:score", rf"there is no file mine/none.py \(from the working directory {tmp_path}\)"),
        ("mine/broken.py:score", r"file 'mine/broken.py' cannot be imported \(RuntimeError: half written\); fix the file"),
        ("mine/json.py:missing", r"mine/json.py has no function 'missing'"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolve_reward(spec)


def test_rewards_that_raise_time_out_or_crash_score_zero_and_are_counted(rewards) -> None:
    runner = RewardRunner(f"{rewards}:flaky", timeout_s=1.0)
    try:
        prompts = ["ok", "boom1", "ok", "slow", "ok", "text", "die", "ok"]
        batch = runner.score(prompts, ["3", "3", "4", "3", "3", "3", "3", " 3"], ["3"] * 8)
        assert batch.scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
        assert (batch.errors, batch.timeouts) == (3, 1)  # boom raises, "high" is no number, die kills the worker
        assert batch.first_error == "reward my_rewards:flaky raised RuntimeError: no answer for boom1"
        assert runner.restarts == 2  # after the timeout and after the death; later calls still scored
        assert runner.score(["ok"], ["3"], ["3"]).scores == [1.0]
    finally:
        runner.close()


def _user_files(tmp_path: Path, n: int = 24) -> tuple[Path, Path, Path]:
    model = make_tiny_hf(tmp_path / "user_model", "gpt2")
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    rows = [{"question": f"{a}+{b}=", "answer": f"{a} plus {b} #### {a + b}"} for a in range(5) for b in range(5)][:n]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [*rows[:4], {"question": "boom", "answer": "#### 1"}, {"question": "slow", "answer": "#### 1"}]
    held_out.write_text("".join(json.dumps(r) + "\n" for r in held))
    return model, train, held_out


def test_config_errors_name_the_problem_before_anything_runs(tmp_path, rewards) -> None:
    model, train, _ = _user_files(tmp_path)
    base = [f"model.path={model}", f"data.path={train}", f"reward={rewards}:exact", "eval_prompts=4"]
    apply_overrides(RLVRConfig(), base).check()
    for extra, message in [
        ([f"model.path={tmp_path}"], r"has no config.json"),
        ([f"reward={rewards}:two_args"], r"cannot be called as two_args\(prompt, completion, answer\)"),
        (["eval_prompts=30"], r"has 24 rows, too few to hold out eval_prompts=30"),
        (["max_new_tokens=60"], r"need \d+ tokens but the model has 64 positions"),
        (["reward_timeout_s=0"], r"reward_timeout_s=0.0 must be > 0"),
        (["device=tpu"], r"device='tpu'; choose auto, cpu, cuda or cuda:N"),
        (["model.kind=char", "data.prompt_template=Q{}"], r"not in the task vocabulary .* use model.kind=hf"),
    ]:
        with pytest.raises(ValueError, match=message):
            apply_overrides(RLVRConfig(), [*base, *extra]).check()


@pytest.mark.timeout(300)
def test_one_command_trains_a_users_hf_model_on_a_users_data(tmp_path, rewards) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, train, held_out = _user_files(tmp_path)
    cmd = [sys.executable, str(ROOT / "scripts" / "llm_rlvr.py"), f"model.path={model}", f"data.path={train}",
           f"reward={rewards}:flaky", f"data.eval_path={held_out}", "reward_timeout_s=10", "iterations=3",
           "prompts_per_iter=4", "grpo.group_size=4", "warmup_steps=4", "warmup_batch=8", "eval_prompts=6",
           "eval_every=10", "threads=1", "checkpoint_every=0", "name=byo", f"out_dir={tmp_path / 'runs'}"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "runs" / "byo"
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(done.stdout)["eval_greedy_accuracy_end"] == summary["eval_greedy_accuracy_end"]
    assert 0.0 <= summary["eval_greedy_accuracy_start"] <= 1.0 and 0.0 <= summary["eval_greedy_accuracy_end"] <= 1.0
    # Two greedy evaluations (start, end), each with one raising and one hanging held-out prompt.
    assert (summary["reward_errors"], summary["reward_timeouts"]) == (2, 2)
    assert "1 reward calls failed, 1 timed out (scored 0); first: reward my_rewards:flaky raised" in done.stderr
    loaded = AutoModelForCausalLM.from_pretrained(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert tokenizer.eos_token == "<eos>" and loaded.config.model_type == "gpt2"
    start = AutoModelForCausalLM.from_pretrained(model)
    moved = [not torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), start.state_dict().values())]
    assert any(moved)  # the saved weights are the trained ones, not the user's original



@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_config_runs_on_ray_services(tmp_path, rewards, monkeypatch) -> None:
    import ray
    from transformers import AutoModelForCausalLM

    from infra.llm.rlvr import run_rlvr
    from infra.ray_cluster.realize import node_labels
    from infra.scheduler import Node

    monkeypatch.chdir(tmp_path)  # the reward module sits in the working directory, as a user's would
    model, train, held_out = _user_files(tmp_path)
    cfg = apply_overrides(RLVRConfig(), [
        f"model.path={model}", f"data.path={train}", f"data.eval_path={held_out}", f"reward={rewards}:flaky",
        "reward_timeout_s=10", "iterations=2", "prompts_per_iter=4", "grpo.group_size=4", "warmup_steps=2", "warmup_batch=8",
        "eval_prompts=6", "eval_every=10", "threads=1", "checkpoint_every=0", "name=byo_ray", f"out_dir={tmp_path}",
        "ray=true"])
    node = Node("local", cpu_milli=4000, memory_mib=8192)
    ray.init(address="local", num_cpus=4, labels=node_labels(node), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        summary = run_rlvr(cfg)
    finally:
        ray.shutdown()
    # The reward ran in the Ray reward service's worker process: the same failures, counted the same way.
    assert (summary["reward_errors"], summary["reward_timeouts"]) == (2, 2)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "byo_ray" / "model").config.model_type == "gpt2"
