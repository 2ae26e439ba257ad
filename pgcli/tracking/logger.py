"""One logger interface for every trainer: :class:`MetricLogger`, and :class:`RunLogger`, the one a training run uses.

Trainers and the training monitor only see :class:`MetricLogger` (``log_metrics(metrics, step)`` with ``step`` =
environment steps). :class:`RunLogger` keeps every value in memory for the reports written at the end
(:mod:`pgcli.tracking.reports`) and forwards to an optional MLflow backend (:mod:`pgcli.tracking.backend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pgcli.tracking.reports import plot_learning_curve, write_metrics_csv
from pgcli.tracking.status import RUN_STATUSES

if TYPE_CHECKING:
    from pgcli.tracking.backend import MLflowBackend


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


class RunLogger:
    """The :class:`MetricLogger` of one training run: in-memory history plus an optional MLflow backend."""

    def __init__(self, output_dir: Path, backend: MLflowBackend | None = None) -> None:
        self.output_dir = output_dir
        self.backend = backend
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.closed = False
        self.skip_through: dict[str, int] = {}
        """key -> last step already stored (resume): points at or before it are dropped, never logged twice."""
        self.title = ""
        """The learning curve's title: the run's algo, env id and seed (``trpo on Hopper-v5, seed 1``)."""

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
        # by step only: points of one step (episodes that ended together) keep the order they were logged in
        self.history = {key: sorted(points, key=lambda point: point[0]) for key, points in history.items() if points}
        self.skip_through = {key: points[-1][0] for key, points in self.history.items()}

    def flush(self) -> None:
        """Store every point logged so far (the monitor flushes before each checkpoint): the MLflow backend's buffer,
        or, with no store (``tracking=off``), the whole history as ``metrics.csv``. Either way a run killed without
        time to write its reports resumes from its checkpoint with every point up to it."""
        if self.backend:
            self.backend.flush()
        elif self.history:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_metrics_csv(self.history, self.output_dir / "metrics.csv")

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
        paths = [write_metrics_csv(self.history, self.output_dir / "metrics.csv")]
        png = plot_learning_curve(self.history, self.output_dir / "learning_curve.png", title=self.title)
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
            if self.backend:  # without one, the reports above are the store
                self.backend.flush()
        except Exception as exc:
            n = self.backend.n_buffered if self.backend else 0
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
