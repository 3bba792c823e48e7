"""Precomputed instruction embeddings in one file, for a machine without the MiniLM package.

The VLA encodes each distinct instruction once (:class:`policies.encoders.SentenceCache`) with the
offline MiniLM package, 88 MB of weights. A machine that cannot get it (the GPU machine, whose
transfers are 64 MiB) runs from a file written where it is installed: every string the run will
meet, as the pooled sentence embedding ``[L, D]`` and, for ``language: tokens``, the token
embeddings ``[L, 1 + T, D]`` with their lengths. :func:`preload_embeddings` puts them in the
process-wide caches, so these strings never reach the encoder; a string missing from the file
still does, and fails there naming the package.

Token rows are stored without their zero padding, in float16 (the file of the suite's 1,231
strings: about 14 MB instead of 47): a relative rounding of 5e-4 of unit vectors, which the
training run that reads them then sees instead of float32's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from policies.encoders import shared_sentence_cache, shared_token_cache


def save_embeddings(path: str | Path, strings: Sequence[str], language_tokens: int | None) -> dict[str, int]:
    """Encode ``strings`` with MiniLM (sentence, and tokens up to ``language_tokens`` rows; None: none)
    and write them to ``path``; returns ``{strings, bytes}``."""
    strings = sorted(set(strings))
    data: dict = {"strings": strings, "sentence": shared_sentence_cache()(strings).half()}
    if language_tokens is not None:
        tokens = shared_token_cache(language_tokens)(strings)  # [L, 1 + T, D], zero rows after each length
        lengths = (tokens.abs().sum(-1) > 0).sum(-1)
        data |= {"language_tokens": language_tokens, "token_lengths": lengths,
                 "token_rows": torch.cat([t[:n] for t, n in zip(tokens, lengths.tolist())]).half()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return {"strings": len(strings), "bytes": path.stat().st_size}


def preload_embeddings(path: str | Path) -> int:
    """Put the file's embeddings into the shared sentence and token caches; returns how many strings.

    Raises:
        FileNotFoundError: no such file; ValueError: not a file of :func:`save_embeddings`.
    """
    data = torch.load(Path(path), weights_only=True)
    if not isinstance(data, dict) or "strings" not in data or "sentence" not in data:
        raise ValueError(f"{path} is not an instruction-embeddings file (policies.embedding_file.save_embeddings)")
    strings = data["strings"]
    shared_sentence_cache().preload(dict(zip(strings, data["sentence"].float())))
    if "token_rows" in data:
        width = data["language_tokens"]
        rows = data["token_rows"].float().split(data["token_lengths"].tolist())
        padded = torch.zeros(len(strings), 1 + width, data["token_rows"].shape[-1])
        for i, r in enumerate(rows):
            padded[i, : r.shape[0]] = r
        shared_token_cache(width).preload(dict(zip(strings, padded)))
    return len(strings)
