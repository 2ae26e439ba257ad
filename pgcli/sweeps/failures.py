"""A failed sweep job on the terminal: one line, the traceback kept in the job's log, nothing printed twice.

Hydra 1.3 reports a failed job itself: whenever a sweeper reads the job's result it writes "Error executing job with
overrides: [...]", and the basic sweeper re-raises the job's exception once the batch is done, which Hydra prints
with its traceback. pgcli's rule is one line for an error (docs/sweeps.md, "Failure isolation"), so:

- the job reports its own failure (:func:`job_failed`, from ``pgcli.commands.train.run_train``): one line naming the
  job, the overrides that set it apart and the reason (a :class:`~pgcli.errors.PgcliError`'s message, or an
  unexpected exception's type and first line with the log that holds its traceback), and raises :class:`JobFailed`;
- the sweep's callback then marks Hydra's record of the job as reported (:func:`quiet_failure`): reading it raises
  without Hydra's line, and the basic sweeper ends the sweep by :class:`SweepJobFailed` (a ``SystemExit``, which
  Hydra lets through without a traceback; ``pgcli train`` then closes the sweep and exits 1), as its re-raise did.
  Other sweepers get :class:`JobFailed`, an ordinary exception: Optuna's tells the study the trial failed and goes on,
  or, past its ``max_failure_rate``, writes its results and ends the search by :class:`SweepJobFailed` too.

``PGCLI_DEBUG=1`` leaves all of this out: Hydra's own report, with the traceback on the terminal.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from pgcli.errors import PgcliError
from pgcli.redact import redact_text

if TYPE_CHECKING:
    from hydra.conf import HydraConf

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's default sweeper: it re-raises a failed job's exception to end the sweep after the batch."""
JOB_LOG = "train.log"
"""The job's log in its output dir (conf/hydra/job_logging/pgcli.yaml), where no other log file is configured."""


class JobFailed(PgcliError):
    """A sweep job failed and said so: its line is on the terminal and its traceback in its log."""


class SweepJobFailed(SystemExit):
    """What ends a sweep on a reported failure (the basic sweeper re-raises it; the Optuna sweeper raises it past its
    ``max_failure_rate``): exit status 1, no traceback. Built as ``SweepJobFailed(1)``: a launcher's worker pickles it
    back with its args."""


class ReportedFailure(JobReturn):
    """Hydra's record of a job whose failure the job has reported: reading the result raises its exception without
    Hydra's "Error executing job with overrides" line."""

    @property
    def return_value(self) -> Any:
        raise self._return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


def job_failed(exc: Exception, hc: HydraConf) -> JobFailed:
    """Report the failed job on one line (stderr) and write its traceback to the job's log; returns the exception the
    job raises for Hydra to record."""
    log = write_traceback(exc, Path(hc.runtime.output_dir))
    if isinstance(exc, PgcliError):
        reason = str(exc)
    else:
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else ''} (traceback in {_relative(log)})"
    which = " ".join([f"#{hc.job.num}", *distinct_overrides(hc)])
    print(redact_text(f"pgcli: job {which} failed: {reason}"), file=sys.stderr, flush=True)
    return JobFailed(redact_text(reason))


def quiet_failure(job_return: JobReturn, sweeper: str) -> None:
    """Mark ``job_return`` as reported if its job raised :class:`JobFailed` (see the module docstring)."""
    if job_return.status != JobStatus.FAILED or not isinstance(job_return._return_value, JobFailed):
        return
    # Hydra 1.3 has no setting for its line; the record the launcher hands back must be one of another class.
    job_return.__class__ = ReportedFailure
    if sweeper == BASIC_SWEEPER:
        job_return._return_value = SweepJobFailed(1)


def write_traceback(exc: BaseException, output_dir: Path) -> Path:
    """Add ``exc`` with its traceback (secrets masked) to the job's log, the file Hydra's job logging writes
    (``<output_dir>/train.log`` if it writes none); returns its path."""
    text = "the job failed:\n" + redact_text("".join(traceback.format_exception(exc))).rstrip()
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if files:  # that file only: a console handler would print the traceback after all
        files[0].handle(
            logging.makeLogRecord({"name": "pgcli", "levelno": logging.ERROR, "levelname": "ERROR", "msg": text})
        )
        return Path(files[0].baseFilename)
    path = output_dir / JOB_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text + "\n")
    return path


def distinct_overrides(hc: HydraConf) -> list[str]:
    """The job's overrides that set it apart in its sweep (``++env.kwargs={a:1}``, not ``total_steps=256``): those of
    the keys the sweep varies, read from the sweep's ``multirun.yaml`` and the sweeper's search space; all of the job's
    overrides when neither names one."""
    from pgcli.config.overrides import Overrides

    keys = _swept_keys(hc)
    job = Overrides.parse(str(o) for o in hc.overrides.task)
    last = {o.key_or_group: str(o.input_line) for o in job}  # a search's value comes after the command line's
    chosen = [line for key, line in last.items() if key in keys]
    return chosen or list(last.values())


def _swept_keys(hc: HydraConf) -> set[str]:
    """The keys of the sweeper's search space and of the sweep's command line with several values (``seed=0,1``)."""
    import yaml

    from pgcli.config.overrides import Overrides

    keys = {str(k) for k in (hc.sweeper.get("params") or {})}
    try:  # Hydra's basic sweeper writes the file before any job; another job may be masking a secret in it right now
        task = OmegaConf.select(OmegaConf.load(Path(hc.sweep.dir) / "multirun.yaml"), "hydra.overrides.task")
    except (OSError, yaml.YAMLError):
        return keys  # no file (another sweeper) or half written: the label is longer, the failure still reported
    return keys | Overrides.parse(str(o) for o in task or []).swept_keys()


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
