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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pgcli.config import TrackingConfig

RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
MLFLOW_BATCH_LIMIT = 1000  # MLflow's maximum number of metrics per log_batch call
PARAM_BATCH_LIMIT = 100
T = TypeVar("T")


class MetricLogger(Protocol):
    """What trainers and the training monitor log through."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

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
    ) -> None:
        from mlflow.tracking import MlflowClient

        quiet_mlflow_logs()
        self.client = MlflowClient(tracking_uri=target.uri)
        run_tags = dict(tags)
        if parent_run_id:
            # A child lives in its parent's experiment (MLflow nests runs only within one experiment), so a sweep over
            # env=a,b still shows as one tree.
            self.experiment_id = with_retry(self.client.get_run, parent_run_id).info.experiment_id
            run_tags["mlflow.parentRunId"] = parent_run_id
        else:
            self.experiment_id = get_or_create_experiment(self.client, experiment, target.artifact_root)
        run = with_retry(self.client.create_run, self.experiment_id, run_name=run_name, tags=run_tags)
        self.run_id: str = run.info.run_id
        self.artifact_uri: str = run.info.artifact_uri
        self.flush_every_s = flush_every_s
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._last_point: dict[str, tuple[int, int]] = {}  # key -> (step, timestamp) of its latest value

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(step)
        for key, value in metrics.items():
            timestamp = now
            last = self._last_point.get(key)
            if last is not None and last[0] == step and last[1] >= timestamp:
                # MLflow keeps one copy of identical (key, step, timestamp, value) points, so two episodes that end in
                # the same vector step with the same return would count as one: a later millisecond keeps both.
                timestamp = last[1] + 1
            self._last_point[key] = (step, timestamp)
            self._buffer.append(Metric(key, float(value), timestamp, step))
        if len(self._buffer) >= MLFLOW_BATCH_LIMIT or time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[:MLFLOW_BATCH_LIMIT]
            with_retry(self.client.log_batch, self.run_id, metrics=chunk, synchronous=True)
            # Dropped only once written: a Ctrl-C inside log_batch leaves the chunk for the flush in end(). Points
            # that were committed just before the interrupt are ignored by MLflow the second time (same key).
            del self._buffer[: len(chunk)]
        self._last_flush = time.monotonic()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), PARAM_BATCH_LIMIT):
            with_retry(self.client.log_batch, self.run_id, params=items[i : i + PARAM_BATCH_LIMIT], synchronous=True)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        tag_list = [RunTag(k, str(v)) for k, v in tags.items()]
        with_retry(self.client.log_batch, self.run_id, tags=tag_list, synchronous=True)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_model(self, model_dir: Path, name: str) -> None:
        """Log ``model_dir`` (a saved agent with its ``agent.json``) as the MLflow Model ``runs:/<run id>/<name>``."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pgcli-model-") as tmp:
            self.client.log_artifacts(self.run_id, str(save_pyfunc_model(model_dir, Path(tmp) / name)), name)

    def end(self, status: str) -> None:
        try:
            self.flush()
        finally:
            with_retry(self.client.set_terminated, self.run_id, status=status)


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


def quiet_mlflow_logs() -> None:
    """MLflow and alembic log INFO lines (schema migrations of a new SQLite store) to stderr; keep the console clean."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


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
    """The id of experiment ``name``, created (with its artifacts under ``artifact_root``) if needed."""
    exp = with_retry(client.get_experiment_by_name, name)
    if exp is not None:
        return str(exp.experiment_id)
    location = f"{artifact_root}/{name}" if artifact_root else None
    try:
        return str(with_retry(client.create_experiment, name, artifact_location=location))
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

    @property
    def run_id(self) -> str | None:
        return self.backend.run_id if self.backend else None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.history.setdefault(key, []).append((int(step), float(value)))
        if self.backend:
            self.backend.log_metrics(metrics, step)

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

    def close(self, status: str) -> None:
        """Flush, write the reports, log them, and end the MLflow run with ``status``. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        try:
            for path in self.write_reports():
                self.log_artifact(path)
        finally:
            if self.backend:
                self.backend.end(status)


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
# Reading and annotating stored runs: sweep parents (pgcli.sweep) and `pgcli compare` (pgcli.compare)
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


class RunStore:
    """The runs of one tracking store, through ``MlflowClient`` (every call retried while SQLite is locked)."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        quiet_mlflow_logs()
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)

    def create_run(
        self, experiment: str, *, run_name: str, tags: Mapping[str, str], artifact_root: str | None = None
    ) -> RunRecord:
        """Start a run (RUNNING) in ``experiment``, creating the experiment if needed."""
        experiment_id = get_or_create_experiment(self.client, experiment, artifact_root)
        run = with_retry(self.client.create_run, experiment_id, run_name=run_name, tags=dict(tags))
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

        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), PARAM_BATCH_LIMIT):
            with_retry(self.client.log_batch, run_id, params=items[i : i + PARAM_BATCH_LIMIT], synchronous=True)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        with_retry(self.client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)

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
        out: list[RunRecord] = []
        token = None
        while True:
            page = with_retry(
                self.client.search_runs,
                experiment_ids,
                filter_string=filter_string,
                order_by=order_by,
                max_results=1000,
                page_token=token,
            )
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
    )
