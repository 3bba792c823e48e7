"""The tiny transformer, its KV cache, the tasks and the GRPO math."""

import numpy as np
import pytest
import torch

from infra.llm.engine import load_engine
from infra.llm.grpo_trainer import GRPOTrainer, llm_grpo_config
from infra.llm.lm import CharCodec
from infra.llm.model import ModelConfig, TinyCausalLM, sequence_logprobs
from infra.llm.verifiable_tasks import EOS, PAD, VOCAB_SIZE, decode, encode, exact_match, load_task

torch.set_num_threads(1)


def _trained_ish_model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    m = TinyCausalLM(ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, n_heads=2, n_layers=2))
    with torch.no_grad():  # larger weights than the init so that greedy outputs vary across prompts
        for p in m.parameters():
            p.mul_(20.0)
    return m.eval()


def test_cached_generation_equals_uncached_greedy_with_left_padding() -> None:
    model = _trained_ish_model()
    from infra.llm.engine import left_pad

    prompts = [encode("12+7="), encode("s:9031="), encode("3+4=")]
    tokens, mask = left_pad(prompts, PAD)
    cached = model.generate(tokens, mask, 10, eos_id=EOS, temperature=0.0)
    uncached = model.generate(tokens, mask, 10, eos_id=EOS, temperature=0.0, use_cache=False)
    assert torch.equal(cached, uncached)
    # A left-padded row generates what it generates alone.
    alone = model.generate(*left_pad([prompts[2]], PAD), 10, eos_id=EOS, temperature=0.0)
    assert torch.equal(cached[2], alone[0])
    assert len({tuple(r) for r in cached.tolist()}) > 1


def test_sequence_logprobs_match_generation_distribution() -> None:
    model = _trained_ish_model(1)
    from infra.llm.engine import left_pad

    tokens, mask = left_pad([encode("1+2="), encode("s:21=")], PAD)
    comp = model.generate(tokens, mask, 4, eos_id=EOS, temperature=0.0)
    logp = sequence_logprobs(model, tokens, mask, comp)
    full = torch.cat([tokens, comp], 1)
    fmask = torch.cat([mask, torch.ones_like(comp, dtype=torch.bool)], 1)
    # The greedy token is the argmax, so its log-prob is the max over the vocabulary at each step.
    logits = model(full, fmask)[:, tokens.shape[1] - 1 : -1]
    assert torch.allclose(logp, torch.log_softmax(logits, -1).max(-1).values, atol=1e-5)


def test_generation_rejects_overlong_request() -> None:
    model = TinyCausalLM(ModelConfig(vocab_size=VOCAB_SIZE, max_len=8))
    with pytest.raises(ValueError, match="max_len"):
        model.generate(torch.ones(1, 5, dtype=torch.long), torch.ones(1, 5, dtype=torch.bool), 4, eos_id=EOS)


def test_unknown_engine_names_the_adapter_point() -> None:
    with pytest.raises(ValueError, match="register_engine"):
        load_engine("vllm", ModelConfig(kind="char", vocab_size=VOCAB_SIZE))
    with pytest.raises(ValueError, match=r"got model\.kind='char'"):
        load_engine("transformers", ModelConfig(kind="char", vocab_size=VOCAB_SIZE))


@pytest.mark.parametrize(("name", "size"), [("add", 2), ("sort", 4)])
def test_tasks_check_answers_exactly(name: str, size: int) -> None:
    task = load_task(name, size)
    codec = CharCodec()
    for prompt in task.sample(np.random.default_rng(0), 20):
        answer = task.solve(prompt)
        good = codec.encode_answer(answer)
        assert exact_match(prompt, codec.decode(good), answer) == 1.0
        assert exact_match(prompt, codec.decode([*good[:-1], PAD]), answer) == 0.0  # no EOS: a stray token
        assert exact_match(prompt, codec.decode(codec.encode_answer(answer + "1")), answer) == 0.0
        assert decode(good) == (answer, True)
    assert load_task("add", 2).solve("37+85=") == "122"
    assert load_task("sort", 4).solve("s:3141=") == "1134"
    with pytest.raises(ValueError, match="unknown task"):
        load_task("chess", 1)


def test_grpo_update_raises_reward_of_rewarded_completion() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, n_heads=2, n_layers=1)
    trainer = GRPOTrainer(TinyCausalLM(cfg), llm_grpo_config(group_size=4, lr=1e-2, ref_kl_coef=0.0), pad_id=PAD, eos_id=EOS)
    prompts = [encode("s:21=")] * 4
    good, bad = [*encode("12")[1:], EOS], [*encode("21")[1:], EOS]
    comps = [good, bad, good, bad]
    from infra.llm.engine import left_pad

    def logp_good() -> float:
        t, m = left_pad([prompts[0]], PAD)
        return sequence_logprobs(trainer.model, t, m, torch.tensor([good])).sum().item()

    before = logp_good()
    for _ in range(3):
        trainer.update(prompts, comps, [1.0, 0.0, 1.0, 0.0])
    assert logp_good() > before + 0.5
    with pytest.raises(ValueError, match="group_size"):
        trainer.update(prompts[:3], comps[:3], [1.0, 0.0, 1.0])


def test_num_params_matches_the_module() -> None:
    cfg = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, d_model=48, n_heads=3, n_layers=2, max_len=20)
    assert cfg.num_params() == sum(p.numel() for p in TinyCausalLM(cfg).parameters())
