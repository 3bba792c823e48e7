"""A run's outputs: ``metrics.csv``, ``curves.png``, videos, wandb files and the progress bar.

Layout of ``runs/NAME/``: ``config.yaml``, ``checkpoints/``, ``metrics.csv`` (one row per
iteration, columns added as new metrics appear), ``curves.png``, ``videos/*.mp4|gif`` and, with
wandb enabled, ``wandb/``. Every file is written atomically (temporary file + rename).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from infra.common.files import atomic_path, write_atomic


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


CURVES = (
    ("episode_return", "train episode return"),
    ("episode_success", "train episode success"),
    ("eval/train/success", "eval success (train episodes)"),
    ("eval/validation/success", "eval success (validation)"),
    ("eval/paraphrase/success", "eval success (paraphrase, test)"),
    ("eval/composition/success", "eval success (composition, test)"),
    ("eval/return", "eval return"),
)


class RunLog:
    """Metrics, curves, videos and progress of one run.

    Args:
        run_dir: The run directory (created if missing).
        cfg: The logging section.
        total_steps: The run's budget in ``unit`` (the progress bar's total).
        config: The full config as a dict (sent to wandb).
        wandb_id: The wandb run id to continue when resuming.
        unit: What the budget counts, a metric of every row: ``env_steps`` (RL) or ``iterations`` (SFT);
            the progress bar, the curves' x axis and wandb's step follow it.
    """

    def __init__(
        self, run_dir: Path, cfg: LogConfig, total_steps: int, config: dict[str, Any], wandb_id: str | None = None,
        unit: str = "env_steps",
    ) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.key = "env_steps" if unit == "env_steps" else "iteration"
        self.rows: list[dict[str, float]] = []
        self.wandb_run = None
        self.wandb_id = wandb_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "videos").mkdir(exist_ok=True)
        if cfg.wandb != "disabled":
            import wandb

            self.wandb_run = wandb.init(
                project=cfg.wandb_project, dir=str(run_dir), mode=cfg.wandb, config=config,
                name=run_dir.name, id=wandb_id, resume="allow" if wandb_id else None,
            )
            self.wandb_id = self.wandb_run.id
        self.bar = tqdm(total=total_steps, unit="step" if self.key == "env_steps" else "it", unit_scale=True,
                        dynamic_ncols=True, disable=not cfg.progress)

    def load_rows(self, up_to_iteration: int) -> None:
        """Reload ``metrics.csv`` rows up to an iteration (a resumed run continues the same file)."""
        path = self.run_dir / "metrics.csv"
        if not path.exists():
            return
        with path.open() as f:
            for row in csv.DictReader(f):
                parsed = {k: float(v) for k, v in row.items() if v not in ("", None)}
                if parsed.get("iteration", 0) <= up_to_iteration:
                    self.rows.append(parsed)
        if self.rows:
            self.bar.update(int(self.rows[-1].get(self.key, 0)))

    def log(self, metrics: dict[str, float]) -> None:
        """Record one iteration's metrics; refresh the CSV, progress bar and wandb."""
        self.rows.append(dict(metrics))
        self._write_csv()
        steps = int(metrics[self.key])
        self.bar.update(steps - self.bar.n)
        shown = {k.split("/")[-2] if k.startswith("eval/") else k: v for k, v in metrics.items()
                 if k in ("episode_success", "episode_return", "eval/validation/success")}
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
        write_atomic(self.run_dir / "metrics.csv", out.getvalue().encode())

    def plot(self) -> Path:
        """Draw the learning curves (return and success against the budget's unit) to ``curves.png``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_ret, ax_succ) = plt.subplots(1, 2, figsize=(11, 4))
        for key, label in CURVES:
            points = [(r[self.key], r[key]) for r in self.rows if key in r]
            if not points:
                continue
            ax = ax_ret if "return" in key else ax_succ
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if key.startswith("eval") else None, ms=3, label=label)
        for ax, title in ((ax_ret, "return"), (ax_succ, "success rate")):
            ax.set_xlabel("environment steps" if self.key == "env_steps" else "iterations")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        ax_succ.set_ylim(-0.02, 1.02)
        fig.suptitle(self.run_dir.name)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        path = self.run_dir / "curves.png"
        write_atomic(path, buf.getvalue())
        return path

    def video_due(self, evaluation: int, last: bool) -> bool:
        """Whether evaluation number ``evaluation`` (1 for the first) gets videos: see ``LogConfig.video_every``."""
        return self.cfg.video and (last or (evaluation - 1) % self.cfg.video_every == 0)

    def video(
        self, frames: list[np.ndarray], name: str, fps: int = 20, wandb_key: str = "video", step: int | None = None
    ) -> Path | None:
        """Write ``frames`` (``[H, W, 3]`` uint8) to ``videos/<name>.<format>``; ``None`` when disabled or empty.

        With wandb enabled the file is also logged as a ``wandb.Video`` under ``wandb_key`` at ``step``
        (environment steps; the media land in ``wandb/*/files/media/videos/``).
        """
        if not self.cfg.video or not frames:
            return None
        import imageio.v2 as iio

        path = self.run_dir / "videos" / f"{name}.{self.cfg.video_format}"
        big = [upscale(f) for f in frames]
        with atomic_path(path) as tmp:
            if self.cfg.video_format == "gif":
                iio.mimwrite(tmp, big, duration=1000 / fps, loop=0)
            else:
                iio.mimwrite(tmp, big, fps=fps, macro_block_size=16)
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
