"""Tracking outages: writes a tracking server could not take wait in the run directory until it is back.

When a run logs to a remote ``mlflow server`` and the server stops answering mid-run, training goes on: every write
(metrics, params, tags, artifacts, the final status) is appended in order to ``<run dir>/tracking_spool.jsonl``
instead of stalling or failing the run. The MLflow backend (``pgcli.tracking.backend.MLflowBackend``) checks the
server's ``/health`` now and then and, once it answers, replays the spool and carries on online. If the server is
still down when training ends, the spool stays and ``pgcli sync <run dir>`` delivers it later.

Nothing is lost and nothing is counted twice: metrics keep the timestamp they were logged with, and MLflow stores one
copy of an identical (key, step, timestamp, value) point, so a batch that was committed just before the connection
dropped and is sent again is not duplicated. This module does not import MLflow: it stores and reads plain JSON
operations; :mod:`pgcli.tracking.sync` applies them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgcli.redact import redact_uri

SPOOL_FILE = "tracking_spool.jsonl"


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (the only kind of store that can go away mid-run)."""
    return uri.startswith(("http://", "https://"))


def is_outage(exc: BaseException) -> bool:
    """Whether an exception from an MLflow client call means the server is unreachable (not a bad request).

    MLflow wraps requests' errors in an ``MlflowException`` whose message names them; a 5xx answer from a proxy in
    front of a restarting server counts as an outage too. A 4xx (bad request, no such run) does not.
    """
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    markers = (
        "ConnectionError",
        "Connection refused",
        "Max retries exceeded",
        "timed out",
        "Timeout",
        "RemoteDisconnected",
        "Connection aborted",
        "502",
        "503",
        "504",
        "too many 5",
    )
    return any(m in text for m in markers)


def ended_offline(run_dir: Path, run_id: str) -> Spool | None:
    """The spool in ``run_dir`` when it holds run ``run_id``'s final status, not yet delivered: the run ended during
    an outage and shows RUNNING in its store until ``pgcli sync`` (its process is gone, but it is not stale)."""
    spool = Spool(run_dir / SPOOL_FILE)
    try:
        if spool.path.is_file() and spool.header().get("run_id") == run_id and spool.end_status() is not None:
            return spool
    except (OSError, ValueError, KeyError):
        pass  # unreadable: judge the run by its process alone
    return None


def not_spooled(paths: list[Path], run_dir: Path) -> list[Path]:
    """Those of ``paths`` the spool in ``run_dir`` does not have to deliver any more: all of them without a spool,
    none when it cannot be read. The spool names files, not copies, so ``checkpoint_keep`` deletes a checkpoint only
    once it was delivered (docs/tracking.md, "When the tracking server goes away")."""
    spool = Spool(run_dir / SPOOL_FILE)
    if not spool.path.is_file():
        return list(paths)
    try:
        waiting = spool.pending_paths()
    except (OSError, ValueError, KeyError):
        return []
    return [path for path in paths if path.resolve() not in waiting]


@dataclass
class Spool:
    """An append-only JSON-lines file of tracking operations for one run.

    The first line names the run (``{"op": "run", "run_id": ..., "uri": ...}``, the URI without credentials); each
    later line is one operation: ``metrics`` (``[key, value, timestamp_ms, step]`` points), ``params``, ``tags``,
    ``artifact`` (a local path, logged when delivered), ``model`` (a saved agent, logged as an MLflow Model when
    delivered) or ``end`` (the run's final status).
    """

    path: Path

    def start(self, run_id: str, uri: str) -> None:
        """Begin a spool for ``run_id`` (keeps one that is already there: an earlier outage of the same run)."""
        if not self.path.is_file():
            self.append({"op": "run", "run_id": run_id, "uri": redact_uri(uri)})

    def append(self, op: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(op) + "\n")
            f.flush()
            os.fsync(f.fileno())  # an outage is rare; a write that survives a crash of pgcli itself is worth an fsync

    def header(self) -> dict[str, Any]:
        """The ``run`` line: which run and store the operations belong to."""
        first = next(self._lines(), None)
        if first is None or first.get("op") != "run":
            raise ValueError(f"{self.path} is not a pgcli tracking spool (no run line)")
        return first

    def operations(self) -> list[dict[str, Any]]:
        """Every operation after the header, in the order they were made."""
        ops = list(self._lines())
        return [op for op in ops[1:] if op.get("op") != "run"]

    def end_status(self) -> str | None:
        """The final status the run spooled (its ``end`` operation), or None while it has not ended there."""
        return next((op["status"] for op in reversed(self.operations()) if op["op"] == "end"), None)

    def pending_paths(self) -> set[Path]:
        """The local files and folders the spool still has to deliver (artifacts, models), resolved."""
        return {Path(op["path"]).resolve() for op in self.operations() if op["op"] in ("artifact", "model")}

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def _lines(self) -> Iterator[dict[str, Any]]:
        with self.path.open() as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    # The last line of a spool whose writer was killed mid-write: every complete line before it is
                    # good; anything else is a corrupt file.
                    if f.readline() == "":
                        return
                    raise ValueError(f"{self.path}: line {n} is not JSON") from None
