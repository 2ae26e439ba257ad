"""One training job from Python, as ``pgcli train <overrides>`` would run it: :func:`run_job`.

Benchmarks and scripts call this instead of assembling ``compose`` + ``RunContext`` + ``train`` themselves, so their
runs get the same config, checks, labels and run directory as a command-line run (docs/runs.md). What it does not
do: print the end-of-run summary (it returns it), write ``.hydra/`` or ``train.log`` (so ``pgcli train resume=``
cannot continue such a run; the resolved config is in its MLflow params and ``model/agent.json``), or sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgcli.config.compose import CONF_DIR, hydra_compose
from pgcli.training.build import RunContext, train
from pgcli.training.summary import TrainSummary


@dataclass(frozen=True)
class JobLabels:
    """How ``pgcli train`` names a job, from Hydra's group choices (``hydra.runtime.choices``)."""

    algo: str
    """The ``algo=`` option (``trpo``)."""
    env: str
    """The env label (``pgcli.config.labels.env_label``): experiment, run name and ``tags.env``."""
    preset: str
    """The applied ``conf/preset`` option, or ``none``."""
    run_dir: Path
    """``hydra.run.dir``: where ``pgcli train`` would write this job (relative to the current directory)."""


def run_job(
    overrides: Sequence[str],
    *,
    output_dir: Path | None = None,
    tracking: bool = True,
    one_process: bool = False,
) -> TrainSummary:
    """Compose, check, label and train one job in this process; returns its :class:`TrainSummary`.

    The steps are ``pgcli train``'s for a single run, the same passes (:func:`pgcli.training.pipeline.prepare_job`):
    ``init=<run>``'s carried-over settings, a text task's implied choices (``env=addition`` adds
    ``model=tiny_gpt algo=grpo``), ``~preset`` when ``env.id`` leaves its preset's env (with the same note on
    stderr), every rule of the config and the world's checks (:func:`pgcli.training.checks.train_config`), the
    tracking store and run directory checked, ``init`` found and fitting; then the run named
    ``<algo>-<env label>-s<seed>`` and trained inside :class:`pgcli.training.run.Run`, which ends its MLflow run
    FINISHED, FAILED or KILLED.

    Example::

        summary = run_job(["algo=trpo", "env=cartpole", "total_steps=20000"], output_dir=tmp, tracking=False)
        print(summary.final_return, tmp / "metrics.csv")

    Args:
        overrides: ``pgcli train``'s ``key=value`` overrides (no flags, no sweep syntax).
        output_dir: the run directory; default: ``hydra.run.dir``, as ``pgcli train`` names it
            (``outputs/runs/<date>/<time>_<algo>_<env>_s<seed>`` under the current directory).
        tracking: False appends ``tracking=off`` (it wins over the overrides): no MLflow run; metrics go to
            ``<output_dir>/metrics.csv`` and ``learning_curve.png``.
        one_process: train in one process (``pgcli.hardware.placement.one_process``: the same numbers) for jobs that
            share the cores; by default, as ``pgcli train``, only when the second core is busy.

    Raises:
        ConfigError: a bad override, value or env, in one line (nothing was created).
        PgcliError: the store or run directory cannot be used, or training failed in a way pgcli reports in one line.
        pgcli.training.run.Interrupted: SIGINT, SIGTERM or SIGHUP (the run ends KILLED).
    """
    from pgcli.hardware import placement
    from pgcli.training.console import print_budget_note
    from pgcli.training.pipeline import prepare_job

    task = [*overrides, *([] if tracking else ["tracking=off"])]
    job = prepare_job(task, output_dir=None if output_dir is None else Path(output_dir))
    assert job.cfg is not None  # checked by the pipeline's check_jobs pass
    labels = job_labels(job.overrides)
    run_dir = labels.run_dir if output_dir is None else Path(output_dir)
    ctx = RunContext(
        algo_name=labels.algo, env_name=labels.env, preset=labels.preset, output_dir=run_dir, overrides=job.overrides
    )
    print_budget_note(job.cfg, job.overrides)
    return train(placement.one_process(job.cfg) if one_process else placement.fall_back_when_busy(job.cfg), ctx)


def job_labels(overrides: list[str]) -> JobLabels:
    """The labels of the job ``overrides`` compose to (composed with Hydra's own node, as the Hydra job has it)."""
    from pgcli.config.labels import env_label, preset_label

    composed = hydra_compose(overrides, hydra_node=True)
    choices = composed.hydra.runtime.choices
    return JobLabels(
        algo=str(choices["algo"]),
        env=env_label(str(composed.env.id), choices.get("env"), CONF_DIR),
        preset=preset_label(choices, CONF_DIR),
        run_dir=Path(str(composed.hydra.run.dir)),
    )
