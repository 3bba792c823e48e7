"""Write a tiny randomly initialised Hugging Face causal LM, its tokenizer and a GSM8K-style file.

    python scripts/llm_tiny_model.py DIR [--arch llama|gpt2] [--data FILE]

A model folder to try ``scripts/llm_rlvr.py model.path=DIR`` without downloading one (the tests
build theirs with the same code). The tokenizer is built with the ``tokenizers`` library (one token
per character, ``<bos>`` prepended, ``<pad>`` and ``<eos>`` special) and wrapped in
``PreTrainedTokenizerFast``; model and tokenizer are saved with ``save_pretrained``, exactly the
folder a user would bring. ``--data`` also writes every one-digit sum ``a+b=`` as a JSONL row in
GSM8K's shape (``{"question": "3+4=", "answer": "3 plus 4 #### 7"}``).
"""

from __future__ import annotations

import argparse
import json
import sys
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


def write_sums(path: Path) -> Path:
    """Every one-digit sum as a GSM8K-style JSONL row; returns ``path``."""
    rows = [{"question": f"{a}+{b}=", "answer": f"{a} plus {b} #### {a + b}"} for a in range(10) for b in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="model folder to write")
    parser.add_argument("--arch", choices=("llama", "gpt2"), default="llama")
    parser.add_argument("--width", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, help="also write the one-digit sums here (JSONL)")
    args = parser.parse_args(argv)
    make_tiny_hf(args.dir, args.arch, args.seed, args.width, args.layers)
    if args.data:
        write_sums(args.data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
