"""``pgcli runs``: the latest runs of the store, and ``--stale``: RUNNING runs whose process is gone, marked KILLED.

The listing shows what each training run is (experiment, algo, env id), how far it got (its last logged step, and its
budget while it is short of it: a resumed run's budget is its ``total_steps`` tag, read as ``pgcli compare`` reads
it), how long it took and its last evaluation's return (a text run's accuracy); the runs of ``pgcli eval`` follow in a
section of their own, with the model they scored. Both fit a 120-column terminal (docs/runs.md, "SIGKILL and stale
runs").

A run records its process as tags (``pid``, ``hostname``, ``pid_start``). A process killed with SIGKILL (or a
machine that lost power) cannot end its run, so the run stays RUNNING; ``pgcli runs --stale`` finds the RUNNING runs
of this host whose process no longer exists and ends them KILLED (``--dry-run`` only lists them). Runs of other hosts
are never touched: their processes cannot be checked from here, and neither are runs that ended while their tracking
server was unreachable: their end waits in their run directory's spool, and ``pgcli sync`` delivers it
(docs/tracking.md, "When the tracking server goes away"). ``pgcli train resume=<run id>`` continues a stale run from
its last checkpoint. The listing shows the first 8 hex digits of each run id, which every command that takes a run
takes as well (a unique prefix: docs/runs.md, "Run ids").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgcli.commands.compare import DEFAULT_METRIC, EVAL_TAG
from pgcli.compare.groups import RunCurve, lookup
from pgcli.compare.report import decimals
from pgcli.config.compose import compose_train_config
from pgcli.errors import CommandParser, ConfigError
from pgcli.tracking.status import RUNNING
from pgcli.training.owner import StaleRun, find_stale_runs, mark_killed

if TYPE_CHECKING:
    from pgcli.tracking.store import RunRecord, RunStore

WIDTH = 120
"""The listing fits a terminal this wide: the name column takes what the others leave, and is cut in its middle to
fit."""
MIN_NAME = 16
"""The name column keeps at least this many characters, however wide the other columns are."""
CAPS = {"experiment": 16, "env": 18, "algo": 10}
"""Longest value shown of these columns; longer ones are cut (with "…"), and when a line is still too wide, cut further
in this order (the experiment is often the env's name again; the env id's version matters)."""
MIN_CAPPED = 8
"""The :data:`CAPS` columns are cut no shorter than this to make room for the name."""
ACCURACY = "eval/accuracy"
"""A text run's final score (pgcli.lm.evaluation): shown instead of its return, which is a reward of its own scale."""
TRAIN_HEADER = ["id", "status", "experiment", "algo", "env", "steps", "duration", "return", "started", "name"]
EVAL_HEADER = ["id", "status", "experiment", "algo", "env", "model", "episodes", "return", "started", "name"]
NO_POINTS = np.empty(0)


def main(args: list[str]) -> int:
    parser = CommandParser(
        prog="pgcli runs",
        description="List the latest runs of pgcli's run store (experiment, algo, env, steps, duration, final "
        "return), then the runs of `pgcli eval` apart; with --stale, end the RUNNING runs whose process is gone "
        "(killed with SIGKILL, machine restarted) as KILLED.",
        epilog="examples:\n"
        "  pgcli runs                          # the 20 latest runs, then the 20 latest eval runs\n"
        "  pgcli runs --stale --dry-run        # which RUNNING runs of this host lost their process\n"
        "  pgcli runs --stale                  # ... and mark them KILLED\n"
        "  pgcli train resume=<id>             # continue one from its last checkpoint (its id as listed here)\n"
        "  pgcli eval <id>                     # every command that takes a run takes the 8 hex digits shown",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stale", action="store_true", help="find RUNNING runs whose process is gone, mark KILLED")
    parser.add_argument("--dry-run", action="store_true", help="with --stale: list them, change nothing")
    parser.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    parser.add_argument("--limit", type=int, default=20, help="runs to list per section (default: 20)")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli ui)")
    ns = parser.parse_args(args)
    if ns.dry_run and not ns.stale:
        raise ConfigError("--dry-run goes with --stale")
    if ns.limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {ns.limit})")
    run_cfg = compose_train_config(ns.overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store; drop the tracking override")
    from pgcli.tracking.checks import check_store
    from pgcli.tracking.store import RunStore
    from pgcli.tracking.uri import resolve_tracking_target

    uri = resolve_tracking_target(run_cfg.tracking).uri
    check_store(uri, "read", doing="list")
    store = RunStore(uri)
    experiment_ids = store.experiment_ids(ns.experiment) if ns.experiment else None
    if ns.experiment and not experiment_ids:
        raise ConfigError(
            f"no experiment {', '.join(ns.experiment)} in {uri} (experiments: {', '.join(store.experiment_names())})"
        )

    if ns.stale:
        stale, unknown = find_stale_runs(store, experiment_ids)
        stale, offline = _without_offline_ends(store, stale)
        if stale and not ns.dry_run:
            check_store(uri, "write", doing="mark runs KILLED", fix="fix its permissions, or list them with --dry-run")
        for run in stale:
            print(f"{run.run_id}  {run.name}  {run.reason}")
        if not ns.dry_run:
            mark_killed(store, stale)
        done = "would mark" if ns.dry_run else "marked"
        note = f"; {unknown} RUNNING run(s) of other hosts or without a pid tag left alone" if unknown else ""
        note += f"; {offline} that ended offline left for pgcli sync" if offline else ""
        print(f"pgcli: {done} {len(stale)} stale run(s) KILLED{note}", file=sys.stderr)
        return 0

    runs = store.search(experiment_ids or store.experiment_ids(), order_by=["attributes.start_time DESC"])
    list_runs(store, runs, ns.limit)
    return 0


def list_runs(store: RunStore, runs: Sequence[RunRecord], limit: int) -> None:
    """Print the latest ``limit`` training runs of ``runs`` (newest first), then the latest ``limit`` eval runs in a
    section of their own (none when there are none); how many of how many on stderr."""
    from pgcli.tracking.listing import experiment_names, last_steps

    evals = [r for r in runs if EVAL_TAG in r.tags]
    trains = [r for r in runs if EVAL_TAG not in r.tags]
    names = experiment_names(store)
    steps = last_steps(store, trains[:limit])
    by_id = {r.run_id: r for r in runs}
    print("\n".join(table(TRAIN_HEADER, [train_row(r, names, steps.get(r.run_id)) for r in trains[:limit]])))
    if evals:
        print("\neval runs (pgcli eval)")
        print("\n".join(table(EVAL_HEADER, [eval_row(r, names, by_id) for r in evals[:limit]])))
    counts = f"{min(len(trains), limit)} of {len(trains)} runs"
    counts += f", {min(len(evals), limit)} of {len(evals)} eval runs" if evals else ""
    print(f"pgcli: {counts} in {store.uri}", file=sys.stderr)


def train_row(record: RunRecord, experiments: dict[str, str], last_step: int | None) -> list[str]:
    """One training run (or a sweep's parent run): what it trained, how far, how long, and its last evaluation."""
    sweep = record.tags.get("pgcli_role") == "sweep"
    return [
        *_identity(record, experiments, _env_id(record)),
        "-" if sweep else steps_cell(record, last_step),
        duration_cell(record),
        return_cell(record.metrics),
        *_ending(record),
    ]


def eval_row(record: RunRecord, experiments: dict[str, str], runs: dict[str, RunRecord]) -> list[str]:
    """One ``pgcli eval`` run: the model it scored (``final`` or ``best``), over how many episodes, and the return.
    Its env is the evaluated run's env id when that run is in the store, else the env ``pgcli eval`` recorded."""
    source = runs.get(record.tags.get("source_run_id", ""))
    env = _env_id(source) if source is not None else record.tags.get("env", "-")
    return [
        *_identity(record, experiments, env),
        record.tags.get(EVAL_TAG, "-"),
        record.params.get("episodes", "-"),
        return_cell(record.metrics),
        *_ending(record),
    ]


def _identity(record: RunRecord, experiments: dict[str, str], env: str) -> list[str]:
    experiment = experiments.get(record.experiment_id, record.experiment_id)
    return [record.run_id[:8], record.status, experiment, record.tags.get("algo", "-"), env]


def _ending(record: RunRecord) -> list[str]:
    return [datetime.fromtimestamp(record.start_time / 1000).strftime("%Y-%m-%d %H:%M"), record.name]


def _curve(record: RunRecord) -> RunCurve:
    """``record`` as ``pgcli compare`` keys it (without its curve), so that both read a run's keys one way."""
    return RunCurve(record.run_id, record.params, record.tags, NO_POINTS, NO_POINTS)


def _env_id(record: RunRecord) -> str:
    env_id = lookup(_curve(record), "env_id")
    return record.tags.get("env", "-") if env_id == "?" else env_id


def steps_cell(record: RunRecord, last_step: int | None) -> str:
    """The run's last logged step (``20.5k``); ``1k/3k`` while it is short of its budget (a KILLED or RUNNING run).
    The budget is read as ``pgcli compare`` reads it: a resumed run's is its ``total_steps`` tag (docs/runs.md,
    "Resume")."""
    budget = lookup(_curve(record), "total_steps")
    if not budget.isdigit():
        return "-" if last_step is None else short_count(last_step)
    trained = last_step or 0
    return short_count(trained) if trained >= int(budget) else f"{short_count(trained)}/{short_count(int(budget))}"


def short_count(n: int) -> str:
    """A step count in three significant digits: 256, 2.05k, 20.5k, 1M."""
    rounded = float(f"{n:.3g}")
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rounded >= size:
            return f"{rounded / size:.3g}{unit}"
    return str(n)


def duration_cell(record: RunRecord) -> str:
    """How long the run took (a RUNNING run: so far), as 42s, 1m23s, 2h05m or 3d04h; ``-`` for a run not started."""
    end = record.end_time or (int(time.time() * 1000) if record.status == RUNNING else 0)
    if not end or not record.start_time:
        return "-"
    return short_duration(max(end - record.start_time, 0) // 1000)


def short_duration(seconds: int) -> str:
    """42s, 1m23s, 2h05m, 3d04h: the two largest units."""
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if not minutes:
        return f"{s}s"
    if not hours:
        return f"{m}m{s:02d}s"
    return f"{h}h{m:02d}m" if not days else f"{days}d{h:02d}h"


def return_cell(metrics: dict[str, float]) -> str:
    """The run's last evaluation: its mean return, or a text run's accuracy (``acc 0.750``)."""
    if ACCURACY in metrics:
        return f"acc {metrics[ACCURACY]:.3f}"
    value = metrics.get(DEFAULT_METRIC)
    return "-" if value is None or not math.isfinite(value) else f"{value:.{decimals([value])}f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart within :data:`WIDTH`: the name (the last column) takes what the others
    leave, at least :data:`MIN_NAME`; the :data:`CAPS` columns are cut at their cap, and further (down to
    :data:`MIN_CAPPED`, in the order of :data:`CAPS`) when the name would otherwise push the line past :data:`WIDTH`."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    widths = [min(w, CAPS.get(name, w)) for name, w in zip(header, widths, strict=True)]
    gaps = 2 * (len(widths) - 1)
    widths[-1] = min(widths[-1], max(MIN_NAME, WIDTH - gaps - sum(widths[:-1])))
    for name in CAPS:
        i, excess = header.index(name), sum(widths) + gaps - WIDTH
        widths[i] -= max(0, min(excess, widths[i] - MIN_CAPPED))
    cuts = [*([_cut] * (len(widths) - 1)), cut_middle]  # names share their start (<algo>-<env>-...), not their end
    return [
        "  ".join(cut(cell, w).ljust(w) for cell, w, cut in zip(line, widths, cuts, strict=True)).rstrip()
        for line in (header, *rows)
    ]


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def cut_middle(cell: str, width: int) -> str:
    """``cell`` within ``width`` characters, its middle replaced by "…": the start and the end stay (run names differ
    at their end: ``...-algo.beta=0.1-s0``, ``...-s1``)."""
    if len(cell) <= width:
        return cell
    tail = (width - 1) // 2
    return cell[: width - 1 - tail] + "…" + cell[len(cell) - tail :]


def _without_offline_ends(store: RunStore, stale: list[StaleRun]) -> tuple[list[StaleRun], int]:
    """The stale runs less those that ended during a tracking outage (their end waits in their spool: one line each
    says how to deliver it), and how many those were."""
    from pgcli.tracking.spool import ended_offline

    left = []
    for run in stale:
        run_dir = store.get(run.run_id).tags.get("output_dir")
        spool = ended_offline(Path(run_dir), run.run_id) if run_dir else None
        if spool is None:
            left.append(run)
        else:
            print(
                f"pgcli: run {run.run_id} ended {spool.end_status()} while its tracking server was unreachable: "
                f"`pgcli sync {spool.path.parent}` delivers it",
                file=sys.stderr,
            )
    return left, len(stale) - len(left)
