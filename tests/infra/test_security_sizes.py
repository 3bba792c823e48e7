"""Every size from a config, a checkpoint or a caller is bounded before it is allocated.

YAML aliases (a "billion laughs") are refused in files and in ``key=value`` overrides; a 200 kB value
costs no 200 kB message; threads beyond the cores, a model or a checkpoint's policy beyond this
machine's memory, a gang of too many bundles and a megabyte instruction are refused in one line, and
the instruction cache stays bounded (least recently used first out).
"""

import asyncio

import pytest
import torch

from infra.common.typed_config import ConfigError, apply_overrides, load_yaml, parse_overrides

BOMB = "a: &a [x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b]\n"


def test_yaml_aliases_are_refused_in_files(tmp_path):
    from infra.common.runlog import read_config
    from vla_rl.config import read_yaml

    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(ConfigError, match=r"bomb\.yaml: YAML alias \*a at line 2 is not read"):
        read_yaml(path)
    (tmp_path / "config.yaml").write_text(BOMB)
    with pytest.raises(ConfigError, match="YAML alias"):
        read_config(tmp_path)


def test_yaml_aliases_are_refused_in_overrides():
    with pytest.raises(ConfigError, match=r"override value .*YAML alias \*a"):
        parse_overrides(["seed=[&a [1, 1], *a, *a]"])
    assert load_yaml("a: &x 1", "anchor alone") == {"a": 1}  # an anchor never used expands nothing


def test_a_huge_bad_value_makes_a_short_message():
    from infra.llm.rlvr import RLVRConfig

    with pytest.raises(ConfigError) as err:
        apply_overrides(RLVRConfig(), ["threads=" + "x" * 200_000])
    assert "must be an integer" in str(err.value) and len(str(err.value)) < 300


def test_threads_beyond_the_cores_are_refused_before_the_job_starts(tmp_path):
    from infra.common.limits import cores
    from infra.llm.rlvr import RLVRConfig, run_rlvr

    cfg = apply_overrides(RLVRConfig(), ["model.kind=char", "threads=100000", f"out_dir={tmp_path}", "name=t"])
    with pytest.raises(ConfigError, match=f"threads=100000 must be between 1 and the {cores()} cores"):
        run_rlvr(cfg)
    assert list(tmp_path.iterdir()) == []


def test_a_model_beyond_this_machines_memory_is_refused_from_its_sizes(tmp_path):
    from infra.llm.rlvr import RLVRConfig, run_rlvr

    cfg = apply_overrides(RLVRConfig(), ["model.kind=char", "model.d_model=100000", "model.n_heads=4", "threads=1",
                                         f"out_dir={tmp_path}", "name=big"])
    with pytest.raises(ConfigError, match=r"model \(char\) to train: [\d,]+ parameters need [\d.]+ GiB, over 80%"):
        run_rlvr(cfg)
    assert list(tmp_path.iterdir()) == []


def test_torch_threads_beyond_the_cores_are_refused_before_the_run_starts(tmp_path):
    from infra.common.limits import cores
    from vla_rl.config import load_config

    cfg = load_config("configs/reach_state_ppo.yaml", [f"out_dir={tmp_path}", "torch_threads=100000"])
    with pytest.raises(ConfigError, match=f"torch_threads=100000 must be between 1 and the {cores()} cores"):
        cfg.check()
    assert list(tmp_path.iterdir()) == []


def test_a_training_config_naming_a_huge_policy_is_refused_before_the_policy_is_allocated(tmp_path, monkeypatch):
    import policies
    from vla_rl.config import load_config
    from vla_rl.trainer import Trainer

    built = []
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: built.append(a) or pytest.fail("policy allocated"))
    cfg = load_config("configs/reach_state_ppo.yaml", [f"out_dir={tmp_path}", "name=huge", "env.num_envs=2",
                                                       "policy.hidden_sizes=[300000,300000]"])
    with pytest.raises(ConfigError, match=r"the policy\.\* sizes of this config: [\d,]+ parameters need [\d.]+ GiB"):
        Trainer(cfg)
    assert built == []


def test_a_checkpoint_naming_a_huge_policy_is_refused_before_allocation(tmp_path):
    from infra.common import checkpoint_io
    from vla_rl.checkpoint import CheckpointError
    from vla_rl.config import load_config, to_dict
    from vla_rl.deploy import load_policy

    cfg = to_dict(load_config("configs/reach_state_ppo.yaml"))
    cfg["policy"]["hidden_sizes"] = [300_000, 300_000]
    payload = {"config": cfg, "obs_spec": {"proprio": {"shape": [7], "dtype": "torch.float32"},
                                           "state": {"shape": [10], "dtype": "torch.float32"}},
               "action_dim": 4, "policy": {}}
    checkpoint_io.save(tmp_path / "latest.pt", payload, "vla_rl")
    with pytest.raises(CheckpointError, match=r"the policy its config describes: [\d,]+ parameters need"):
        load_policy(tmp_path / "latest.pt")


def test_a_checkpoint_whose_config_builds_no_policy_raises_the_loaders_error(tmp_path):
    from infra.common import checkpoint_io
    from vla_rl.checkpoint import CheckpointError
    from vla_rl.config import load_config, to_dict
    from vla_rl.deploy import load_policy

    payload = {"config": to_dict(load_config("configs/reach_state_ppo.yaml")), "obs_spec": {"x": {"shape": "a"}},
               "action_dim": 4, "policy": {}}
    checkpoint_io.save(tmp_path / "latest.pt", payload, "vla_rl")
    with pytest.raises(CheckpointError, match="does not describe a policy this code builds"):
        load_policy(tmp_path / "latest.pt")


def test_a_gang_of_too_many_bundles_is_refused_before_the_journal_stores_it(tmp_path):
    from infra.scheduler import Bundle, GangRequest, RequestError
    from infra.scheduler.requests import MAX_BUNDLES
    from infra.service.actor import Credentials, SchedulerService, token_digest

    svc = SchedulerService(store=str(tmp_path))
    svc._follow_nodes = svc._adopt_groups = lambda: None
    svc.credentials = Credentials("", {token_digest("t"): "alice"})
    seq, size = svc.journal.seq, (tmp_path / "journal.jsonl").stat().st_size
    huge = GangRequest("huge", (Bundle(100, 64),) * (MAX_BUNDLES + 1), tenant="alice")
    with pytest.raises(RequestError, match=f"{MAX_BUNDLES + 1} bundles, over the {MAX_BUNDLES}"):
        asyncio.run(svc.submit(huge, cred="t"))
    long_name = GangRequest("n" * 10_000, (Bundle(100, 64),), tenant="alice")
    with pytest.raises(RequestError, match="over 200 characters") as err:
        asyncio.run(svc.submit(long_name, cred="t"))
    assert len(str(err.value)) < 300
    assert svc.journal.seq == seq and (tmp_path / "journal.jsonl").stat().st_size == size


def test_a_megabyte_instruction_is_refused_before_the_encoder():
    from policies.encoders import SentenceCache

    cache = SentenceCache(lambda strings: pytest.fail("the encoder ran"))
    with pytest.raises(ValueError, match=r"at most 2000 characters; got 'xxx.*\(1000000 characters\)") as err:
        cache(["x" * 1_000_000])
    assert len(str(err.value)) < 300


def test_the_instruction_cache_is_bounded_least_recently_used_first():
    from policies.encoders import SentenceCache

    cache = SentenceCache(lambda strings: torch.arange(float(len(strings)))[:, None], max_entries=2)
    cache.preload({"kept": torch.zeros(1)})
    cache(["a", "b"])
    cache(["a"])  # b is now the least recently used
    cache(["c"])
    assert set(cache._cache) == {"a", "c"}
    cache(["b", "kept"])  # b comes back through the encoder; a preloaded string never does
    assert cache.encoded == {"a": 1, "b": 2, "c": 1}


@pytest.mark.parametrize("value", ["nan", "1e4", "-1"])
def test_the_scheduler_benchmark_refuses_an_unbounded_inflation(value):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "scripts/bench_scheduler.py", "--inflate", value],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"argument --inflate: {value} is outside [0.1, 10]" in out.stderr
