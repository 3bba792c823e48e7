"""A tiny randomly initialised Hugging Face causal LM and a character tokenizer, built offline.

The tokenizer is built with the ``tokenizers`` library (one token per character, ``<bos>``
prepended, ``<pad>`` and ``<eos>`` special) and wrapped in ``PreTrainedTokenizerFast``; model and
tokenizer are saved with ``save_pretrained`` so that tests load them back exactly as a user's
folder would be loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHARS = "0123456789+=s: abcdefghijklmnopqrstuvwxyz?#"


def tiny_tokenizer():  # -> PreTrainedTokenizerFast
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3} | {c: i + 4 for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def make_tiny_hf(path: Path, arch: str = "llama", seed: int = 0, width: int = 64, layers: int = 2) -> Path:
    """Save a tiny ``arch`` (``llama`` or ``gpt2``) model and its tokenizer into ``path``; returns ``path``."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    tokenizer = tiny_tokenizer()
    ids = {"vocab_size": len(tokenizer), "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **ids)
    else:
        cfg = GPT2Config(n_embd=width, n_layer=layers, n_head=4, n_positions=64, **ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
