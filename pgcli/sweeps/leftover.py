"""What is left of a stopped sweep (Ctrl-C, SIGTERM) and the commands that finish it (docs/sweeps.md, "Stopping a
sweep").

A job stopped with the sweep ends KILLED: it was interrupted, it did not fail. It continues with
``pgcli train resume=<run id>`` when it saved a checkpoint (a clean stop saves one); a job stopped before its first
checkpoint, and every job that never started, runs again as a sweep of just those jobs, grouped into as few
``pgcli train -m`` command lines as a grid allows. An Optuna search continues with the trials it has not finished: the
same command with ``hydra.sweeper.n_trials`` lowered (the study itself continues when it has a ``storage``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.tracking.status import KILLED
from pgcli.training.checkpoints import checkpoints_dir, latest_checkpoint
from pgcli.training.console import lookup_overrides, resume_command

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pgcli.tracking.store import RunRecord


@dataclass
class SweepPlan:
    """What a sweep was asked to run, recorded when it starts (it travels to the workers with the sweep callback)."""

    task: list[str]
    """The command line's config overrides, as Hydra recorded them."""
    hydra: list[str] = field(default_factory=list)
    """The command line's ``hydra...`` overrides (launcher, sweeper settings)."""
    jobs: list[list[str]] | None = None
    """A grid sweep's overrides of each job, by job number; None for another sweeper."""
    n_trials: int | None = None
    """An Optuna search's trial count."""

    @classmethod
    def from_config(cls, config: DictConfig) -> SweepPlan:
        from omegaconf import OmegaConf

        from pgcli.config.compose import job_overrides
        from pgcli.config.overrides import Overrides

        task = [str(o) for o in config.hydra.overrides.task]
        hydra = [str(o) for o in config.hydra.overrides.hydra if not str(o).startswith("hydra.mode=")]
        n_trials = OmegaConf.select(config, "hydra.sweeper.n_trials", default=None)
        if n_trials is not None:
            return cls(task, hydra, n_trials=int(n_trials))
        grid = Overrides.parse(task).is_grid()
        return cls(task, hydra, jobs=job_overrides(task, multirun=True) if grid else None)

    @property
    def n_jobs(self) -> int | None:
        if self.n_trials is not None:
            return self.n_trials
        return len(self.jobs) if self.jobs is not None else None


@dataclass
class Leftover:
    """A stopped sweep's jobs that did not run to their end, and the commands that run them."""

    interrupted: int = 0
    """Jobs that started and were stopped (KILLED, not pruned), or left no run."""
    not_started: int = 0
    commands: list[str] = field(default_factory=list)
    """``<command> (job #N...)``, one per command line to run."""


def leftover(plan: SweepPlan | None, children: list[RunRecord], no_run: list[int]) -> Leftover:
    """What is left of a stopped sweep: ``children`` are its runs, ``no_run`` the jobs that started without one."""
    jobs: dict[int, list[RunRecord]] = {}
    for child in children:
        job = child.tags.get("sweep_job", "")
        if job.isdigit():
            jobs.setdefault(int(job), []).append(child)
    stopped = {n for n, runs in jobs.items() if any(_interrupted(r) for r in runs)} | set(no_run)
    planned = plan.n_jobs if plan is not None else None
    started = set(jobs) | set(no_run)
    not_started = max(planned - len(started), 0) if planned is not None else 0
    left = Leftover(interrupted=len(stopped), not_started=not_started)
    if plan is None:
        return left
    if plan.n_trials is not None:
        if stopped or not_started:  # an interrupted trial's value never reaches the study: it runs as a new one
            n = len(stopped) + not_started
            command = _command(plan, plan.task, extra=[f"hydra.sweeper.n_trials={n}"])
            left.commands.append(
                f"{command} (the {n} trial{'s' if n > 1 else ''} left; the study continues when "
                "hydra.sweeper.storage is set)"
            )
        return left
    rerun = [n for n in range(planned or 0) if n not in started]
    for num in sorted(stopped):
        run = next((r for r in jobs.get(num, []) if _interrupted(r) and _checkpointed(r)), None)
        if run is None:
            rerun.append(num)
        else:
            left.commands.append(f"{resume_command(run.run_id, None, lookup_overrides(plan.task))} (job #{num})")
    left.commands += grid_commands(plan, sorted(rerun), not_started=set(range(planned or 0)) - started)
    return left


def grid_commands(plan: SweepPlan, nums: list[int], *, not_started: set[int]) -> list[str]:
    """``pgcli train -m`` command lines that run the grid jobs ``nums`` again: jobs that differ only in the last swept
    key share one (``seed=1,2``), as Hydra's basic sweeper orders them."""
    from pgcli.config.overrides import Overrides

    assert plan.jobs is not None
    swept = [i for i, o in enumerate(Overrides.parse(plan.task)) if o.is_sweep_override()]
    groups: dict[tuple[str, ...], list[int]] = {}
    for num in nums:
        groups.setdefault(tuple(_value(plan.jobs[num][i]) for i in swept[:-1]), []).append(num)
    commands = []
    for head, members in groups.items():
        last = ",".join(dict.fromkeys(_value(plan.jobs[n][swept[-1]]) for n in members))
        task = list(plan.task)
        for i, value in zip(swept, [*head, last], strict=True):
            task[i] = f"{plan.jobs[members[0]][i].partition('=')[0]}={value}"
        which = ", ".join(f"#{n}" for n in members)
        why = "not started" if set(members) <= not_started else "to run again"
        commands.append(f"{_command(plan, task)} (job{'s' if len(members) > 1 else ''} {which}, {why})")
    return commands


def _command(plan: SweepPlan, task: list[str], extra: list[str] | None = None) -> str:
    """The sweep's command line on ``task``; ``extra`` replaces the same keys of the original."""
    from pgcli.redact import redact_text

    replaced = {o.partition("=")[0] for o in extra or []}
    hydra = [o for o in plan.hydra if o.partition("=")[0] not in replaced]
    return redact_text(shlex.join(["pgcli", "train", "-m", *task, *hydra, *(extra or [])]))


def _value(override: str) -> str:
    return override.partition("=")[2]


def _interrupted(run: RunRecord) -> bool:
    return run.status == KILLED and run.tags.get("pruned") != "true"


def _checkpointed(run: RunRecord) -> bool:
    output_dir: Any = run.tags.get("output_dir")
    return bool(output_dir) and latest_checkpoint(checkpoints_dir(Path(output_dir))) is not None
