"""Listing a SQLite MLflow store with the standard library: what ``pgcli runs`` and ``pgcli compare`` read, and the
run a run id (or a prefix of one) names, without importing MLflow.

Importing MLflow's SQLAlchemy store costs seconds of CPU (docs/benchmarks/overhead.md, "Light commands"), more than
a listing takes. A read-only listing needs six tables whose columns MLflow has kept since its 1.x schemas
(``experiments``, ``runs``, ``tags``, ``params``, ``latest_metrics``, ``metrics``), so :class:`SqliteReader` reads
them in a few queries, with MLflow's own semantics: active experiments (of the default workspace, where the schema
has workspaces) and active runs, runs newest first with the run id breaking ties, each metric's latest value (NaN
where MLflow stored one), a metric's whole history. A store missing one of those columns gets no reader
(:meth:`SqliteReader.open` returns None) and is read through MLflow, which names what is wrong with it. Nothing here
writes, creates or migrates a store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from pgcli.tracking.uri import sqlite_path

COLUMNS = {
    "experiments": {"experiment_id", "name", "lifecycle_stage", "creation_time"},
    "runs": {"run_uuid", "name", "status", "start_time", "end_time", "lifecycle_stage", "experiment_id"},
    "tags": {"key", "value", "run_uuid"},
    "params": {"key", "value", "run_uuid"},
    "latest_metrics": {"key", "value", "step", "is_nan", "run_uuid"},
    "metrics": {"key", "value", "step", "is_nan", "run_uuid"},
}
"""The tables and columns a listing reads."""
DEFAULT_WORKSPACE = "default"
"""MLflow's workspace of a store without workspaces (the experiments of others are not listed, as MLflow does)."""
IDS_PER_QUERY = 500
"""Run ids per ``IN (...)`` query: below SQLite's bound-parameter limit."""


class SqliteReader:
    """Read-only queries on one SQLite MLflow store (a fresh connection per call: nothing stays open)."""

    def __init__(self, path: Path, workspaces: bool) -> None:
        self.path = path
        self.workspaces = workspaces

    @classmethod
    def open(cls, uri: str) -> SqliteReader | None:
        """A reader of the store at ``uri``, or None: not a SQLite URI, no such file, or a schema without a column
        the listing reads."""
        path = sqlite_path(uri)
        if path is None or not path.is_file():
            return None
        try:
            with _connect(path) as db:
                found = {t: {row[1] for row in db.execute(f"PRAGMA table_info({t})")} for t in COLUMNS}
        except sqlite3.Error:
            return None
        if any(not needed <= found[table] for table, needed in COLUMNS.items()):
            return None
        return cls(path, "workspace" in found["experiments"])

    def experiments(self) -> list[tuple[str, str]]:
        """(id, name) of the active experiments, newest first (MLflow's order: creation time, then id)."""
        where = "lifecycle_stage = 'active'" + (" AND workspace = ?" if self.workspaces else "")
        args = (DEFAULT_WORKSPACE,) if self.workspaces else ()
        query = f"SELECT experiment_id, name FROM experiments WHERE {where} ORDER BY creation_time DESC, experiment_id"
        with _connect(self.path) as db:
            return [(str(i), str(n)) for i, n in db.execute(query, args)]

    def runs_latest_first(self, experiment_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The active runs of these experiments, newest first, as the fields of a
        :class:`~pgcli.tracking.store.RunRecord` (its params, tags and latest metric values included)."""
        if not experiment_ids:
            return []
        marks = ", ".join("?" * len(experiment_ids))
        where = f"lifecycle_stage = 'active' AND experiment_id IN ({marks})"
        return self._runs(where, [int(i) for i in experiment_ids])

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The run with this id, deleted or not (as MLflow's ``get_run``), in the fields of a
        :class:`~pgcli.tracking.store.RunRecord`; None when there is none."""
        runs = self._runs(f"run_uuid = ? AND {self._experiment_in('')}", [run_id, *self._workspace()])
        return runs[0] if runs else None

    def runs_with_id_prefix(self, prefix: str) -> list[dict[str, Any]]:
        """The active runs of active experiments whose id starts with ``prefix`` (lowercase hex digits), ordered by
        id, in the fields of a :class:`~pgcli.tracking.store.RunRecord`."""
        if not prefix or not all(c in "0123456789abcdef" for c in prefix):
            raise ValueError(f"a run id prefix is lowercase hex digits, got {prefix!r}")
        active = self._experiment_in("lifecycle_stage = 'active'")
        where = f"lifecycle_stage = 'active' AND run_uuid LIKE ? AND {active}"
        runs = self._runs(where, [f"{prefix}%", *self._workspace()])
        return sorted((r for r in runs if r["run_id"].startswith(prefix)), key=lambda r: r["run_id"])

    def _experiment_in(self, condition: str) -> str:
        """``experiment_id IN`` the experiments that meet ``condition`` (and are of the default workspace)."""
        conditions = [c for c in (condition, "workspace = ?" if self.workspaces else "") if c]
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return f"experiment_id IN (SELECT experiment_id FROM experiments{where})"

    def _workspace(self) -> tuple[str, ...]:
        return (DEFAULT_WORKSPACE,) if self.workspaces else ()

    def _runs(self, where: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        """The runs ``where`` selects, newest first, each with its params, tags and latest metric values."""
        query = (
            "SELECT run_uuid, experiment_id, name, status, start_time, end_time FROM runs "
            f"WHERE {where} ORDER BY start_time DESC, run_uuid"
        )
        with _connect(self.path) as db:
            rows = db.execute(query, list(args)).fetchall()
            runs = {
                r[0]: {
                    "run_id": r[0],
                    "experiment_id": str(r[1]),
                    "name": r[2] or "",
                    "status": r[3],
                    "start_time": int(r[4] or 0),
                    "end_time": int(r[5] or 0),
                    "params": {},
                    "tags": {},
                    "metrics": {},
                }
                for r in rows
            }
            for table in ("params", "tags"):
                for run_id, key, value in _by_run(db, f"SELECT run_uuid, key, value FROM {table}", list(runs)):
                    runs[run_id][table][key] = value
            query = "SELECT run_uuid, key, value, is_nan FROM latest_metrics"
            for run_id, key, value, is_nan in _by_run(db, query, list(runs)):
                runs[run_id]["metrics"][key] = float("nan") if is_nan else float(value)
        return list(runs.values())

    def last_steps(self, run_ids: Sequence[str]) -> dict[str, int]:
        """Run id -> the largest step among its metrics' latest points (runs that logged no metric left out)."""
        with _connect(self.path) as db:
            query = "SELECT run_uuid, MAX(step) FROM latest_metrics"
            return {r: int(s) for r, s in _by_run(db, query, list(run_ids), group=True)}

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every point of one metric, in step order (as MLflow's ``get_metric_history``)."""
        query = "SELECT step, value, is_nan FROM metrics WHERE run_uuid = ? AND key = ?"
        with _connect(self.path) as db:
            rows = db.execute(query, (run_id, key)).fetchall()
        return sorted((int(step), float("nan") if is_nan else float(value)) for step, value, is_nan in rows)


@contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection (``mode=ro``: a missing file is an error, never a new empty store) that waits while a
    writer holds the lock, as MLflow's client retries."""
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)) as db:
        yield db


def _by_run(db: sqlite3.Connection, select: str, run_ids: list[str], group: bool = False) -> Iterator[tuple[Any, ...]]:
    """The rows of ``select`` for these run ids, a chunk of ids per query."""
    for i in range(0, len(run_ids), IDS_PER_QUERY):
        chunk = run_ids[i : i + IDS_PER_QUERY]
        query = f"{select} WHERE run_uuid IN ({', '.join('?' * len(chunk))})" + (" GROUP BY run_uuid" if group else "")
        yield from db.execute(query, chunk)
