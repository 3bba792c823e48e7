"""Checkpoints and the converter against crafted files: nothing runs, nothing large is allocated.

The converter loads a format-2 pickle weights-only and needs ``--trust-pickle`` before a full
unpickle (a crafted one runs nothing and the file is left as it was); a format-3 checkpoint whose
tensor strides span far beyond its data is refused before its storage is allocated, with the loader's
own ``CheckpointError`` in one line.
"""

import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from infra.common import checkpoint_io
from infra.common.checkpoint_io import MAGIC, CheckpointError
from infra.common.files import seal

ROOT = Path(__file__).resolve().parents[2]


def _converter():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("convert_checkpoint", ROOT / "scripts" / "convert_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _format_2(payload) -> bytes:
    buf = io.BytesIO()
    torch.save({"format_version": 2, **payload}, buf)
    return seal(b"VLARLCKPT1\n", buf.getvalue())


def test_the_converter_runs_no_pickle_without_trust_pickle(tmp_path, capsys):
    marker, path = tmp_path / "ran", tmp_path / "latest.pt"
    blob = _format_2({"policy": _Boom(marker)})
    path.write_bytes(blob)
    assert _converter().main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "pass --trust-pickle only if you or someone you trust wrote it" in err and err.count("\n") == 1
    assert not marker.exists() and path.read_bytes() == blob and not (tmp_path / "latest.pt.format2").exists()


def test_the_converter_converts_tensors_and_plain_data_without_the_flag(tmp_path):
    path = tmp_path / "latest.pt"
    weights = {"w": torch.arange(6.0).reshape(2, 3)}
    path.write_bytes(_format_2({"policy": weights, "step": 3, "config": {"seed": 1}}))
    assert _converter().main([str(path)]) == 0
    got = checkpoint_io.load(path, "vla_rl", "fix")
    assert torch.equal(got["policy"]["w"], weights["w"]) and got["step"] == 3


@pytest.mark.parametrize("strides", [[10**12, 1], [-1, 1], [1], "x"])
def test_strides_spanning_beyond_the_data_are_refused_before_allocation(tmp_path, strides):
    good = checkpoint_io.dumps({"w": torch.zeros(2, 3).t()}, "vla_rl")  # a transposed tensor: strides recorded
    body = good[len(MAGIC) + 32:]
    size = int.from_bytes(body[:8], "little")
    header = json.loads(body[8 : 8 + size])
    assert header["payload"]["w"]["$tensor"][1] == [1, 3]
    header["payload"]["w"]["$tensor"][1] = strides
    raw = json.dumps(header).encode()
    (tmp_path / "latest.pt").write_bytes(seal(MAGIC, len(raw).to_bytes(8, "little") + raw + body[8 + size :]))
    with pytest.raises(CheckpointError, match="valid seal but its contents are not") as err:
        checkpoint_io.load(tmp_path / "latest.pt", "vla_rl", "fix")
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
