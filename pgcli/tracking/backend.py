"""Experiment tracking: one logger interface for every trainer, MLflow as a backend.

Trainers only see :class:`MetricLogger` (``log_metrics(metrics, step)`` with ``step`` = environment steps). The
:class:`RunLogger` keeps every value in memory (for the CSV and the learning-curve PNG written at the end) and
forwards to an optional :class:`MLflowBackend`, which buffers metrics and writes them with ``log_batch``: per-value
``log_metric`` on SQLite costs ~3.6 ms, a batched value ~0.1 ms (docs/benchmarks.md). This is the only module that
imports ``mlflow``.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pgcli.config import TrackingConfig
from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_mapping, redact_text
from pgcli.tracking.spool import SPOOL_FILE, Spool, is_outage, is_remote, strip_credentials

RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
MLFLOW_BATCH_LIMIT = 1000  # MLflow's maximum number of metrics per log_batch call
PARAM_BATCH_LIMIT = 100
T = TypeVar("T")
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
"""MLflow 3's experiment kind: "Machine learning" (model training) rather than a GenAI app. MLflow 3.17's UI picks
its view from the sidebar's GenAI / Model training switch instead, which ``pgcli ui``'s URLs set (pgcli/commands/ui.py)."""


class MetricLogger(Protocol):
    """What trainers and the training monitor log through."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def flush(self) -> None:
        """Write buffered metrics now (before a checkpoint: the store then has every point up to it)."""
        ...

    def log_model(self, model_dir: Path, name: str) -> None: ...

    def close(self, status: str) -> None: ...


@dataclass(frozen=True)
class TrackingTarget:
    """Where runs go: a tracking URI and, for the embedded store, the artifact root of new experiments."""

    uri: str
    artifact_root: str | None


def resolve_tracking_target(cfg: TrackingConfig, cwd: Path | None = None) -> TrackingTarget:
    """``tracking.uri`` if set, else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite store under ``store_dir``.

    Paths are made absolute against the directory pgcli started in, so Hydra's per-run directories never scatter
    stores (hydra-ecosystem/hydra#830).
    """
    uri = cfg.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return TrackingTarget(uri, _artifacts_beside(uri))
    store = (Path(cwd or os.getcwd()) / cfg.store_dir).resolve()
    return TrackingTarget(f"sqlite:///{store / 'mlflow.db'}", (store / "mlartifacts").as_uri())


def _artifacts_beside(uri: str) -> str | None:
    """For a SQLite file store, ``mlartifacts/`` next to the database (MLflow's own default is ``./mlruns`` in
    whatever directory the first run happens to start in). Servers and other databases manage their own artifacts."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri.endswith(":memory:"):
        return None
    return (Path(uri[len(prefix) :]).resolve().parent / "mlartifacts").as_uri()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"clip_range": 0.2}}`` -> ``{"algo.clip_range": 0.2}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


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
        self.client = MlflowClient(tracking_uri=target.uri)
        self.uri = target.uri
        run_tags = redact_mapping(tags)  # no URI credentials or secret-named values in the store (issue 10)
        if run_id is not None:
            run = with_retry(self.client.get_run, run_id)
            self.experiment_id = str(run.info.experiment_id)
            with_retry(self.client.update_run, run_id, status="RUNNING")
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
        return {key: sorted((int(m.step), float(m.value)) for m in ms) for key, ms in points.items()}

    def log_model(self, model_dir: Path, name: str) -> None:
        """Log ``model_dir`` (a saved agent with its ``agent.json``) as the MLflow Model ``runs:/<run id>/<name>``."""
        self._write({"op": "model", "path": str(Path(model_dir).resolve()), "name": name})

    def end(self, status: str) -> None:
        self._next_probe = 0.0  # one more try to reach a server that went away, whatever the probe clock says
        try:
            self.flush()
        finally:
            self._write({"op": "end", "status": status})
        if self._offline and self.spool is not None:
            n = len(self.spool.operations())
            print(f"pgcli: warning: tracking server {strip_credentials(self.uri)} is still unreachable: run "
                  f"{self.run_id} shows RUNNING there until `pgcli sync {self.spool.path.parent}` delivers the {n} "
                  "writes waiting in " + str(self.spool.path), file=sys.stderr, flush=True)  # fmt: skip

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
        print(f"pgcli: warning: tracking server {strip_credentials(self.uri)} unreachable ({reason}); training goes "
              f"on and its writes wait in {self.spool.path}", file=sys.stderr, flush=True)  # fmt: skip

    def _reconnect(self) -> bool:
        """Every ``probe_every_s`` while offline: if the server answers, deliver the spool and go back online."""
        assert self.spool is not None
        if time.monotonic() < self._next_probe:
            return False
        self._next_probe = time.monotonic() + self.probe_every_s
        if not server_is_healthy(self.uri):
            return False
        try:
            n = deliver_spool(self.client, self.spool)
        except Exception as exc:
            if not is_outage(exc):
                raise
            return False
        self._offline = False
        print(f"pgcli: tracking server {strip_credentials(self.uri)} is back: delivered {n} spooled writes",
              file=sys.stderr, flush=True)  # fmt: skip
        return True


def quick_http_failures() -> None:
    """Fail a request to an unreachable tracking server in seconds instead of MLflow's ~4 minutes of retries.

    pgcli spools writes during an outage (MLflowBackend), so long client-side retries would only stall training.
    A user's own ``MLFLOW_HTTP_REQUEST_*`` settings win.
    """
    for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                       ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")):  # fmt: skip
        os.environ.setdefault(key, value)


def server_is_healthy(uri: str, timeout_s: float = 2.0) -> bool:
    """Whether the MLflow server at ``uri`` answers ``GET /health`` with 200 within ``timeout_s``."""
    import requests

    try:
        return requests.get(strip_credentials(uri).rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


def apply_operation(client: Any, run_id: str, op: Mapping[str, Any]) -> None:
    """Write one spool-format operation (pgcli.tracking.spool) to ``run_id`` through ``client``."""
    from mlflow.entities import Metric, Param, RunTag

    kind = op["op"]
    if kind == "metrics":
        points = [Metric(key, value, timestamp, step) for key, value, timestamp, step in op["metrics"]]
        for i in range(0, len(points), MLFLOW_BATCH_LIMIT):
            with_retry(client.log_batch, run_id, metrics=points[i : i + MLFLOW_BATCH_LIMIT], synchronous=True)
    elif kind == "params":
        items = [Param(k, v) for k, v in op["params"].items()]
        for i in range(0, len(items), PARAM_BATCH_LIMIT):
            with_retry(client.log_batch, run_id, params=items[i : i + PARAM_BATCH_LIMIT], synchronous=True)
    elif kind == "tags":
        with_retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()], synchronous=True)
    elif kind == "artifact":
        path = Path(op["path"])
        if path.is_dir():
            client.log_artifacts(run_id, str(path), op["artifact_path"])
        elif path.is_file():
            client.log_artifact(run_id, str(path), op["artifact_path"])
        # else: removed since (an old checkpoint pruned by checkpoint_keep): nothing left to deliver
    elif kind == "model":  # an MLflow Model built from a saved agent's files when it is delivered
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pgcli-model-") as tmp:
            client.log_artifacts(run_id, str(save_pyfunc_model(Path(op["path"]), Path(tmp) / op["name"])), op["name"])
    elif kind == "end":
        with_retry(client.set_terminated, run_id, status=op["status"])
    else:
        raise ValueError(f"unknown tracking operation {kind!r}")


def deliver_spool(client: Any, spool: Spool) -> int:
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
        if not server_is_healthy(target, timeout_s=10.0):
            raise PgcliError(f"tracking server {strip_credentials(target)} is unreachable; nothing was delivered "
                             f"(the {len(ops)} writes stay in {spool.path})")  # fmt: skip
    quiet_mlflow_logs()
    status = next((op["status"] for op in reversed(ops) if op["op"] == "end"), None)
    n = deliver_spool(MlflowClient(tracking_uri=target), spool)
    return header["run_id"], n, status


PYFUNC_LOADER = "pgcli.pyfunc"
MODEL_REQUIREMENTS = ("pgcli", "torch", "numpy", "gymnasium", "stable-baselines3", "sb3-contrib", "pandas")


def save_pyfunc_model(model_dir: Path, path: Path) -> Path:
    """Write an MLflow Model at ``path``: pyfunc with :mod:`pgcli.pyfunc` as loader, the agent's files beside MLmodel.

    A loader module rather than a pickled ``PythonModel``: the model holds plain files only (weights, JSON, SB3's zip),
    and loading it unpickles no object of ours. Requirements are pinned from the installed versions (MLflow's own
    inference would import the model in a subprocess: seconds per run).
    """
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    import mlflow.pyfunc

    requirements = []
    for package in MODEL_REQUIREMENTS:
        try:
            requirements.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    mlflow.pyfunc.save_model(str(path), loader_module=PYFUNC_LOADER, pip_requirements=requirements)
    for item in model_dir.iterdir():
        if item.is_file():
            shutil.copy2(item, path / item.name)
    return path


def quiet_mlflow_logs(uri: str | None = None) -> None:
    """MLflow and alembic log INFO lines (schema migrations of a new SQLite store) to stderr; keep the console clean.

    MLflow also prints "View run <name> at: <uri>/#/..." for a server, with any credentials in the URI: off then.
    """
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if uri is not None and redact_text(uri) != uri:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


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


def get_or_create_experiment(client: Any, name: str, artifact_root: str | None) -> str:
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


class RunLogger:
    """The :class:`MetricLogger` of one training run: in-memory history plus an optional MLflow backend."""

    def __init__(self, output_dir: Path, backend: MLflowBackend | None = None) -> None:
        self.output_dir = output_dir
        self.backend = backend
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.closed = False
        self.skip_through: dict[str, int] = {}
        """key -> last step already stored (resume): points at or before it are dropped, never logged twice."""

    @property
    def run_id(self) -> str | None:
        return self.backend.run_id if self.backend else None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if self.skip_through:
            metrics = {k: v for k, v in metrics.items() if step > self.skip_through.get(k, -1)}
        for key, value in metrics.items():
            self.history.setdefault(key, []).append((int(step), float(value)))
        if self.backend and metrics:
            self.backend.log_metrics(metrics, step)

    def restore_history(self, history: Mapping[str, list[tuple[int, float]]]) -> None:
        """Start from the points an earlier attempt of this run stored (resume); later points only past them."""
        self.history = {key: sorted(points) for key, points in history.items() if points}
        self.skip_through = {key: points[-1][0] for key, points in self.history.items()}

    def flush(self) -> None:
        if self.backend:
            self.backend.flush()

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.backend:
            self.backend.log_params(params)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.backend:
            self.backend.set_tags(tags)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.backend:
            self.backend.log_artifact(path, artifact_path)

    def log_model(self, model_dir: Path, name: str) -> None:
        if self.backend:
            self.backend.log_model(model_dir, name)

    def last(self, key: str) -> float | None:
        """The most recent value of ``key`` (None if never logged)."""
        points = self.history.get(key)
        return points[-1][1] if points else None

    def write_reports(self) -> list[Path]:
        """Write ``metrics.csv`` and ``learning_curve.png`` into the run directory; returns their paths."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        csv_path = self.output_dir / "metrics.csv"
        with csv_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["key", "step", "value"])
            for key in sorted(self.history):
                writer.writerows((key, step, value) for step, value in self.history[key])
        paths = [csv_path]
        png = plot_learning_curve(self.history, self.output_dir / "learning_curve.png")
        if png:
            paths.append(png)
        return paths

    def finalize(self) -> list[str]:
        """Write the reports, log them and flush every buffered metric; returns what could not be written (one
        ``"<what>: <error>"`` line each), so the caller can end the run FAILED instead of FINISHED."""
        missing: list[str] = []
        try:
            paths = self.write_reports()
        except Exception as exc:  # a full or read-only disk: the store may still take the metrics
            paths = []
            missing.append(f"metrics.csv/learning_curve.png in {self.output_dir}: {_one_line(exc)}")
        for path in paths:
            try:
                self.log_artifact(path)
            except Exception as exc:
                missing.append(f"artifact {path.name}: {_one_line(exc)}")
        try:
            self.flush()
        except Exception as exc:
            n = len(self.backend._buffer) if self.backend else 0
            missing.append(f"{n} buffered metric values: {_one_line(exc)}")
        return missing

    def end(self, status: str) -> None:
        """End the MLflow run with ``status`` (decided by :mod:`pgcli.training.run`). Safe to call twice."""
        if self.closed:
            return
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        self.closed = True
        if self.backend:
            self.backend.end(status)

    def close(self, status: str) -> None:
        """:meth:`finalize`, then :meth:`end` with ``status``."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        if not self.closed:
            self.finalize()
        self.end(status)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def plot_learning_curve(history: Mapping[str, list[tuple[int, float]]], path: Path) -> Path | None:
    """Training return (rolling mean) and evaluation return (mean +- std) against env steps."""
    train, ev, ev_std = (history.get(k, []) for k in ("rollout/ep_return_mean", "eval/return_mean", "eval/return_std"))
    if not train and not ev:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train (mean of last 100 episodes)", color="tab:blue", alpha=0.8)
    if ev:
        steps, means = zip(*ev, strict=True)
        ax.plot(steps, means, "o-", label="eval (deterministic)", color="tab:orange")
        if len(ev_std) == len(ev):
            stds = [s for _, s in ev_std]
            lo = [m - s for m, s in zip(means, stds, strict=True)]
            hi = [m + s for m, s in zip(means, stds, strict=True)]
            ax.fill_between(steps, lo, hi, color="tab:orange", alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Reading and annotating stored runs: sweep parents (pgcli.sweeps.tree) and `pgcli compare` (pgcli.commands.compare)
# --------------------------------------------------------------------------------------------------------------------


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
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        quiet_mlflow_logs(uri)
        self.uri = uri
        try:
            self.client = MlflowClient(tracking_uri=uri)
        except MlflowException as exc:  # e.g. a folder store MLflow 3 no longer opens, an out-of-date schema
            raise PgcliError(f"cannot open the run store {uri}: {str(exc).split('. ')[0]}") from None

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
        from mlflow.exceptions import MlflowException

        try:
            return self.get(run_id)
        except MlflowException:
            return None

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
            return [e.experiment_id for e in with_retry(self.client.search_experiments)]
        found = [with_retry(self.client.get_experiment_by_name, n) for n in names]
        return [e.experiment_id for e in found if e is not None]

    def experiment_names(self) -> list[str]:
        return [e.name for e in with_retry(self.client.search_experiments)]

    def search(
        self, experiment_ids: list[str], filter_string: str = "", *, order_by: list[str] | None = None
    ) -> list[RunRecord]:
        """Every run matching ``filter_string`` (MLflow search syntax) in the given experiments, all pages."""
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
        points = with_retry(self.client.get_metric_history, run_id, key)
        return sorted((int(m.step), float(m.value)) for m in points)


def open_run_store(cfg: TrackingConfig) -> RunStore | None:
    """The run store ``cfg`` points at (None with ``tracking=off``)."""
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
