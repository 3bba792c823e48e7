"""The VLA's token language input (``policy.language: tokens``): MiniLM token embeddings read by
attention, what they tell that the pooled sentence embedding does not (which colour fills which
role), padding, errors, SFT augmentation and deployment."""

import pytest
import torch
from tensordict import TensorDict

from policies import VLAConfig, VLAPolicy
from policies.encoders import EMBED_DIM, TokenAttention, shared_sentence_cache, shared_token_cache
from sims.tasks import COLOUR_NAMES, instruction_table

SPEC = {"rgb": (1, 3, 32, 32), "proprio": (5,), "instruction": ()}
SWAPPED = ["put the orange block on the red block", "put the red block on the orange block"]


def _policy(**overrides) -> VLAPolicy:
    settings = {"language": "tokens", "language_tokens": 16, **overrides}
    cfg = VLAConfig(image_size=32, conv_channels=(8, 16), width=32, trunk_sizes=(32,), **settings)
    return VLAPolicy(cfg, SPEC, action_dim=3)


def test_token_embeddings_layout_and_the_pooled_embedding_blind_to_roles() -> None:
    """Row 0 is the sentence embedding, then one unit-norm row per token, then zero padding; swapping
    the two colours barely moves the sentence embedding but moves the tokens that carry them."""
    tokens = shared_token_cache(16)(SWAPPED)
    sentences = shared_sentence_cache()(SWAPPED)
    assert tokens.shape == (2, 17, EMBED_DIM)
    assert torch.allclose(tokens[:, 0], sentences, atol=1e-6)
    norms = tokens[:, 1:].norm(dim=-1)
    used = norms > 0
    assert used.sum(-1).tolist() == [10, 10]  # [CLS], 8 words, [SEP]
    assert torch.allclose(norms[used], torch.ones(int(used.sum())), atol=1e-5)
    assert float(sentences[0] @ sentences[1]) > 0.99  # the pooled embedding: nearly the same sentence
    colour_rows = (tokens[0, 1:11] * tokens[1, 1:11]).sum(-1)  # per position, same word piece order
    assert float(colour_rows[3]) < 0.9 and float(colour_rows[7]) < 0.9  # positions of the two colours


def test_too_long_instruction_names_the_limit() -> None:
    policy = _policy()
    with pytest.raises(ValueError, match=r"raise policy\.language_tokens"):
        policy.set_instructions(["put the orange block on the red block and then " * 3])


def test_bad_token_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="language_tokens=2"):
        _policy(language_tokens=2)
    with pytest.raises(ValueError, match="language='words'"):
        VLAPolicy(VLAConfig(image_size=32, conv_channels=(8,), language="words"), SPEC, 3)
    with pytest.raises(ValueError, match="language_heads=0"):
        TokenAttention(EMBED_DIM, 0, 8)


def test_padding_does_not_change_the_action() -> None:
    """The same instruction encoded with more padding rows gives the same output."""
    torch.manual_seed(0)
    short = _policy()
    long = VLAPolicy(VLAConfig(image_size=32, conv_channels=(8, 16), width=32, trunk_sizes=(32,),
                               language="tokens", language_tokens=24), SPEC, action_dim=3)
    long.load_state_dict(short.state_dict())
    for p in (short, long):
        p.set_instructions(SWAPPED)
    obs = TensorDict({"rgb": torch.randint(0, 256, (2, 1, 3, 32, 32), dtype=torch.uint8),
                      "proprio": torch.randn(2, 5), "instruction": torch.tensor([0, 1])}, batch_size=[2])
    a, b = short.actor(), long.actor()
    assert torch.allclose(a(*short.actor_inputs(obs)), b(*long.actor_inputs(obs)), atol=1e-5)


def test_hidden_tokens_inside_a_row_are_masked_not_cut() -> None:
    """Rows with hidden tokens before their last one (token dropout): the attention reads exactly
    the present tokens, as it does for each row alone, and a row whose one token is past the
    others' token count still has it (cutting by count left it all padding: NaN)."""
    torch.manual_seed(0)
    attention = TokenAttention(EMBED_DIM, 2, 16)
    sentence, tokens = torch.randn(3, EMBED_DIM), torch.randn(3, 6, EMBED_DIM)
    tokens[0, 1:] = 0  # one token
    tokens[1, :4] = 0  # one token, at position 4: two present tokens is the batch's largest count
    tokens[1, 5:] = 0
    tokens[2, 1:5] = 0  # tokens at 0 and 5
    with torch.no_grad():
        together = attention(sentence, tokens)
        for i in range(3):
            alone = tokens[i][tokens[i].abs().sum(-1) != 0].unsqueeze(0)
            assert torch.allclose(together[i], attention(sentence[i : i + 1], alone)[0], atol=1e-6)
    assert torch.isfinite(together).all()


def _role_probe(use_tokens: bool) -> float:
    """Train a reader of the instruction to name the colour of the block that moves in stack and push,
    on training instructions without some (colour, role) pairs; return its accuracy on those pairs."""
    table = instruction_table(("stack", "push"), "train")
    first = [next(w for w in s.split() if w in COLOUR_NAMES) for s in table]
    stack_words = ("put", "stack", "place", "set")
    held = torch.tensor([(s.split()[0] in stack_words) == (c in ("red", "yellow")) and c in
                         ("red", "yellow", "green", "cyan") for s, c in zip(table, first)])
    label = torch.tensor([COLOUR_NAMES.index(c) for c in first])
    embeddings = shared_token_cache(16)(table)
    torch.manual_seed(0)
    attention = TokenAttention(EMBED_DIM, 4, 32)
    head = torch.nn.Sequential(torch.nn.Linear(EMBED_DIM + (128 if use_tokens else 0), 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, len(COLOUR_NAMES)))
    params = [*head.parameters(), *(attention.parameters() if use_tokens else ())]
    optimizer = torch.optim.Adam(params, lr=1e-3)

    def read(index: torch.Tensor) -> torch.Tensor:
        e = embeddings[index]
        x = torch.cat([e[:, 0], attention(e[:, 0], e[:, 1:])], -1) if use_tokens else e[:, 0]
        return head(x)

    train = (~held).nonzero().squeeze(1)
    for _ in range(800):
        index = train[torch.randint(len(train), (128,))]
        loss = torch.nn.functional.cross_entropy(read(index), label[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        index = held.nonzero().squeeze(1)
        return float((read(index).argmax(-1) == label[index]).float().mean())


def test_tokens_name_the_moved_block_in_unseen_colour_role_pairs() -> None:
    """The pooled embedding cannot tell which of two colours is the moved block's in a pair never
    trained (it guesses from which colours moved in training); attention over tokens can (chance: 1/9)."""
    assert _role_probe(use_tokens=True) >= 0.5
    assert _role_probe(use_tokens=False) < 0.5


def test_augmentation_mixes_the_sentence_row_and_hides_tokens_the_policy_then_masks() -> None:
    from policies.vla import INSTRUCTION_EMBEDDING
    from vla_rl.sft import LanguageAugment

    embeddings = shared_token_cache(16)(SWAPPED)
    length = int((embeddings[:, 1:].abs().sum(-1) != 0).sum(-1).max())
    partners = torch.tensor([[0, 1], [1, 0]])
    index = torch.tensor([0, 1, 0] * 100)
    torch.manual_seed(0)
    fed = LanguageAugment(embeddings, partners, template_mix=1.0, noise=0.0, token_dropout=0.0)(index)
    assert fed.shape == (300, 1 + length, EMBED_DIM)
    assert not torch.allclose(fed[:, 0], embeddings[index, 0])  # the sentence row moved
    assert torch.equal(fed[:, 1:], embeddings[index, 1 : 1 + length])  # the tokens did not

    dropped = LanguageAugment(embeddings, None, template_mix=0.0, noise=0.5, token_dropout=0.3)(index)
    present = embeddings[index, 1 : 1 + length].abs().sum(-1) != 0
    kept = dropped[:, 1:].abs().sum(-1) != 0
    assert not bool((kept & ~present).any())  # padding stays padding under noise
    assert 0.6 < float(kept.sum() / present.sum()) < 0.8 and bool(kept.any(-1).all())
    shown = dropped[:, 1:][kept]
    assert torch.allclose(shown.norm(dim=-1), torch.ones(len(shown)), atol=1e-5)
    assert not torch.allclose(shown, embeddings[index, 1 : 1 + length][kept])  # noise reaches tokens

    # The policy reads the augmented embedding in place of the indexed one, hidden tokens masked:
    # a frame with one token hidden reads as the same embedding with that token removed.
    policy = _policy()
    policy.set_instructions(SWAPPED)
    one = dropped[:1].clone()
    k = int(kept[0].nonzero()[0])
    one[0, 1 + k] = 0.0
    removed = torch.cat([one[:, :1 + k], one[:, 2 + k:]], dim=1)
    head = policy.language_tokens
    assert torch.allclose(head(one[:, 0], one[:, 1:]), head(removed[:, 0], removed[:, 1:]), atol=1e-6)
    read = policy._embedding(TensorDict({"instruction": index[:3], INSTRUCTION_EMBEDDING: dropped[:3]},
                                        batch_size=[3]))
    assert torch.equal(read, dropped[:3])


def test_deployed_policy_takes_text_and_exports_with_the_token_shape(tmp_path) -> None:
    from vla_rl.deploy import DeployedPolicy, TensorSpec

    policy = _policy()
    obs_spec = {"rgb": TensorSpec((1, 3, 32, 32), torch.uint8), "proprio": TensorSpec((5,), torch.float32)}
    deployed = DeployedPolicy(policy, obs_spec, torch.device("cpu"))
    assert deployed.specs["instruction_embedding"].shape == (17, EMBED_DIM)
    rgb = torch.randint(0, 256, (2, 1, 3, 32, 32), dtype=torch.uint8)
    action = deployed.act(rgb=rgb, instruction=SWAPPED, proprio=torch.zeros(2, 5))
    assert action.shape == (2, 3)
    path = deployed.export(tmp_path / "actor.pt")
    graph = torch.jit.load(str(path))
    embedding = policy.embed_instructions(SWAPPED)
    assert torch.allclose(graph(rgb, embedding, torch.zeros(2, 5)), torch.as_tensor(action), atol=1e-5)


def test_tail_cut_hides_the_last_tokens_of_the_longest_instructions_and_never_a_whole_frame() -> None:
    from vla_rl.sft import LanguageAugment

    texts = ["touch the red ball", "push the purple block until it is on the pink target"]
    embeddings = shared_token_cache(16)(texts)
    present = embeddings[:, 1:].abs().sum(-1) != 0
    short, long = (int(n) for n in present.sum(-1))
    index = torch.tensor([0] * 120 + [1] * 8)  # one minibatch
    torch.manual_seed(0)
    dropped = LanguageAugment(embeddings, None, template_mix=0.0, noise=0.0, token_dropout=0.25)(index)
    torch.manual_seed(0)  # the same dropout draw, then the cut
    cut = LanguageAugment(embeddings, None, template_mix=0.0, noise=0.0, token_dropout=0.25, tail_cut=True)(index)
    kept_dropped, kept_cut = (x[:, 1:].abs().sum(-1) != 0 for x in (dropped, cut))
    assert not bool((kept_cut & ~kept_dropped).any())  # it only hides more
    assert bool(kept_cut.any(-1).all())  # every frame keeps a token
    limit = int(kept_dropped.sum(-1).max())
    assert limit < long and not bool(kept_cut[:, limit:].any())  # nothing past the largest kept count
    assert bool((kept_cut[index == 0] == kept_dropped[index == 0]).all()) and short <= limit
    assert int(kept_cut[index == 1].sum()) < int(kept_dropped[index == 1].sum())  # the long one lost its tail
