"""The LeRobot dataset v3.0 layout: its paths, ``meta/info.json``, and a writer of episodes.

A dataset folder holds (LeRobot 0.4.4, ``src/lerobot/datasets/utils.py`` and ``lerobot_dataset.py``)::

    meta/info.json                      codebase_version "v3.0", fps, features, path templates, totals
    meta/stats.json                     per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet                  task strings (a pandas index) and their task_index
    meta/episodes/chunk-000/file-000.parquet   one row per episode: length, tasks, where its rows and frames lie
    data/chunk-XXX/file-YYY.parquet     one row per frame: the features, timestamp, indices
    videos/<video_key>/chunk-XXX/file-YYY.mp4  the frames of each camera, episodes one after another

Episodes are appended to the current data file and to the current mp4 of each camera; an episode's
frames start at ``videos/<key>/from_timestamp`` seconds into its mp4.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CODEBASE_VERSION = "v3.0"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
CHUNKS_SIZE = 1000
"""Files per chunk folder (LeRobot's ``DEFAULT_CHUNK_SIZE``)."""
INDEX_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""The features every LeRobot dataset has (LeRobot's ``DEFAULT_FEATURES``), filled in by the writer."""
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
VIDEO_SAMPLES_PER_EPISODE = 8
"""Frames per episode and camera kept for the image statistics."""
MAX_STATS_IMAGES = 4096
"""At most this many of those frames (evenly spaced over the dataset) per camera enter the image
statistics, in float32: all 8 x 5,000 of a 5,000-episode dataset as float64 quantiles took 12 GB."""


def video_feature(height: int, width: int, fps: int, pix_fmt: str) -> dict[str, Any]:
    """The info.json entry of a camera stored as mp4 (H.264), as LeRobot's ``get_video_info`` writes it."""
    return {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": height, "video.width": width, "video.codec": "h264", "video.pix_fmt": pix_fmt,
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}}


def chunk_and_file(number: int) -> dict[str, int]:
    """The ``chunk_index``/``file_index`` of the ``number``-th file of a kind (CHUNKS_SIZE files per chunk)."""
    return {"chunk_index": number // CHUNKS_SIZE, "file_index": number % CHUNKS_SIZE}


def _arrow_array(values: np.ndarray) -> pa.Array:
    """A column [L, *shape] as nested fixed-size lists (a scalar column for shape [1] or [])."""
    values = np.ascontiguousarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet``: task_index and the task strings as the unnamed pandas index, as LeRobot writes it."""
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                     "metadata": None},
                    {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
                     "numpy_type": "object", "metadata": None}],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = pa.table({"task_index": pa.array(np.arange(len(tasks)), pa.int64()),
                      "__index_level_0__": pa.array(tasks, pa.string())})
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def feature_stats(values: np.ndarray, axis: int | tuple[int, ...] = 0) -> dict[str, list]:
    """LeRobot's statistics of ``values`` reduced over ``axis``: min, max, mean, std, count, q01..q99.

    Args:
        values: [n, *shape] (a vector feature, reduced over axis 0), or [n, 3, H, W] images in [0, 1]
            reduced over (0, 2, 3) with kept dimensions (per-channel statistics of shape [3, 1, 1]).
    """
    keep = axis != 0
    stats = {"min": values.min(axis=axis, keepdims=keep), "max": values.max(axis=axis, keepdims=keep),
             "mean": values.mean(axis=axis, keepdims=keep), "std": values.std(axis=axis, keepdims=keep)}
    for q in QUANTILES:
        stats[f"q{round(q * 100):02d}"] = np.quantile(values, q, axis=axis, keepdims=keep)
    out: dict[str, list] = {k: np.asarray(v[0] if keep else v, np.float64).tolist() for k, v in stats.items()}
    out["count"] = [len(values)]
    return out


class _VideoFile:
    """One mp4 being written: H.264 through imageio-ffmpeg's bundled ffmpeg, frames appended."""

    def __init__(self, path: Path, height: int, width: int, fps: int, pix_fmt: str, crf: int):
        import imageio_ffmpeg  # here, not at the top: importing the trainers needs no ffmpeg (a GPU benchmark)

        path.parent.mkdir(parents=True, exist_ok=True)
        self._gen = imageio_ffmpeg.write_frames(
            str(path), (width, height), fps=fps, codec="libx264", pix_fmt_out=pix_fmt, quality=None,
            macro_block_size=1, output_params=["-crf", str(crf), "-preset", "fast"])
        self._gen.send(None)
        self.frames = 0

    def append(self, frames: np.ndarray) -> None:
        """Append uint8 frames [L, H, W, 3]."""
        for frame in frames:
            self._gen.send(np.ascontiguousarray(frame))
        self.frames += len(frames)

    def close(self) -> None:
        self._gen.close()


class LeRobotWriter:
    """Writes episodes into a new LeRobot v3.0 dataset folder.

    Each file number holds ``episodes_per_file`` consecutive episodes: one data parquet and one mp4 per
    camera. :meth:`close` writes the metadata (info, stats, tasks, episodes); until then the folder is
    incomplete.
    """

    def __init__(self, root: Path, *, fps: int, features: dict[str, dict[str, Any]], tasks: list[str],
                 robot_type: str | None = None, episodes_per_file: int = 1000, crf: int = 0):
        """Args:
            root: the dataset folder; it must not exist or be empty.
            fps: frames per second (the control rate).
            features: info.json features without :data:`INDEX_FEATURES`; videos from :func:`video_feature`.
            tasks: the task strings; an episode names its task by index into this list.
            robot_type: info.json ``robot_type``.
            episodes_per_file: episodes per data file and mp4 before the next file number starts.
            crf: H.264 constant rate factor of the mp4s: 0 is lossless (but for the RGB <-> YUV rounding, at
                most 2 levels), 18 visually lossless, 23 ffmpeg's default.
        """
        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise FileExistsError(f"{self.root} is not empty; give --out a new folder (or remove the old dataset)")
        bad = [k for k in features if "/" in k or k in INDEX_FEATURES]
        if bad:
            raise ValueError(f"feature names {bad} are reserved or contain '/'")
        self.fps, self.tasks, self.crf = fps, list(tasks), crf
        self.features = {**features, **INDEX_FEATURES}
        self.video_keys = [k for k, f in features.items() if f["dtype"] == "video"]
        self.robot_type, self.episodes_per_file = robot_type, episodes_per_file
        self._episodes: list[dict[str, Any]] = []
        self._rows: list[dict[str, np.ndarray]] = []  # episodes of the current file number
        self._stats_rows: dict[str, list[np.ndarray]] = {k: [] for k in self._data_keys}
        self._stats_frames: dict[str, list[np.ndarray]] = {k: [] for k in self.video_keys}
        self._videos: dict[str, _VideoFile] = {}
        self._file_number, self._frames = 0, 0

    @property
    def _data_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] != "video"]

    def add_episode(self, data: dict[str, np.ndarray], videos: dict[str, np.ndarray], task_index: int,
                    extra: dict[str, Any] | None = None) -> int:
        """Append one episode; returns its episode_index.

        Args:
            data: every non-video feature except :data:`INDEX_FEATURES`, each [L, *shape].
            videos: every video feature, uint8 [L, H, W, 3].
            task_index: index into ``tasks``.
            extra: more columns of this episode's row in meta/episodes (the same keys for every episode).
        """
        length = len(data["action"])
        episode = len(self._episodes)
        if len(self._rows) == self.episodes_per_file:
            self._flush()
        where = chunk_and_file(self._file_number)
        rows = dict(data)
        rows.update(timestamp=(np.arange(length) / self.fps).astype(np.float32), frame_index=np.arange(length),
                    episode_index=np.full(length, episode), index=self._frames + np.arange(length),
                    task_index=np.full(length, task_index))
        self._rows.append(rows)
        row: dict[str, Any] = {"episode_index": episode, "tasks": [self.tasks[task_index]], "length": length,
                               "data/chunk_index": where["chunk_index"], "data/file_index": where["file_index"],
                               "dataset_from_index": self._frames, "dataset_to_index": self._frames + length}
        for key in self.video_keys:
            row.update(self._append_video(key, videos[key], where))
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, **(extra or {})})
        self._episodes.append(row)
        for key in self._data_keys:
            shape = self.features[key]["shape"]
            self._stats_rows[key].append(np.asarray(rows[key], np.float64).reshape(length, *shape))
        self._frames += length
        return episode

    def _append_video(self, key: str, frames: np.ndarray, where: dict[str, int]) -> dict[str, Any]:
        """Append one episode's frames [L, H, W, 3] to camera ``key``'s current mp4; its episode columns."""
        if key not in self._videos:
            height, width = self.features[key]["shape"][:2]
            path = self.root / VIDEO_PATH.format(video_key=key, **where)
            self._videos[key] = _VideoFile(path, height, width, self.fps, self.features[key]["info"]["video.pix_fmt"],
                                           self.crf)
        video = self._videos[key]
        start = video.frames / self.fps
        video.append(frames)
        picks = np.linspace(0, len(frames) - 1, min(len(frames), VIDEO_SAMPLES_PER_EPISODE)).round().astype(int)
        self._stats_frames[key].append(frames[picks])
        return {f"videos/{key}/chunk_index": where["chunk_index"], f"videos/{key}/file_index": where["file_index"],
                f"videos/{key}/from_timestamp": start, f"videos/{key}/to_timestamp": video.frames / self.fps}

    def _flush(self) -> None:
        """Write the current file number's data parquet, close its mp4s and start the next number."""
        if not self._rows:
            return
        columns = {k: _arrow_array(np.concatenate([r[k] for r in self._rows]).astype(self.features[k]["dtype"]))
                   for k in self._data_keys}
        path = self.root / DATA_PATH.format(**chunk_and_file(self._file_number))
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path)
        for video in self._videos.values():
            video.close()
        self._rows, self._videos = [], {}
        self._file_number += 1

    def close(self, source: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the last files and the metadata; returns info.json as written (``source`` under that key)."""
        if not self._episodes:
            shutil.rmtree(self.root, ignore_errors=True)
            raise ValueError("no episode was added; nothing written")
        self._flush()
        episodes = pa.table({k: [e[k] for e in self._episodes] for k in self._episodes[0]})
        (self.root / "meta/episodes/chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(episodes, self.root / EPISODES_PATH.format(chunk_index=0, file_index=0))
        pq.write_table(tasks_table(self.tasks), self.root / TASKS_PATH)
        stats = {k: feature_stats(np.concatenate(v)) for k, v in self._stats_rows.items()}
        for key, frames in self._stats_frames.items():
            images = np.concatenate(frames)
            picks = np.linspace(0, len(images) - 1, min(len(images), MAX_STATS_IMAGES)).round().astype(int)
            stats[key] = feature_stats(images[picks].transpose(0, 3, 1, 2).astype(np.float32) / 255.0, axis=(0, 2, 3))
        (self.root / STATS_PATH).write_text(json.dumps(stats, indent=2))
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
                "total_episodes": len(self._episodes), "total_frames": self._frames, "total_tasks": len(self.tasks),
                "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
                "fps": self.fps, "splits": {"train": f"0:{len(self._episodes)}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.video_keys else None, "features": self.features}
        if source is not None:
            info["source"] = source
        text = json.dumps(info, indent=4)
        (self.root / INFO_PATH).write_text(text)
        return json.loads(text)
