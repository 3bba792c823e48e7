"""Convert a format-2 checkpoint (a pickle) of this project to format 3 (safetensors and JSON).

    python scripts/convert_checkpoint.py PATH [--out OUT] [--trust-pickle]

Format-2 files are ``torch.save`` pickles, and a full unpickle runs whatever the file names. This
script first loads the file with ``torch.load(weights_only=True)``, which builds tensors and plain
containers only and refuses anything else; a checkpoint that holds more (numpy arrays, a random
generator's state) is converted only with ``--trust-pickle``, the one full unpickle in the project:
pass it only for checkpoints you (or someone you trust) wrote. Without ``--out`` it converts in place
and keeps the original as ``PATH.format2``.
"""

from __future__ import annotations

import argparse
import io
import pickle
import shutil
import sys
from pathlib import Path

import torch
from bench_report import output_path

from infra.common import checkpoint_io
from infra.common.files import DigestMismatch, NotSealed, unseal
from infra.common.limits import short

KINDS = checkpoint_io.LEGACY_MAGICS


def convert(path: Path, out: Path, keep: Path | None = None, trust_pickle: bool = False) -> str:
    """Write the format-2 checkpoint ``path`` to ``out`` in format 3 (a copy of ``path`` to ``keep`` first,
    when given); returns its kind. A weights-only load first; a full unpickle only with ``trust_pickle``.

    Raises:
        CheckpointError: ``path`` is not an intact format-2 checkpoint, or needs ``trust_pickle``.
    """
    blob = path.read_bytes()
    magic = next((m for m in KINDS if blob.startswith(m)), None)
    if magic is None:
        raise checkpoint_io.CheckpointError(f"{path} is not a format-2 checkpoint of this project (no known header)")
    try:
        data = unseal(blob, magic)
    except (NotSealed, DigestMismatch):
        raise checkpoint_io.CheckpointError(f"{path} is corrupt or truncated (checksum mismatch); nothing converted") from None
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            why = short(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, 160)
            raise checkpoint_io.CheckpointError(
                f"{path} holds more than tensors and plain data ({why}); a full unpickle runs whatever code the file "
                "names: pass --trust-pickle only if you or someone you trust wrote it") from None
        # The user said this file is trusted: the only full pickle load in the project.
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)  # nosec B614: --trust-pickle
    if not isinstance(payload, dict):
        raise checkpoint_io.CheckpointError(f"{path} holds a {type(payload).__name__}, not a checkpoint's dict")
    if keep is not None:
        shutil.copy2(path, keep)
    payload.pop("format_version", None)  # format 2's version field: format 3 keeps it in the file header
    checkpoint_io.save(out, payload, KINDS[magic])
    return KINDS[magic]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/convert_checkpoint.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a format-2 checkpoint file (latest.pt, iter_*.pt, trainer.ckpt)")
    parser.add_argument("--out", type=output_path, help="where to write format 3 (default: in place, original kept as .format2)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow a full unpickle when the weights-only load refuses the file: it runs whatever "
                             "code the file names, so only for files you or someone you trust wrote")
    args = parser.parse_args(argv)
    out = args.out or args.path
    try:
        keep = args.path.with_name(args.path.name + ".format2") if args.out is None else None
        kind = convert(args.path, out, keep, args.trust_pickle)
    except (OSError, checkpoint_io.CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {kind} checkpoint {out} (format {checkpoint_io.FORMAT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
