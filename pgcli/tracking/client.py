"""Calling MLflow's client safely: every MLflow call pgcli makes goes through the helpers here.

The writer (:mod:`pgcli.tracking.backend`), spool delivery (:mod:`pgcli.tracking.sync`) and the run store
(:mod:`pgcli.tracking.store`) share them: a quiet console, fail-fast HTTP to a tracking server, retries while a shared
SQLite file is locked by a parallel sweep job, and pgcli's experiments found or created one way. Nothing here imports
MLflow at run time: the callers pass their ``MlflowClient`` in.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pgcli.redact import redact_text

if TYPE_CHECKING:
    from mlflow import MlflowClient

STALE_MARK = "marked KILLED by pgcli runs --stale"
"""How the ``error`` tag of a run that ``pgcli runs --stale`` ended begins (docs/runs.md); ``pgcli sync`` drops it when
the run's spool holds its true end."""
MLFLOW_BATCH_LIMIT = 1000  # MLflow's maximum number of metrics per log_batch call
PARAM_BATCH_LIMIT = 100
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
"""MLflow 3's experiment kind: "Machine learning" (model training) rather than a GenAI app. MLflow 3.17's UI picks
its view from the sidebar's GenAI / Model training switch instead, which ``pgcli ui``'s URLs set
(pgcli/commands/ui.py)."""
T = TypeVar("T")


def quiet_mlflow_logs(uri: str | None = None) -> None:
    """MLflow and alembic log INFO lines (schema migrations of a new SQLite store) to stderr; keep the console clean.

    MLflow also prints "View run <name> at: <uri>/#/..." for a server, with any credentials in the URI: off then.
    """
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if uri is not None and redact_text(uri) != uri:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def quick_http_failures() -> None:
    """Fail a request to an unreachable tracking server in seconds instead of MLflow's ~4 minutes of retries.

    pgcli spools writes during an outage (MLflowBackend), so long client-side retries would only stall training.
    A user's own ``MLFLOW_HTTP_REQUEST_*`` settings win.
    """
    for key, value in (
        ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"),
        ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
        ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10"),
    ):
        os.environ.setdefault(key, value)


def with_retry(fn: Callable[..., T], *args: Any, timeout_s: float = 60.0, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retried with backoff while SQLite reports "database is locked".

    Parallel sweep jobs share one SQLite file; SQLite serialises writers and a writer that waits past the driver's
    busy timeout gets this error. It is transient, so the call is repeated (for up to ``timeout_s``) instead of
    failing the job.
    """
    delay, deadline = 0.05, time.monotonic() + timeout_s
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if "database is locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def get_or_create_experiment(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    """The id of experiment ``name``, created (with its artifacts under ``artifact_root``) if needed.

    pgcli's experiments are tagged as model training (:data:`EXPERIMENT_KIND`), existing ones on their next run.
    """
    exp = with_retry(client.get_experiment_by_name, name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:
            with_retry(client.set_experiment_tag, exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return str(exp.experiment_id)
    location = f"{artifact_root}/{name}" if artifact_root else None
    try:
        tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        return str(with_retry(client.create_experiment, name, artifact_location=location, tags=tags))
    except Exception:  # a parallel sweep job created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)
