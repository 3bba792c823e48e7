"""No silent loss: trainer checkpoints, a trainer or rollout actor killed mid-call on Ray, weights by reference.

In-process tests check the checkpoint contract (restore bit for bit, a re-sent call is not applied
twice, a missing or broken checkpoint is a one-line error). Ray tests (local, loopback) kill a
service actor with ``ray.kill`` while it executes a call and check that the job ends with the
weights and version of an undisturbed run, and that the driver never receives weight tensors
before the job's end.
"""


import contextlib
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from infra.llm import trainer_checkpoint as ckpt
from infra.llm.grpo_trainer import llm_grpo_config
from infra.llm.handles import JobServices
from infra.llm.lm import load_codec
from infra.llm.model import ModelConfig
from infra.llm.rlvr import RLVRConfig, run_job
from infra.llm.service_actors import RewardService, RolloutService, TrainerService
from infra.llm.service_plane import TRAINER_REPLAY, ResilientService
from infra.llm.trainer_checkpoint import CheckpointError, CheckpointSpec
from infra.llm.verifiable_tasks import VOCAB_SIZE

SMALL = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)


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
        svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 3, spec if svc is first else None)
        svc.finish_warmup("j", 0)
        svc.train("j", *_batch(0), 1)
    stats = first.train("j", *_batch(1), 2)
    # The trainer dies after its checkpoint of call 2, before the reply: the new one restores call 2
    # and answers the re-sent call from its record instead of applying the update twice.
    restored = TrainerService()
    assert restored.register_job("j", SMALL, llm_grpo_config(group_size=4), 3, spec, resume=True) == 3
    assert restored.train("j", *_batch(1), 2) == stats
    assert ckpt.read_info(spec.dir, "j") == ckpt.CheckpointInfo("j", 3, 2)
    undisturbed.train("j", *_batch(1), 2)
    for svc in (restored, undisturbed):
        svc.train("j", *_batch(2), 3)
    a, b = _weights(restored, "j"), _weights(undisturbed, "j")
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert restored.weights("j")[1] == undisturbed.weights("j")[1] == 3
    with pytest.raises(CheckpointError, match="call 7 but its trainer is at 4"):
        restored.train("j", *_batch(3), 7)



@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_hugging_face_job_restores_bit_for_bit(arch, tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from llm_tiny_model import make_tiny_hf

    model = ModelConfig(path=str(make_tiny_hf(tmp_path / arch, arch)))
    codec = load_codec(model)
    prompts = [codec.encode(f"{i}+1=") for i in range(4)] * 2
    comps = [codec.encode_answer(str(i)) for i in range(8)]
    spec = CheckpointSpec(str(tmp_path / "ckpt"))
    first, undisturbed = TrainerService(), TrainerService()
    first.register_job("j", model, llm_grpo_config(group_size=4), 0, spec)
    undisturbed.register_job("j", model, llm_grpo_config(group_size=4), 0)
    for svc in (first, undisturbed):
        svc.finish_warmup("j", 0)
        svc.train("j", prompts, comps, [1, 0] * 4, 1)
    restored = TrainerService()
    assert restored.register_job("j", model, llm_grpo_config(group_size=4), 0, spec, resume=True) == 2
    for svc in (restored, undisturbed):
        svc.train("j", prompts, comps, [0, 1] * 4, 2)
    a, b = _weights(restored, "j"), _weights(undisturbed, "j")
    assert all(torch.equal(a[k], b[k]) for k in b) and restored.weights("j")[1] == 2


def test_missing_or_broken_checkpoint_is_a_one_line_error_naming_the_path(tmp_path) -> None:
    spec = CheckpointSpec(str(tmp_path / "j"))
    svc = TrainerService()
    with pytest.raises(CheckpointError, match="without a checkpoint") as lost:
        svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, None, resume=True)
    with pytest.raises(CheckpointError, match="there is none") as missing:
        svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec, resume=True)
    svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec)
    path = ckpt.checkpoint_path(spec.dir)
    path.write_bytes(path.read_bytes()[:-100])  # truncated, as a full disk would leave it
    with pytest.raises(CheckpointError, match="corrupt or truncated") as broken:
        TrainerService().register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec, resume=True)
    path.unlink()  # a fresh registration writes a new checkpoint, never over an existing file
    svc.register_job("j", SMALL, llm_grpo_config(group_size=4), 0, spec)
    with pytest.raises(CheckpointError, match="belongs to job 'j'"):
        TrainerService().register_job("k", SMALL, llm_grpo_config(group_size=4), 0, spec, resume=True)
    for err in (lost, missing, broken):
        assert "\n" not in str(err.value)
    assert str(path) in str(missing.value) and str(path) in str(broken.value)
    with pytest.raises(ValueError, match="absolute path"):
        CheckpointSpec("relative/dir").validate()


# ---------------------------------------------------------------- on Ray: actors killed mid-call


def _cfg(name: str, root: Path, **kw) -> RLVRConfig:
    return RLVRConfig(name=name, task="sort", task_size=3, seed=5, iterations=3, prompts_per_iter=4, grpo=llm_grpo_config(group_size=4),
                      warmup_steps=2, warmup_batch=8, eval_prompts=8, eval_every=100, model=SMALL,
                      checkpoint_dir=str(root / name), **kw)


TRAIN_CALL = 2 + 1 + 1
"""The trainer's state-changing call number of iteration 1's update (2 warm-up steps, the end of the warm-up)."""
GENERATE_SEED = 5 * 100_003 + 1
"""The sampling seed run_job gives iteration 1's generation (seed 5)."""


def _stops_mid_update(marker: Path) -> type:
    class StopsMidUpdate(TrainerService):
        """Blocks inside update ``TRAIN_CALL``, after its first optimiser step, until it is killed (once)."""

        def train(self, job, *args):
            opt = self._jobs[job].trainer.opt
            if args[-1] == TRAIN_CALL and not marker.exists():
                first_step = opt.step

                def step_then_block(*a, **k):
                    out = first_step(*a, **k)
                    marker.touch()
                    time.sleep(300)  # ray.kill ends the process here
                    return out

                opt.step = step_then_block
            return super().train(job, *args)

    return StopsMidUpdate


def _stops_mid_generation(marker: Path) -> type:
    class StopsMidGeneration(RolloutService):
        """Blocks inside the generation of seed ``GENERATE_SEED``, its tokens sampled, until it is killed (once)."""

        def generate(self, job, prompts, max_new_tokens, temperature=1.0, seed=0):
            if seed == GENERATE_SEED and not marker.exists():
                sample = self.engine.generate

                def sample_then_block(*a, **k):
                    out = sample(*a, **k)
                    marker.touch()
                    time.sleep(300)  # ray.kill ends the process here
                    return out

                self.engine.generate = sample_then_block
            return super().generate(job, prompts, max_new_tokens, temperature, seed)

    return StopsMidGeneration


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def _services(ray, trainer_cls: type = TrainerService, rollout_cls: type = RolloutService):
    """The job's three services as Ray actors behind ``ResilientService`` (no CPU reserved: 2-core machines)."""
    def start(cls, *args):
        return lambda: ray.remote(cls).options(num_cpus=0).remote(*args)

    svc = JobServices(rollout=ResilientService(start(rollout_cls, SMALL), timeout_s=120),
                      reward=ResilientService(start(RewardService), timeout_s=120),
                      trainer=ResilientService(start(trainer_cls), timeout_s=120, replay_kwargs=TRAINER_REPLAY))
    try:
        yield svc
    finally:
        for handle in (svc.rollout, svc.reward, svc.trainer):
            ray.kill(handle.actor, no_restart=True)


def _kill_when(marker: Path, service: ResilientService, before=None) -> threading.Thread:
    """Kill ``service``'s actor once ``marker`` exists (the actor is inside the call), after ``before()``."""
    import ray

    def kill() -> None:
        for _ in range(1200):  # at most 120 s
            if marker.exists():
                if before:
                    before()
                ray.kill(service.actor, no_restart=True)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


class _Recording:
    """A handle that keeps what the driver sent and received."""

    def __init__(self, inner) -> None:
        self.inner, self.sent, self.received = inner, [], []

    def call(self, method, *args, **kwargs):
        self.sent.append((method, args))
        self.received.append((method, out := self.inner.call(method, *args, **kwargs)))
        return out

    def call_ref(self, method, *args, **kwargs):
        self.sent.append((method, args))
        self.received.append((method, out := self.inner.call_ref(method, *args, **kwargs)))
        return out


def _tensors(value) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(map(_tensors, value.values()))
    return sum(map(_tensors, value)) if isinstance(value, list | tuple) else 0


@pytest.fixture(scope="module")
def undisturbed(ray_session, tmp_path_factory):
    """The job run on Ray without a fault, its handles recording what the driver saw."""
    with _services(ray_session) as svc:
        rec = JobServices(*(_Recording(h) for h in (svc.rollout, svc.reward, svc.trainer)))
        result = run_job("job", _cfg("job", tmp_path_factory.mktemp("undisturbed")), rec)
    return result, rec


def _assert_same(result, undisturbed) -> None:
    expected = undisturbed[0]
    assert result.version == expected.version == 3
    assert [r.get("mean_reward") for r in result.rows] == [r.get("mean_reward") for r in expected.rows]
    for k, v in expected.weights.items():
        assert torch.equal(result.weights[k], v), f"{k} differs from the undisturbed run"


@pytest.mark.timeout(240)
def test_weights_go_to_the_rollout_by_reference_never_through_the_driver(undisturbed, ray_session) -> None:
    result, rec = undisturbed
    handed = [args[1] for method, args in rec.rollout.sent if method in ("register_job", "update_weights")]
    assert len(handed) == 1 + 3 and all(isinstance(ref, ray_session.ObjectRef) for ref in handed)
    carrying = [(method, _tensors(out)) for h in (rec.rollout, rec.reward, rec.trainer) for method, out in h.received
                if _tensors(out)]
    assert carrying == [("weights", len(result.weights))]  # only the final weights, once, at the job's end


@pytest.mark.timeout(240)
def test_trainer_killed_mid_update_resumes_from_its_checkpoint(undisturbed, ray_session, tmp_path) -> None:
    marker = tmp_path / "in_update"
    with _services(ray_session, trainer_cls=_stops_mid_update(marker)) as svc:
        killer = _kill_when(marker, svc.trainer)
        result = run_job("job", _cfg("job", tmp_path), svc)
        killer.join(timeout=10)
        assert marker.exists() and svc.trainer.restarts == 1
    _assert_same(result, undisturbed)


@pytest.mark.timeout(240)
def test_rollout_killed_mid_generation_redoes_it(undisturbed, ray_session, tmp_path) -> None:
    marker = tmp_path / "in_generation"
    with _services(ray_session, rollout_cls=_stops_mid_generation(marker)) as svc:
        killer = _kill_when(marker, svc.rollout)
        result = run_job("job", _cfg("job", tmp_path), svc)
        killer.join(timeout=10)
        assert marker.exists() and svc.rollout.restarts == 1
    _assert_same(result, undisturbed)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["broken", "none"])
def test_trainer_killed_without_a_usable_checkpoint_fails_the_job_in_one_line(fault, ray_session, tmp_path) -> None:
    marker = tmp_path / "in_update"
    cfg = _cfg("job", tmp_path, checkpoint_every=0 if fault == "none" else 1)
    path = ckpt.checkpoint_path(cfg.checkpoint_dir)

    def corrupt() -> None:
        if fault == "broken":
            path.write_bytes(path.read_bytes()[:-64])

    with _services(ray_session, trainer_cls=_stops_mid_update(marker)) as svc:
        killer = _kill_when(marker, svc.trainer, before=corrupt)
        with pytest.raises(CheckpointError) as err:
            run_job("job", cfg, svc)
        killer.join(timeout=10)
    assert "\n" not in str(err.value)
    assert (str(path) in str(err.value)) if fault == "broken" else ("without a checkpoint" in str(err.value))
