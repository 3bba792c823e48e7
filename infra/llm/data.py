"""A user's prompts and reference answers from a JSONL or parquet file (GSM8K-style rows).

Each row is an object with a prompt field (``question``) and an answer field (``answer``); as in
GSM8K, the reference answer is the text after the last ``####`` of the answer field (the worked
solution before it is not what the reward compares). Field names, the delimiter and a prompt
template are configurable. Every problem with the file is found when it is loaded — before a job
starts — and raised as a one-line ``ValueError`` naming the file, the row and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infra.common.typed_config import ConfigError
from infra.llm.verifiable_tasks import Example

FORMATS = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class DataConfig:
    """Where a job's prompts come from when they are not a built-in task."""

    path: str = ""
    """JSONL (one object per line) or parquet file of prompts and answers; empty: the built-in ``task``."""
    eval_path: str = ""
    """Held-out file of the same shape for the greedy accuracy; empty: ``eval_prompts`` rows of
    ``path`` (chosen with the job's seed) are held out of training instead."""
    prompt_field: str = "question"
    """Field holding the prompt text."""
    answer_field: str = "answer"
    """Field holding the reference answer."""
    answer_delimiter: str = "####"
    """The reference answer is the text after the last occurrence of this in the answer field
    (GSM8K's convention); empty: the whole field."""
    prompt_template: str = "{}"
    """The prompt the model sees: this text with ``{}`` replaced by the prompt field."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the first bad field and the fix (no file
        is read: a missing file is refused where the job starts)."""
        for name in ("path", "eval_path"):
            value = getattr(self, name)
            if value and Path(value).suffix not in FORMATS:
                raise ConfigError(f"data.{name}={value!r} has an unknown format; use one of {list(FORMATS)} "
                                  "(JSON lines or parquet).")
        if self.eval_path and not self.path:
            raise ConfigError(f"data.eval_path={self.eval_path!r} holds out rows of a file but data.path is empty; "
                              "set data.path to the training file, or leave eval_path empty for a built-in task.")
        for name in ("prompt_field", "answer_field"):
            if not getattr(self, name):
                raise ConfigError(f"data.{name} is empty; name the field of each row that holds it.")
        if "{}" not in self.prompt_template:
            raise ConfigError(f"data.prompt_template={self.prompt_template!r} has no '{{}}' where the prompt goes.")


def _rows(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"data file {str(path)!r} is not a readable parquet file ({e}).") from e
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"data file {str(path)!r} line {n} is not valid JSON ({e.msg}); "
                                 "write one JSON object per line.") from e
    return rows


def _text(row: Any, name: str, where: str, cfg: DataConfig) -> str:
    if not isinstance(row, dict):
        raise ValueError(f"{where} is a {type(row).__name__}, not an object with fields {cfg.prompt_field!r} "
                         f"and {cfg.answer_field!r}.")
    if name not in row:
        raise ValueError(f"{where} has no field {name!r} (it has {sorted(row)}); set data.prompt_field / "
                         "data.answer_field to the names your file uses.")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{where} field {name!r} is {value!r}; it must be text or a number.")
    return str(value)


def load_examples(path: str, cfg: DataConfig) -> list[Example]:
    """Every row of the file ``path`` as an :class:`Example` (prompt templated, answer after the delimiter).

    Raises:
        ValueError: ``cfg`` refuses a field (a :class:`~infra.common.typed_config.ConfigError`), or the file is
            missing, unreadable, of an unknown format, empty, or a row lacks a field.
    """
    cfg.validate()
    file = Path(path)
    if file.suffix not in FORMATS:
        raise ValueError(f"data file {path!r} has an unknown format; use one of {list(FORMATS)} (JSON lines or parquet).")
    if not file.is_file():
        raise ValueError(f"data file {path!r} does not exist.")
    out = []
    for n, row in enumerate(_rows(file), 1):
        where = f"data file {path!r} row {n}"
        prompt = _text(row, cfg.prompt_field, where, cfg)
        answer = _text(row, cfg.answer_field, where, cfg)
        if cfg.answer_delimiter:
            if cfg.answer_delimiter not in answer:
                raise ValueError(f"{where}: its {cfg.answer_field!r} has no {cfg.answer_delimiter!r} before the final "
                                 "answer; set data.answer_delimiter='' to use the whole field.")
            answer = answer.rsplit(cfg.answer_delimiter, 1)[1]
        out.append(Example(cfg.prompt_template.replace("{}", prompt), answer.strip()))
    if not out:
        raise ValueError(f"data file {path!r} has no rows.")
    return out


class FileSource:
    """A :class:`~infra.llm.verifiable_tasks.PromptSource` over a user's examples: training draws with replacement
    from ``train``, greedy accuracy on ``held_out``."""

    def __init__(self, train: list[Example], held_out: list[Example]) -> None:
        self.train = train
        self.held_out = held_out

    def sample(self, rng: np.random.Generator, n: int) -> list[Example]:
        return [self.train[i] for i in rng.integers(0, len(self.train), size=n)]

    def eval_set(self, n: int) -> list[Example]:
        return self.held_out[:n]

    def probe(self) -> list[Example]:
        return [*self.train, *self.held_out]


def load_file_source(cfg: DataConfig, eval_prompts: int, seed: int) -> FileSource:
    """The examples of ``cfg.path``; held out: ``cfg.eval_path``, or ``eval_prompts`` rows of ``path`` chosen by ``seed``."""
    examples = load_examples(cfg.path, cfg)
    if cfg.eval_path:
        return FileSource(examples, load_examples(cfg.eval_path, cfg))
    if len(examples) <= eval_prompts:
        raise ValueError(f"data file {cfg.path!r} has {len(examples)} rows, too few to hold out eval_prompts={eval_prompts} "
                         "and train on the rest; lower eval_prompts or pass data.eval_path.")
    order = np.random.default_rng([seed, 999]).permutation(len(examples))
    return FileSource([examples[i] for i in order[eval_prompts:]], [examples[i] for i in order[:eval_prompts]])
