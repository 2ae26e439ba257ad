"""The MLflow writer of one training run: batched metrics, and no stall when a tracking server goes away.

:class:`MLflowBackend` is what :class:`~pgcli.tracking.logger.RunLogger` forwards to. It buffers metrics and writes
them with ``log_batch``: per-value ``log_metric`` on SQLite costs ~3.6 ms, a batched value ~0.1 ms
(docs/tracking.md, "What is logged"). During a tracking-server outage its writes go to the run directory's spool
(:mod:`pgcli.tracking.spool`) and are delivered when the server is back (:mod:`pgcli.tracking.sync`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgcli.redact import redact_mapping, redact_uri
from pgcli.tracking.client import (
    MLFLOW_BATCH_LIMIT,
    get_or_create_experiment,
    quick_http_failures,
    quiet_mlflow_logs,
    with_retry,
)
from pgcli.tracking.spool import SPOOL_FILE, Spool, is_outage, is_remote
from pgcli.tracking.status import RUNNING
from pgcli.tracking.store import ensure_store
from pgcli.tracking.sync import apply_operation, deliver_spool
from pgcli.tracking.uri import TrackingTarget, probe_health

HEALTH_TIMEOUT_S = 2.0
"""How long a reconnect probe waits for the server's ``/health`` (training goes on meanwhile)."""


class MLflowBackend:
    """One MLflow run, written through ``MlflowClient`` with batched metrics.

    Using the client (not ``mlflow.start_run``) keeps no global active run, so runs in sweep workers can name their
    parent explicitly and ``$MLFLOW_RUN_ID`` cannot hijack them (mlflow/mlflow#15713).

    With a tracking server and a ``spool_dir``, an outage never stops or stalls training: writes go to
    ``<spool_dir>/tracking_spool.jsonl`` while the server is unreachable and are delivered, in order, once its
    ``/health`` answers again (checked every ``probe_every_s``) or later by ``pgcli sync`` (pgcli.tracking.spool).
    """

    def __init__(
        self,
        target: TrackingTarget,
        *,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        flush_every_s: float = 5.0,
        spool_dir: Path | None = None,
        probe_every_s: float = 10.0,
        run_id: str | None = None,
    ) -> None:
        """Create a run, or with ``run_id`` re-open that one (resume): back to RUNNING, its ``error`` tag dropped."""
        from mlflow.tracking import MlflowClient

        quiet_mlflow_logs(target.uri)
        if is_remote(target.uri):
            quick_http_failures()
        ensure_store(target.uri)  # a new SQLite store is created once, also by runs started together
        self.client = MlflowClient(tracking_uri=target.uri)
        self.uri = target.uri
        run_tags = redact_mapping(tags)  # docs/tracking.md, "Credentials and secrets"
        if run_id is not None:
            run = with_retry(self.client.get_run, run_id)
            self.experiment_id = str(run.info.experiment_id)
            with_retry(self.client.update_run, run_id, status=RUNNING)
            if "error" in run.data.tags:  # the reason an earlier attempt failed; this attempt sets its own
                with_retry(self.client.delete_tag, run_id, "error")
        elif parent_run_id:
            # A child lives in its parent's experiment (MLflow nests runs only within one experiment), so a sweep over
            # env=a,b still shows as one tree.
            self.experiment_id = with_retry(self.client.get_run, parent_run_id).info.experiment_id
            run_tags["mlflow.parentRunId"] = parent_run_id
        else:
            self.experiment_id = get_or_create_experiment(self.client, experiment, target.artifact_root)
        if run_id is None:
            run = with_retry(self.client.create_run, self.experiment_id, run_name=run_name, tags=run_tags)
        self.run_id: str = run.info.run_id
        self.artifact_uri: str = run.info.artifact_uri
        self.flush_every_s = flush_every_s
        self._buffer: list[list[Any]] = []  # [key, value, timestamp_ms, step] points not yet written
        self._last_flush = time.monotonic()
        self._last_point: dict[str, tuple[int, int]] = {}  # key -> (step, timestamp) of its latest value
        self.spool = Spool(spool_dir / SPOOL_FILE) if spool_dir is not None and is_remote(target.uri) else None
        self.probe_every_s = probe_every_s
        self._offline = False
        self._next_probe = 0.0
        if run_id is not None:
            self.set_tags(tags)

    @property
    def n_buffered(self) -> int:
        """Metric values logged but not yet written (a flush that failed leaves them here)."""
        return len(self._buffer)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now, step = int(time.time() * 1000), int(step)
        for key, value in metrics.items():
            timestamp = now
            last = self._last_point.get(key)
            if last is not None and last[0] == step and last[1] >= timestamp:
                # MLflow keeps one copy of identical (key, step, timestamp, value) points, so two episodes that end in
                # the same vector step with the same return would count as one: a later millisecond keeps both.
                timestamp = last[1] + 1
            self._last_point[key] = (step, timestamp)
            self._buffer.append([key, float(value), timestamp, step])
        if len(self._buffer) >= MLFLOW_BATCH_LIMIT or time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[:MLFLOW_BATCH_LIMIT]
            self._write({"op": "metrics", "metrics": chunk})
            # Dropped only once written: a Ctrl-C inside log_batch leaves the chunk for the flush in end(). Points
            # that were committed just before the interrupt are ignored by MLflow the second time (same key).
            del self._buffer[: len(chunk)]
        self._last_flush = time.monotonic()

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._write({"op": "params", "params": {k: str(v) for k, v in redact_mapping(params).items()}})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._write({"op": "tags", "tags": {k: str(v) for k, v in redact_mapping(tags).items()}})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._write({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def stored_history(self) -> dict[str, list[tuple[int, float]]]:
        """Every point this run has in the store: key -> ``(step, value)`` in step order."""
        keys = with_retry(self.client.get_run, self.run_id).data.metrics
        points = {key: with_retry(self.client.get_metric_history, self.run_id, key) for key in keys}
        # by step only (a stable sort): points of one step keep the order the store gives them
        return {
            key: sorted(((int(m.step), float(m.value)) for m in ms), key=lambda point: point[0])
            for key, ms in points.items()
        }

    def log_model(self, model_dir: Path, name: str) -> None:
        """Log ``model_dir`` (a saved agent with its ``agent.json``) as the MLflow Model ``runs:/<run id>/<name>``."""
        self._write({"op": "model", "path": str(Path(model_dir).resolve()), "name": name})

    def end(self, status: str) -> None:
        self._next_probe = 0.0  # one more try to reach a server that went away, whatever the probe clock says
        try:
            self.flush()
        finally:
            self._write({"op": "end", "status": status, "end_time": int(time.time() * 1000)})
        if self._offline and self.spool is not None:
            n = len(self.spool.operations())
            print(
                f"pgcli: warning: tracking server {redact_uri(self.uri)} is still unreachable: run "
                f"{self.run_id} shows RUNNING there until `pgcli sync {self.spool.path.parent}` delivers the {n} "
                "writes waiting in " + str(self.spool.path),
                file=sys.stderr,
                flush=True,
            )

    # -- outages -----------------------------------------------------------------------------------------------------
    def _write(self, op: dict[str, Any]) -> None:
        """Apply one operation now; while a tracking server is unreachable, spool it instead (in order)."""
        if self.spool is not None and self._offline and not self._reconnect():
            self.spool.append(op)
            return
        try:
            apply_operation(self.client, self.run_id, op)
        except Exception as exc:
            if self.spool is None or not is_outage(exc):
                raise
            self._go_offline(exc)
            self.spool.append(op)

    def _go_offline(self, exc: BaseException) -> None:
        assert self.spool is not None
        self._offline, self._next_probe = True, time.monotonic() + self.probe_every_s
        self.spool.start(self.run_id, self.uri)
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        print(
            f"pgcli: warning: tracking server {redact_uri(self.uri)} unreachable ({reason}); training goes "
            f"on and its writes wait in {self.spool.path}",
            file=sys.stderr,
            flush=True,
        )

    def _reconnect(self) -> bool:
        """Every ``probe_every_s`` while offline: if the server answers, deliver the spool and go back online."""
        assert self.spool is not None
        if time.monotonic() < self._next_probe:
            return False
        self._next_probe = time.monotonic() + self.probe_every_s
        if not probe_health(self.uri, HEALTH_TIMEOUT_S).ok:
            return False
        try:
            n = deliver_spool(self.client, self.spool)
        except Exception as exc:
            if not is_outage(exc):
                raise
            return False
        self._offline = False
        print(
            f"pgcli: tracking server {redact_uri(self.uri)} is back: delivered {n} spooled writes",
            file=sys.stderr,
            flush=True,
        )
        return True
