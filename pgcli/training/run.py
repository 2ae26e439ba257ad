"""A training run's life in one place: create or re-open its MLflow run, and decide how it ends.

:class:`Run` is the context manager around one training job (``pgcli.training.build.train``):

- on entry it claims the run directory for this process (``<run dir>/.owner``, :func:`pgcli.training.owner.claim_run`:
  one writer per run, released when the run ends), then creates the MLflow run (or, when resuming, nothing yet:
  :meth:`Run.start` re-opens the old run only once its checkpoint has loaded, so a bad checkpoint changes nothing in
  the store) and records who runs it (``pid``, ``hostname``, ``pid_start`` tags and ``<run dir>/run.json``);
- SIGINT, SIGTERM and SIGHUP end the run KILLED. During training the first one asks for a clean stop: the monitor
  finishes the current update, saves a checkpoint, and the run saves its model before it ends; a second signal (or
  one outside training) stops at once. Once training is done (:meth:`Run.finishing`: the final evaluation) a signal
  stops at once and the model, complete, is still saved;
- on exit the final status is decided here and nowhere else (:func:`final_status`): an interrupt is KILLED, an
  exception FAILED (with an ``error`` tag), otherwise FINISHED, unless some metric or report could not be written:
  then FAILED, with the reason in the ``error`` tag and the missing pieces listed in ``run.json``.

A process killed with SIGKILL cannot end its run: it stays RUNNING, with the metrics of up to the last
``tracking.flush_every_s`` seconds unwritten (every checkpoint flushes first, so nothing up to the last checkpoint is
lost). :func:`pgcli.training.owner.find_stale_runs` (``pgcli runs --stale``) finds such runs by their
``pid``/``hostname`` tags and marks them KILLED; ``pgcli train resume=<run>`` continues them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pgcli.errors import PgcliError
from pgcli.redact import redact_uri
from pgcli.tracking.status import FAILED, FINISHED, KILLED, RUNNING
from pgcli.training.owner import claim_run, process_tags, release_run

if TYPE_CHECKING:
    from pgcli.contracts import Learner
    from pgcli.tracking.backend import MLflowBackend
    from pgcli.tracking.logger import RunLogger

PARENT_RUN_ENV = "PGCLI_PARENT_RUN_ID"
SWEPT_KEYS_ENV = "PGCLI_SWEPT_KEYS"
"""The keys a sweep varies (comma-separated), set by the sweep for its jobs: their run names show them."""
"""Set by the sweep callback: children of a multirun attach to this MLflow run."""
RUN_FILE = "run.json"
"""``<run dir>/run.json``: run id, tracking URI, process, and (at the end) status and what could not be written."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PROCESS_TAGS = ("pid", "hostname", "pid_start")


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: the run ends KILLED and ``pgcli`` exits with 128 + the signal number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StoppedEarly(Exception):
    """Training was stopped on purpose before its budget (a search's pruner, ``pgcli.sweeps.study.TrialPruned``): not an
    error; the run ends KILLED, as a run cut short, with :meth:`tags` saying why."""

    def tags(self) -> dict[str, str]:
        return {}


def final_status(exc: BaseException | None, missing: Sequence[str] = ()) -> str:
    """How a run ends: KILLED on an interrupt or an early stop, FAILED on an exception or when something could not
    be written, else FINISHED. The one place that maps outcomes to MLflow statuses."""
    if isinstance(exc, (KeyboardInterrupt, StoppedEarly)):
        return KILLED
    if exc is not None or missing:
        return FAILED
    return FINISHED


def sweep_status(how_it_ended: str, n_failed_jobs: int) -> str:
    """A sweep parent's status: how the sweep itself ended, and FAILED when any job failed or left no run."""
    if how_it_ended == KILLED:
        return KILLED
    return FAILED if how_it_ended == FAILED or n_failed_jobs else FINISHED


def error_tags(exc: BaseException) -> dict[str, str]:
    """The ``error`` tag of a FAILED run: exception type and first line, as the sweep summary reports it."""
    lines = str(exc).strip().splitlines()
    return {"error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]}


# --------------------------------------------------------------------------------------------------------------------
# Signals
# --------------------------------------------------------------------------------------------------------------------


class StopRequest:
    """The first stop signal during training: the monitor checkpoints at the next update boundary and raises."""

    def __init__(self) -> None:
        self.armed = False
        """True while training runs (a clean stop is possible); otherwise signals stop at once."""
        self.signum: int | None = None
        self.clean = False
        """True once training stopped at an update boundary with a checkpoint saved: the agent can be saved too."""

    def __bool__(self) -> bool:
        return self.signum is not None

    def stop_now(self) -> None:
        """Called by the monitor at an update boundary, once the checkpoint is saved: end training."""
        self.clean = True
        raise Interrupted(self.signum or signal.SIGINT)


@contextmanager
def stop_signals(stop: StopRequest) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted`, or request a clean stop while ``stop.armed``.

    Signal handlers can only be set in the main thread; a job run in a worker thread keeps the defaults.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.armed and stop.signum is None:
            stop.signum = signum
            _say(
                f"pgcli: {signal.Signals(signum).name}: stopping after this update (a checkpoint and the model are "
                "saved); send it again to stop at once"
            )
            return
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _say(line: str) -> None:
    with suppress(OSError):  # SIGHUP: the terminal may be gone
        print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------------
# Checkpoints and the run directory
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: its MLflow run (None with ``tracking=off``) and its newest good checkpoint (a
    ``checkpoints/step_<N>`` or the final ``model/``, see ``pgcli.training.resume.resume_point``)."""

    run_id: str | None
    checkpoint: Path
    step: int
    skipped: tuple[str, ...] = ()
    """Newer checkpoints that could not be loaded, each as ``<dir>: <why>``, newest first."""


def read_run_file(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_run_file(run_dir: Path, data: Mapping[str, Any]) -> None:
    """Write ``run.json`` atomically (a reader never sees half a file)."""
    tmp = run_dir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(dict(data), indent=2) + "\n")
    os.replace(tmp, run_dir / RUN_FILE)


# --------------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------------


class Closeable(Protocol):
    """An env, trainer or monitor: released when the run ends, whatever the outcome."""

    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


class RunMonitor(Protocol):
    """What the run needs of the training monitor (``pgcli.training.monitor.TrainingMonitor``, which honours
    :attr:`Run.stop`): its curves restored on resume and saved beside the final model, and the best evaluation's agent
    to log beside the model."""

    @property
    def best_dir(self) -> Path | None: ...

    def load_state(self, checkpoint: Path, step: int) -> None: ...

    def save_state(self, path: Path) -> None: ...


class Run:
    """One training run, from its MLflow run's creation (or re-opening) to its final status.

    Example (``pgcli.training.build.train``)::

        with Run(output_dir, open_backend, params=params, resume=resume) as run:
            env = run.closing(make_vec_env(...))
            trainer = run.closing(Trainer(...))
            monitor = run.closing(TrainingMonitor(run.logger, schedule, ..., hooks=Hooks(stop=run.stop)))
            run.start(trainer, monitor)  # resume: load the checkpoint, then re-open the MLflow run
            steps = trainer.learn(total_steps, monitor)
            monitor.finish(steps, trainer)
            run.save_model(trainer)
    """

    def __init__(
        self,
        output_dir: Path,
        open_backend: Callable[[str | None], MLflowBackend | None],
        *,
        params: Mapping[str, Any],
        resume: ResumePoint | None = None,
        log_model: bool = True,
        describe_model: Callable[[Path], None] | None = None,
    ) -> None:
        """``open_backend(None)`` creates the MLflow run and ``open_backend(run_id)`` re-opens one (resume); both return
        None for ``tracking=off``. ``params`` are logged to a new run; a resumed run keeps the ones it has.
        ``describe_model(dir)`` adds what loads a saved agent without pgcli's config (``pgcli.agent``); the saved agents
        are logged as MLflow Models (``pgcli.pyfunc``: gymnasium agents and text policies alike)."""
        from pgcli.tracking.logger import RunLogger

        self.output_dir, self.params, self.resume, self.log_model = output_dir, params, resume, log_model
        self.describe_model = describe_model
        self._open_backend = open_backend
        self.logger: RunLogger = RunLogger(output_dir)
        """What the trainer and monitor log through; its MLflow backend is attached when the run opens."""
        self._opened = False
        self._claimed = False
        self.stop = StopRequest()
        self.trainer: Learner | None = None
        self.monitor: RunMonitor | None = None
        self._resources = ExitStack()
        self._signals = ExitStack()

    # -- entering ----------------------------------------------------------------------------------------------------
    def __enter__(self) -> Run:
        self._signals.enter_context(stop_signals(self.stop))
        try:
            # one writer per run (docs/runs.md): claimed before anything is written, released when the run ends
            claim_run(self.output_dir, f"the run in {self.output_dir}")
            self._claimed = True
            if self.resume is None:
                # A new run exists before the env and trainer are built, so a job whose env fails at make time (one
                # bad job of a sweep) still leaves a FAILED run that says why (docs/sweeps.md, "Failure isolation").
                self._open(None)
                self.logger.log_params(self.params)
                hydra_dir = self.output_dir / ".hydra"
                if hydra_dir.is_dir():  # logged now, so a killed run keeps its config too
                    self.logger.log_artifact(hydra_dir, "hydra")
        except BaseException as exc:
            try:
                self._end(exc)
            finally:
                self._release()
                self._signals.close()
            raise
        return self

    def closing(self, obj: C) -> C:
        """Close ``obj`` when the run ends (in reverse order of registration)."""
        self._resources.callback(obj.close)
        return obj

    def start(self, trainer: Learner, monitor: RunMonitor) -> None:
        """Training begins. On resume: load the checkpoint into ``trainer`` and ``monitor``, then re-open the MLflow
        run with its stored metric history (later points are logged only past it: no step is logged twice)."""
        self.trainer, self.monitor = trainer, monitor
        if self.resume is not None:
            checkpoint = self.resume.checkpoint
            try:
                trainer.load(checkpoint)
            except PgcliError:
                raise
            except Exception as exc:  # a truncated or foreign file: torch/zip/pickle errors of every kind
                lines = str(exc).strip().splitlines()
                raise PgcliError(
                    f"cannot load checkpoint {checkpoint}: {type(exc).__name__}: {lines[0] if lines else ''}"
                ) from None
            monitor.load_state(checkpoint, self.resume.step)
            self._open(self.resume.run_id)
        self.stop.armed = True

    def finishing(self) -> None:
        """Training is done: from here (the final evaluation, the model, the reports) a stop signal stops at once,
        since there is no update left to wait for; the agent is whole, so the model is still saved on the way out, and
        the run ends KILLED with 128 + the signal's number (docs/runs.md, "Signals: a clean stop")."""
        self.stop.armed = False
        self.stop.clean = True

    def save_model(self, trainer: Learner) -> Path:
        """Save the final agent to ``<run dir>/model`` and log it (and the best agent) as MLflow Models.

        The model is saved at an update boundary (the end of training, or a clean stop), so with the monitor's state
        beside it (``monitor.json``, written last) it is a checkpoint too: ``resume=<run> total_steps=<more>``
        continues from it when no ``checkpoints/step_<N>`` is newer (docs/runs.md, "Resume")."""
        model_dir = trainer.save(self.output_dir / "model")
        if self.monitor is not None:
            self.monitor.save_state(model_dir)
        best = self.monitor.best_dir if self.monitor is not None else None
        saved = [(model_dir, "model")] + ([(best, "best_model")] if best is not None and best.is_dir() else [])
        for path, name in saved:
            if self.describe_model is not None:  # agent.json: what `pgcli eval` and the MLflow Model load it from
                self.describe_model(path)
            if self.log_model:
                self.logger.log_model(path, name)
        return model_dir

    # -- leaving -----------------------------------------------------------------------------------------------------
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.armed = False
        try:
            if isinstance(exc, Interrupted) and self.stop.clean and self.trainer is not None:
                self.save_model(self.trainer)  # stopped cleanly at an update: the agent is consistent
        except Exception as save_error:
            _say(f"pgcli: could not save the model on the way out: {save_error}")
        finally:
            try:
                self._resources.close()
            finally:
                try:
                    self._end(exc)
                finally:
                    self._release()
                    self._signals.close()

    def _release(self) -> None:
        if self._claimed:
            self._claimed = False
            release_run(self.output_dir)

    def _open(self, run_id: str | None) -> None:
        self.logger.backend = self._open_backend(run_id)
        self._opened = True
        if run_id is not None and self.logger.backend is not None:
            self.logger.restore_history(self.logger.backend.stored_history())
        elif self.resume is not None:
            self.logger.restore_history(_csv_history(self.output_dir / "metrics.csv"))
        self.logger.set_tags(process_tags())
        write_run_file(self.output_dir, {**self._run_file_base(), "status": RUNNING})

    def _run_file_base(self) -> dict[str, Any]:
        backend = self.logger.backend
        return {
            "run_id": backend.run_id if backend else None,
            # no credentials on disk: a URI with user:password@ is kept as the bare server (pgcli.redact.redact_uri)
            "tracking_uri": redact_uri(backend.uri) if backend else None,
            **process_tags(),
        }

    def _end(self, exc: BaseException | None) -> None:
        """Flush and report, decide the status, end the MLflow run. Nothing to end before the run was opened."""
        logger = self.logger
        if not self._opened or logger.closed:
            return
        try:
            missing = logger.finalize()
        except KeyboardInterrupt as again:  # a second Ctrl-C while the reports are written: still end the run
            exc, missing = again, ["metrics.csv, learning_curve.png, buffered metrics: interrupted while writing"]
        status = final_status(exc, missing)
        tags = error_tags(exc) if status == FAILED and exc is not None else {}
        if isinstance(exc, StoppedEarly):
            tags = exc.tags()
        if missing:
            tags["error"] = (f"{tags['error']}; " if tags else "") + "not written: " + "; ".join(missing)
            _say(f"pgcli: the run ends {status}: not written: " + "; ".join(missing))
        try:
            if tags:
                logger.set_tags({k: v[:5000] for k, v in tags.items()})
        finally:
            with suppress(OSError):  # the disk that refused the reports; the store has the status
                write_run_file(self.output_dir, {**self._run_file_base(), "status": status, "missing": missing})
            logger.end(status)


def _csv_history(path: Path) -> dict[str, list[tuple[int, float]]]:
    """The points of a run's ``metrics.csv`` (resume with ``tracking=off``); empty when there is none."""
    import csv

    history: dict[str, list[tuple[int, float]]] = {}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                history.setdefault(row["key"], []).append((int(row["step"]), float(row["value"])))
    except (OSError, KeyError, ValueError):
        return {}
    return history
