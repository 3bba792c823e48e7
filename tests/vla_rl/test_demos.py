"""Demonstrations as a LeRobot v3.0 dataset: the written layout, the round trip through DemoDataset,
DART labels, failures dropped, one-line errors on bad input; and, in a separate virtual environment
with LeRobot's dataset code, LeRobot reading what we write and us reading what LeRobot writes (slow)."""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from infra.common.files import write_atomic
from sims import tasks as T
from sims.experts import ScriptedExpert
from sims.vec_env import SimVectorEnv
from vla_rl.demos import CollectConfig, DatasetError, DemoDataset, LeRobotWriter, collect
from vla_rl.demos.reader import decode_mp4

CAMERAS = ("front", "wrist")
SIZE = 32
EPISODES_PER_FILE = 4


def _collect(out: Path, **kwargs) -> dict:
    cfg = CollectConfig(out=out, num_threads=1, **{"task": "suite", "episodes": 6, "num_envs": 3, **kwargs})
    return collect.collect_demos(cfg, progress=False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A suite dataset (6 episodes over 2 files, cameras front and wrist at 32 px) and what its writer was given."""
    added = []

    class SpyWriter(LeRobotWriter):
        def add_episode(self, data, videos, task_index, extra=None):
            added.append({"data": data, "videos": videos, "task_index": task_index, "extra": extra})
            return super().add_episode(data, videos, task_index, extra)

    root = tmp_path_factory.mktemp("demos") / "suite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(collect, "LeRobotWriter", SpyWriter)
        info = _collect(root, cameras=CAMERAS, image_size=SIZE, episodes_per_file=EPISODES_PER_FILE)
    return root, info, added


def test_layout_files_info_and_columns(recorded):
    root, info, added = recorded
    lengths = [len(a["data"]["action"]) for a in added]
    videos = [f"videos/observation.images.{c}/chunk-000/file-00{i}.mp4" for c in CAMERAS for i in (0, 1)]
    for rel in ("meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
                "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet", *videos):
        assert (root / rel).is_file(), rel
    assert json.loads((root / "meta/info.json").read_text()) == info
    assert info["codebase_version"] == "v3.0" and info["fps"] == 25 and info["chunks_size"] == 1000
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert (info["total_episodes"], info["total_frames"], info["splits"]) == (6, sum(lengths), {"train": "0:6"})
    assert all({"dtype", "shape", "names"} <= set(f) for f in info["features"].values())
    video = info["features"]["observation.images.front"]
    assert video["dtype"] == "video" and video["shape"] == [SIZE, SIZE, 3]
    assert video["info"]["video.fps"] == 25 and video["info"]["video.codec"] == "h264"
    source = info["source"]
    assert (source["split"], source["seed"], source["kept"]) == ("train", 0, 6)

    schema = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    assert schema.field("observation.state").type == pa.list_(pa.float32(), T.PROPRIO_DIM)
    assert schema.field("action").type == pa.list_(pa.float32(), 4)
    assert schema.field("observation.environment_state").type == pa.list_(pa.float32(), T.STATE_DIM)
    assert schema.field("timestamp").type == pa.float32()
    for name in ("frame_index", "episode_index", "index", "task_index", "sims.task_index"):
        assert schema.field(name).type == pa.int64(), name

    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in episodes] == lengths and all(e["sims/success"] for e in episodes)
    assert episodes[-1]["dataset_to_index"] == sum(lengths) and episodes[4]["data/file_index"] == 1
    for camera in CAMERAS:
        key = f"videos/observation.images.{camera}"
        for file in (0, 1):
            in_file = [e for e in episodes if e[f"{key}/file_index"] == file]
            frames = decode_mp4(root / "videos" / f"observation.images.{camera}" / f"chunk-000/file-00{file}.mp4")
            assert len(frames) == sum(e["length"] for e in in_file), (camera, file)
            assert in_file[-1][f"{key}/to_timestamp"] == pytest.approx(len(frames) / 25)

    tasks = pq.read_table(root / "meta/tasks.parquet")
    instructions = T.instruction_table(T.resolve_tasks("suite"), "train")
    assert tasks["__index_level_0__"].to_pylist() == instructions
    assert tasks["task_index"].to_pylist() == list(range(len(instructions)))
    stats = json.loads((root / "meta/stats.json").read_text())
    assert np.shape(stats["observation.images.wrist"]["mean"]) == (3, 1, 1)
    assert {"min", "max", "mean", "std", "count", "q01", "q99"} <= set(stats["action"])


def test_round_trip_actions_exact_frames_close(recorded):
    root, _, added = recorded
    ds = DemoDataset(root)
    assert ds.cameras == [f"observation.images.{c}" for c in CAMERAS] and ds.num_episodes == 6
    for key, name in (("action", "action"), ("observation.state", "proprio"),
                      ("observation.environment_state", "state"), ("observation.goal_pixel", "goal_pixel")):
        recorded_values = np.concatenate([a["data"][key] for a in added])
        assert np.array_equal(ds.data[name].numpy(), recorded_values), key
    instruction = np.concatenate([np.full(len(a["data"]["action"]), a["task_index"]) for a in added])
    assert np.array_equal(ds.data["instruction"].numpy(), instruction)
    assert ds.instructions == T.instruction_table(T.resolve_tasks("suite"), "train")
    rgb = ds.data["rgb"].numpy().astype(int)  # [T, cams, 3, H, W]
    assert rgb.shape == (len(ds), 2, 3, SIZE, SIZE) and ds.data["rgb"].dtype == torch.uint8
    for c, camera in enumerate(CAMERAS):
        frames = np.concatenate([a["videos"][f"observation.images.{camera}"] for a in added]).transpose(0, 3, 1, 2)
        error = np.abs(rgb[:, c] - frames)
        assert error.mean() < 1.0 and error.max() <= 3, camera  # crf 0: only RGB <-> YUV rounding

    small = DemoDataset(root, action_chunk=3, cameras=["front"], image_size=16, episodes=[1, 2])
    assert small.data["rgb"].shape[1:] == (1, 3, 16, 16)
    batch = small.batch(torch.arange(len(small)))
    actions = np.concatenate([a["data"]["action"] for a in added[1:3]])
    ends = np.cumsum([len(a["data"]["action"]) for a in added[1:3]]) - 1
    last = ends[np.searchsorted(ends, np.arange(len(small)))]
    ahead = np.arange(len(small))[:, None] + np.arange(3)
    assert np.array_equal(batch["action_mask"].numpy(), ahead <= last[:, None])
    assert np.array_equal(batch["action"].numpy(), actions[np.minimum(ahead, last[:, None])])

    first = [b["frame"] for b in ds.minibatches(16, seed=3)]
    assert all(torch.equal(a, b) for a, b in zip(first, [b["frame"] for b in ds.minibatches(16, seed=3)]))
    order = torch.cat([torch.stack([b["episode"], b["frame"]], 1) for b in ds.minibatches(16, seed=4)])
    assert len(order) == len(ds) and len({tuple(r) for r in order.tolist()}) == len(ds)
    assert not torch.equal(torch.cat(first), torch.cat([b["frame"] for b in ds.minibatches(16, seed=4)]))


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_noise_executes_noisy_actions_and_labels_clean_expert_actions(tmp_path, monkeypatch, noise):
    expert_actions, executed = [], []

    act = ScriptedExpert.act

    def spy_act(expert, obs):
        expert_actions.append(act(expert, obs))
        return expert_actions[-1]

    step = SimVectorEnv.step_arrays

    def spy_step(env, action):
        executed.append(action)
        return step(env, action)

    monkeypatch.setattr(ScriptedExpert, "act", spy_act)  # the gantry suite's expert (sims.suite_of("push").expert)
    monkeypatch.setattr(SimVectorEnv, "step_arrays", spy_step)
    _collect(tmp_path / "d", task="push", episodes=4, num_envs=2, noise=noise, keep_failures=True, image_size=16)
    ds = DemoDataset(tmp_path / "d", cameras=[])
    episodes = pq.read_table(tmp_path / "d/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for i in range(2):
        mine = sorted((e["sims/env_episode"], e["episode_index"]) for e in episodes if e["sims/env_index"] == i)
        labels = torch.cat([ds.data["action"][ds.data["episode"] == e] for _, e in mine]).numpy()
        assert np.array_equal(labels, np.stack(expert_actions)[:len(labels), i])  # the label is the expert's
        ran = np.stack(executed)[:len(labels), i]
        if noise == 0:
            assert np.array_equal(ran, labels)
        else:
            inside = np.abs(ran) < 1.0  # not clipped
            assert 0.6 * noise < np.std((ran - labels)[inside]) < 1.4 * noise
            assert np.isin(labels[:, 3], [-1.0, 1.0]).all()  # the expert opens or closes; noise would not


def test_failures_dropped_unless_kept(tmp_path):
    dropped = _collect(tmp_path / "a", task="stack", episodes=6, num_envs=4, noise=0.7, image_size=16)
    kept = _collect(tmp_path / "b", task="stack", episodes=6, num_envs=4, noise=0.7, image_size=16, keep_failures=True)
    assert dropped["source"]["attempted"] > dropped["source"]["kept"] == 6 == kept["source"]["kept"]
    success = [pq.read_table(p / "meta/episodes/chunk-000/file-000.parquet")["sims/success"].to_pylist()
               for p in (tmp_path / "a", tmp_path / "b")]
    assert all(success[0]) and not all(success[1])


def test_task_weights_choose_which_tasks_are_demonstrated(tmp_path):
    only = {name: 0.0 for name in T.TASK_NAMES if name not in ("reach", "lift")}
    info = _collect(tmp_path / "w", episodes=6, image_size=16, task_weights=only)
    assert info["source"]["task_weights"] == only
    column = pq.read_table(tmp_path / "w/data/chunk-000/file-000.parquet")["sims.task_index"].to_pylist()
    assert {T.TASK_NAMES[int(np.ravel(v)[0])] for v in column} <= {"reach", "lift"}
    with pytest.raises(ValueError, match=r"task weights name \['pushh'\]"):
        CollectConfig(task_weights={"pushh": 1.0}, out=tmp_path / "x").validate()
    with pytest.raises(ValueError, match="one of them > 0"):
        CollectConfig(task_weights=dict.fromkeys(T.TASK_NAMES, 0.0), out=tmp_path / "x").validate()


def test_per_task_caps_each_tasks_demonstrations(tmp_path):
    info = _collect(tmp_path / "f", episodes=len(T.TASK_NAMES), image_size=16, per_task=1)
    table = pq.read_table(tmp_path / "f/data/chunk-000/file-000.parquet").to_pydict()
    task_of = {e: int(np.ravel(t)[0]) for e, t in zip(table["episode_index"], table["sims.task_index"])}
    assert sorted(task_of.values()) == list(range(len(T.TASK_NAMES)))  # one episode of each task
    assert info["source"]["per_task"] == 1 and info["source"]["succeeded"] >= info["source"]["kept"] == 6
    with pytest.raises(ValueError, match=r"episodes=7 with per_task=1 over the 6 task\(s\) of suite"):
        CollectConfig(per_task=1, episodes=7, out=tmp_path / "x").validate()


def _break(root: Path, change: str) -> None:
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    if change == "no info":
        info_path.unlink()
    elif change == "version":
        info["codebase_version"] = "v2.1"
    elif change == "feature":
        del info["features"]["action"]
    elif change == "video":
        next((root / "videos").rglob("file-001.mp4")).unlink()
    if change in ("version", "feature"):
        info_path.write_text(json.dumps(info))


@pytest.mark.parametrize(("change", "message"), [
    ("no info", "meta/info.json is missing; pass the dataset's root folder"),
    ("version", "codebase_version 'v2.1', this reader reads 'v3.0'; convert"),
    ("feature", "feature(s) ['action'] missing"),
    ("video", "file-001.mp4 is missing"),
])
def test_bad_dataset_one_line_error(recorded, tmp_path, change, message):
    root = tmp_path / "copy"
    shutil.copytree(recorded[0], root)
    _break(root, change)
    with pytest.raises(DatasetError) as err:
        DemoDataset(root)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_arguments(recorded, tmp_path):
    with pytest.raises(DatasetError, match=r"no video feature \['top'\]; its cameras are"):
        DemoDataset(recorded[0], cameras=["top"])
    with pytest.raises(ValueError, match="noise=-1"):
        CollectConfig(noise=-1.0, out=tmp_path / "x").validate()
    with pytest.raises(ValueError, match="is not empty"):
        CollectConfig(out=recorded[0]).validate()


# ----------------------------------------------------------------------------- LeRobot's own loader
# LeRobot cannot sit beside this project's packages (docs/demos.md, "Checked against LeRobot"), so the
# tests make it a virtual environment of its own on first use and reuse it while its key holds.
LEROBOT_VENV = Path(os.environ.get("LEROBOT_VENV", Path(__file__).resolve().parents[2] / ".venv-lerobot"))
# torchcodec 0.13.0 is the newest build on PyPI that links the CPU torch alone (0.14 on need CUDA torch's
# libraries); torchvision is whichever release matches the pinned torch.
LEROBOT_REQUIREMENTS = ("lerobot-dataset==0.4.4", "torchcodec==0.13.0", "torchvision")
# 2.5x its time on a 2-core machine under load; with the rest of the first test it stays under pytest's
# faulthandler_timeout (720 s), which would end the whole run.
LEROBOT_INSTALL_TIMEOUT_S = 480
_IMPORT = """
import torch
try:
    import torchvision
except RuntimeError as e:
    # PyPI's torchvision is built against CUDA torch: beside the CPU torch its compiled ops do not load,
    # and its import then fails declaring fake kernels for two of them. LeRobot's dataset code calls no
    # torchvision op, so declaring their schemas (without kernels) lets the pure-Python part import.
    if "torchvision::nms does not exist" not in str(e):
        raise
    for op in ("nms", "qnms"):
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
try:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
except ImportError:
    from ledataset.datasets.lerobot_dataset import LeRobotDataset
"""
_READ = _IMPORT + """
import sys, numpy as np, torch
root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/demos", root=root, delta_timestamps={"action": [0.0, 0.04, 0.08]})
picks = [0, len(ds) // 2, len(ds) - 1]
items = [ds[i] for i in picks]
stack = lambda key: np.stack([it[key].numpy() for it in items])
np.savez(out, picks=picks, length=len(ds), episodes=ds.num_episodes, task=[it["task"] for it in items],
         action=torch.stack(list(ds.hf_dataset["action"])).numpy(), chunk=stack("action"), pad=stack("action_is_pad"),
         front=stack("observation.images.front"), wrist=stack("observation.images.wrist"),
         goal=stack("observation.goal_pixel"))
"""
_WRITE = _IMPORT + """
import sys, numpy as np
features = {"observation.state": {"dtype": "float32", "shape": (5,), "names": None},
            "action": {"dtype": "float32", "shape": (2,), "names": None},
            "observation.images.cam": {"dtype": "video", "shape": (32, 48, 3),
                                       "names": ["height", "width", "channels"]}}
ds = LeRobotDataset.create("local/made", fps=10, features=features, root=sys.argv[1], use_videos=True)
for e in range(3):
    for t in range(7 + e):
        image = np.zeros((32, 48, 3), np.uint8)
        image[:, :, e] = 25 * t
        ds.add_frame({"observation.state": np.full(5, t, np.float32), "action": np.full(2, 10 * e + t, np.float32),
                      "observation.images.cam": image, "task": f"task {e % 2}"})
    ds.save_episode()
ds.finalize()
"""


def _subprocess_env() -> dict[str, str]:
    """This environment without the PYTHON* variables, which would point the other interpreter at our packages."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


def _required() -> bool:
    """Whether a LeRobot environment that cannot be made fails the tests (CI, which sets CI=true) or skips them."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _registry_reachable() -> bool:
    """Whether pip can fetch LeRobot's dataset wheel (about 200 KB): a registry out of reach skips, a failing
    install fails."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--timeout", "20", "--retries", "1",
               "-d", tmp, LEROBOT_REQUIREMENTS[0]]
        try:
            return subprocess.run(cmd, env=_subprocess_env(), capture_output=True, timeout=120).returncode == 0
        except subprocess.TimeoutExpired:
            return False


def _make_lerobot_venv(venv: Path) -> None:
    """A fresh virtual environment at ``venv`` with LeRobot's dataset code on this interpreter's own torch build
    (a constraint, so pip takes the CPU wheel where we run on one and never pulls a CUDA torch)."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "-c", str(constraints), "torch", *LEROBOT_REQUIREMENTS]
    try:
        proc = subprocess.run(cmd, env=_subprocess_env(), capture_output=True, text=True,
                              timeout=LEROBOT_INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"installing LeRobot into {venv} took over {LEROBOT_INSTALL_TIMEOUT_S} s (a slow registry?); "
                    "rerun: pip's cache keeps what it downloaded", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"pip could not install {' '.join(LEROBOT_REQUIREMENTS)} into {venv}: "
                    f"{_last_line(proc.stderr)}", pytrace=False)


def _check_lerobot_imports(python: Path) -> None:
    """LeRobot's dataset code and torchcodec's decoder import, or one line says what is missing."""
    script = _IMPORT + "from torchcodec.decoders import VideoDecoder\n"
    proc = subprocess.run([str(python), "-c", script], env=_subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    if proc.returncode == 0:
        return
    if "libavutil" in proc.stderr:
        pytest.fail("torchcodec finds no FFmpeg shared libraries: apt-get install ffmpeg (make setup does it when "
                    "run as root)", pytrace=False)
    pytest.fail(f"LeRobot does not import in {python}: {_last_line(proc.stderr)}; delete "
                f"{python.parent.parent} to make it anew", pytrace=False)


def _lerobot_venv_python(venv: Path) -> Path:
    """The interpreter of LeRobot's virtual environment at ``venv``: made when missing (a few minutes), reused
    while Python, torch and ``LEROBOT_REQUIREMENTS`` stay the same."""
    python, stamp = venv / "bin" / "python", venv / ".lerobot-stamp"
    key = hashlib.sha256(repr((sys.version_info[:2], torch.__version__, LEROBOT_REQUIREMENTS)).encode()).hexdigest()
    venv.parent.mkdir(parents=True, exist_ok=True)
    # One maker at a time (two sessions sharing LEROBOT_VENV); the holder's steps all have timeouts.
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make = not (stamp.is_file() and stamp.read_text() == key)
        if make:
            if not _registry_reachable():
                reason = (f"pip cannot reach the package registry to install {LEROBOT_REQUIREMENTS[0]} into "
                          f"{venv}; LeRobot's cross-check needs it once")
                if _required():
                    pytest.fail(reason, pytrace=False)
                pytest.skip(reason)
            _make_lerobot_venv(venv)
        _check_lerobot_imports(python)
        if make:  # the stamp says complete and working
            write_atomic(stamp, key.encode())
    return python


@pytest.fixture(scope="session")
def lerobot_python() -> Path:
    """LeRobot's interpreter for the session (``LEROBOT_VENV``, default ``.venv-lerobot`` in the checkout)."""
    return _lerobot_venv_python(LEROBOT_VENV)


def _run_lerobot(python: Path, script: str, *args: Path) -> None:
    env = _subprocess_env()
    env.update(HF_HUB_OFFLINE="1", HF_LEROBOT_HOME=str(args[0].parent / "hf"))
    proc = subprocess.run([str(python), "-c", script, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=args[0].parent)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture
def venv_steps(monkeypatch):
    """Stands in for pip and the import check: records which steps ran instead of installing (seconds, no network)."""
    steps = []

    def probe() -> bool:
        steps.append("probe")
        return True

    def make(venv: Path) -> None:
        steps.append("make")
        venv.mkdir(exist_ok=True)

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_registry_reachable", probe)
    monkeypatch.setattr(module, "_make_lerobot_venv", make)
    monkeypatch.setattr(module, "_check_lerobot_imports", lambda python: steps.append("check"))
    return steps


def test_lerobot_venv_made_once_and_remade_when_its_requirements_change(venv_steps, monkeypatch, tmp_path):
    venv = tmp_path / "lerobot"
    assert _lerobot_venv_python(venv) == venv / "bin" / "python"
    assert venv_steps == ["probe", "make", "check"]
    _lerobot_venv_python(venv)
    assert venv_steps[3:] == ["check"]  # reused: only the imports are checked
    monkeypatch.setattr(sys.modules[__name__], "LEROBOT_REQUIREMENTS", (*LEROBOT_REQUIREMENTS, "extra==1"))
    _lerobot_venv_python(venv)
    assert venv_steps[4:] == ["probe", "make", "check"]


@pytest.mark.parametrize("ci", ["true", ""])
def test_lerobot_venv_without_registry_fails_in_ci_and_skips_elsewhere(venv_steps, monkeypatch, tmp_path, ci):
    monkeypatch.setattr(sys.modules[__name__], "_registry_reachable", lambda: False)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="cannot reach the package"):
        _lerobot_venv_python(tmp_path / "lerobot")
    assert venv_steps == [] and not (tmp_path / "lerobot" / ".lerobot-stamp").exists()


@pytest.mark.slow
@pytest.mark.timeout(LEROBOT_INSTALL_TIMEOUT_S + 200)  # the first of the two makes LeRobot's environment
def test_lerobot_loads_our_dataset(lerobot_python, recorded, tmp_path):
    root, info, _ = recorded
    _run_lerobot(lerobot_python, _READ, root, tmp_path / "lerobot.npz")
    got = np.load(tmp_path / "lerobot.npz")
    ours = DemoDataset(root, action_chunk=3)
    assert (int(got["length"]), int(got["episodes"])) == (info["total_frames"], info["total_episodes"])
    assert np.array_equal(got["action"], ours.data["action"].numpy())
    batch = ours.batch(torch.as_tensor(got["picks"]))
    assert np.array_equal(got["chunk"], batch["action"].numpy())
    assert np.array_equal(got["pad"], ~batch["action_mask"].numpy())
    assert np.array_equal(got["goal"], batch["goal_pixel"].numpy())
    assert list(got["task"]) == [ours.instructions[i] for i in batch["instruction"].tolist()]
    for c, camera in enumerate(CAMERAS):  # LeRobot gives float [3, H, W] in [0, 1]
        assert np.abs(got[camera] * 255 - batch["rgb"][:, c].numpy()).max() <= 1.0, camera


@pytest.mark.slow
@pytest.mark.timeout(LEROBOT_INSTALL_TIMEOUT_S + 200)
def test_reader_loads_a_dataset_lerobot_wrote(lerobot_python, tmp_path):
    _run_lerobot(lerobot_python, _WRITE, tmp_path / "made")
    ds = DemoDataset(tmp_path / "made", action_chunk=2)
    assert ds.instructions == ["task 0", "task 1"] and len(ds) == 7 + 8 + 9 and ds.num_episodes == 3
    assert ds.data["action"][:, 0].tolist() == [10.0 * e + t for e in range(3) for t in range(7 + e)]
    assert ds.data["instruction"].tolist() == [e % 2 for e in range(3) for _ in range(7 + e)]
    red = [float(25 * t) for t in range(7)]  # episode 0 brightens its red channel by 25 a frame (AV1: lossy)
    assert np.abs(ds.data["rgb"][:7, 0, 0].float().mean((1, 2)).numpy() - red).max() < 6
    assert ds.batch(torch.tensor([6]))["action_mask"].tolist() == [[True, False]]
