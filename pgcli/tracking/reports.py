"""The reports a training run leaves in its run directory: ``metrics.csv`` and ``learning_curve.png``.

Both are written from the in-memory metric history (key -> ``(env step, value)`` points) that
:class:`~pgcli.tracking.logger.RunLogger` keeps, so they exist with ``tracking=off`` too.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path


def write_metrics_csv(history: Mapping[str, list[tuple[int, float]]], path: Path) -> Path:
    """Every point as one ``key,step,value`` row, keys in sorted order, each key's points as logged."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "step", "value"])
        for key in sorted(history):
            writer.writerows((key, step, value) for step, value in history[key])
    return path


def plot_learning_curve(history: Mapping[str, list[tuple[int, float]]], path: Path) -> Path | None:
    """Training return (rolling mean) and evaluation return (mean +- std) against env steps."""
    train, ev, ev_std = (history.get(k, []) for k in ("rollout/ep_return_mean", "eval/return_mean", "eval/return_std"))
    if not train and not ev:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train (mean of last 100 episodes)", color="tab:blue", alpha=0.8)
    if ev:
        steps, means = zip(*ev, strict=True)
        ax.plot(steps, means, "o-", label="eval (deterministic)", color="tab:orange")
        if len(ev_std) == len(ev):
            stds = [s for _, s in ev_std]
            lo = [m - s for m, s in zip(means, stds, strict=True)]
            hi = [m + s for m, s in zip(means, stds, strict=True)]
            ax.fill_between(steps, lo, hi, color="tab:orange", alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
