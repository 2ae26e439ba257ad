"""``pgcli runs``: the latest runs of the store, and ``--stale``: RUNNING runs whose process is gone, marked KILLED.

A run records its process as tags (``pid``, ``hostname``, ``pid_start``). A process killed with SIGKILL (or a
machine that lost power) cannot end its run, so the run stays RUNNING; ``pgcli runs --stale`` finds the RUNNING runs
of this host whose process no longer exists and ends them KILLED (``--dry-run`` only lists them). Runs of other hosts
are never touched: their processes cannot be checked from here, and neither are runs that ended while their tracking
server was unreachable: their end waits in their run directory's spool, and ``pgcli sync`` delivers it
(docs/tracking.md, "When the tracking server goes away"). ``pgcli train resume=<run id>`` continues a stale run from
its last checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pgcli.config.compose import compose_train_config
from pgcli.errors import CommandParser, ConfigError
from pgcli.training.run import StaleRun, find_stale_runs, mark_killed

if TYPE_CHECKING:
    from pgcli.tracking.store import RunStore


def main(args: list[str]) -> int:
    parser = CommandParser(
        prog="pgcli runs",
        description="List the latest runs of pgcli's run store; with --stale, end the RUNNING runs whose process "
        "is gone (killed with SIGKILL, machine restarted) as KILLED.",
        epilog="examples:\n"
        "  pgcli runs                          # the 20 latest runs\n"
        "  pgcli runs --stale --dry-run        # which RUNNING runs of this host lost their process\n"
        "  pgcli runs --stale                  # ... and mark them KILLED\n"
        "  pgcli train resume=<run id>         # continue one from its last checkpoint",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stale", action="store_true", help="find RUNNING runs whose process is gone, mark KILLED")
    parser.add_argument("--dry-run", action="store_true", help="with --stale: list them, change nothing")
    parser.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    parser.add_argument("--limit", type=int, default=20, help="runs to list (default: 20)")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli ui)")
    ns = parser.parse_args(args)
    if ns.dry_run and not ns.stale:
        raise ConfigError("--dry-run goes with --stale")
    if ns.limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {ns.limit})")
    run_cfg = compose_train_config(ns.overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store; drop the tracking override")
    from pgcli.tracking.store import RunStore, check_readable_store, check_writable_store
    from pgcli.tracking.uri import resolve_tracking_target

    uri = resolve_tracking_target(run_cfg.tracking).uri
    check_readable_store(uri, doing="list")
    store = RunStore(uri)
    experiment_ids = store.experiment_ids(ns.experiment) if ns.experiment else None
    if ns.experiment and not experiment_ids:
        raise ConfigError(f"no experiment {', '.join(ns.experiment)} in {uri} (experiments: "
                          f"{', '.join(store.experiment_names())})")  # fmt: skip

    if ns.stale:
        stale, unknown = find_stale_runs(store, experiment_ids)
        stale, offline = _without_offline_ends(store, stale)
        if stale and not ns.dry_run:
            check_writable_store(uri, doing="mark runs KILLED", fix="fix its permissions, or list them with --dry-run")
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
    print(f"{'run id':32}  {'status':8}  {'started':16}  name")
    for record in runs[: ns.limit]:
        started = datetime.fromtimestamp(record.start_time / 1000).strftime("%Y-%m-%d %H:%M")
        print(f"{record.run_id:32}  {record.status:8}  {started:16}  {record.name}")
    print(f"pgcli: {min(len(runs), ns.limit)} of {len(runs)} runs in {uri}", file=sys.stderr)
    return 0


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
            print(f"pgcli: run {run.run_id} ended {spool.end_status()} while its tracking server was unreachable: "
                  f"`pgcli sync {spool.path.parent}` delivers it", file=sys.stderr)  # fmt: skip
    return left, len(stale) - len(left)
