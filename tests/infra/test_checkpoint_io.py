"""Checkpoint files hold data, never code: crafted files are refused without running anything, format-2
pickles are refused with the converter's command, and the converter turns them into format 3."""

import collections
import io
import os
import random

import numpy as np
import pytest
import torch

from infra.common import checkpoint_io
from infra.common.checkpoint_io import MAGIC, CheckpointError
from infra.common.files import seal


class _Boom:
    """Unpickling this runs a shell command (what a hostile checkpoint does)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pickle(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _payload() -> dict:
    weight = torch.randn(4, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    state = collections.OrderedDict(w=weight, tied=weight, b=torch.zeros(4, dtype=torch.bfloat16))
    state._metadata = {"": {"version": 1}}
    return {
        "policy": state, "step": 7, "lr": 3e-4, "nan": float("nan"), "name": "run",
        "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"params": [0], "betas": (0.9, 0.999)}]},
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        "obs": {"rgb": torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8)}, "scalar": np.float32(0.5),
        "none": None, "empty": torch.empty(0),
    }


def test_a_payload_comes_back_exactly(tmp_path):
    want = _payload()
    checkpoint_io.save(tmp_path / "c.ckpt", want, "vla_rl")
    got = checkpoint_io.load(tmp_path / "c.ckpt", "vla_rl", "fix")
    assert got["policy"]["w"].stride() == want["policy"]["w"].stride()  # channels-last kept: bit-exact resume
    assert got["policy"]["w"] is got["policy"]["tied"] and got["policy"]._metadata == {"": {"version": 1}}
    assert torch.equal(got["policy"]["b"], want["policy"]["b"]) and got["policy"]["b"].dtype == torch.bfloat16
    assert got["opt"]["state"][0]["step"].item() == 3.0 and got["opt"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert torch.equal(got["rng"]["torch"], want["rng"]["torch"]) and got["rng"]["python"] == want["rng"]["python"]
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(got["rng"]["numpy"], want["rng"]["numpy"], strict=True))
    assert type(got["scalar"]) is np.float32 and np.isnan(got["nan"]) and got["empty"].shape == (0,)
    assert torch.equal(got["obs"]["rgb"], want["obs"]["rgb"]) and got["step"] == 7 and got["none"] is None


def test_a_crafted_pickle_behind_a_valid_header_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    for blob in (seal(MAGIC, _pickle({"x": _Boom(marker)})),  # the new header, a pickle body
                 seal(b"VLARLCKPT1\n", _pickle({"format_version": 2, "x": _Boom(marker)}))):  # format 2
        (tmp_path / "latest.pt").write_bytes(blob)
        with pytest.raises(CheckpointError) as err:
            checkpoint_io.load(tmp_path / "latest.pt", "vla_rl", "fix")
        assert "\n" not in str(err.value)
    assert "convert_checkpoint.py" in str(err.value) and str(tmp_path / "latest.pt") in str(err.value)
    assert not marker.exists()


def test_a_crafted_document_naming_code_is_refused(tmp_path):
    import json
    import struct

    from safetensors.torch import save as save_tensors

    for tree in ({"$fn": "os.system"}, {"$obj": ["subprocess.Popen", {"args": "true"}]}, {"$nope": 1}):
        header = json.dumps({"format": 3, "kind": "vla_rl", "payload": {"x": tree}}).encode()
        body = struct.pack("<Q", len(header)) + header + save_tensors({})
        (tmp_path / "c.ckpt").write_bytes(seal(MAGIC, body))
        with pytest.raises(CheckpointError, match="valid seal but its contents are not a format-3 checkpoint"):
            checkpoint_io.load(tmp_path / "c.ckpt", "vla_rl", "fix")


def test_an_object_in_a_payload_is_refused_at_save_naming_its_key(tmp_path):
    with pytest.raises(CheckpointError, match=r"/extra/thing is a .*_Boom, which is not plain data"):
        checkpoint_io.save(tmp_path / "c.ckpt", {"extra": {"thing": _Boom(tmp_path)}}, "vla_rl")


def test_another_trainers_checkpoint_is_refused(tmp_path):
    checkpoint_io.save(tmp_path / "c.ckpt", {"job": "j"}, "llm_trainer")
    with pytest.raises(CheckpointError, match="is a 'llm_trainer' checkpoint, not a 'vla_rl' one"):
        checkpoint_io.load(tmp_path / "c.ckpt", "vla_rl", "fix")

