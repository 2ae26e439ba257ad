"""One training job: the composition root (``build``), the run's lifecycle (``run``), the monitor around the update
loop (``monitor``, ``evaluation``), the checks a config passes first (``checks``), and :func:`run_job`, the entry
point for scripts and benchmarks.

``run_job`` and ``TrainSummary`` are loaded on first use: importing a module of this package (``checks`` on every
``pgcli train`` command line) must not import the composition root and its trainers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgcli.training.job import run_job
    from pgcli.training.summary import TrainSummary

__all__ = ["TrainSummary", "run_job"]


def __getattr__(name: str) -> Any:
    if name == "run_job":
        from pgcli.training.job import run_job

        return run_job
    if name == "TrainSummary":
        from pgcli.training.summary import TrainSummary

        return TrainSummary
    raise AttributeError(f"module 'pgcli.training' has no attribute {name!r}")
