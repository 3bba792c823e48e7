"""Tables and a figure of one or more recipe results (``scripts/sft_rl.py --json`` files, one per seed).

The per-task table puts SFT beside SFT + RL on every test split (median over seeds, with each
seed's Wilson interval when there is one seed); the summary gives the median and the worst seed
of the overall success per stage and split, the gap train - paraphrase, and RL's gain over SFT.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

STAGES = ("sft", "rl")
STAGE_NAMES = {"sft": "SFT", "rl": "SFT + RL"}


def _cell(runs: list[dict[str, Any]], stage: str, split: str, task: str | None) -> str:
    """``61.2 % [58.1, 64.2]`` for one seed; ``61.2 % (worst 55.0 %)`` (the median) for several."""
    rates = []
    for run in runs:
        entry = run["results"][stage].get(split)
        if entry is not None and task is not None:
            entry = entry["tasks"].get(task)
        if entry is not None:
            rates.append(entry)
    if not rates:
        return "-"
    if len(rates) == 1:
        low, high = rates[0]["ci95"]
        return f"{100 * rates[0]['success']:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"
    values = [r["success"] for r in rates]
    return f"{100 * statistics.median(values):.1f} % (worst {100 * min(values):.1f} %)"


def splits_of(runs: list[dict[str, Any]]) -> list[str]:
    """The test splits the runs were evaluated on, in their recorded order."""
    return [k for k, v in runs[0]["results"]["sft"].items() if isinstance(v, dict)]


def per_task_table(runs: list[dict[str, Any]]) -> str:
    """Markdown: one row per task and one for all tasks; SFT and SFT + RL on every split."""
    splits = splits_of(runs)
    tasks = list(runs[0]["results"]["sft"][splits[0]]["tasks"])
    header = "| task | " + " | ".join(f"{STAGE_NAMES[s]}: {split}" for split in splits for s in STAGES) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(splits))]
    for task in [*tasks, None]:
        cells = [_cell(runs, s, split, task) for split in splits for s in STAGES]
        lines.append(f"| {task or '**all**'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst seed of the overall success per stage and split, and the two derived gaps (pp)."""

    def stat(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "worst": min(values)}

    walls = [run["wall_s"] for run in runs]
    out: dict[str, Any] = {"seeds": [run["config"]["recipe"]["seed"] for run in runs],
                           "wall_s": {"median": statistics.median(walls), "worst": max(walls)}}
    for stage in STAGES:
        out[stage] = {split: stat([run["results"][stage][split]["success"] for run in runs])
                      for split in splits_of(runs)}
    gains = [100 * (r["results"]["rl"]["paraphrase"]["success"] - r["results"]["sft"]["paraphrase"]["success"])
             for r in runs]
    gaps = [100 * (r["results"]["rl"]["train"]["success"] - r["results"]["rl"]["paraphrase"]["success"]) for r in runs]
    out["rl_gain_paraphrase_pp"] = stat(gains)
    out["train_minus_paraphrase_pp"] = {"median": statistics.median(gaps), "worst": max(gaps)}
    return out


def plot_per_task(runs: list[dict[str, Any]], split: str, path: str | Path) -> None:
    """Bars per task, SFT beside SFT + RL, on ``split`` (median over seeds; whiskers: the seeds' range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(runs[0]["results"]["sft"][split]["tasks"])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.38
    for k, stage in enumerate(STAGES):
        values = [[100 * r["results"][stage][split]["tasks"][t]["success"] for r in runs] for t in tasks]
        med = [statistics.median(v) for v in values]
        err = [[m - min(v) for m, v in zip(med, values)], [max(v) - m for m, v in zip(med, values)]]
        x = [i + (k - 0.5) * width for i in range(len(tasks))]
        ax.bar(x, med, width, yerr=err if len(runs) > 1 else None, label=STAGE_NAMES[stage], capsize=3)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylim(0, 118)  # room above 100 % for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel(f"success on {split} (%)")
    ax.set_title(f"suite recipe, {len(runs)} seed(s), {runs[0]['results']['sft'][split]['episodes']} episodes each")
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_demos_curve(points: list[dict[str, Any]], split: str, path: str | Path) -> None:
    """SFT success on ``split`` against the number of demonstrations: ``points`` are
    ``{"episodes": N, "results": {split: {success, ci95, tasks}}}``; overall with its interval, and per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted(points, key=lambda p: p["episodes"])
    n = [p["episodes"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for task in points[0]["results"][split]["tasks"]:
        ax.plot(n, [100 * p["results"][split]["tasks"][task]["success"] for p in points], lw=1, alpha=0.6,
                marker=".", label=task)
    overall = [100 * p["results"][split]["success"] for p in points]
    low = [100 * p["results"][split]["ci95"][0] for p in points]
    high = [100 * p["results"][split]["ci95"][1] for p in points]
    ax.fill_between(n, low, high, color="k", alpha=0.15)
    ax.plot(n, overall, color="k", lw=2, marker="o", label="all tasks")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(n, [str(v) for v in n])
    ax.set_ylim(0, 100)
    ax.set_xlabel("expert demonstrations (all tasks)")
    ax.set_ylabel(f"SFT success on {split} (%)")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
