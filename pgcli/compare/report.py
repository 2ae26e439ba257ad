"""The report of ``pgcli compare``: the results table (terminal, ``compare-<metric>.md``, ``.html``) and the plot
(``compare-<metric>.png``; ``compare-<metric>-vs-<x>.*`` with ``--x``: :func:`report_stem`).

Groups of fewer than :data:`FEW_RUNS` runs are marked (a bootstrap over 2 runs is not a confidence interval anyone
should trust). The plot has one panel per env id (and per reward, when the reward is a key), each with its own y-axis
and its legend below it; the figure grows with the legend. Against another metric (``--x``) it draws each run's path
and the group's mean path (:func:`pgcli.compare.stats.mean_path`), without a band.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pgcli.compare.groups import (
    BASE_KEYS,
    REWARD_KEY,
    TRIAL_KEY,
    Group,
    is_reward_metric,
    reward_meaning,
    setting_text,
)
from pgcli.compare.stats import GroupStats, mean_path

FEW_RUNS = 3
"""Groups with fewer runs are marked: their spread says little."""
PANEL_SIZE = (7.0, 4.2)
"""Inches of one panel's axes and titles, without its legend."""
LEGEND_LINE = 0.2
"""Inches per legend entry (small font), below the panel."""
LEGEND_CHAR = 0.075
"""Inches per character of a legend entry: a panel widens to fit its longest label."""


def report_stem(metric: str, x: str | None = None) -> str:
    """The report's file name without suffix, by what it draws: ``compare-eval_return_mean``,
    ``compare-eval_accuracy-vs-eval_kl_ref``; two comparisons of one sweep by different metrics keep both."""

    def slug(key: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.]+", "_", key).strip("_") or "metric"

    return f"compare-{slug(metric)}" + (f"-vs-{slug(x)}" if x else "")


def run_mark(n_runs: int) -> str:
    """The table's note on a group's size."""
    if n_runs == 1:
        return "n=1: no spread, no CI"
    return f"n<{FEW_RUNS}: CI unreliable" if n_runs < FEW_RUNS else ""


def table_header(keys: Sequence[str], metric: str, with_setting: bool, *, x: str | None = None) -> list[str]:
    setting = ["config"] if with_setting else []
    x_final = [f"final {x} (mean ± std)"] if x else []
    return [*keys, "budget", *setting, "n", f"final {metric} (mean ± std)", *x_final, "IQM", "95% CI of mean", "note"]


def decimals(values: Sequence[float]) -> int:
    """Decimals to print a row with: 1 for returns (|x| >= 10), 3 for rates and accuracies in [0, 1] and other
    small scores, which one decimal would round to 0.0."""
    finite = [abs(v) for v in values if np.isfinite(v)]
    return 1 if finite and max(finite) >= 10 else 3


def table_rows(
    groups: Sequence[Group], stats: Sequence[GroupStats], with_setting: bool, *, x: str | None = None
) -> list[list[str]]:
    rows = []
    for g, s in zip(groups, stats, strict=True):
        setting = [", ".join(f"{k}={v}" for k, v in g.setting.items()) or "-"] if with_setting else []
        d = decimals([s.final_mean, s.final_iqm, *(s.final_ci or ())])
        final = f"{s.final_mean:.{d}f}" + (f" ± {s.final_std:.{d}f}" if s.final_std is not None else "")
        x_final = [x_final_cell(g)] if x else []
        ci = f"[{s.final_ci[0]:.{d}f}, {s.final_ci[1]:.{d}f}]" if s.final_ci is not None else "-"
        note = "; ".join(n for n in (run_mark(s.n_runs), "" if s.steps.size else "no common steps") if n)
        rows.append(
            [*g.key, g.budget, *setting, str(s.n_runs), final, *x_final, f"{s.final_iqm:.{d}f}", ci, note or "-"]
        )
    return rows


def x_final_cell(group: Group) -> str:
    """The ``--x`` metric's last value per run of ``group``: mean ± std (ddof=1; the mean alone for one run)."""
    finals = np.array([float(run.xs[-1]) for run in group.runs if run.xs is not None])
    d = decimals([float(finals.mean())])
    return f"{finals.mean():.{d}f}" + (f" ± {finals.std(ddof=1):.{d}f}" if finals.size > 1 else "")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def html_table(
    header: list[str],
    rows: list[list[str]],
    title: str,
    notes: Sequence[str],
    *,
    alt: str = "learning curves",
    image: str = "compare.png",
) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#eee}</style></head><body>"
        f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"
        + (f"<ul>{items}</ul>" if items else "")
        + f"<p><img src='{html.escape(image)}' alt='{html.escape(alt)}'></p></body></html>\n"
    )


def selection_label(*, sweep: str | None, experiments: Sequence[str] | None, filter_string: str) -> str:
    """Which runs a comparison selected, for its titles: the sweep, else the experiments, and the filter."""
    parts = [f"sweep {sweep}"] if sweep else []
    if not sweep and experiments:
        parts.append(f"experiment{'s' if len(experiments) > 1 else ''} {', '.join(experiments)}")
    if filter_string:
        parts.append(f"filter {filter_string}")
    return ", ".join(parts)


def figure(
    groups: Sequence[Group],
    stats: Sequence[GroupStats],
    keys: Sequence[str],
    metric: str,
    *,
    title: str = "",
    x: str | None = None,
) -> Any:
    """The learning-curve figure: one panel per env id (and reward, when it is a key: :func:`panel_of`), each with its
    own y-axis (returns between envs are not on one scale) and its legend below it, the figure as tall and wide as
    the legends need; in a panel, each group's mean curve and, when it has 2+ runs, its bootstrap band; ``title``
    (the selection, :func:`selection_label`) on top. With ``x`` (a metric every run has as ``xs``), ``metric``
    against ``x``: each run's path as a thin line and the group's mean path (x and y averaged over its runs at each
    common step) as a thick one, no band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = [panel_of(g, keys) for g in groups]
    panels = sorted(set(where))
    labels = [group_label(g, s, keys) for g, s in zip(groups, stats, strict=True)]
    n_cols = min(len(panels), 2)
    n_rows = -(-len(panels) // n_cols)
    entries = [where.count(panel) for panel in panels]
    width = max(PANEL_SIZE[0], LEGEND_CHAR * max(map(len, labels)) + 1.0)
    height = sum(PANEL_SIZE[1] + LEGEND_LINE * max(entries[r * n_cols : (r + 1) * n_cols]) for r in range(n_rows))
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(width * n_cols, height + 0.6), dpi=100, squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, n in zip(axes.flat, entries, strict=False):
        ax.set_prop_cycle(color=colors(n))
    for g, s, panel, label in zip(groups, stats, where, labels, strict=True):
        ax = axes.flat[panels.index(panel)]
        if x is None:
            _draw_curve(ax, g, s, label)
        else:
            _draw_paths(ax, g, label)
    for ax, (env, reward) in zip(axes.flat, panels, strict=False):
        ax.set_title(f"{env}, reward: {reward}" if reward else env)
        ax.set_xlabel(
            x
            or steps_label(
                env, {g.key[keys.index("algo")] for g, p in zip(groups, where, strict=True) if p == (env, reward)}
            )
        )
        ax.set_ylabel(f"{metric}\n({reward_meaning(reward)})" if reward and is_reward_metric(metric) else metric)
        ax.grid(alpha=0.3)
        _legend_below(ax, fig)
    if x is None:
        band = "mean over seeds, 95% bootstrap CI band (none for n=1)"
    else:
        band = "thick: mean over seeds of x and y at each step; thin: each run (no band against a metric)"
    fig.suptitle(f"{title}\n{band}" if title else band, fontsize="medium")
    return fig


def colors(n: int) -> list[Any]:
    """``n`` distinct line colours: matplotlib's ten, then tab20's lighter ten, then viridis steps."""
    import matplotlib

    if n > 20:
        return [matplotlib.colormaps["viridis"](i / (n - 1)) for i in range(n)]
    tab20 = list(matplotlib.colormaps["tab20"].colors)  # type: ignore[attr-defined]
    return tab20[0::2] + tab20[1::2]


def panel_of(g: Group, keys: Sequence[str]) -> tuple[str, str]:
    """The panel a group is drawn in: (env id, reward); the reward is "" unless it is a key (rewards differ)."""
    return g.key[keys.index("env_id")], g.key[keys.index(REWARD_KEY)] if REWARD_KEY in keys else ""


def _legend_below(ax: Any, fig: Any) -> None:
    """The panel's legend under its x label, one entry a line: beside the axes, 14 groups would cover the curves or
    run off the figure's edge; the layout makes room for it."""
    from matplotlib.transforms import offset_copy

    below_label = offset_copy(ax.transAxes, fig=fig, y=-0.45, units="inches")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below_label, fontsize="small")


TEXT_STEP_UNITS = {"sft": "demonstrations", "rm": "preference pairs"}
"""What a step counts on a text task for the algorithms whose step is not a sampled completion (docs/lm.md)."""


def steps_label(env: str, algos: set[str]) -> str:
    """The x axis of ``env``'s panel: environment steps, or on a text task what its runs' steps count (sampled
    completions; turns on a multi-turn task; demonstrations for SFT, preference pairs for a reward model)."""
    from pgcli.config import TEXT_ENV_CONFIGS

    if env not in TEXT_ENV_CONFIGS:
        return "environment steps"
    rl = "sampled turns" if env == "countdown_tool" else "sampled completions"
    return " / ".join(sorted({TEXT_STEP_UNITS.get(algo, rl) for algo in algos})) or rl


def group_label(g: Group, s: GroupStats, keys: Sequence[str]) -> str:
    """A group in the legend: algo, its --group-by values, budget, setting (not a trial's) and n."""
    shown = (k not in BASE_KEYS and k != REWARD_KEY for k in keys)  # the reward names the panel
    extra = [f"{k}={v}" for k, v, show in zip(keys, g.key, shown, strict=True) if show and v != "-"]
    label = " ".join([g.key[keys.index("algo")], *extra, f"{g.budget} steps"])
    trial = TRIAL_KEY in keys and g.key[keys.index(TRIAL_KEY)] != "-"
    label += "" if trial else setting_text(g.setting)  # a trial's parameters are in the table, not the legend
    return label + f" (n={s.n_runs}" + (f", <{FEW_RUNS} runs)" if s.n_runs < FEW_RUNS else ")")


def _draw_curve(ax: Any, g: Group, s: GroupStats, label: str) -> None:
    """A group's mean curve against steps and its bootstrap band (an error bar for one evaluation)."""
    if not s.steps.size:  # the runs share no steps: draw each run rather than hide the group
        color = None
        for run in g.runs:
            (line,) = ax.plot(run.steps, run.values, lw=0.8, color=color, label=label + ": no common steps")
            color, label = line.get_color(), "_"
        return
    (line,) = ax.plot(s.steps, s.curve_mean, marker="o" if s.steps.size <= 30 else None, label=label)
    if s.curve_lo is None or s.curve_hi is None:
        return  # one run: no band
    if s.steps.size > 1:
        ax.fill_between(s.steps, s.curve_lo, s.curve_hi, color=line.get_color(), alpha=0.2)
    else:  # evaluated once (eval.every=0): the band is an error bar
        err = [s.curve_mean - s.curve_lo, s.curve_hi - s.curve_mean]
        ax.errorbar(s.steps, s.curve_mean, yerr=err, color=line.get_color(), capsize=6)


def _draw_paths(ax: Any, g: Group, label: str) -> None:
    """A group against a metric: its mean path (thick, marked) and each run's path (thin, same colour)."""
    paths = [(run.steps, run.xs, run.values) for run in g.runs if run.xs is not None]
    steps, x_mean, y_mean = mean_path(paths)
    if not steps.size:  # the runs share no steps: their paths only
        label += ": no common steps"
    (line,) = ax.plot(x_mean, y_mean, lw=2, marker="o" if steps.size <= 30 else None, label=label)
    if len(paths) > 1 or not steps.size:
        for _, xs, ys in paths:
            ax.plot(xs, ys, lw=0.7, alpha=0.45, color=line.get_color())


def plot_curves(
    groups: Sequence[Group],
    stats: Sequence[GroupStats],
    keys: Sequence[str],
    metric: str,
    path: Path,
    *,
    title: str = "",
    x: str | None = None,
) -> Path:
    """Save :func:`figure` as ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(groups, stats, keys, metric, title=title, x=x)
    fig.savefig(path)
    plt.close(fig)
    return path
