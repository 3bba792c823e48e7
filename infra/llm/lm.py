"""The policy model of an RLVR job, whichever kind it is, and the tokenizer that goes with it.

A job names its model with :class:`~infra.llm.model.ModelConfig`: ``kind="hf"`` is any Hugging
Face causal LM in a local folder (``AutoModelForCausalLM`` + ``AutoTokenizer``, as written by
``save_pretrained``), ``kind="char"`` the tiny :class:`~infra.llm.model.TinyCausalLM` of the CPU
demo. Everything else — the GRPO trainer, the rollout engine, the job loop — sees only

- a :class:`CausalLM`: an ``nn.Module`` with ``generate`` (batched, KV-cached, left-padded),
  ``logprobs`` and ``save``; its ``state_dict`` is what travels between trainer and rollout;
- a :class:`Codec`: text <-> token ids, with the pad and EOS ids.

Shapes: ``B`` batch, ``P`` prompt length (left-padded), ``C`` completion length, ``V`` vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from infra.llm.model import ModelConfig, TinyCausalLM, sample_next
from infra.llm.verifiable_tasks import EOS, PAD, decode, encode


@runtime_checkable
class CausalLM(Protocol):
    """What the trainer and the rollout engine need from a policy model (an ``nn.Module``)."""

    def generate(
        self, prompts: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *, eos_id: int,
        temperature: float = 1.0, generator: torch.Generator | None = None, use_cache: bool = True,
    ) -> torch.Tensor:
        """Continuations ``[B, max_new_tokens]`` of left-padded ``prompts`` ``[B, P]`` (EOS-filled after EOS)."""
        ...

    def logprobs(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, C]`` of ``completions`` ``[B, C]`` given the prompts, with gradients."""
        ...

    def save(self, path: Path) -> None:
        """Write the model's weights and config into the folder ``path``."""
        ...


class Codec(Protocol):
    """Text <-> token ids for one model."""

    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt (with the model's leading special tokens)."""
        ...

    def encode_answer(self, text: str) -> list[int]:
        """Token ids of a completion that says ``text`` and stops: no leading specials, EOS last."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of a completion up to its first EOS, special tokens dropped."""
        ...

    def save(self, path: Path) -> None:
        """Write what is needed to tokenize again into the folder ``path``."""
        ...


class CharCodec:
    """The character vocabulary of the built-in tasks (the ``char`` model's tokenizer)."""

    pad_id = PAD
    eos_id = EOS

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def encode_answer(self, text: str) -> list[int]:
        return [*encode(text)[1:], EOS]

    def decode(self, ids: list[int]) -> str:
        return decode(ids)[0]

    def save(self, path: Path) -> None:
        """Nothing to write: the vocabulary is fixed in :mod:`infra.llm.verifiable_tasks`."""


class HFCodec:
    """A Hugging Face tokenizer; pad falls back to EOS when the tokenizer has none."""

    def __init__(self, tokenizer: object, path: str) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError(
                f"the tokenizer in {path} has no eos_token, so generation could never stop; set "
                "tokenizer.eos_token (and pad_token) and save it again with save_pretrained."
            )
        pad = getattr(tokenizer, "pad_token_id", None)
        self.eos_id = int(eos)
        self.pad_id = int(eos if pad is None else pad)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def encode_answer(self, text: str) -> list[int]:
        return [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.eos_id]

    def decode(self, ids: list[int]) -> str:
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def save(self, path: Path) -> None:
        self.tokenizer.save_pretrained(str(path))


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``[B, T]`` counted from each row's first real token (left padding)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _max_positions(config: object) -> int | None:
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


class HFCausalLM(nn.Module):
    """A transformers causal LM (``net``) behind the :class:`CausalLM` interface.

    Generation runs its own token loop over the model's KV cache (``past_key_values``) rather than
    ``net.generate``, so that sampling draws from the caller's ``torch.Generator`` (a seed fixes
    the rollout) and rows behave exactly as the tiny model's: left padding with position ids from
    the mask, EOS repeated after a row stops, the batch ends when every row has stopped.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model was built for (``n_positions`` / ``max_position_embeddings``)."""
        return _max_positions(self.net.config)

    @staticmethod
    def max_positions_of(path: str) -> int | None:
        """:attr:`max_positions` of the model in the folder ``path``, read from its config alone."""
        from transformers import AutoConfig

        return _max_positions(AutoConfig.from_pretrained(path))

    def _logits(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=tokens, attention_mask=mask.long(), position_ids=_positions(mask)).logits

    @torch.no_grad()
    def generate(
        self, prompts: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *, eos_id: int,
        temperature: float = 1.0, generator: torch.Generator | None = None, use_cache: bool = True,
    ) -> torch.Tensor:
        from transformers import DynamicCache

        b, p = prompts.shape
        limit = self.max_positions
        if limit is not None and p + max_new_tokens > limit:
            raise ValueError(
                f"prompt length {p} + max_new_tokens {max_new_tokens} exceeds the model's {limit} positions; "
                "shorten the prompts or lower max_new_tokens."
            )
        out = torch.full((b, max_new_tokens), eos_id, dtype=torch.long, device=prompts.device)
        done = torch.zeros(b, dtype=torch.bool, device=prompts.device)
        seq, mask = prompts, prompt_mask.long()
        cache = DynamicCache(config=self.net.config) if use_cache else None  # filled in place by each forward
        for i in range(max_new_tokens):
            if cache is not None:
                step = seq if i == 0 else seq[:, -1:]
                pos = _positions(mask)[:, -step.shape[1] :]
                logits = self.net(input_ids=step, attention_mask=mask, position_ids=pos, cache=cache,
                                  use_cache=True).logits[:, -1]
            else:
                logits = self._logits(seq, mask.bool())[:, -1]
            nxt = torch.where(done, torch.full_like(done, eos_id, dtype=torch.long), sample_next(logits, temperature, generator))
            out[:, i] = nxt
            done |= nxt == eos_id
            if bool(done.all()):
                break
            seq = torch.cat([seq, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        return out

    def logprobs(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        seq = torch.cat([prompts, completions], 1)
        mask = torch.cat([prompt_mask, torch.ones_like(completions, dtype=torch.bool)], 1)
        logits = self._logits(seq, mask)[:, prompts.shape[1] - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None]).squeeze(-1)

    def save(self, path: Path) -> None:
        self.net.save_pretrained(str(path))


def _hf_folder(cfg: ModelConfig) -> str:
    if not cfg.path:
        raise ValueError(
            "model.path is empty; pass model.path=DIR (a folder written by save_pretrained) or "
            "model.kind=char for the tiny CPU demo."
        )
    if not (Path(cfg.path) / "config.json").is_file():
        raise ValueError(f"model.path={cfg.path!r} has no config.json; point it at a folder written by save_pretrained.")
    return cfg.path


def check_model(cfg: ModelConfig) -> None:
    """Raise ``ValueError`` (one line, with the fix) unless ``cfg`` names a loadable causal LM and tokenizer."""
    if cfg.kind == "char":
        return
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = _hf_folder(cfg)
    try:
        model_type = AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError) as e:
        raise ValueError(f"model.path={path!r}: its config.json cannot be read ({str(e).splitlines()[0]}).") from e
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"model.path={path!r} holds a {model_type!r} model, which AutoModelForCausalLM cannot load; "
                         "use a decoder-only (causal) language model.")
    load_codec(cfg)


def load_codec(cfg: ModelConfig) -> Codec:
    """The tokenizer of ``cfg``'s model (``AutoTokenizer`` from ``model.path`` for ``hf``)."""
    if cfg.kind == "char":
        return CharCodec()
    from transformers import AutoTokenizer

    path = _hf_folder(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"model.path={path!r}: no tokenizer can be loaded from it ({str(e).splitlines()[0]}); "
                         "save the tokenizer into the same folder with tokenizer.save_pretrained.") from e
    return HFCodec(tokenizer, path)


def build_model(cfg: ModelConfig, seed: int) -> CausalLM:
    """The policy of ``cfg`` on the host: ``hf`` loads the folder's weights (float32), ``char``
    initialises a tiny model from ``seed``."""
    cfg.validate()
    if cfg.kind == "char":
        torch.manual_seed(seed)
        return TinyCausalLM(cfg)
    from transformers import AutoModelForCausalLM

    return HFCausalLM(AutoModelForCausalLM.from_pretrained(_hf_folder(cfg)).float())
