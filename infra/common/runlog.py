"""A run's output directory, one layout for every trainer (the VLA trainer and the LLM RLVR job).

Layout of ``runs/NAME/``: ``config.yaml`` (the run's config, written when the run starts),
``metrics.csv`` (one row per iteration, columns added as new metrics appear, rewritten after every
row so a run that stops keeps its rows), ``curves.png`` (the trainer's curves against its budget's
unit), ``summary.json`` (written when the run ends), ``videos/*.mp4|gif`` (only where a trainer has
frames) and, with wandb enabled, ``wandb/``. Each trainer adds its own state beside them
(``checkpoints/``; the LLM job's ``model/``). Every file is written atomically (temporary file + rename).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from tqdm import tqdm

from infra.common.files import atomic_path, write_atomic
from infra.common.provenance import load_average, provenance
from infra.common.typed_config import ConfigError, load_yaml

CONFIG, METRICS, CURVES, SUMMARY = "config.yaml", "metrics.csv", "curves.png", "summary.json"
"""The file names of the layout."""


@dataclass
class LogConfig:
    """Where and how progress is reported."""

    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode: files under the run directory (``offline``), synced (``online``), or none."""
    wandb_project: str = "vla-rl"
    """wandb project name."""
    progress: bool = True
    """Show a progress bar with steps/s and success."""
    video: bool = True
    """Write evaluation videos (train and held-out instructions) under ``videos/``."""
    video_every: int = 5
    """Videos at the first evaluation, every this many evaluations after it and the last one (1: at
    every evaluation). A gymnasium task renders environment 0 for its video; the metrics cost no
    rendering (docs/training.md, "Evaluation cost")."""
    video_format: Literal["mp4", "gif"] = "mp4"
    """Video container."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the bad value of the ``log`` section."""
        if not self.wandb_project:
            raise ConfigError("log.wandb_project must not be empty (default: vla-rl)")
        if self.video_every < 1:
            raise ConfigError(f"log.video_every={self.video_every!r} must be at least 1")


@dataclass(frozen=True)
class Panel:
    """One plot of ``curves.png``: the metrics drawn on it, each ``(metric, legend label)``."""

    title: str
    curves: tuple[tuple[str, str], ...]
    fraction: bool = False
    """The metrics are fractions: the y axis spans [0, 1]."""


@dataclass(frozen=True)
class Curves:
    """What a trainer's run shows: the x metric, the panels of ``curves.png`` and the progress bar's metrics."""

    x: str
    """A metric of every row (``env_steps``, ``iteration``): the curves' x axis, the progress bar's
    position and wandb's step."""
    x_label: str
    """The x axis' label."""
    panels: tuple[Panel, ...]
    """Side by side, left to right; a metric recorded only at evaluations (``eval...``) is drawn with markers."""
    shown: tuple[tuple[str, str], ...] = ()
    """``(metric, short name)`` shown after the progress bar when a row has them."""
    unit: str = "it"
    """The progress bar's unit."""


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write ``config`` (plain YAML types: dicts, lists, scalars) to ``run_dir/config.yaml``."""
    write_atomic(run_dir / CONFIG, yaml.safe_dump(config, sort_keys=False).encode())


def read_config(run_dir: Path) -> dict[str, Any] | None:
    """The config a run in ``run_dir`` was started with; ``None`` when it has none."""
    path = run_dir / CONFIG
    return load_yaml(path.read_text(), str(path)) if path.exists() else None


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of ``run_dir/metrics.csv`` (none when absent); an empty cell is a metric the row did not have."""
    path = run_dir / METRICS
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


class RunLog:
    """The config, metrics, curves, summary, videos and progress of one run.

    Creating it writes ``config.yaml``; :meth:`log` rewrites ``metrics.csv``; :meth:`plot` and
    :meth:`write_summary` write the rest when the run ends.

    Args:
        run_dir: The run directory (created if missing).
        cfg: The logging section.
        total_steps: The run's budget in ``curves.x`` (the progress bar's total).
        config: The full config as plain YAML types (written to ``config.yaml``, sent to wandb).
        curves: What this trainer plots and shows (:class:`Curves`).
        wandb_id: The wandb run id to continue when resuming.
    """

    def __init__(
        self, run_dir: Path, cfg: LogConfig, total_steps: int, config: dict[str, Any], curves: Curves,
        wandb_id: str | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.config, self.load_at_start = config, load_average()
        self.curves = curves
        self.rows: list[dict[str, float]] = []
        self.wandb_run = None
        self.wandb_id = wandb_id
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, config)
        if cfg.wandb != "disabled":
            import wandb

            self.wandb_run = wandb.init(
                project=cfg.wandb_project, dir=str(run_dir), mode=cfg.wandb, config=config,
                name=run_dir.name, id=wandb_id, resume="allow" if wandb_id else None,
            )
            self.wandb_id = self.wandb_run.id
        self.bar = tqdm(total=total_steps, unit=curves.unit, unit_scale=True, dynamic_ncols=True,
                        disable=not cfg.progress)

    def load_rows(self, up_to_iteration: int) -> None:
        """Reload ``metrics.csv`` rows up to an iteration (a resumed run continues the same file)."""
        self.rows += [r for r in read_metrics(self.run_dir) if r.get("iteration", 0) <= up_to_iteration]
        if self.rows:
            self.bar.update(int(self.rows[-1].get(self.curves.x, 0)))

    def log(self, metrics: dict[str, float]) -> None:
        """Record one iteration's metrics; refresh the CSV, progress bar and wandb."""
        self.rows.append(dict(metrics))
        self._write_csv()
        steps = int(metrics[self.curves.x])
        self.bar.update(steps - self.bar.n)
        shown = {name: metrics[key] for key, name in self.curves.shown if key in metrics}
        self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=steps)

    def _write_csv(self) -> None:
        columns: list[str] = []
        for row in self.rows:
            columns += [k for k in row if k not in columns]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(self.run_dir / METRICS, out.getvalue().encode())

    def plot(self, title: str = "") -> Path:
        """Draw the panels of ``curves`` against ``curves.x`` to ``curves.png``, titled ``title`` (default: the run's name)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        x = self.curves.x
        fig, axes = plt.subplots(1, len(self.curves.panels), figsize=(5.5 * len(self.curves.panels), 4), squeeze=False)
        for ax, panel in zip(axes[0], self.curves.panels, strict=True):
            for key, label in panel.curves:
                points = [(r[x], r[key]) for r in self.rows if key in r and x in r]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o" if key.startswith("eval") else None, ms=3, label=label)
            ax.set_xlabel(self.curves.x_label)
            ax.set_title(panel.title)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            if panel.fraction:
                ax.set_ylim(-0.02, 1.02)
        fig.suptitle(title or self.run_dir.name)
        path = self.run_dir / CURVES
        write_atomic(path, _png(fig))
        return path

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary`` (JSON types) to ``summary.json`` with its provenance (commit, config, machine,
        load: :func:`~infra.common.provenance.provenance`): the run ended."""
        path = self.run_dir / SUMMARY
        write_atomic(path, json.dumps({**summary, **provenance(self.config, self.load_at_start)}, indent=2).encode())
        return path

    def video_due(self, evaluation: int, last: bool) -> bool:
        """Whether evaluation number ``evaluation`` (1 for the first) gets videos: see ``LogConfig.video_every``."""
        return self.cfg.video and (last or (evaluation - 1) % self.cfg.video_every == 0)

    def video(
        self, frames: list[np.ndarray], name: str, fps: int = 20, wandb_key: str = "video", step: int | None = None
    ) -> Path | None:
        """Write ``frames`` (``[H, W, 3]`` uint8) to ``videos/<name>.<format>``; ``None`` when disabled or empty,
        or when the encoder cannot run (one line says why: a video is not worth a run, and mp4 forks an encoder
        process, which a loaded machine can refuse a large trainer with ``ENOMEM``).

        With wandb enabled the file is also logged as a ``wandb.Video`` under ``wandb_key`` at ``step``
        (environment steps; the media land in ``wandb/*/files/media/videos/``).
        """
        if not self.cfg.video or not frames:
            return None
        import imageio.v2 as iio

        path = self.run_dir / "videos" / f"{name}.{self.cfg.video_format}"
        path.parent.mkdir(exist_ok=True)
        big = [upscale(f) for f in frames]
        try:
            with atomic_path(path) as tmp:
                if self.cfg.video_format == "gif":
                    iio.mimwrite(tmp, big, duration=1000 / fps, loop=0)
                else:
                    iio.mimwrite(tmp, big, fps=fps, macro_block_size=16)
        except OSError as err:
            tqdm.write(f"[log] video {path.name} not written ({err}); the run goes on")
            return None
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.log({wandb_key: wandb.Video(str(path), format=self.cfg.video_format)}, step=step)
        return path

    def close(self) -> None:
        """Close the progress bar and finish the wandb run."""
        self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def upscale(frame: np.ndarray, min_size: int = 256) -> np.ndarray:
    """Nearest-neighbour upscale of a small ``[H, W, 3]`` frame so videos are watchable (and 16-aligned)."""
    factor = max(1, -(-min_size // max(frame.shape[:2])))
    big = frame.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else frame  # repeat(1) still copies
    h, w = big.shape[0] - big.shape[0] % 16, big.shape[1] - big.shape[1] % 16
    return np.ascontiguousarray(big[:h, :w])



def _png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def run_curve(rows: list[dict[str, float]], key: str, x: str, window: int = 1) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(xs, ys, sparse)`` of metric ``key`` against ``x`` over a run's ``rows`` (:func:`read_metrics`). ``sparse``: the
    metric is in fewer than half the rows (an evaluation), drawn as it is; otherwise ``ys`` is the mean of the
    metric's last ``window`` values at each point (a per-iteration metric, e.g. the training episodes' success)."""
    points = [(r[x], r[key]) for r in rows if key in r and x in r]
    if not points:
        return np.zeros(0), np.zeros(0), True
    xs, ys = (np.array(v) for v in zip(*points, strict=True))
    sparse = 2 * len(points) < len(rows)
    if not sparse and window > 1:
        ys = np.array([ys[max(0, k - window + 1):k + 1].mean() for k in range(len(ys))])
    return xs, ys, sparse


def plot_runs(runs: dict[str, Path], metrics: list[str], xs: list[str], window: int = 1, title: str = "") -> bytes:
    """PNG bytes of ``metrics`` (one row of panels each) of several runs (``label -> run dir``) against each key of
    ``xs`` (e.g. ``env_steps``, ``wall_time``), one line per run (:func:`run_curve`: evaluations with markers,
    per-iteration metrics as running means of ``window``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {label: read_metrics(path) for label, path in runs.items()}
    fig, axes = plt.subplots(len(metrics), len(xs), figsize=(5.5 * len(xs), 3.6 * len(metrics)), squeeze=False)
    for i, key in enumerate(metrics):
        for j, x in enumerate(xs):
            ax = axes[i][j]
            for label, table in rows.items():
                px, py, sparse = run_curve(table, key, x, window)
                if len(px):
                    ax.plot(px, py, marker="o" if sparse else None, ms=3,
                            label=label if sparse or window == 1 else f"{label} (running mean of {window})")
            ax.set_xlabel(x)
            ax.set_title(key, fontsize=9)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(title)
    return _png(fig)
