"""Reading a LeRobot v3.0 dataset (ours or anyone's) into TensorDict batches.

A :class:`DemoDataset` holds every selected frame in memory (frames decoded once from the mp4s)
and serves TensorDict batches with the keys of the environment's observations:

========================  ===============================  ======================================
batch key                 dtype, shape                     LeRobot feature
========================  ===============================  ======================================
``rgb``                   uint8 [B, cams, 3, H, W]         every video feature (or ``cameras``)
``proprio``               float32 [B, P]                   ``observation.state``
``action``                float32 [B, A] or [B, K, A]      ``action`` (K future actions with
                                                           ``action_chunk=K``)
``action_mask``           bool [B, K]                      True where the chunk's action is real,
                                                           False past the episode's end (padding
                                                           repeats the last action)
``instruction``           int64 [B]                        ``task_index`` (into ``instructions``)
``episode``, ``frame``    int64 [B]                        ``episode_index``, ``frame_index``
``state``                 float32 [B, S]                   ``observation.environment_state``
``goal_pixel``            float32 [B, cams, 2]             ``observation.goal_pixel``
``object_goal_pixel``     float32 [B, cams, 2]             ``observation.object_goal_pixel``
``task``                  int64 [B]                        ``sims.task_index``
any other feature         its dtype, [B, *shape]           under its own name
========================  ===============================  ======================================

The last five rows are present when the dataset has those features.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from vla_rl.demos.lerobot import CODEBASE_VERSION, EPISODES_PATH, INDEX_FEATURES, INFO_PATH, TASKS_PATH

KEYS = {"observation.state": "proprio", "action": "action", "task_index": "instruction", "episode_index": "episode",
        "frame_index": "frame", "observation.environment_state": "state", "observation.goal_pixel": "goal_pixel",
        "observation.object_goal_pixel": "object_goal_pixel", "sims.task_index": "task"}
"""LeRobot feature -> batch key; features not listed keep their own name."""
REQUIRED = ("observation.state", "action", *INDEX_FEATURES)
_INFO_FIELDS = ("fps", "features", "data_path", "total_episodes")
_NOT_IN_BATCHES = ("timestamp", "index")


class DatasetError(ValueError):
    """A dataset folder this reader cannot use; the message names the problem and the fix."""


def read_info(root: Path) -> dict[str, Any]:
    """``meta/info.json`` of the dataset at ``root``, checked: a v3.0 dataset with the features the reader needs.

    Raises:
        DatasetError: no info.json, another codebase_version, a missing field or feature.
    """
    path = Path(root) / INFO_PATH
    if not path.is_file():
        raise DatasetError(f"{root} is not a LeRobot dataset: {INFO_PATH} is missing; pass the dataset's root folder "
                           "(the one holding meta/, data/ and videos/), e.g. one written by scripts/collect_demos.py")
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not valid JSON ({exc}); write the dataset again") from exc
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise DatasetError(f"{path}: codebase_version {version!r}, this reader reads {CODEBASE_VERSION!r}; convert "
                           "it with LeRobot's lerobot/datasets/v30/convert_dataset_v21_to_v30.py, or record it again")
    missing = [k for k in _INFO_FIELDS if k not in info]
    if missing:
        raise DatasetError(f"{path} lacks the field(s) {missing}; it is not a complete LeRobot v3.0 info.json")
    lacking = [k for k in REQUIRED if k not in info["features"]]
    if lacking:
        raise DatasetError(f"{path}: feature(s) {lacking} missing (it has {sorted(info['features'])}); the reader "
                           "needs observation.state (proprioception), action and LeRobot's index features")
    return info


def read_tasks(root: Path) -> list[str]:
    """The task strings of ``meta/tasks.parquet``, in task_index order (the pandas index or a string column)."""
    path = Path(root) / TASKS_PATH
    if not path.is_file():
        raise DatasetError(f"{path} is missing; a LeRobot v3.0 dataset lists its task strings there")
    table = pq.read_table(path)
    text = [f.name for f in table.schema if f.name != "task_index"
            and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))]
    if "task_index" not in table.column_names or len(text) != 1:
        raise DatasetError(f"{path} has columns {table.column_names}; expected task_index and one string column")
    order = np.argsort(table["task_index"].to_numpy())
    if not np.array_equal(table["task_index"].to_numpy()[order], np.arange(len(order))):
        raise DatasetError(f"{path}: task_index is not 0..{len(order) - 1}; rewrite the tasks table")
    return [table[text[0]][int(i)].as_py() for i in order]


def _column(table: pa.Table, name: str, shape: Sequence[int], where: Path) -> np.ndarray:
    """Column ``name`` as numpy [rows, *shape] ([rows] for shape [1]); nested lists are flattened."""
    if name not in table.column_names:
        raise DatasetError(f"{where} has no column {name!r} (info.json declares it); the data files do not match "
                           "meta/info.json: write the dataset again")
    array = table[name].combine_chunks()
    while any(is_list(array.type) for is_list in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)):
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    shape = [] if list(shape) == [1] else list(shape)
    if values.size != len(table) * int(np.prod(shape)):
        raise DatasetError(f"{where}: column {name!r} does not hold {len(table)} rows of shape {shape}")
    return values.reshape(len(table), *shape)


def read_episodes(root: Path, episodes: Sequence[int] | None) -> pa.Table:
    """The meta/episodes rows (all files), sorted by episode_index; only ``episodes`` when given."""
    paths = sorted((Path(root) / "meta/episodes").glob("*/*.parquet"))
    if not paths:
        raise DatasetError(f"{root}: no {EPISODES_PATH.split('/chunk')[0]}/chunk-*/file-*.parquet; the dataset lacks "
                           "its episode table: write it again (or finish the LeRobot recording)")
    table = pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")
    _require_columns(table, ["episode_index", "length", "data/chunk_index", "data/file_index"], paths[0])
    table = table.sort_by("episode_index")
    if episodes is not None:
        index = table["episode_index"].to_numpy()
        unknown = sorted(set(episodes) - set(index.tolist()))
        if unknown:
            raise DatasetError(f"{root}: episodes {unknown[:10]} are not in the dataset (0..{len(index) - 1})")
        table = table.filter(pa.array(np.isin(index, list(episodes))))
    if len(table) == 0:
        raise DatasetError(f"{root}: no episode to read (episodes={episodes}); pass None for all, or some indices")
    return table


def _require_columns(table: pa.Table, names: Sequence[str], where: Path) -> None:
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise DatasetError(f"{where} lacks the column(s) {missing} of LeRobot v3.0; write the dataset again")


def read_rows(root: Path, info: dict[str, Any], episodes: pa.Table, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Features ``keys`` of every frame of ``episodes``, sorted by (episode_index, frame_index), as numpy."""
    files = sorted(set(zip(episodes["data/chunk_index"].to_pylist(), episodes["data/file_index"].to_pylist())))
    wanted = set(episodes["episode_index"].to_pylist())
    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for chunk, file in files:
        path = Path(root) / info["data_path"].format(chunk_index=chunk, file_index=file)
        if not path.is_file():
            raise DatasetError(f"{path} is missing (meta/episodes points to it); the dataset is incomplete")
        table = pq.read_table(path)
        keep = np.isin(_column(table, "episode_index", [1], path), list(wanted))
        table = table.filter(pa.array(keep))
        for key in keys:
            parts[key].append(_column(table, key, info["features"][key]["shape"], path))
    rows = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.lexsort((rows["frame_index"], rows["episode_index"]))
    rows = {k: v[order] for k, v in rows.items()}
    lengths = np.bincount(np.searchsorted(episodes["episode_index"].to_numpy(), rows["episode_index"]),
                          minlength=len(episodes))
    bad = np.flatnonzero(lengths != episodes["length"].to_numpy())
    if len(bad):
        e = episodes["episode_index"][int(bad[0])].as_py()
        raise DatasetError(f"{root}: episode {e} has {lengths[bad[0]]} data rows but length "
                           f"{episodes['length'][int(bad[0])].as_py()} in meta/episodes; the dataset is inconsistent")
    return rows


def decode_mp4(path: Path) -> np.ndarray:
    """Every frame of the video at ``path``, uint8 [F, H, W, 3] (imageio-ffmpeg's ffmpeg: H.264, AV1, ...).

    Raises:
        DatasetError: ffmpeg cannot read the file (truncated or damaged), in one line naming it.
    """
    import imageio_ffmpeg  # here, not at the top: importing the trainers needs no ffmpeg (a GPU benchmark)

    try:
        frames = imageio_ffmpeg.read_frames(str(path))
        width, height = next(frames)["size"]
        data = b"".join(frames)
    except (OSError, RuntimeError, StopIteration) as exc:  # ffmpeg's messages run to dozens of lines
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"{path} cannot be decoded ({first}): the video is truncated or damaged; restore it, or "
                           "record the dataset again (scripts/collect_demos.py)") from None
    return np.frombuffer(data, np.uint8).reshape(-1, height, width, 3)


def _resize(frames: np.ndarray, size: int | None) -> np.ndarray:
    """uint8 [n, H, W, 3] -> uint8 [n, 3, size, size] (bilinear, antialiased), or [n, 3, H, W] for None."""
    chw = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    if size is None or chw.shape[-2:] == (size, size):
        return chw.numpy()
    out = torch.nn.functional.interpolate(chw.float(), size=(size, size), mode="bilinear", antialias=True)
    return out.round().clamp(0, 255).to(torch.uint8).numpy()


def read_frames(root: Path, info: dict[str, Any], episodes: pa.Table, rows: dict[str, np.ndarray],
                cameras: Sequence[str], image_size: int | None) -> np.ndarray:
    """The frame of each row from each camera's mp4s, uint8 [rows, cams, 3, H, W]."""
    out: np.ndarray | None = None
    lengths = episodes["length"].to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for c, key in enumerate(cameras):
        _require_columns(episodes, [f"videos/{key}/{k}" for k in ("chunk_index", "file_index", "from_timestamp")],
                         Path(root) / "meta/episodes")
        cached: tuple[Path, np.ndarray] | None = None
        for e in range(len(episodes)):
            chunk, file = (episodes[f"videos/{key}/{k}"][e].as_py() for k in ("chunk_index", "file_index"))
            path = Path(root) / info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
            if cached is None or cached[0] != path:
                if not path.is_file():
                    raise DatasetError(f"{path} is missing (meta/episodes points to it); the dataset is incomplete")
                cached = (path, decode_mp4(path))
            sel = slice(starts[e], starts[e] + lengths[e])
            start = episodes[f"videos/{key}/from_timestamp"][e].as_py()
            ids = np.round((start + rows["timestamp"][sel]) * info["fps"]).astype(np.int64)
            if ids.max() >= len(cached[1]):
                raise DatasetError(f"{path} has {len(cached[1])} frames but episode "
                                   f"{episodes['episode_index'][e].as_py()} needs frame {ids.max()}; the video is "
                                   "shorter than its episodes: encode it again")
            frames = _resize(cached[1][ids], image_size)
            if out is None:
                out = np.empty((len(rows["timestamp"]), len(cameras), *frames.shape[1:]), np.uint8)
            if frames.shape[1:] != out.shape[2:]:
                raise DatasetError(f"{path}: frames of {frames.shape[2:]} pixels, other cameras {out.shape[3:]}; pass "
                                   "image_size=N to resize every camera to N x N")
            out[sel, c] = frames
    assert out is not None
    return out


class DemoDataset:
    """The frames of a LeRobot v3.0 dataset in memory, served as TensorDict batches (keys: module docstring).

    Attributes:
        root: the dataset folder; info: its meta/info.json.
        instructions: task strings; ``instruction`` indexes them. For a dataset written by
            scripts/collect_demos.py this is the environment's ``env.instructions`` (train set).
        cameras: the video features read, in ``rgb``'s camera order.
        num_episodes: episodes read.
    """

    def __init__(self, root: str | Path, *, action_chunk: int | None = None, cameras: Sequence[str] | None = None,
                 image_size: int | None = None, episodes: Sequence[int] | None = None):
        """Args:
            root: the dataset folder (holding meta/, data/, videos/).
            action_chunk: K: ``action`` is [B, K, A], the actions of frames t..t+K-1, with ``action_mask``.
                None: ``action`` is [B, A].
            cameras: video features to read (full keys or the part after ``observation.images.``);
                None: every video feature; []: none (no ``rgb``).
            image_size: resize frames to image_size x image_size; None keeps the recorded size.
            episodes: episode indices to read; None: all.
        """
        self.root = Path(root)
        self.info = info = read_info(self.root)
        if action_chunk is not None and action_chunk < 1:
            raise ValueError(f"action_chunk={action_chunk}; it must be at least 1 (or None for single actions)")
        if image_size is not None and image_size < 1:
            raise ValueError(f"image_size={image_size}; it must be at least 1 (or None for the recorded size)")
        self.action_chunk = action_chunk
        self.instructions = read_tasks(self.root)
        self.cameras = self._select_cameras(cameras)
        table = read_episodes(self.root, episodes)
        self.num_episodes = len(table)
        features = info["features"]
        keys = [k for k, f in features.items() if f["dtype"] not in ("video", "image", "string")]
        rows = read_rows(self.root, info, table, keys)
        data = {KEYS.get(k, k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items()
                if k not in _NOT_IN_BATCHES}
        if self.cameras:
            data["rgb"] = torch.from_numpy(read_frames(self.root, info, table, rows, self.cameras, image_size))
        self.data = TensorDict(data, batch_size=[len(rows["index"])])
        lengths = torch.from_numpy(np.array(table["length"].to_numpy(), np.int64))
        self._last = torch.repeat_interleave(torch.cumsum(lengths, 0) - 1, lengths)  # last row of each row's episode

    def _select_cameras(self, cameras: Sequence[str] | None) -> list[str]:
        features = self.info["features"]
        videos = [k for k, f in features.items() if f["dtype"] == "video"]
        if cameras is None:
            images = [k for k, f in features.items() if f["dtype"] == "image"]
            if images:
                raise DatasetError(f"{self.root}: cameras {images} are stored as images in the parquet files; this "
                                   "reader decodes videos: re-encode them as videos, or pass cameras=[] to skip them")
            return videos
        by_name = {**{k: k for k in videos}, **{k.removeprefix("observation.images."): k for k in videos}}
        unknown = [c for c in cameras if c not in by_name]
        if unknown:
            raise DatasetError(f"{self.root}: no video feature {unknown}; its cameras are {videos}")
        return [by_name[c] for c in cameras]

    def __len__(self) -> int:
        """Frames read."""
        return self.data.batch_size[0]

    def batch(self, index: torch.Tensor) -> TensorDict:
        """Frames ``index`` (int64 [B]) as a TensorDict [B]; with ``action_chunk`` K, ``action`` is [B, K, A]."""
        out = self.data[index]
        if self.action_chunk is not None:
            ahead = index[:, None] + torch.arange(self.action_chunk)  # [B, K]
            last = self._last[index][:, None]
            out["action_mask"] = ahead <= last
            out["action"] = self.data["action"][torch.minimum(ahead, last)]
        return out

    def minibatches(self, batch_size: int, *, seed: int, drop_last: bool = False) -> Iterator[TensorDict]:
        """One pass over every frame, shuffled by ``seed``, as :meth:`batch` TensorDicts of ``batch_size`` frames."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}; it must be at least 1")
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        for i in range(0, stop, batch_size):
            yield self.batch(order[i:i + batch_size])
