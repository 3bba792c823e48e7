"""VLA policy: shapes for every head and fusion, act/evaluate agreement, the frozen cached language
encoder, input errors, and a supervised learning test where language must steer vision."""

import policy_synthetic as synthetic
import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

import policies
from policies import ActionHeadConfig, SentenceCache, VLAConfig, VLAPolicy

SPEC = {"rgb": (2, 3, 32, 32), "proprio": (5,), "instruction": ()}
INSTRUCTIONS = ["pick up the red cube", "push the blue block left", "open the drawer"]


def _fake_sentences() -> SentenceCache:
    """A deterministic stand-in for MiniLM (the real one is exercised by the cache and learning tests)."""

    def encode(strings: list[str]) -> torch.Tensor:
        g = torch.Generator().manual_seed(sum(map(ord, "".join(strings))))
        return F.normalize(torch.randn(len(strings), 384, generator=g), dim=-1)

    return SentenceCache(encode)


def _obs(n: int = 6, size: int = 32) -> TensorDict:
    return TensorDict(
        {
            "rgb": torch.randint(0, 256, (n, 2, 3, size, size), dtype=torch.uint8),
            "proprio": torch.randn(n, 5),
            "instruction": torch.randint(0, len(INSTRUCTIONS), (n,)),
        },
        batch_size=[n],
    )


def _policy(**overrides) -> VLAPolicy:
    cfg = VLAConfig(image_size=32, conv_channels=(8, 16), width=32, trunk_sizes=(32,), **overrides)
    policy = VLAPolicy(cfg, SPEC, action_dim=3, sentences=_fake_sentences())
    policy.set_instructions(INSTRUCTIONS)
    return policy


@pytest.mark.parametrize(("kind", "chunk"), [("gaussian", 1), ("gaussian", 4), ("binned", 1), ("binned", 2)])
def test_shapes_and_act_evaluate_agree(kind: str, chunk: int) -> None:
    torch.manual_seed(0)
    policy = _policy(head=ActionHeadConfig(kind=kind, chunk=chunk, bins=11))
    obs = _obs()
    out = policy.act(obs)
    assert out["action"].shape == ((6, 3) if chunk == 1 else (6, chunk, 3))
    assert out["log_prob"].shape == out["value"].shape == (6,)
    log_prob, entropy, value = policy.evaluate_actions(obs, out["action"])
    assert torch.allclose(log_prob, out["log_prob"], atol=1e-5)
    assert torch.allclose(value, policy.value(obs), atol=1e-6)
    assert entropy.shape == (6,) and torch.isfinite(entropy).all()
    (-log_prob.mean() - 0.01 * entropy.mean() + value.square().mean()).backward()
    missing = [name for name, p in policy.named_parameters() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"


def test_images_of_another_size_are_resized_and_proprio_is_optional() -> None:
    policy = VLAPolicy(
        VLAConfig(image_size=32, conv_channels=(8, 16), width=32, trunk_sizes=(32,), proprio_key=""),
        {"rgb": (2, 3, 64, 64)},
        action_dim=3,
        sentences=_fake_sentences(),
    )
    policy.set_instructions(INSTRUCTIONS)
    obs = _obs(size=64).exclude("proprio")
    assert policy.act(obs)["action"].shape == (6, 3)


def test_language_encoder_runs_once_per_string_and_gets_no_gradient() -> None:
    sentences = SentenceCache()  # the real, bundled MiniLM
    policy = VLAPolicy(
        VLAConfig(image_size=32, conv_channels=(8, 16), width=32), SPEC, 3, sentences=sentences
    )
    policy.set_instructions(INSTRUCTIONS + INSTRUCTIONS[:1])
    first = policy.instruction_embeddings.clone()
    policy.set_instructions(INSTRUCTIONS[::-1])
    other = VLAPolicy(VLAConfig(image_size=32, conv_channels=(8, 16), width=32), SPEC, 3, sentences=sentences)
    other.set_instructions(INSTRUCTIONS)
    assert dict(sentences.encoded) == dict.fromkeys(INSTRUCTIONS, 1)
    assert first.shape == (4, 384) and torch.allclose(first.norm(dim=-1), torch.ones(4), atol=1e-4)
    assert torch.equal(policy.instruction_embeddings, first[:3].flip(0))
    # Paraphrases land closer to each other than to another task (the embeddings are real MiniLM ones).
    red, blue, drawer = sentences(["pick up the red cube", "grab the red block", "open the drawer"])
    assert red @ blue > red @ drawer

    obs = _obs()
    log_prob, _, value = policy.evaluate_actions(obs, torch.zeros(6, 3))
    (log_prob.sum() + value.sum()).backward()
    assert not policy.instruction_embeddings.requires_grad and policy.instruction_embeddings.grad is None
    assert all(p.numel() != 22_713_216 for p in policy.parameters())
    assert not any("instruction_embeddings" in k for k in policy.state_dict())
    assert sum(p.numel() for p in policy.parameters()) < 2_000_000  # MiniLM (22.7M) is not a parameter


def test_bad_inputs_name_the_problem() -> None:
    policy = VLAPolicy(VLAConfig(image_size=32, conv_channels=(8, 16)), SPEC, 3, sentences=_fake_sentences())
    with pytest.raises(RuntimeError, match="set_instructions"):
        policy.act(_obs())
    policy.set_instructions(INSTRUCTIONS)
    bad = _obs()
    bad["instruction"][0] = 7
    with pytest.raises(IndexError, match="out of range"):
        policy.act(bad)
    with pytest.raises(ValueError, match="uint8"):
        policy.act(_obs().set("rgb", torch.rand(6, 2, 3, 32, 32)))
    with pytest.raises(ValueError, match="non-empty list"):
        policy.set_instructions("open the drawer")
    with pytest.raises(KeyError, match="reads observation key 'rgb'"):
        VLAPolicy(VLAConfig(), {"state": (4,)}, 3)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        VLAPolicy(VLAConfig(image_size=30), SPEC, 3)
    with pytest.raises(ValueError, match="valid fields"):
        policies.load("vla", SPEC, 3, fusion="film")


@pytest.mark.slow
def test_language_conditions_vision_in_supervised_pointing() -> None:
    """Point at the square whose colour the instruction names; only language says which of 3 it is.

    A policy blind to language can at best point at one of the three squares; the chance level is
    measured on the evaluation data (the fraction of shown squares whose direction would pass).
    Held-out paraphrases (templates never trained on) are scored as well.
    """
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    train, heldout = (
        synthetic.instructions(synthetic.TRAIN_TEMPLATES),
        synthetic.instructions(synthetic.HELDOUT_TEMPLATES),
    )
    sample, _ = synthetic.batch(2, synthetic.TRAIN_TEMPLATES, generator)
    policy = policies.load("vla", sample, action_dim=2)  # the default config: 64x64, Gaussian head
    policy.set_instructions(train + heldout)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(400):
        obs, target = synthetic.batch(64, synthetic.TRAIN_TEMPLATES, generator)
        policy.update_normalization(obs)
        log_prob, _, _ = policy.evaluate_actions(obs, target)
        optimizer.zero_grad()
        (-log_prob.mean()).backward()
        optimizer.step()

    def accuracy(templates: tuple[str, ...], offset: int) -> tuple[float, float]:
        obs, target, squares = synthetic.batch(
            512, templates, torch.Generator().manual_seed(1), with_squares=True
        )
        obs["instruction"] += offset
        action = policy.act(obs, deterministic=True)["action"]
        hit = F.cosine_similarity(action, target, dim=-1) > 0.9
        chance = (F.cosine_similarity(squares, target.unsqueeze(1), dim=-1) > 0.9).float().mean()
        return hit.float().mean().item(), chance.item()

    train_acc, chance = accuracy(synthetic.TRAIN_TEMPLATES, 0)
    heldout_acc, _ = accuracy(synthetic.HELDOUT_TEMPLATES, len(train))
    assert chance < 0.5
    assert train_acc > chance + 0.4, (train_acc, chance)
    assert heldout_acc > chance + 0.3, (heldout_acc, chance)


def test_checkpoint_round_trip_restores_outputs_after_set_instructions() -> None:
    torch.manual_seed(0)
    policy = _policy()
    obs = _obs(n=64)
    policy.update_normalization(obs)
    assert policy.proprio_norm.count.item() == 64
    restored = VLAPolicy(policy.cfg, SPEC, 3, sentences=_fake_sentences())
    restored.load_state_dict(policy.state_dict())
    restored.set_instructions(INSTRUCTIONS)
    assert torch.equal(restored.proprio_norm.mean, policy.proprio_norm.mean)
    assert torch.equal(
        restored.act(obs, deterministic=True)["action"], policy.act(obs, deterministic=True)["action"]
    )
    assert torch.equal(restored.value(obs), policy.value(obs))


def _asym_policy() -> VLAPolicy:
    cfg = VLAConfig(
        image_size=32,
        conv_channels=(8, 16),
        width=32,
        trunk_sizes=(32,),
        critic_obs_keys=("proprio", "state"),
        critic_hidden_sizes=(16, 16),
    )
    policy = VLAPolicy(cfg, {**SPEC, "state": (7,)}, action_dim=3, sentences=_fake_sentences())
    policy.set_instructions(INSTRUCTIONS)
    return policy


def _asym_obs(n: int = 6) -> TensorDict:
    obs = _obs(n)
    obs["state"] = torch.randn(n, 7)
    return obs


def test_asymmetric_critic_reads_only_its_keys_and_round_trips() -> None:
    torch.manual_seed(0)
    policy = _asym_policy()
    obs = _asym_obs()
    policy.update_normalization(obs)
    assert policy.critic_norm is not None and int(policy.critic_norm.count) > 0
    out = policy.act(obs)
    assert out["action"].shape == (6, 3) and out["value"].shape == (6,)
    log_prob, entropy, value = policy.evaluate_actions(obs, out["action"])
    assert torch.allclose(value, policy.value(obs), atol=1e-6)

    # the critic ignores the images (and language); it does depend on the privileged state
    changed = obs.clone()
    changed["rgb"] = torch.randint(0, 256, changed["rgb"].shape, dtype=torch.uint8)
    changed["instruction"] = (changed["instruction"] + 1) % len(INSTRUCTIONS)
    assert torch.equal(policy.value(changed), policy.value(obs))
    changed["state"] = changed["state"] + 1.0
    assert not torch.allclose(policy.value(changed), policy.value(obs))
    # value() never runs the image encoder: it works without rgb in the batch
    assert policy.value(obs.exclude("rgb", "instruction")).shape == (6,)

    # the actor's loss reaches no critic parameter, the value loss no image-encoder parameter
    policy.zero_grad()
    value.square().mean().backward()
    assert all(p.grad is None for p in policy.image_encoder.parameters())
    assert all(p.grad is not None for p in policy.critic_trunk.parameters())
    policy.zero_grad()
    (-log_prob.mean() - entropy.mean()).backward()
    assert all(p.grad is None for p in policy.critic_trunk.parameters())

    restored = _asym_policy()
    restored.load_state_dict(policy.state_dict())
    assert torch.allclose(restored.value(obs), policy.value(obs))
    assert torch.allclose(restored.evaluate_actions(obs, out["action"])[0], log_prob.detach(), atol=1e-6)


def test_asymmetric_critic_names_a_missing_key() -> None:
    cfg = VLAConfig(image_size=32, conv_channels=(8,), width=16, critic_obs_keys=("state",))
    # the policy's own message (the key, what the spec has), not Python's bare KeyError('state')
    with pytest.raises(KeyError, match=r"VLAPolicy critic reads observation key 'state', which the observation "
                                       r"spec lacks \(it has: instruction, proprio, rgb\)"):
        VLAPolicy(cfg, SPEC, action_dim=3, sentences=_fake_sentences())


@pytest.mark.slow
def test_attention_loss_teaches_the_first_head_to_find_the_named_square() -> None:
    """Trained only by the attention loss, head 0 attends to the square the instruction names
    (held-out images and held-out paraphrases), not to the other two."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    train = synthetic.instructions(synthetic.TRAIN_TEMPLATES)
    heldout = synthetic.instructions(synthetic.HELDOUT_TEMPLATES)
    sample, _ = synthetic.batch(2, synthetic.TRAIN_TEMPLATES, generator)
    cfg = VLAConfig(conv_channels=(32, 32, 32), conv_stride=1, readout="attention",
                    attention_target_keys=("target_point",))
    policy = VLAPolicy(cfg, sample, action_dim=2)
    policy.set_instructions(train + heldout)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        obs, _ = synthetic.batch(64, synthetic.TRAIN_TEMPLATES, generator)
        aux = policy.evaluate_terms(obs).aux
        optimizer.zero_grad()
        aux.backward()
        optimizer.step()
        losses.append(aux.item())
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])

    obs, _ = synthetic.batch(256, synthetic.HELDOUT_TEMPLATES, torch.Generator().manual_seed(1))
    obs["instruction"] += len(train)
    with torch.no_grad():
        *_, logits = policy._forward(obs)
    size = policy.image_encoder.out_size
    peak = policy.attention.grid[logits[:, 0].argmax(-1)]  # [n, 2] in [-1, 1]
    # within half a square (4 px of 64, i.e. 0.125) plus one map cell of the named square's centre
    hit = (peak - obs["target_point"][:, 0]).abs().max(-1).values < 0.125 + 2.0 / size
    assert hit.float().mean() > 0.8, hit.float().mean()


def test_attention_loss_needs_the_attention_readout_and_its_key() -> None:
    with pytest.raises(ValueError, match="readout: attention"):
        _policy(attention_target_keys=("goal_pixel",))
    with pytest.raises(KeyError, match="goal_pixel"):
        _policy(readout="attention", attention_target_keys=("goal_pixel",))
    policy = _policy(readout="attention", conv_stride=1)
    obs = _obs()
    assert policy.evaluate_terms(obs).aux is None


def test_trunk_target_loss_is_learnable_and_checkpoints_its_statistics() -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(VLAConfig(image_size=32, conv_channels=(8, 16), width=32, trunk_sizes=(32,),
                                 trunk_target_key="state", trunk_target_dims=2),
                       {**SPEC, "state": (7,)}, 3, sentences=_fake_sentences())
    policy.set_instructions(INSTRUCTIONS)
    obs = _obs(n=64)
    obs["state"] = torch.randn(64, 7)
    obs["state"][:, :2] = obs["proprio"][:, :2] * 3.0 + 1.0  # learnable from proprio
    policy.update_normalization(obs)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    first = None
    for _ in range(200):
        aux = policy.evaluate_terms(obs).aux
        first = aux.item() if first is None else first
        optimizer.zero_grad()
        aux.backward()
        optimizer.step()
    assert aux.item() < 0.1 * first
    restored = VLAPolicy(policy.cfg, {**SPEC, "state": (7,)}, 3, sentences=_fake_sentences())
    restored.load_state_dict(policy.state_dict())
    assert torch.equal(restored.target_norm.mean, policy.target_norm.mean)
    with pytest.raises(ValueError, match="trunk_target_dims"):
        VLAPolicy(VLAConfig(image_size=32, trunk_target_key="state", trunk_target_dims=9),
                  {**SPEC, "state": (7,)}, 3, sentences=_fake_sentences())


def test_frozen_perception_is_computed_once_and_only_the_motor_pathway_trains() -> None:
    torch.manual_seed(0)
    policy = _policy(readout="attention", freeze_perception=True)
    obs = _obs(n=10)
    full = policy.evaluate_terms(obs)
    prepared = policy.prepare_update_batch(obs, chunk_size=4)  # three chunks
    assert "rgb" not in prepared and prepared["perception"].shape == (10, 32 * 3)
    cached = policy.evaluate_terms(prepared)
    action = full.dist.sample()
    assert torch.allclose(full.dist.log_prob(action), cached.dist.log_prob(action), atol=1e-5)
    assert torch.allclose(full.value, cached.value, atol=1e-6)
    (-cached.dist.log_prob(action).mean() + cached.value.square().mean()).backward()
    trained = {name.split(".")[0] for name, p in policy.named_parameters() if p.grad is not None}
    assert trained == {"proprio", "trunk", "head", "value_head"}
    frozen = {name.split(".")[0] for name, p in policy.named_parameters() if not p.requires_grad}
    assert frozen == {"language", "image_encoder", "attention", "image_proj"}
    assert _policy().prepare_update_batch(obs) is obs  # nothing frozen: the batch is left as it is
