"""Delivering spooled writes: replay a run's ``tracking_spool.jsonl`` into its store (``pgcli sync``, docs/runs.md).

:mod:`pgcli.tracking.spool` keeps the operations a tracking server could not take as plain JSON; this module turns
each back into the MLflow call it stands for. The MLflow backend replays a spool here when the server comes back
mid-run, and ``pgcli sync <run dir>`` does it later when the run ended during the outage. Replaying is idempotent,
so nothing is counted twice.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_uri
from pgcli.tracking.client import (
    MLFLOW_BATCH_LIMIT,
    PARAM_BATCH_LIMIT,
    STALE_MARK,
    quick_http_failures,
    quiet_mlflow_logs,
    with_retry,
)
from pgcli.tracking.models import save_pyfunc_model
from pgcli.tracking.spool import SPOOL_FILE, Spool, is_remote
from pgcli.tracking.store import ensure_store
from pgcli.tracking.uri import probe_health

if TYPE_CHECKING:
    from mlflow import MlflowClient


def apply_operation(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    """Write one spool-format operation (pgcli.tracking.spool) to ``run_id`` through ``client``."""
    write = _WRITERS.get(op["op"])
    if write is None:
        raise ValueError(f"unknown tracking operation {op['op']!r}")
    write(client, run_id, op)


def _write_metrics(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    from mlflow.entities import Metric

    points = [Metric(key, value, timestamp, step) for key, value, timestamp, step in op["metrics"]]
    for i in range(0, len(points), MLFLOW_BATCH_LIMIT):
        with_retry(client.log_batch, run_id, metrics=points[i : i + MLFLOW_BATCH_LIMIT], synchronous=True)


def _write_params(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in op["params"].items()]
    for i in range(0, len(items), PARAM_BATCH_LIMIT):
        with_retry(client.log_batch, run_id, params=items[i : i + PARAM_BATCH_LIMIT], synchronous=True)


def _write_tags(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    with_retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()], synchronous=True)


def _write_artifact(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    path = Path(op["path"])
    if path.is_dir():
        client.log_artifacts(run_id, str(path), op["artifact_path"])
    elif path.is_file():
        client.log_artifact(run_id, str(path), op["artifact_path"])
    # else: removed since (an old checkpoint pruned by checkpoint_keep): nothing left to deliver


def _write_model(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    """An MLflow Model, built from a saved agent's files when it is delivered."""
    with tempfile.TemporaryDirectory(prefix="pgcli-model-") as tmp:
        client.log_artifacts(run_id, str(save_pyfunc_model(Path(op["path"]), Path(tmp) / op["name"])), op["name"])


def _write_end(client: MlflowClient, run_id: str, op: Mapping[str, Any]) -> None:
    # end_time: when the run ended, not when its spool was delivered (absent in spools of older pgcli versions)
    with_retry(client.set_terminated, run_id, status=op["status"], end_time=op.get("end_time"))


_WRITERS: dict[str, Callable[[Any, str, Mapping[str, Any]], None]] = {
    "metrics": _write_metrics, "params": _write_params, "tags": _write_tags, "artifact": _write_artifact,
    "model": _write_model, "end": _write_end,
}  # fmt: skip
"""Each spooled operation's writer, by its ``op`` field."""


def deliver_spool(client: MlflowClient, spool: Spool) -> int:
    """Replay every spooled operation in order, then remove the spool; returns how many were delivered.

    Replaying is idempotent (identical metric points are stored once, params and tags are rewritten with the same
    value), so a delivery cut short by a second outage is simply repeated later.
    """
    run_id = spool.header()["run_id"]
    ops = spool.operations()
    for op in ops:
        apply_operation(client, run_id, op)
    spool.clear()
    return len(ops)


def sync_run_dir(run_dir: Path, uri: str | None = None) -> tuple[str, int, str | None]:
    """``pgcli sync``: deliver a run directory's spool to its tracking server.

    Returns (run id, operations delivered, the final status delivered or None). Raises a one-line PgcliError when
    there is nothing to deliver or the server is still unreachable (the spool then stays as it was).
    """
    from mlflow.tracking import MlflowClient

    spool = Spool(run_dir / SPOOL_FILE)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(
            f"{run_dir} is a file, not a run directory; pass the run directory named in the run's warning"
        )
    if not run_dir.is_dir():
        raise ConfigError(f"no such run directory: {run_dir}")
    if not spool.path.is_file():
        raise ConfigError(f"nothing to deliver: {run_dir} has no {SPOOL_FILE} (its run reached its store)")
    try:
        header, ops = spool.header(), spool.operations()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    target = uri or header["uri"]
    if is_remote(target):
        quick_http_failures()
        if not probe_health(target, timeout_s=10.0).ok:
            raise PgcliError(
                f"tracking server {redact_uri(target)} is unreachable; nothing was delivered "
                f"(the {len(ops)} writes stay in {spool.path})"
            )
    quiet_mlflow_logs()
    ensure_store(target)
    status = spool.end_status()
    client = MlflowClient(tracking_uri=target)
    if status is not None:
        _clear_stale_mark(client, header["run_id"])
    n = deliver_spool(client, spool)
    return header["run_id"], n, status


def _clear_stale_mark(client: MlflowClient, run_id: str) -> None:
    """A run that ended during an outage shows RUNNING until its spool is delivered; ``pgcli runs --stale`` of an
    older pgcli (or one that could not see the run directory) may have ended it KILLED meanwhile. Its spooled end is
    the true one (delivered last), so the mark's ``error`` tag goes; a FAILED run's spool sets its own."""
    from mlflow.exceptions import MlflowException

    try:
        run = with_retry(client.get_run, run_id)
    except MlflowException:
        return  # no such run: delivering says so
    if run.data.tags.get("error", "").startswith(STALE_MARK):
        with_retry(client.delete_tag, run_id, "error")
