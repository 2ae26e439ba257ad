"""``pgcli sync <run dir>``: deliver what a run wrote while its tracking server was unreachable (docs/tracking.md).

The run spooled its writes to ``<run dir>/tracking_spool.jsonl`` (metrics, params, tags, artifacts and its final
status); :func:`pgcli.tracking.sync.sync_run_dir` delivers them to the server, in order.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pgcli.errors import CommandParser


def main(args: list[str]) -> int:
    """Entry point of ``pgcli sync``."""
    parser = CommandParser(
        prog="pgcli sync",
        description="Deliver what a run wrote while its tracking server was unreachable (<run dir>/"
        "tracking_spool.jsonl: metrics, params, tags, artifacts and its final status) to the server, in order.",
        epilog="example:\n  pgcli sync outputs/runs/2026-11-23/10-00-00_trpo_hopper_s0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="the run directory named in the run's warning")
    parser.add_argument(
        "--uri",
        default=None,
        help="deliver to this tracking URI (default: the run's own server; "
        "credentials are never stored in the spool, so pass them here or in MLFLOW_TRACKING_USERNAME/"
        "MLFLOW_TRACKING_PASSWORD)",
    )
    ns = parser.parse_args(args)
    if ns.uri is not None:  # the checks of pgcli train (docs/tracking.md), before MLflow touches the store
        from pgcli.tracking.checks import check_tracking_uri

        check_tracking_uri(ns.uri, reach=False)  # an unreachable server: sync_run_dir says the spool stays
    from pgcli.tracking.sync import sync_run_dir

    run_id, n, status = sync_run_dir(ns.run_dir, ns.uri)
    ended = f"; run ended {status}" if status else "; the run had not ended (it is still RUNNING in the store)"
    print(f"pgcli: delivered {n} writes to run {run_id}{ended}")
    return 0
