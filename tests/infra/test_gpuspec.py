"""GPU-model-constrained workloads: the generator script and the policy's model scarcity."""

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from infra.scheduler import node_scoring
from infra.scheduler.frag import TypicalPods
from infra.scheduler.node_scoring import Demand
from infra.scheduler.resources import GPU, Alloc, Cluster, ClusterState, Node

ROOT = Path(__file__).resolve().parents[2]


def place_all(policy_name: str, demands: list[Demand]) -> list[int | None]:
    """Place ``demands`` in order on a 2 x A + 4 x B cluster; the node index of each (None: failed)."""
    cluster = Cluster((
        Node("a", 32000, 262144, (GPU("A"),) * 2),
        Node("b", 64000, 262144, (GPU("B"),) * 4),
    ))
    state = ClusterState(cluster)
    # The workload's typical pod asks for 2 GPUs, so FGD sees A's last free GPU as a fragment and
    # likes to fill it: exactly the placement that strands the next A-only pod.
    typical = TypicalPods(((8000, 1000, 2, frozenset()),), (1.0,))
    policy = node_scoring.load(policy_name, typical=typical)
    rng = np.random.default_rng(0)
    nodes = []
    for d in demands:
        choice = policy.choose(state, d, rng)
        if choice is not None:
            state.allocate(Alloc(choice.node, choice.gpus, d.gpu_milli, d.cpu, d.mem))
        nodes.append(None if choice is None else choice.node)
    return nodes


def test_flexible_pod_leaves_the_scarce_models_last_gpu_to_the_constrained_pod():
    only_a = Demand(8000, 16384, 1, 1000, frozenset({"A"}))
    flexible = Demand(8000, 16384, 1, 1000)
    arrivals = [only_a, flexible, only_a]
    # FGD gives the flexible pod A's last GPU (it removes a fragment) and the second A pod fails.
    assert place_all("fgd", arrivals) == [0, 0, None]
    # Half the demand seen so far was A-only, more than A has left: the flexible pod goes to B.
    assert place_all("fgd-strand", arrivals) == [0, 1, 0]


def test_no_constrained_pods_no_change():
    flexible = Demand(8000, 16384, 1, 1000)
    assert place_all("fgd-strand", [flexible] * 3) == place_all("fgd", [flexible] * 3)


@pytest.mark.parametrize("mix", ["cluster", "openb"])
def test_generator_writes_the_share_seeded(trace_dir, tmp_path, mix):
    cmd = [sys.executable, str(ROOT / "scripts" / "make_gpuspec_workloads.py"), "--mix", mix,
           "--pods", str(trace_dir / "openb_pod_list_default.csv"),
           "--nodes", str(trace_dir / "openb_node_list_gpu_node.csv"), "--fractions", "0.05,0.33"]
    for out in ("one", "two"):
        subprocess.run([*cmd, "--out", str(tmp_path / out)], check=True, capture_output=True)
    original = list(csv.DictReader((trace_dir / "openb_pod_list_default.csv").open()))
    models = {r["model"] for r in csv.DictReader((trace_dir / "openb_node_list_gpu_node.csv").open())}
    specs = {}
    for pct in (5, 33):
        name = f"openb_pod_list_gpuspec{pct:02d}_{mix}_seed0.csv"
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()  # seeded
        rows = list(csv.DictReader((tmp_path / "one" / name).open()))
        gpu = [r for r in rows if int(r["num_gpu"]) > 0]
        share = np.mean([bool(r["gpu_spec"]) for r in gpu])
        assert share == pytest.approx(pct / 100, abs=0.002)
        assert not any(r["gpu_spec"] for r in rows if int(r["num_gpu"]) == 0)
        assert all(set(r["gpu_spec"].split("|")) <= models for r in gpu if r["gpu_spec"])
        # Every other column is the original's.
        assert all({k: v for k, v in r.items() if k != "gpu_spec"} == {k: v for k, v in o.items() if k != "gpu_spec"}
                   for r, o in zip(rows, original))
        specs[pct] = [r["gpu_spec"] for r in gpu if r["gpu_spec"]]
    if mix == "cluster":  # one model each, the cluster's most frequent (G2, 70 % of openb's GPUs) first
        gpus = Cluster.from_csv(trace_dir / "openb_node_list_gpu_node.csv")
        most = Counter(g.model for n in gpus.nodes for g in n.gpus).most_common(1)[0][0]
        assert all("|" not in s for s in specs[33]) and max(set(specs[33]), key=specs[33].count) == most
    else:  # the FGD authors' production mix: T4 first, some specs allow several models
        assert max(set(specs[33]), key=specs[33].count) == "T4" and any("|" in s for s in specs[33])


def test_merged_seed_ranges_give_the_figures_of_all_seeds():
    sys.path.insert(0, str(ROOT / "scripts"))
    from merge_replays import pool

    rng = np.random.default_rng(0)
    chunks = [rng.normal(95, 0.3, n) for n in (3, 3, 4)]
    mean, std = pool([(c.mean(), c.std(), c.size) for c in chunks])
    both = np.concatenate(chunks)
    assert mean == pytest.approx(both.mean()) and std == pytest.approx(both.std())
