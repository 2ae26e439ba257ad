"""The reports a training run leaves in its run directory: ``metrics.csv`` and ``learning_curve.png``.

Both are written from the in-memory metric history (key -> ``(step, value)`` points) that
:class:`~pgcli.tracking.logger.RunLogger` keeps, so they exist with ``tracking=off`` too. The curve shows what the run
logged: a control run's episode returns against env steps; a text run's held-out accuracy, its training reward or
loss and its KL to the reference against sampled completions or demonstrations (docs/lm.md, "Evaluation"). Which
series it drew is one line of the run's log (``train.log``).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("pgcli")

History = Mapping[str, list[tuple[int, float]]]
TEXT_KEYS = ("eval/accuracy", "rollout/reward_mean", "train/teacher_forced_exact", "eval/pairwise_accuracy")
"""Keys only a text run logs (docs/lm.md): its held-out accuracy, an RL run's sampled rewards, SFT's exact match, a
reward model's pairwise accuracy."""


@dataclass(frozen=True)
class Panel:
    """One axes of a text run's curve: ``keys`` against the run's step unit."""

    ylabel: str
    keys: tuple[str, ...]
    unit_interval: bool = False
    """The y axis is [0, 1] (an accuracy)."""
    right: tuple[str, ...] = ()
    """Keys drawn against a second y axis on the right (a learned reward's proxy score beside the gold accuracy)."""
    right_label: str = ""


def write_metrics_csv(history: History, path: Path) -> Path:
    """Every point as one ``key,step,value`` row, keys in sorted order, each key's points as logged. Atomic: a file
    beside it, then renamed over it, so a kill mid-write leaves the previous ``metrics.csv`` whole."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "step", "value"])
        for key in sorted(history):
            writer.writerows((key, step, value) for step, value in history[key])
    os.replace(partial, path)
    return path


def plot_learning_curve(history: History, path: Path, *, title: str = "") -> Path | None:
    """Write the run's learning curve to ``path`` (None when the run logged nothing it shows), titled ``title`` (the
    run's algo, env and seed: ``trpo on Hopper-v5, seed 1``), and log which series it drew."""
    fig = learning_curve_figure(history, title)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def learning_curve_figure(history: History, title: str = "") -> Any:
    """The learning curve's figure (None when the run logged nothing it shows): a text run's panels
    (:func:`text_panels`), else the training and evaluation returns; ``title`` on top."""
    fig, drawn = _plot_text(history) if any(key in history for key in TEXT_KEYS) else _plot_control(history)
    if fig is not None:
        if title:
            fig.suptitle(title)
            log.info("learning_curve.png title: %s", title)
        log.info("learning_curve.png: %s", drawn)
    return fig


def _plot_control(history: History) -> tuple[Any, str]:
    """Training return (rolling mean) and evaluation return (mean +- std) against env steps; and what it drew."""
    train, ev, ev_std = (history.get(k, []) for k in ("rollout/ep_return_mean", "eval/return_mean", "eval/return_std"))
    if not train and not ev:
        return None, ""
    fig, ax = _pyplot().subplots(figsize=(7, 4), dpi=100)
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
    drawn = [k for k, points in (("rollout/ep_return_mean", train), ("eval/return_mean", ev)) if points]
    return fig, f"x environment steps; episode return: {', '.join(drawn)}"


def step_unit(history: History) -> str:
    """What a text run's step counts: demonstrations (SFT), preference pairs (a reward model), sampled turns (RL on a
    multi-turn task) or sampled completions (RL)."""
    if "eval/pairwise_accuracy" in history or "train/pairwise_accuracy" in history:
        return "preference pairs"
    if "train/teacher_forced_exact" in history:
        return "demonstrations"
    return "sampled turns" if _multi_turn(history) else "sampled completions"


def _multi_turn(history: History) -> bool:
    """A run on a multi-turn task: its evaluation plays whole trajectories (``eval/turns_mean``)."""
    return "eval/turns_mean" in history or "rollout/turns_mean" in history


PROXY = "eval/proxy_reward_mean"
"""A run on a learned reward (``env.reward=rm:<run>``): the reward model's mean score of the held-out greedy
completions, the proxy beside the checker's gold ``eval/accuracy``."""


def _proxy(history: History) -> bool:
    return bool(history.get(PROXY))


def text_panels(history: History) -> list[Panel]:
    """What a text run's curve shows, top to bottom, each where logged: held-out greedy accuracy and pass@k on [0, 1];
    the training signal (an RL run's mean reward of its sampled completions, else SFT's loss); the KL to the
    reference policy."""
    pass_k = sorted((k for k in history if k.startswith("eval/pass_at_")), key=lambda k: int(k.rpartition("_")[2]))
    accuracy = tuple(k for k in ("eval/accuracy", *pass_k, "eval/pairwise_accuracy") if history.get(k))
    proxy = _proxy(history)
    panels = []
    if proxy and accuracy:  # RL on a learned reward: the gold and the proxy it optimised, on one panel
        panels.append(Panel("gold: held-out accuracy", accuracy, True, (PROXY,), "proxy: reward-model score"))
    elif accuracy:
        panels.append(Panel("held-out accuracy", accuracy, unit_interval=True))
    if history.get("rollout/reward_mean"):
        what = "proxy reward (reward model)" if proxy else "reward"
        panels.append(Panel(f"{what} of sampled completions", ("rollout/reward_mean",)))
    elif history.get("train/loss"):
        panels.append(Panel("training loss", tuple(k for k in ("train/loss", "eval/loss") if history.get(k))))
    if history.get("train/kl_ref"):
        panels.append(Panel("KL to the reference", ("train/kl_ref",)))
    return panels


SERIES_LABELS = {
    "eval/accuracy": "greedy completion correct",
    "rollout/reward_mean": "mean over each update's batch",
    "train/loss": "NLL per answer token, each update",
    "eval/pairwise_accuracy": "reward model ranks the pair right",
    "eval/loss": "Bradley-Terry loss, held-out pairs",
    PROXY: "proxy: reward model's score, greedy",
    "train/kl_ref": "k3 estimate, each update",
}


def _label(key: str, history: History) -> str:
    """A series' legend entry: what it measures, and its key."""
    if key == "train/loss":
        return f"{_train_loss_label(history)} ({key})"
    if key == "eval/accuracy" and _multi_turn(history):
        return f"greedy trajectory solved ({key})"
    if key.startswith("eval/pass_at_"):
        k = key.removeprefix("eval/pass_at_")
        what = "trajectories solved" if _multi_turn(history) else "sampled correct"
        return f"pass@{k}: one of {k} {what} ({key})"
    if key == "eval/accuracy" and _proxy(history):
        return f"gold: task checker, greedy correct ({key})"
    if key == "rollout/reward_mean" and _proxy(history):
        return f"proxy: reward model's score, mean over each update's batch ({key})"
    return f"{SERIES_LABELS.get(key, key)} ({key})"


def _train_loss_label(history: History) -> str:
    """``train/loss`` is a reward model's Bradley-Terry loss, else SFT's NLL."""
    rm = "eval/pairwise_accuracy" in history
    return "Bradley-Terry loss, each update" if rm else SERIES_LABELS["train/loss"]


def _plot_text(history: History) -> tuple[Any, str]:
    """A text run's panels (:func:`text_panels`) against its step unit; and what it drew."""
    panels = text_panels(history)
    if not panels:
        return None, ""
    fig, axes = _pyplot().subplots(
        len(panels), 1, sharex=True, squeeze=False, figsize=(7, 1.2 + 2.4 * len(panels)), dpi=100
    )
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for key in panel.keys:
            steps, values = zip(*history[key], strict=True)
            style: dict[str, Any] = {"marker": "o", "clip_on": False} if key.startswith("eval/") else {"alpha": 0.7}
            ax.plot(steps, values, label=_label(key, history), **style)
        if panel.unit_interval:
            ax.set_ylim(0.0, 1.0)
        ax.set_ylabel(panel.ylabel)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if panel.right:
            twin = ax.twinx()
            for key in panel.right:
                twin.plot(*zip(*history[key], strict=True), "s--", color="tab:red", label=_label(key, history))
            twin.set_ylabel(panel.right_label)
            more = twin.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        ax.legend(handles, labels, loc="best", fontsize="small")
    axes[-1, 0].set_xlabel(step_unit(history))
    described = "; ".join(_described(p) for p in panels)
    return fig, f"x {step_unit(history)}; {described}"


def _described(panel: Panel) -> str:
    """A panel in train.log: ``held-out accuracy [0, 1]: eval/accuracy`` (``; right axis ...: <keys>``)."""
    text = f"{panel.ylabel}{' [0, 1]' if panel.unit_interval else ''}: {', '.join(panel.keys)}"
    return text + (f" with {panel.right_label} (right axis): {', '.join(panel.right)}" if panel.right else "")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
