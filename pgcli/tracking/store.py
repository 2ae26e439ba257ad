"""The runs of a tracking store, read and annotated as plain values: :class:`RunStore` and :class:`RunRecord`.

Every reader of stored runs goes through here: ``pgcli runs``, ``pgcli compare``, ``pgcli eval`` of a run id, resume,
``--from-run``, ``init=``, sweep parents (pgcli.sweeps.tree). A command that only reads a store first calls
:func:`check_readable_store`, which uses the standard library only: MLflow creates and migrates a SQLite store the
moment a client touches a path (a :class:`RunStore` makes its client on first use) and answers a file that is not a
database with a long SQLAlchemy traceback, so a folder without a store gets one line and nothing created, and a
corrupt store file gets one line naming it. A command that writes to a store it did not create calls
:func:`check_writable_store` first, so a read-only store is one line too. Every MLflow client pgcli makes on a SQLite
store is made after :func:`ensure_store`, so a new store is created once even when several processes start together.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_mapping
from pgcli.tracking.client import (
    PARAM_BATCH_LIMIT,
    get_or_create_experiment,
    quiet_mlflow_logs,
    with_retry,
)
from pgcli.tracking.sqlite_read import SqliteReader
from pgcli.tracking.status import RUN_STATUSES
from pgcli.tracking.uri import (
    SQLITE_PREFIX,
    TrackingSettings,
    resolve_tracking_target,
    sqlite_path,
    sqlite_tables,
)

NEWEST_FIRST = "attributes.start_time DESC"
"""MLflow's order of runs without an ``order_by`` too (the run id breaks ties)."""


@dataclass(frozen=True)
class RunRecord:
    """One stored run, as plain values (no MLflow types leave this module)."""

    run_id: str
    experiment_id: str
    name: str
    status: str
    start_time: int
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    """Latest value of each metric."""
    end_time: int = 0
    """Milliseconds since the epoch when the run ended (0 while it runs)."""


class RunStore:
    """The runs of one tracking store, through ``MlflowClient`` (every call retried while SQLite is locked)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    @cached_property
    def client(self) -> Any:
        """MLflow's client, made on first use: MLflow creates (and migrates) a SQLite store the moment it opens a
        path, so a store named only to look a run up is checked first (:func:`check_readable_store`), not created."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        quiet_mlflow_logs(self.uri)
        try:
            ensure_store(self.uri)
            return MlflowClient(tracking_uri=self.uri)
        except MlflowException as exc:  # e.g. a folder store MLflow 3 no longer opens, an out-of-date schema
            raise PgcliError(f"cannot open the run store {self.uri}: {str(exc).split('. ')[0]}") from None

    @cached_property
    def reader(self) -> SqliteReader | None:
        """The standard library's reader of a SQLite store, for the listings that need no MLflow (None for any other
        store, or one whose schema it does not know): ``pgcli runs`` answers without importing MLflow."""
        return SqliteReader.open(self.uri)

    def create_run(
        self, experiment: str, *, run_name: str, tags: Mapping[str, str], artifact_root: str | None = None
    ) -> RunRecord:
        """Start a run (RUNNING) in ``experiment``, creating the experiment if needed."""
        experiment_id = get_or_create_experiment(self.client, experiment, artifact_root)
        run = with_retry(self.client.create_run, experiment_id, run_name=run_name, tags=redact_mapping(tags))
        return self.get(run.info.run_id)

    def get(self, run_id: str) -> RunRecord:
        return _record(with_retry(self.client.get_run, run_id))

    def find(self, run_id: str) -> RunRecord | None:
        """The run with this id, or None when the store has no such run."""
        if self.reader is not None:  # a lookup that needs no MLflow (`pgcli eval <id> --no-log`, a refusal)
            found = self.reader.run(run_id)
            return RunRecord(**found) if found is not None else None
        from mlflow.exceptions import MlflowException

        try:
            return self.get(run_id)
        except MlflowException:
            return None

    def runs_with_id_prefix(self, prefix: str) -> list[RunRecord]:
        """The runs, in every experiment, whose id starts with ``prefix`` (lowercase hex digits), ordered by id.

        The store itself filters (``attributes.run_id LIKE '<prefix>%'``), so only the matching runs come back, however
        many the store holds; their ids are checked again here, as a database's LIKE may ignore case (and a tracking
        server too old to filter run ids is asked for every run instead). Deleted runs and experiments are left out, as
        ``pgcli runs`` leaves them out.
        """
        if not prefix or not all(c in "0123456789abcdef" for c in prefix):
            raise ValueError(f"a run id prefix is lowercase hex digits, got {prefix!r}")
        if self.reader is not None:
            return [RunRecord(**fields) for fields in self.reader.runs_with_id_prefix(prefix)]
        experiment_ids = self.experiment_ids()
        if not experiment_ids:
            return []
        try:
            runs = self.search(experiment_ids, f"attributes.run_id LIKE '{prefix}%'")
        except ConfigError:  # the server refused the filter (search turns that into a user's error)
            runs = self.search(experiment_ids)
        return sorted((r for r in runs if r.run_id.startswith(prefix)), key=lambda r: r.run_id)

    def create_run_in(self, experiment_id: str, *, run_name: str, tags: Mapping[str, str]) -> RunRecord:
        """Start a run (RUNNING) in an existing experiment."""
        run = with_retry(self.client.create_run, experiment_id, run_name=run_name, tags=dict(tags))
        return self.get(run.info.run_id)

    def download(self, run_id: str, artifact_path: str, dst: Path) -> Path | None:
        """Download an artifact directory of a run into ``dst``; None when the run has no such directory."""
        from mlflow.exceptions import MlflowException

        if not with_retry(self.client.list_artifacts, run_id, artifact_path):
            return None
        dst.mkdir(parents=True, exist_ok=True)
        try:
            return Path(self.client.download_artifacts(run_id, artifact_path, str(dst)))
        except (MlflowException, OSError):
            return None

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in redact_mapping(params).items()]
        for i in range(0, len(items), PARAM_BATCH_LIMIT):
            with_retry(self.client.log_batch, run_id, params=items[i : i + PARAM_BATCH_LIMIT], synchronous=True)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        tag_list = [RunTag(k, str(v)) for k, v in redact_mapping(tags).items()]
        with_retry(self.client.log_batch, run_id, tags=tag_list, synchronous=True)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        with_retry(self.client.log_batch, run_id, metrics=items, synchronous=True)

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def end(self, run_id: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        with_retry(self.client.set_terminated, run_id, status=status)

    def experiment_ids(self, names: list[str] | None = None) -> list[str]:
        """Ids of the named experiments (all experiments when ``names`` is None); unknown names are skipped."""
        if names is None:
            if self.reader is not None:
                return [i for i, _ in self.reader.experiments()]
            return [e.experiment_id for e in with_retry(self.client.search_experiments)]
        if self.reader is not None:
            ids = {n: i for i, n in self.reader.experiments()}
            return [ids[n] for n in names if n in ids]
        found = [with_retry(self.client.get_experiment_by_name, n) for n in names]
        return [e.experiment_id for e in found if e is not None]

    def experiment_names(self) -> list[str]:
        if self.reader is not None:
            return [n for _, n in self.reader.experiments()]
        return [e.name for e in with_retry(self.client.search_experiments)]

    def search(
        self, experiment_ids: list[str], filter_string: str = "", *, order_by: list[str] | None = None
    ) -> list[RunRecord]:
        """Every run matching ``filter_string`` (MLflow search syntax) in the given experiments, all pages."""
        if self.reader is not None and not filter_string and order_by in (None, [NEWEST_FIRST]):
            return [RunRecord(**fields) for fields in self.reader.runs_latest_first(experiment_ids)]
        from mlflow.exceptions import MlflowException

        out: list[RunRecord] = []
        token = None
        while True:
            try:
                page = with_retry(
                    self.client.search_runs,
                    experiment_ids,
                    filter_string=filter_string,
                    order_by=order_by,
                    max_results=1000,
                    page_token=token,
                )
            except MlflowException as exc:
                if exc.error_code != "INVALID_PARAMETER_VALUE":
                    raise
                reason = str(exc).splitlines()[0]
                raise ConfigError(
                    f"invalid search filter {filter_string!r}: {reason} (e.g. \"params.algo = 'ppo'\")"
                ) from None
            out.extend(_record(r) for r in page)
            token = page.token
            if not token:
                return out

    def children(self, parent: RunRecord) -> list[RunRecord]:
        """The runs whose ``mlflow.parentRunId`` is ``parent``."""
        return self.search([parent.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'")

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` points of one metric, in step order."""
        if self.reader is not None:
            return self.reader.metric_history(run_id, key)
        points = with_retry(self.client.get_metric_history, run_id, key)
        return sorted((int(m.step), float(m.value)) for m in points)


def open_run_store(cfg: TrackingSettings) -> RunStore | None:
    """The run store ``cfg`` points at (None with ``tracking=off``); nothing is opened or created until it is used."""
    return RunStore(resolve_tracking_target(cfg).uri) if cfg.backend == "mlflow" else None


def _record(run: Any) -> RunRecord:
    return RunRecord(
        run_id=run.info.run_id,
        experiment_id=str(run.info.experiment_id),
        name=run.info.run_name or "",
        status=run.info.status,
        start_time=int(run.info.start_time or 0),
        params=dict(run.data.params),
        tags=dict(run.data.tags),
        metrics=dict(run.data.metrics),
        end_time=int(run.info.end_time or 0),
    )


# --------------------------------------------------------------------------------------------------------------------
# a new SQLite store, created once
# --------------------------------------------------------------------------------------------------------------------


def ensure_store(uri: str) -> None:
    """Create the SQLite store at ``uri`` with MLflow's schema if it is not there yet, once across processes.

    MLflow creates and migrates a new SQLite store in every process that opens it; two or three ``pgcli train``
    started together on a new store race those migrations, fail, and can leave the store unusable (docs/tracking.md,
    "Embedded store"). Here the first process builds the store in a temporary file beside it, under an exclusive
    ``flock`` on ``<store>.lock``, and renames it into place, so the others find a complete store (and a reader never
    sees half a schema). An existing store (or a file that is no store: MLflow and the preflight answer for it) is
    left alone without taking the lock, so a read-only store stays readable. Other URIs are not touched: a server or
    another database creates its own schema.
    """
    path = sqlite_path(uri)
    if path is None or _tables(path := Path(os.path.abspath(path.expanduser()))) != set():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path.with_name(path.name + ".lock")):
        if _tables(path) != set():  # another process made it while this one waited for the lock
            return
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            _create_schema(f"{SQLITE_PREFIX}{tmp}")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def _tables(path: Path) -> set[str] | None:
    """The tables of a SQLite file (an empty set for no file, an empty file or an empty database); None when it is
    not readable as SQLite."""
    if not path.is_file():
        return set()
    try:
        return sqlite_tables(path)
    except sqlite3.Error:
        return None


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if needed; it is released when the file is closed, also
    when the process dies)."""
    with lock_path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def _create_schema(uri: str) -> None:
    """Let MLflow create a store at ``uri`` as its client would (its tables, migrations, default experiment), then
    close the connections it opened, so the file can be renamed."""
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    quiet_mlflow_logs()
    store = _get_sqlalchemy_store(uri, None)
    store.engine.dispose()
    getattr(type(store), "_engine_map", {}).pop(uri, None)


# --------------------------------------------------------------------------------------------------------------------
# before a reading command opens a store
# --------------------------------------------------------------------------------------------------------------------
