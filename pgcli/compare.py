"""``pgcli compare``: aggregate runs across seeds into learning curves with confidence bands and a results table.

Runs come from the MLflow store (a sweep's parent run, an experiment, or a filter string), are grouped by config keys
(default ``algo`` x ``env``; a key is looked up in the run's params, i.e. the flattened config, then its tags), and
each group is aggregated over its runs (seeds):

- learning curve of one metric (default ``eval/return_mean``) against env steps: every run interpolated onto a
  common step grid, the mean, and a 95% percentile-bootstrap confidence band of the mean (resampling runs);
- final return (each run's last value): mean +- std (ddof=1), the interquartile mean (IQM: the mean of the middle
  50% of runs, ``scipy.stats.trim_mean(x, 0.25)``; Agarwal et al., 2021, "Deep RL at the Edge of the Statistical
  Precipice", rliable) and a 95% bootstrap CI of the mean.

It writes ``compare.png``, ``compare.md`` and ``compare.html``, logs them to the sweep's parent run when there is one,
and prints the table. The aggregation functions below are pure (numpy in, numpy out) and unit-tested.
"""

from __future__ import annotations

import argparse
import html
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgcli.errors import ConfigError, PgcliError

DEFAULT_METRIC = "eval/return_mean"
DEFAULT_GROUP_BY = ("algo", "env")

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
    """The aggregate of one group's runs."""

    key: tuple[str, ...]
    n_runs: int
    final_mean: float
    final_std: float
    final_iqm: float
    final_ci: tuple[float, float]
    steps: np.ndarray  # [P] common env-step grid
    curve_mean: np.ndarray  # [P]
    curve_lo: np.ndarray  # [P] lower edge of the 95% bootstrap band
    curve_hi: np.ndarray  # [P]


def aggregate(
    key: tuple[str, ...],
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
    on_grid = curves_on_grid(curves, grid)  # [n_runs, P]
    lo, hi = bootstrap_ci(on_grid, confidence=confidence, n_boot=n_boot, rng=rng)
    f_lo, f_hi = bootstrap_ci(finals, confidence=confidence, n_boot=n_boot, rng=rng)
    return GroupStats(
        key=key,
        n_runs=len(curves),
        final_mean=float(finals.mean()),
        final_std=float(finals.std(ddof=1)) if finals.size > 1 else 0.0,
        final_iqm=iqm(finals),
        final_ci=(float(f_lo), float(f_hi)),
        steps=grid,
        curve_mean=on_grid.mean(axis=0),
        curve_lo=np.asarray(lo),
        curve_hi=np.asarray(hi),
    )


def group_key(params: dict[str, str], tags: dict[str, str], keys: Sequence[str]) -> tuple[str, ...]:
    """A run's group: each key's value from its params (the flattened config), else its tags, else '?'."""
    return tuple(params.get(k, tags.get(k, "?")) for k in keys)


# --------------------------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------------------------


def table_rows(stats: Sequence[GroupStats]) -> list[list[str]]:
    return [
        [
            *s.key,
            str(s.n_runs),
            f"{s.final_mean:.1f} ± {s.final_std:.1f}",
            f"{s.final_iqm:.1f}",
            f"[{s.final_ci[0]:.1f}, {s.final_ci[1]:.1f}]",
            f"{int(s.steps[-1]) if s.steps.size else 0}",
        ]
        for s in stats
    ]


def table_header(group_by: Sequence[str], metric: str) -> list[str]:
    return [*group_by, "runs", f"final {metric} (mean ± std)", "IQM", "95% CI of mean", "env steps"]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def html_table(header: list[str], rows: list[list[str]], title: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#eee}</style></head><body>"
        f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"
        "<p><img src='compare.png' alt='learning curves'></p></body></html>\n"
    )


def plot_curves(stats: Sequence[GroupStats], group_by: Sequence[str], metric: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for s in stats:
        label = " ".join(f"{k}={v}" for k, v in zip(group_by, s.key, strict=True)) + f" (n={s.n_runs})"
        (line,) = ax.plot(s.steps, s.curve_mean, marker="o" if s.steps.size <= 30 else None, label=label)
        if s.steps.size > 1:
            ax.fill_between(s.steps, s.curve_lo, s.curve_hi, color=line.get_color(), alpha=0.2)
        else:  # evaluated once (eval.every=0): the band is an error bar
            err = [s.curve_mean - s.curve_lo, s.curve_hi - s.curve_mean]
            ax.errorbar(s.steps, s.curve_mean, yerr=err, color=line.get_color(), capsize=6)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(metric)
    ax.set_title("mean over runs, 95% bootstrap CI band")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------------------------------------


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pgcli compare",
        description="Aggregate runs across seeds: learning curves (mean, 95% bootstrap band), final return "
        "mean ± std, IQM. With no selection, compares the children of the most recent sweep.",
        epilog="examples:\n"
        "  pgcli compare                                   # the last sweep (pgcli train -m ...)\n"
        "  pgcli compare --parent 1f2e...                  # a given sweep\n"
        "  pgcli compare --experiment cartpole --group-by algo,algo.learning_rate\n"
        "  pgcli compare --filter \"params.algo = 'ppo' and tags.env = 'hopper'\"\n"
        "  pgcli compare --parent 1f2e... tracking.uri=http://127.0.0.1:5000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parent", help="a sweep's parent run id: compare its child runs")
    parser.add_argument("--experiment", action="append", help="experiment name (repeatable)")
    parser.add_argument("--filter", default="", help="MLflow search filter, e.g. \"params.algo = 'ppo'\"")
    parser.add_argument("--group-by", default=",".join(DEFAULT_GROUP_BY), help="config keys (default: algo,env)")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"curve metric (default: {DEFAULT_METRIC})")
    parser.add_argument("--out", type=Path, help="output directory (default: <sweep dir>/compare or outputs/compare/)")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--include-unfinished", action="store_true", help="also use FAILED/KILLED/RUNNING runs")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli ui)")
    return parser.parse_args(args)


def main(args: list[str]) -> int:
    """Entry point of ``pgcli compare``."""
    ns = parse_args(args)
    group_by = [k.strip() for k in ns.group_by.split(",") if k.strip()]
    if not group_by:
        raise ConfigError("--group-by needs at least one config key, e.g. --group-by algo,env")
    if ns.n_boot < 1:
        raise ConfigError(f"--n-boot must be >= 1 (got {ns.n_boot})")
    from pgcli.compose import compose_train_config
    from pgcli.tracking import RunStore, resolve_tracking_target

    run_cfg = compose_train_config(ns.overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store to compare; drop the tracking override")
    store = RunStore(resolve_tracking_target(run_cfg.tracking).uri)
    parent, runs = select_runs(store, parent=ns.parent, experiments=ns.experiment, filter_string=ns.filter)
    skipped = [r for r in runs if r.status != "FINISHED"]
    if not ns.include_unfinished:
        runs = [r for r in runs if r.status == "FINISHED"]
    groups: dict[tuple[str, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
    no_metric = 0
    for run in sorted(runs, key=lambda r: r.start_time):
        points = store.metric_history(run.run_id, ns.metric)
        if not points:
            no_metric += 1
            continue
        steps, values = (np.array(v, dtype=np.float64) for v in zip(*points, strict=True))
        groups.setdefault(group_key(run.params, run.tags, group_by), []).append((steps, values))
    if not groups:
        raise PgcliError(f"none of the {len(runs)} selected finished runs logged '{ns.metric}'")
    stats = [aggregate(key, curves, n_boot=ns.n_boot) for key, curves in sorted(groups.items())]

    out = ns.out or default_out_dir(parent)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = table_header(group_by, ns.metric), table_rows(stats)
    md = markdown_table(header, rows)
    title = f"pgcli compare: {sum(s.n_runs for s in stats)} runs" + (f", sweep {parent.name}" if parent else "")
    (out / "compare.md").write_text(f"# {title}\n\n{md}\n\n![learning curves](compare.png)\n")
    (out / "compare.html").write_text(html_table(header, rows, title))
    plot_curves(stats, group_by, ns.metric, out / "compare.png")
    if parent is not None:
        for name in ("compare.md", "compare.html", "compare.png"):
            store.log_artifact(parent.run_id, out / name, "compare")

    print(md)
    notes = []
    if skipped and not ns.include_unfinished:
        notes.append(f"{len(skipped)} unfinished run(s) left out (--include-unfinished to use them)")
    if no_metric:
        notes.append(f"{no_metric} run(s) without '{ns.metric}' left out")
    for note in notes:
        print(f"pgcli: {note}", file=sys.stderr)
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
            raise PgcliError(f"no run with id '{parent}' in {store.uri}") from None
        runs = store.search([parent_run.experiment_id], _and(f"tags.mlflow.parentRunId = '{parent}'", filter_string))
        return parent_run, runs
    if experiments:
        ids = store.experiment_ids(experiments)
        if len(ids) < len(experiments):
            known = ", ".join(sorted(store.experiment_names())) or "none"
            raise PgcliError(f"unknown experiment among {', '.join(experiments)} (experiments: {known})")
        return None, [r for r in store.search(ids, filter_string) if r.tags.get("pgcli_role") != "sweep"]
    all_ids = store.experiment_ids()
    if filter_string:
        return None, [r for r in store.search(all_ids, filter_string) if r.tags.get("pgcli_role") != "sweep"]
    sweeps = store.search(all_ids, "tags.pgcli_role = 'sweep'", order_by=["attributes.start_time DESC"])
    if not sweeps:
        raise PgcliError(f"no sweep in {store.uri}; select runs with --experiment, --parent or --filter")
    return select_runs(store, parent=sweeps[0].run_id, experiments=None, filter_string="")


def default_out_dir(parent: Any) -> Path:
    if parent is not None and parent.tags.get("sweep_dir"):
        return Path(parent.tags["sweep_dir"]) / "compare"
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d_%H-%M-%S")


def _and(a: str, b: str) -> str:
    return f"{a} and {b}" if b else a
