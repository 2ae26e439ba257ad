"""One training job: the composition root (``build``), the run's lifecycle (``run``), the monitor around the update
loop (``monitor``, ``evaluation``), the checks a config passes first (``checks``), and :func:`run_job`, the entry
point for scripts and benchmarks."""

from pgcli.training.job import run_job
from pgcli.training.summary import TrainSummary

__all__ = ["TrainSummary", "run_job"]
