"""``pgcli compare``: aggregate runs across seeds into learning curves with confidence bands and a results table.

Runs come from the MLflow store (a sweep's parent run, an experiment, or a filter string; with no selection, the
children of the most recent sweep); only training runs count, not sweep parents or ``pgcli eval`` runs. They are
grouped into seeds of one experiment (:mod:`pgcli.compare.groups`), each group aggregated (:mod:`pgcli.compare.stats`:
mean curve with a 95% bootstrap band, final mean +- std, IQM, bootstrap CI; with ``--x``, the curve against another
logged metric, each run's path and the group's mean path), and reported
(:mod:`pgcli.compare.report`): ``compare-<metric>[-vs-<x>]`` ``.png``, ``.md`` and ``.html`` in the output directory
(named by what they draw, so comparisons by other metrics keep theirs), logged to the sweep's parent run when there is
one, and the table with its notes on the terminal (docs/sweeps.md, "Comparing runs"). A reward metric of runs whose
rewards differ (the task's, a reward model's pairwise accuracy, a reward model's score) is split by reward, said in a
note.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pgcli.compare.groups import (
    BASE_KEYS,
    REWARD_KEY,
    TRIAL_KEY,
    Group,
    RunCurve,
    check_keys,
    make_groups,
    mixed_rewards,
)
from pgcli.compare.report import (
    FEW_RUNS,
    html_table,
    markdown_table,
    plot_curves,
    report_stem,
    selection_label,
    table_header,
    table_rows,
)
from pgcli.compare.stats import GroupStats, aggregate
from pgcli.config.renames import renamed_key, renamed_params
from pgcli.errors import CommandParser, ConfigError
from pgcli.tracking.status import FINISHED
from pgcli.training.logged import MIN_PREFIX, find_run, is_too_short

if TYPE_CHECKING:
    from pgcli.tracking.store import RunRecord, RunStore

DEFAULT_METRIC = "eval/return_mean"
EVAL_TAG = "pgcli.eval.model"
"""Every run ``pgcli eval`` logs has this tag (``final`` or ``best``); training runs never do."""


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli compare",
        description="Aggregate runs across seeds: learning curves (mean, 95% bootstrap band), final return "
        "mean ± std, IQM. Runs are grouped by algo and env id (plus --group-by keys, plus the Optuna trial, plus the "
        "reward when a reward metric's runs have different rewards: task, pairwise accuracy, a reward model); runs of "
        "different budgets or configs are split (a resumed run counts at the budget it was resumed to), and a seed run "
        "twice counts once; `pgcli eval` runs are left out. With no selection, compares the children of the most "
        "recent sweep. Writes compare-<metric>[-vs-<x>].png, .md, .html.",
        epilog="examples:\n"
        "  pgcli compare                                   # the last sweep (pgcli train -m ...)\n"
        "  pgcli compare --parent 1f2e...                  # a given sweep\n"
        "  pgcli compare --experiment cartpole --group-by algo.learning_rate\n"
        "  pgcli compare --filter \"params.algo = 'ppo' and tags.env_id = 'Hopper-v5'\"\n"
        "  pgcli compare --parent 1f2e... --group-by algo.beta --metric eval/accuracy --x eval/kl_ref\n"
        "  pgcli compare --parent 1f2e... tracking.uri=http://127.0.0.1:5000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--parent", help="a sweep's parent run id (or a unique prefix of 8+ hex digits): compare its child runs"
    )
    parser.add_argument("--experiment", action="append", help="experiment name (repeatable)")
    parser.add_argument("--filter", default="", help="MLflow search filter, e.g. \"params.algo = 'ppo'\"")
    parser.add_argument(
        "--group-by", default="", help="more config keys to group by, e.g. algo.learning_rate (always: algo, env_id)"
    )
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"curve metric (default: {DEFAULT_METRIC})")
    parser.add_argument(
        "--x",
        metavar="KEY",
        help="draw the curve metric against this logged metric (e.g. eval/kl_ref), at the steps "
        "where a run logged both, instead of against env steps",
    )
    parser.add_argument("--out", type=Path, help="output directory (default: <sweep dir>/compare or outputs/compare/)")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--include-unfinished", action="store_true", help="also use FAILED/KILLED/RUNNING runs")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli ui)")
    ns = parser.parse_args(args)
    if ns.out is not None:
        from pgcli.training.preflight import check_out_dir

        ns.out = check_out_dir(ns.out, "--out")
    return ns


def main(args: list[str]) -> int:
    """Entry point of ``pgcli compare``."""
    ns = parse_args(args)
    typed = (renamed_key(k.strip()) for k in ns.group_by.split(","))
    keys = [*BASE_KEYS, *(k for k in typed if k and k not in BASE_KEYS)]
    if ns.n_boot < 1:
        raise ConfigError(f"--n-boot must be >= 1 (got {ns.n_boot}); typical: 2000")
    store = open_store(ns.overrides)
    parent, records = select_runs(store, parent=ns.parent, experiments=ns.experiment, filter_string=ns.filter)
    skipped = [] if ns.include_unfinished else [r for r in records if r.status != FINISHED]
    records = [r for r in records if r.status == FINISHED or ns.include_unfinished]
    runs = load_curves(store, records, ns.metric, ns.x)
    if not runs:
        left_out = f" ({len(skipped)} unfinished runs left out: --include-unfinished)" if skipped else ""
        logged = f"both '{ns.metric}' and '{ns.x}'" if ns.x else f"'{ns.metric}'"
        raise ConfigError(f"none of the {len(records)} selected runs logged {logged}{left_out}")
    groups, notes = group_runs(runs, keys, ns.metric)
    stats = [aggregate([(r.steps, r.values) for r in g.runs], n_boot=ns.n_boot) for g in groups]
    few = [s.n_runs for s in stats if s.n_runs < FEW_RUNS]
    if few:
        notes.append(
            f"{len(few)} of {len(groups)} group(s) have fewer than {FEW_RUNS} runs (see 'note'): a single run has no "
            "spread (no std, CI or band is shown); a band over 2 runs is not a reliable CI"
        )

    out = ns.out or default_out_dir(parent)
    selection = selection_label(
        sweep=parent.name if parent else None, experiments=ns.experiment, filter_string=ns.filter
    )
    md = write_report(out, groups, stats, keys, ns.metric, notes, selection=selection, x=ns.x)
    stem = report_stem(ns.metric, ns.x)
    if parent is not None:
        for suffix in (".md", ".html", ".png"):
            store.log_artifact(parent.run_id, out / f"{stem}{suffix}", "compare")

    print(md)
    if notes:
        print("\nnotes:\n" + "".join(f"- {n}\n" for n in notes), end="")
    if skipped:
        print(f"pgcli: {len(skipped)} unfinished run(s) left out (--include-unfinished to use them)", file=sys.stderr)
    if len(records) > len(runs):
        logged = f"a step logging both '{ns.metric}' and '{ns.x}'" if ns.x else f"'{ns.metric}'"
        print(f"pgcli: {len(records) - len(runs)} run(s) without {logged} left out", file=sys.stderr)
    where = f"; logged to parent run {parent.run_id}" if parent else ""
    print(f"pgcli: wrote {out / stem}.png, {stem}.md, {stem}.html{where}", file=sys.stderr)
    return 0


def group_runs(runs: Sequence[RunCurve], keys: list[str], metric: str) -> tuple[list[Group], list[str]]:
    """``runs`` in groups of seeds and the notes on them; ``keys`` (algo, env id, ``--group-by``'s) gains the Optuna
    trial when runs are trials and the reward when ``metric`` is a reward and the runs' rewards differ."""
    check_keys(runs, keys[len(BASE_KEYS) :])
    if any(TRIAL_KEY in r.tags for r in runs) and TRIAL_KEY not in keys:
        keys.append(TRIAL_KEY)  # an Optuna trial's seeds are one group; trials are never averaged together
    mixed = mixed_rewards(runs, metric)  # accuracy, pairwise accuracy and a reward model's score: not one scale
    if mixed and REWARD_KEY not in keys:
        keys.append(REWARD_KEY)
    groups, notes = make_groups(runs, keys)
    return groups, [mixed, *notes] if mixed else notes


def open_store(overrides: list[str]) -> Any:
    """The run store the tracking ``overrides`` point at, checked to exist before MLflow opens (and would create)
    it."""
    from pgcli.config.compose import compose_train_config
    from pgcli.tracking.checks import check_store
    from pgcli.tracking.store import RunStore
    from pgcli.tracking.uri import resolve_tracking_target

    run_cfg = compose_train_config(overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store to compare; drop the tracking override")
    uri = resolve_tracking_target(run_cfg.tracking).uri
    check_store(uri, "read", doing="compare")  # before MLflow, which would create a store where there is none
    return RunStore(uri)


def load_curves(store: RunStore, records: Sequence[RunRecord], metric: str, x: str | None = None) -> list[RunCurve]:
    """Each run's ``metric`` history, oldest run first; runs that never logged it are left out.

    With ``x``, the points are the steps at which the run logged both ``metric`` and ``x`` (the last value of each
    at a step logged twice, as a resumed run may), with ``x``'s values as the run's ``xs``; runs without such a step
    are left out."""
    runs: list[RunCurve] = []
    for record in sorted(records, key=lambda r: r.start_time):
        history = store.metric_history(record.run_id, metric)
        points: Sequence[tuple[float, ...]] = history
        if x is not None and history:
            ys, xs = dict(history), dict(store.metric_history(record.run_id, x))  # step -> last value
            points = [(step, ys[step], xs[step]) for step in sorted(ys.keys() & xs.keys())]
        if points:
            columns = [np.array(v, dtype=np.float64) for v in zip(*points, strict=True)]
            runs.append(RunCurve(record.run_id, renamed_params(record.params), record.tags, *columns))
    return runs


def write_report(
    out: Path,
    groups: Sequence[Group],
    stats: Sequence[GroupStats],
    keys: Sequence[str],
    metric: str,
    notes: Sequence[str],
    *,
    selection: str,
    x: str | None = None,
) -> str:
    """Write the report's ``.md``, ``.html`` and ``.png`` (:func:`~pgcli.compare.report.report_stem`) into ``out``;
    returns the markdown table. With ``x``, the table has each group's final ``x`` too and the plot draws ``metric``
    against ``x``."""
    out.mkdir(parents=True, exist_ok=True)
    with_setting = any(g.setting for g in groups)
    header, rows = table_header(keys, metric, with_setting, x=x), table_rows(groups, stats, with_setting, x=x)
    md = markdown_table(header, rows)
    notes_md = "".join(f"- {n}\n" for n in notes)
    title = f"pgcli compare: {sum(s.n_runs for s in stats)} runs in {len(groups)} group(s)"
    title += f", {selection}" if selection else ""  # the plot carries it too
    alt = f"{metric} against {x}" if x else "learning curves"
    stem = report_stem(metric, x)
    (out / f"{stem}.md").write_text(
        f"# {title}\n\n{md}\n\n" + (f"{notes_md}\n" if notes else "") + f"![{alt}]({stem}.png)\n"
    )
    (out / f"{stem}.html").write_text(html_table(header, rows, title, notes, alt=alt, image=f"{stem}.png"))
    plot_curves(groups, stats, list(keys), metric, out / f"{stem}.png", title=title, x=x)
    return md


def select_runs(
    store: RunStore, *, parent: str | None, experiments: list[str] | None, filter_string: str
) -> tuple[RunRecord | None, list[RunRecord]]:
    """(parent run or None, the selected runs): a sweep's children, an experiment's runs, or a filter's matches.

    With no selection at all, the children of the most recent sweep. Only training runs are compared
    (:func:`training_runs`).
    """
    if parent:
        parent_run = find_run(store, parent)  # its id, or a unique prefix of it (docs/runs.md, "Run ids")
        if parent_run is None:
            short = f"; a run id prefix needs at least {MIN_PREFIX} hex digits" if is_too_short(parent) else ""
            raise ConfigError(f"--parent: no run with id '{parent}' in {store.uri}{short}")
        parent_filter = f"tags.mlflow.parentRunId = '{parent_run.run_id}'"
        return parent_run, training_runs(store.search([parent_run.experiment_id], _and(parent_filter, filter_string)))
    if experiments:
        ids = store.experiment_ids(experiments)
        if len(ids) < len(experiments):
            known = ", ".join(sorted(store.experiment_names())) or "none"
            raise ConfigError(f"--experiment: unknown experiment among {', '.join(experiments)} (experiments: {known})")
        return None, training_runs(store.search(ids, filter_string))
    all_ids = store.experiment_ids()
    if filter_string:
        return None, training_runs(store.search(all_ids, filter_string))
    sweeps = store.search(all_ids, "tags.pgcli_role = 'sweep'", order_by=["attributes.start_time DESC"])
    if not sweeps:
        raise ConfigError(f"no sweep in {store.uri}; select runs with --experiment, --parent or --filter")
    return select_runs(store, parent=sweeps[0].run_id, experiments=None, filter_string="")


def training_runs(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The training runs among ``records``: not a sweep's parent (``pgcli_role=sweep``: it has no curve of its own)
    and not a ``pgcli eval`` run (tagged ``pgcli.eval.model``: one evaluation of a trained agent, logged beside the
    run it scored, not a run of its own budget). They are left out silently: they are not what compare compares."""
    return [r for r in records if r.tags.get("pgcli_role") != "sweep" and EVAL_TAG not in r.tags]


def default_out_dir(parent: RunRecord | None) -> Path:
    if parent is not None and parent.tags.get("sweep_dir"):
        return Path(parent.tags["sweep_dir"]) / "compare"
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d_%H-%M-%S")


def _and(a: str, b: str) -> str:
    return f"{a} and {b}" if b else a
