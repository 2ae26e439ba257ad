"""What a training job shows while it runs: a live progress bar, or, in a job of a parallel sweep, a progress line now
and then.

A job of a sweep whose launcher runs several jobs at once (joblib, Ray) shares the terminal with the other jobs: two
live bars would redraw one line in turn, so such a job prints whole lines instead, each naming the job
(docs/sweeps.md, "Launchers"). Single runs and sequential sweeps keep tqdm's bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

JOB_PROGRESS_EVERY_S = 30.0
"""Seconds between two progress lines of one job of a parallel sweep."""


def parallel_job() -> str | None:
    """``#<n>`` (Hydra's job number) when this process runs a job of a sweep whose launcher runs several jobs at once
    (joblib, Ray); None for a single run, a job of a sequential sweep (the basic launcher) or a job outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from pgcli.hardware.placement import parallel_launcher

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or not parallel_launcher(str(hc.launcher.get("_target_", ""))):
        return None
    return f"#{hc.job.num}"


def progress_bar(total: int) -> Any:
    """The training progress display for ``total`` steps: a live tqdm bar, or a :class:`JobProgress` for a job of
    a parallel sweep. Both take ``update(n)``, ``set_postfix(stats, refresh=False)``, ``write(text, file=...)`` and
    ``close()``, and have ``n`` and a settable ``total``."""
    job = parallel_job()
    if job is not None:
        return JobProgress(job, total)
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True, mininterval=0.5, leave=True)


@contextmanager
def episode_progress(total: int, what: str) -> Iterator[Callable[[int], None]]:
    """Say ``what`` is played (``pgcli: evaluating 10 episodes ...``) on stderr, then a bar of the ``total`` episodes
    (removed when done; none in a job of a parallel sweep); yields what ``run_episodes`` calls with the episodes
    played so far."""
    write_line(sys.stderr, f"pgcli: {what}...")
    if parallel_job() is not None:
        yield lambda n: None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="episode", dynamic_ncols=True, leave=False)
    try:
        yield lambda n: bar.update(n - bar.n)
    finally:
        bar.close()


class JobProgress:
    """The progress of one job of a parallel sweep: every :data:`JOB_PROGRESS_EVERY_S` seconds one whole line on
    stderr, ``pgcli: job #1: 40,960/100,000 steps (41%), sps 3,120, return 87.5, eval 120.0``."""

    def __init__(self, job: str, total: int, every_s: float = JOB_PROGRESS_EVERY_S) -> None:
        self.job, self.total, self.n, self.every_s = job, total, 0, every_s
        self.stats: dict[str, str] = {}
        self._due = time.monotonic() + every_s

    def set_postfix(self, stats: Mapping[str, str], refresh: bool = False) -> None:
        self.stats = dict(stats)

    def update(self, n: int) -> None:
        self.n += n
        if time.monotonic() >= self._due and self.n < self.total:  # the summary says the rest at the end
            self._due = time.monotonic() + self.every_s
            write_line(sys.stderr, self.line())

    def line(self) -> str:
        done = f"{self.n:,}/{self.total:,} steps ({self.n / max(self.total, 1):.0%})"
        return f"pgcli: job {self.job}: {done}" + "".join(f", {key} {value}" for key, value in self.stats.items())

    def write(self, text: str, file: Any = None) -> None:
        """A note (tqdm's ``write``): one whole line on ``file`` (stderr by default)."""
        write_line(sys.stderr if file is None else file, text)

    def close(self) -> None:
        pass


def write_line(stream: Any, text: str) -> None:
    """``text`` and a newline in one write: lines of processes that share a terminal do not interleave."""
    stream.write(text + "\n")
    stream.flush()


def number(value: float) -> str:
    """``value`` to three decimals, a rounded negative zero as ``0.000`` (a KL estimate of -1e-9 is 0)."""
    text = f"{value:.3f}"
    return "0.000" if text == "-0.000" else text
