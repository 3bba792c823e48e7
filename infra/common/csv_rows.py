"""Rows of the trace CSV files (openb pod and node lists), with errors that name the file, row and column.

A malformed value used to surface as ``ValueError: invalid literal for int() with base 10: 'abc'``
with no hint of where; :func:`read_rows` yields each row with its place (``path:line``) and
:func:`count` reads an integer column refusing text, NaN and values out of range by that place.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path


class RowError(ValueError):
    """A row of a trace file holds a value that cannot be used; the message names file, line and column."""


def read_rows(path: str | Path, columns: set[str], what: str, flag: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``(place, row)`` of every data row of the CSV file ``path`` (``place``: ``path:line``, the header is line 1).

    Args:
        path: The CSV file.
        columns: Columns every row needs.
        what: What the file is, for messages (``"Pod list"``).
        flag: The command-line option that names the file (``--pods``).

    Raises:
        FileNotFoundError: ``path`` is not a file.
        RowError: The header lacks one of ``columns``, or a row has fewer fields than the header.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found: pass {flag} with an existing CSV file.")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = columns - set(reader.fieldnames or ())
        if missing:
            raise RowError(f"{what} {path} lacks columns {sorted(missing)}; expected {sorted(columns)}.")
        for row in reader:
            place = f"{path}:{reader.line_num}"
            short = sorted(k for k in columns if row.get(k) is None)
            if short:
                raise RowError(f"{place}: the row has no value for {short}; every row needs {sorted(columns)}.")
            yield place, row


def count(row: dict[str, str], column: str, place: str, low: int = 0) -> int:
    """The integer in ``row[column]``, at least ``low``.

    Raises:
        RowError: Not an integer, or below ``low``; the message names ``place`` and the column.
    """
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise RowError(f"{place}: {column}={text!r} is not an integer; fix the row or drop it.") from None
    if value < low:
        raise RowError(f"{place}: {column}={value} must be at least {low}; fix the row or drop it.")
    return value


def number(row: dict[str, str], column: str, place: str) -> float:
    """The finite number in ``row[column]``.

    Raises:
        RowError: Not a number, or NaN / infinite; the message names ``place`` and the column.
    """
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{place}: {column}={text!r} is not a number; fix the row or drop it.") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise RowError(f"{place}: {column}={text!r} must be a finite number; fix the row or drop it.")
    return value
