"""``pgcli compare``: aggregate runs across seeds into learning curves with confidence bands and a results table.

Runs come from the MLflow store (a sweep's parent run, an experiment, or a filter string). A group is a set of runs
that differ only in their seed, so that averaging them means something:

- runs are keyed by algo and env id (tag ``env_id``, else param ``env.id``), any ``--group-by`` keys, and the Optuna
  trial number when runs carry a ``trial`` tag (each trial is its own group);
- within a key, runs with different budgets (``total_steps``) are split into one group per budget, and runs whose
  configs differ in anything else than the seed (a grid sweep over ``algo.learning_rate``) into one group per
  setting; the report says which runs were split and why;
- two runs with the same seed in one group (the same sweep run twice) are never both averaged: the latest run of
  each seed is used and the others are reported as left out.

Each group is then aggregated over its runs:

- learning curve of one metric (default ``eval/return_mean``) against env steps. Curves are aligned on a common step
  grid: the steps logged by any run between the latest first step and the earliest last step, each run linearly
  interpolated there, so every point of the mean averages all n runs (no curve extrapolated, none silently dropped
  from the mean). Runs of one budget share their evaluation steps, so the grid is usually exactly those steps.
  The mean and a 95% percentile-bootstrap confidence band of the mean (resampling runs);
- final value (each run's last value): mean +- std (ddof=1), the interquartile mean (IQM: the mean of the middle
  50% of runs, ``scipy.stats.trim_mean(x, 0.25)``; Agarwal et al., 2021, "Deep RL at the Edge of the Statistical
  Precipice", rliable) and a 95% bootstrap CI of the mean.

A group of one run has no spread: no std, no CI and no band are shown for it. Groups of fewer than 3 runs are marked
(a bootstrap over 2 runs is not a confidence interval anyone should trust). The plot has one panel per env id, each
with its own y-axis. It writes ``compare.png``, ``compare.md`` and ``compare.html``, logs them to the sweep's parent
run when there is one, and prints the table with its notes. The aggregation functions below are pure (numpy in,
numpy out) and unit-tested.
"""

from __future__ import annotations

import argparse
import html
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pgcli.errors import CommandParser, ConfigError

DEFAULT_METRIC = "eval/return_mean"
BASE_KEYS = ("algo", "env_id")
"""Every group is keyed by these; ``--group-by`` adds keys."""
TRIAL_KEY = "trial"
"""Tag of an Optuna trial's runs (``trial=<n>``): each trial is its own group."""
KEY_SOURCES = {
    "env_id": ("tags.env_id", "params.env.id"),
    "trial": ("tags.trial",),
    "seed": ("tags.seed", "params.seed"),
    "total_steps": ("params.total_steps",),
}
"""Where a key is looked up, first hit wins; any other key: its param (the flattened config), then its tag."""
NOT_SET = {"trial": "-"}
"""Shown for a run without the key (default '?': a run that should have it but does not)."""
NOT_CONFIG = ("seed", "run_name", "experiment", "progress", "n_seeds", "checkpoint_every", "total_steps")
NOT_CONFIG_PREFIXES = ("tracking.", "hardware.")
"""Params that do not change what a run learns (or are handled apart, as the budget): runs differing only in these
are repeats of one experiment."""

# --------------------------------------------------------------------------------------------------------------------
# Pure aggregation
# --------------------------------------------------------------------------------------------------------------------


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: drop the lowest and highest ``int(0.25 n)`` values, average the rest (rliable's IQM,
    ``scipy.stats.trim_mean(values, 0.25)``). Robust to one outlier seed, less noisy than the median."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("iqm of no values")
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


def bootstrap_ci(
    samples: np.ndarray, *, confidence: float = 0.95, n_boot: int = 2000, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap confidence interval of the mean over runs.

    Args:
        samples: [n_runs] or [n_runs, n_points]; resampling draws whole runs (rows) with replacement.
        confidence: coverage of the interval.
        n_boot: bootstrap resamples.
        rng: random generator (default: seeded with 0, so a report is reproducible).

    Returns:
        (lo, hi), each shaped like ``samples[0]``. One run gives lo = hi = its values.
    """
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"samples must be [n_runs] or [n_runs, n_points] with n_runs >= 1, got shape {x.shape}")
    rng = rng if rng is not None else np.random.default_rng(0)
    idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))  # [B, n_runs]
    means = x[idx].mean(axis=1)  # [B] or [B, n_points]
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    return lo, hi


def common_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The env steps every curve covers: all logged steps between the latest first step and the earliest last step.

    Curves logged at the same steps (the usual case: one eval cadence) keep exactly those steps.
    """
    if not curves:
        raise ValueError("no curves")
    start = max(float(steps[0]) for steps, _ in curves)
    stop = min(float(steps[-1]) for steps, _ in curves)
    all_steps = np.unique(np.concatenate([np.asarray(steps, dtype=np.float64) for steps, _ in curves]))
    return all_steps[(all_steps >= start) & (all_steps <= stop)]


def curves_on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """Each (steps, values) curve linearly interpolated at ``grid``: [n_runs, len(grid)]."""
    return np.stack([np.interp(grid, np.asarray(s, dtype=np.float64), np.asarray(v, dtype=np.float64))
                     for s, v in curves])  # fmt: skip


@dataclass
class GroupStats:
    """The aggregate of one group's runs. Spread (std, CI, band) is None for a single run."""

    n_runs: int
    final_mean: float
    final_std: float | None
    final_iqm: float
    final_ci: tuple[float, float] | None
    steps: np.ndarray  # [P] common env-step grid (empty when the runs share no steps)
    curve_mean: np.ndarray  # [P]
    curve_lo: np.ndarray | None  # [P] lower edge of the 95% bootstrap band
    curve_hi: np.ndarray | None  # [P]


def aggregate(
    curves: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    confidence: float = 0.95,
    n_boot: int = 2000,
    rng: np.random.Generator | None = None,
) -> GroupStats:
    """Aggregate one group's learning curves (one (steps, values) pair per run, steps increasing)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    finals = np.array([float(v[-1]) for _, v in curves])
    grid = common_grid(curves)
    on_grid = curves_on_grid(curves, grid) if grid.size else np.zeros((len(curves), 0))  # [n_runs, P]
    spread = len(curves) > 1
    lo = hi = None
    f_ci = None
    if spread:
        if grid.size:
            lo, hi = (np.asarray(a) for a in bootstrap_ci(on_grid, confidence=confidence, n_boot=n_boot, rng=rng))
        f_lo, f_hi = bootstrap_ci(finals, confidence=confidence, n_boot=n_boot, rng=rng)
        f_ci = (float(f_lo), float(f_hi))
    return GroupStats(
        n_runs=len(curves),
        final_mean=float(finals.mean()),
        final_std=float(finals.std(ddof=1)) if spread else None,
        final_iqm=iqm(finals),
        final_ci=f_ci,
        steps=grid,
        curve_mean=on_grid.mean(axis=0),
        curve_lo=lo,
        curve_hi=hi,
    )


# --------------------------------------------------------------------------------------------------------------------
# Grouping: runs that differ only in their seed
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCurve:
    """One run's metric history and the values that decide its group."""

    run_id: str
    params: dict[str, str]
    tags: dict[str, str]
    steps: np.ndarray  # [P_run] env steps, increasing
    values: np.ndarray  # [P_run]


@dataclass
class Group:
    """Runs of one experiment (same key, budget and config) with distinct seeds."""

    key: tuple[str, ...]
    """Values of the group keys (algo, env_id, --group-by keys, trial)."""
    budget: str
    """``total_steps`` of its runs."""
    setting: dict[str, str] = field(default_factory=dict)
    """Config values that told it apart from other runs of the same key and budget."""
    runs: list[RunCurve] = field(default_factory=list)


def lookup(run: RunCurve, key: str) -> str:
    """A key's value for a run: from its sources in :data:`KEY_SOURCES`, else its param, else its tag, else
    :data:`NOT_SET`'s mark."""
    for source in KEY_SOURCES.get(key, (f"params.{key}", f"tags.{key}")):
        kind, _, name = source.partition(".")
        value = (run.params if kind == "params" else run.tags).get(name)
        if value is not None:
            return value
    return NOT_SET.get(key, "?")


def config_of(run: RunCurve) -> dict[str, str]:
    """The params that define what a run learns (its flattened config less seed, budget, tracking, hardware)."""
    return {k: v for k, v in run.params.items() if k not in NOT_CONFIG and not k.startswith(NOT_CONFIG_PREFIXES)}


def describe(key: Sequence[str], budget: str | None = None) -> str:
    """A group for the notes: ``ppo | CartPole-v1 | 5000 steps`` (keys a run does not have are left out)."""
    return " | ".join([*(k for k in key if k != "-"), *([f"{budget} steps"] if budget is not None else [])])


def make_groups(runs: Sequence[RunCurve], keys: Sequence[str]) -> tuple[list[Group], list[str]]:
    """Split ``runs`` (oldest first) into groups of seeds of one experiment; returns the groups and what was done.

    Keyed by ``keys``; within a key, split by budget and then by any config value that differs; within a group,
    the latest run of each seed is kept. Every split and every run left out is described in the returned notes.
    """
    notes: list[str] = []
    by_key: dict[tuple[str, ...], list[RunCurve]] = {}
    for run in runs:
        by_key.setdefault(tuple(lookup(run, k) for k in keys), []).append(run)
    groups: list[Group] = []
    for key, key_runs in sorted(by_key.items()):
        by_budget: dict[str, list[RunCurve]] = {}
        for run in key_runs:
            by_budget.setdefault(lookup(run, "total_steps"), []).append(run)
        if len(by_budget) > 1:
            counts = ", ".join(f"{len(r)} x {b}" for b, r in sorted(by_budget.items(), key=_budget_order))
            notes.append(f"split {describe(key)}: runs of different budgets ({counts} env steps) are not averaged")
        for budget, budget_runs in sorted(by_budget.items(), key=_budget_order):
            for group in _split_by_config(key, budget, budget_runs, notes):
                groups.append(_one_run_per_seed(group, notes))
    return groups, notes


def _budget_order(item: tuple[str, Any]) -> tuple[int, str]:
    budget = item[0]
    return (int(budget), "") if budget.isdigit() else (-1, budget)


def _split_by_config(key: tuple[str, ...], budget: str, runs: list[RunCurve], notes: list[str]) -> list[Group]:
    configs = [config_of(r) for r in runs]
    names = sorted({k for c in configs for k in c})
    varying = [k for k in names if len({c.get(k, "") for c in configs}) > 1]
    if not varying:
        return [Group(key, budget, {}, list(runs))]
    split: dict[tuple[str, ...], Group] = {}
    for run, config in zip(runs, configs, strict=True):
        values = tuple(config.get(k, "") for k in varying)
        group = split.setdefault(values, Group(key, budget, dict(zip(varying, values, strict=True))))
        group.runs.append(run)
    shown = ", ".join(varying[:4]) + (f" and {len(varying) - 4} more" if len(varying) > 4 else "")
    notes.append(
        f"split {describe(key, budget)}: runs differ in {shown}, so they are {len(split)} experiments, not seeds "
        "of one (add the key to --group-by to name it in the table)"
    )
    return [group for _, group in sorted(split.items())]


def _one_run_per_seed(group: Group, notes: list[str]) -> Group:
    latest: dict[str, RunCurve] = {}
    unseeded: list[RunCurve] = []
    for run in group.runs:  # oldest first: a later run of a seed replaces an earlier one
        seed = lookup(run, "seed")
        if seed == "?":
            unseeded.append(run)
        else:
            latest[seed] = run
    kept = [*latest.values(), *unseeded]
    if len(kept) < len(group.runs):
        counts = Counter(lookup(r, "seed") for r in group.runs)
        repeated = ", ".join(f"seed {s} x{n}" for s, n in sorted(counts.items()) if n > 1 and s != "?")
        notes.append(
            f"duplicate seeds in {describe(group.key, group.budget)}{_setting_text(group.setting)}: {repeated}; "
            f"used the latest run of each seed, left out {len(group.runs) - len(kept)} older run(s)"
        )
    group.runs = kept
    return group


def _setting_text(setting: dict[str, str]) -> str:
    return " (" + ", ".join(f"{k}={v}" for k, v in setting.items()) + ")" if setting else ""


# --------------------------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------------------------

FEW_RUNS = 3
"""Groups with fewer runs are marked: their spread says little."""


def run_mark(n_runs: int) -> str:
    """The table's note on a group's size."""
    if n_runs == 1:
        return "n=1: no spread, no CI"
    return f"n<{FEW_RUNS}: CI unreliable" if n_runs < FEW_RUNS else ""


def table_header(keys: Sequence[str], metric: str, with_setting: bool) -> list[str]:
    setting = ["config"] if with_setting else []
    return [*keys, "budget", *setting, "n", f"final {metric} (mean ± std)", "IQM", "95% CI of mean", "note"]


def decimals(values: Sequence[float]) -> int:
    """Decimals to print a row with: 1 for returns (|x| >= 10), 3 for rates and accuracies in [0, 1] and other
    small scores, which one decimal would round to 0.0."""
    finite = [abs(v) for v in values if np.isfinite(v)]
    return 1 if finite and max(finite) >= 10 else 3


def table_rows(groups: Sequence[Group], stats: Sequence[GroupStats], with_setting: bool) -> list[list[str]]:
    rows = []
    for g, s in zip(groups, stats, strict=True):
        setting = [", ".join(f"{k}={v}" for k, v in g.setting.items()) or "-"] if with_setting else []
        d = decimals([s.final_mean, s.final_iqm, *(s.final_ci or ())])
        final = f"{s.final_mean:.{d}f}" + (f" ± {s.final_std:.{d}f}" if s.final_std is not None else "")
        ci = f"[{s.final_ci[0]:.{d}f}, {s.final_ci[1]:.{d}f}]" if s.final_ci is not None else "-"
        note = "; ".join(n for n in (run_mark(s.n_runs), "" if s.steps.size else "no common steps") if n)
        rows.append([*g.key, g.budget, *setting, str(s.n_runs), final, f"{s.final_iqm:.{d}f}", ci, note or "-"])
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def html_table(header: list[str], rows: list[list[str]], title: str, notes: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#eee}</style></head><body>"
        f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"
        + (f"<ul>{items}</ul>" if items else "")
        + "<p><img src='compare.png' alt='learning curves'></p></body></html>\n"
    )


def figure(groups: Sequence[Group], stats: Sequence[GroupStats], keys: Sequence[str], metric: str) -> Any:
    """The learning-curve figure: one panel per env id, each with its own y-axis (returns between envs are not on
    one scale); in it, each group's mean curve and, when it has 2+ runs, its bootstrap band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_index = keys.index("env_id")
    envs = sorted({g.key[env_index] for g in groups})
    n_cols = min(len(envs), 2)
    n_rows = -(-len(envs) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(7 * n_cols, 4.2 * n_rows), dpi=100, squeeze=False)
    for ax in axes.flat[len(envs) :]:
        ax.set_visible(False)
    for g, s in zip(groups, stats, strict=True):
        ax = axes.flat[envs.index(g.key[env_index])]
        extra = [f"{k}={v}" for k, v in zip(keys, g.key, strict=True) if k not in BASE_KEYS and v != "-"]
        label = " ".join([g.key[keys.index("algo")], *extra, f"{g.budget} steps"])
        label += _setting_text(g.setting) + f" (n={s.n_runs}" + (f", <{FEW_RUNS} runs)" if s.n_runs < FEW_RUNS else ")")
        if not s.steps.size:  # the runs share no steps: draw each run rather than hide the group
            color = None
            for run in g.runs:
                (line,) = ax.plot(run.steps, run.values, lw=0.8, color=color, label=label + ": no common steps")
                color, label = line.get_color(), "_"
            continue
        (line,) = ax.plot(s.steps, s.curve_mean, marker="o" if s.steps.size <= 30 else None, label=label)
        if s.curve_lo is None or s.curve_hi is None:
            continue  # one run: no band
        if s.steps.size > 1:
            ax.fill_between(s.steps, s.curve_lo, s.curve_hi, color=line.get_color(), alpha=0.2)
        else:  # evaluated once (eval.every=0): the band is an error bar
            err = [s.curve_mean - s.curve_lo, s.curve_hi - s.curve_mean]
            ax.errorbar(s.steps, s.curve_mean, yerr=err, color=line.get_color(), capsize=6)
    for ax, env in zip(axes.flat, envs, strict=False):
        ax.set_title(env)
        ax.set_xlabel("environment steps")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle("mean over seeds, 95% bootstrap CI band (none for n=1)", fontsize="medium")
    fig.tight_layout()
    return fig


def plot_curves(
    groups: Sequence[Group], stats: Sequence[GroupStats], keys: Sequence[str], metric: str, path: Path
) -> Path:
    """Save :func:`figure` as ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(groups, stats, keys, metric)
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------------------------------------


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli compare",
        description="Aggregate runs across seeds: learning curves (mean, 95% bootstrap band), final return "
        "mean ± std, IQM. Runs are grouped by algo and env id (plus --group-by keys, plus the Optuna trial); runs of "
        "different budgets or configs are split, and a seed run twice counts once. With no selection, compares "
        "the children of the most recent sweep.",
        epilog="examples:\n"
        "  pgcli compare                                   # the last sweep (pgcli train -m ...)\n"
        "  pgcli compare --parent 1f2e...                  # a given sweep\n"
        "  pgcli compare --experiment cartpole --group-by algo.learning_rate\n"
        "  pgcli compare --filter \"params.algo = 'ppo' and tags.env_id = 'Hopper-v5'\"\n"
        "  pgcli compare --parent 1f2e... tracking.uri=http://127.0.0.1:5000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parent", help="a sweep's parent run id: compare its child runs")
    parser.add_argument("--experiment", action="append", help="experiment name (repeatable)")
    parser.add_argument("--filter", default="", help="MLflow search filter, e.g. \"params.algo = 'ppo'\"")
    parser.add_argument(
        "--group-by", default="", help="more config keys to group by, e.g. algo.learning_rate (always: algo, env_id)"
    )
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"curve metric (default: {DEFAULT_METRIC})")
    parser.add_argument("--out", type=Path, help="output directory (default: <sweep dir>/compare or outputs/compare/)")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--include-unfinished", action="store_true", help="also use FAILED/KILLED/RUNNING runs")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli ui)")
    return parser.parse_args(args)


def main(args: list[str]) -> int:
    """Entry point of ``pgcli compare``."""
    ns = parse_args(args)
    keys = [*BASE_KEYS, *(k for k in (k.strip() for k in ns.group_by.split(",")) if k and k not in BASE_KEYS)]
    if ns.n_boot < 1:
        raise ConfigError(f"--n-boot must be >= 1 (got {ns.n_boot}); typical: 2000")
    from pgcli.config.compose import compose_train_config
    from pgcli.tracking.backend import RunStore, resolve_tracking_target
    from pgcli.tracking.store_check import check_readable_store

    run_cfg = compose_train_config(ns.overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store to compare; drop the tracking override")
    uri = resolve_tracking_target(run_cfg.tracking).uri
    check_readable_store(uri, doing="compare")  # before MLflow, which would create a store where there is none
    store = RunStore(uri)
    parent, records = select_runs(store, parent=ns.parent, experiments=ns.experiment, filter_string=ns.filter)
    skipped = [] if ns.include_unfinished else [r for r in records if r.status != "FINISHED"]
    records = [r for r in records if r.status == "FINISHED" or ns.include_unfinished]
    runs: list[RunCurve] = []
    for record in sorted(records, key=lambda r: r.start_time):
        points = store.metric_history(record.run_id, ns.metric)
        if points:
            steps, values = (np.array(v, dtype=np.float64) for v in zip(*points, strict=True))
            runs.append(RunCurve(record.run_id, record.params, record.tags, steps, values))
    if not runs:
        left_out = f" ({len(skipped)} unfinished runs left out: --include-unfinished)" if skipped else ""
        raise ConfigError(f"none of the {len(records)} selected runs logged '{ns.metric}'{left_out}")
    if any(TRIAL_KEY in r.tags for r in runs) and TRIAL_KEY not in keys:
        keys.append(TRIAL_KEY)  # an Optuna trial's seeds are one group; trials are never averaged together
    groups, notes = make_groups(runs, keys)
    stats = [aggregate([(r.steps, r.values) for r in g.runs], n_boot=ns.n_boot) for g in groups]
    few = [s.n_runs for s in stats if s.n_runs < FEW_RUNS]
    if few:
        notes.append(
            f"{len(few)} of {len(groups)} group(s) have fewer than {FEW_RUNS} runs (see 'note'): a single run has no "
            "spread (no std, CI or band is shown); a band over 2 runs is not a reliable CI"
        )

    out = ns.out or default_out_dir(parent)
    out.mkdir(parents=True, exist_ok=True)
    with_setting = any(g.setting for g in groups)
    header, rows = table_header(keys, ns.metric, with_setting), table_rows(groups, stats, with_setting)
    md = markdown_table(header, rows)
    notes_md = "".join(f"- {n}\n" for n in notes)
    title = f"pgcli compare: {sum(s.n_runs for s in stats)} runs in {len(groups)} group(s)"
    title += f", sweep {parent.name}" if parent else ""
    (out / "compare.md").write_text(
        f"# {title}\n\n{md}\n\n" + (f"{notes_md}\n" if notes else "") + "![learning curves](compare.png)\n"
    )
    (out / "compare.html").write_text(html_table(header, rows, title, notes))
    plot_curves(groups, stats, keys, ns.metric, out / "compare.png")
    if parent is not None:
        for name in ("compare.md", "compare.html", "compare.png"):
            store.log_artifact(parent.run_id, out / name, "compare")

    print(md)
    if notes:
        print("\nnotes:\n" + notes_md, end="")
    if skipped:
        print(f"pgcli: {len(skipped)} unfinished run(s) left out (--include-unfinished to use them)", file=sys.stderr)
    if len(records) > len(runs):
        print(f"pgcli: {len(records) - len(runs)} run(s) without '{ns.metric}' left out", file=sys.stderr)
    where = f"; logged to parent run {parent.run_id}" if parent else ""
    print(f"pgcli: wrote {out / 'compare.png'}, compare.md, compare.html{where}", file=sys.stderr)
    return 0


def select_runs(
    store: Any, *, parent: str | None, experiments: list[str] | None, filter_string: str
) -> tuple[Any, list[Any]]:
    """(parent run or None, the selected runs): a sweep's children, an experiment's runs, or a filter's matches.

    With no selection at all, the children of the most recent sweep. Sweep parents themselves are never compared.
    """
    if parent:
        try:
            parent_run = store.get(parent)
        except Exception:
            raise ConfigError(f"--parent: no run with id '{parent}' in {store.uri}") from None
        runs = store.search([parent_run.experiment_id], _and(f"tags.mlflow.parentRunId = '{parent}'", filter_string))
        return parent_run, runs
    if experiments:
        ids = store.experiment_ids(experiments)
        if len(ids) < len(experiments):
            known = ", ".join(sorted(store.experiment_names())) or "none"
            raise ConfigError(f"--experiment: unknown experiment among {', '.join(experiments)} (experiments: {known})")
        return None, [r for r in store.search(ids, filter_string) if r.tags.get("pgcli_role") != "sweep"]
    all_ids = store.experiment_ids()
    if filter_string:
        return None, [r for r in store.search(all_ids, filter_string) if r.tags.get("pgcli_role") != "sweep"]
    sweeps = store.search(all_ids, "tags.pgcli_role = 'sweep'", order_by=["attributes.start_time DESC"])
    if not sweeps:
        raise ConfigError(f"no sweep in {store.uri}; select runs with --experiment, --parent or --filter")
    return select_runs(store, parent=sweeps[0].run_id, experiments=None, filter_string="")


def default_out_dir(parent: Any) -> Path:
    if parent is not None and parent.tags.get("sweep_dir"):
        return Path(parent.tags["sweep_dir"]) / "compare"
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d_%H-%M-%S")


def _and(a: str, b: str) -> str:
    return f"{a} and {b}" if b else a
