"""No silent loss: trainer checkpoints, a trainer or rollout actor killed mid-call on Ray, weights by reference.

In-process tests check the checkpoint contract (restore bit for bit, a re-sent call is not applied
twice, a missing or broken checkpoint is a one-line error). Ray tests (local, loopback) kill a
service actor with ``ray.kill`` while it executes a call and check that the job ends with the
weights and version of an undisturbed run, and that the driver never receives weight tensors
before the job's end.
"""


import pytest
import torch

from infra.llm import checkpoint as ckpt
from infra.llm.checkpoint import CheckpointError, CheckpointSpec
from infra.llm.grpo import GRPOConfig
from infra.llm.model import ModelConfig
from infra.llm.services import TrainerService
from infra.llm.tasks import VOCAB_SIZE

SMALL = ModelConfig(vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)


def _batch(seed: int) -> tuple[list[list[int]], list[list[int]], list[float]]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, VOCAB_SIZE, (5,), generator=g).tolist() for _ in range(8)]
    comps = [[*torch.randint(3, VOCAB_SIZE, (3,), generator=g).tolist(), 2] for _ in range(8)]
    return prompts, comps, torch.rand(8, generator=g).round().tolist()


def _weights(svc: TrainerService, job: str) -> dict[str, torch.Tensor]:
    return svc.weights(job)[0]


def test_a_restored_trainer_continues_bit_for_bit_and_answers_a_resent_call(tmp_path) -> None:
    spec = CheckpointSpec(str(tmp_path / "j"))
    first, undisturbed = TrainerService(), TrainerService()
    for svc in (first, undisturbed):
        svc.register_job("j", SMALL, GRPOConfig(), 3, spec if svc is first else None)
        svc.finish_warmup("j", 0)
        svc.train("j", *_batch(0), 4, 1)
    stats = first.train("j", *_batch(1), 4, 2)
    # The trainer dies after its checkpoint of call 2, before the reply: the new one restores call 2
    # and answers the re-sent call from its record instead of applying the update twice.
    restored = TrainerService()
    assert restored.register_job("j", SMALL, GRPOConfig(), 3, spec, resume=True) == 3
    assert restored.train("j", *_batch(1), 4, 2) == stats
    assert ckpt.read_info(spec.dir, "j") == ckpt.CheckpointInfo("j", 3, 2)
    undisturbed.train("j", *_batch(1), 4, 2)
    for svc in (restored, undisturbed):
        svc.train("j", *_batch(2), 4, 3)
    a, b = _weights(restored, "j"), _weights(undisturbed, "j")
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert restored.weights("j")[1] == undisturbed.weights("j")[1] == 3
    with pytest.raises(CheckpointError, match="call 7 but its trainer is at 4"):
        restored.train("j", *_batch(3), 4, 7)


def test_missing_or_broken_checkpoint_is_a_one_line_error_naming_the_path(tmp_path) -> None:
    spec = CheckpointSpec(str(tmp_path / "j"))
    svc = TrainerService()
    with pytest.raises(CheckpointError, match="without a checkpoint") as lost:
        svc.register_job("j", SMALL, GRPOConfig(), 0, None, resume=True)
    with pytest.raises(CheckpointError, match="there is none") as missing:
        svc.register_job("j", SMALL, GRPOConfig(), 0, spec, resume=True)
    svc.register_job("j", SMALL, GRPOConfig(), 0, spec)
    path = ckpt.checkpoint_path(spec.dir)
    path.write_bytes(path.read_bytes()[:-100])  # truncated, as a full disk would leave it
    with pytest.raises(CheckpointError, match="truncated or corrupted") as broken:
        TrainerService().register_job("j", SMALL, GRPOConfig(), 0, spec, resume=True)
    svc.register_job("j", SMALL, GRPOConfig(), 0, spec)  # a fresh registration writes a new checkpoint
    with pytest.raises(CheckpointError, match="belongs to job 'j'"):
        TrainerService().register_job("k", SMALL, GRPOConfig(), 0, spec, resume=True)
    for err in (lost, missing, broken):
        assert "\n" not in str(err.value)
    assert str(path) in str(missing.value) and str(path) in str(broken.value)
    with pytest.raises(ValueError, match="absolute path"):
        CheckpointSpec("relative/dir").check()
