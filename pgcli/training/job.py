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
from typing import TYPE_CHECKING

from pgcli.config import TrainConfig
from pgcli.config.compose import CONF_DIR, hydra_compose, text_task_overrides
from pgcli.training.build import RunContext, train
from pgcli.training.summary import TrainSummary

if TYPE_CHECKING:
    from pgcli.training.preflight import StorePlan


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

    The steps are ``pgcli train``'s for a single run: a text task's implied choices (``env=addition`` adds
    ``model=tiny_gpt algo=grpo``), ``~preset`` when ``env.id`` leaves its preset's env (with the same note on
    stderr), every rule of the config and the world's checks (:func:`pgcli.training.checks.train_config`), the
    tracking store and run directory checked, then the run named ``<algo>-<env label>-s<seed>`` and trained inside
    :class:`pgcli.training.run.Run`, which ends its MLflow run FINISHED, FAILED or KILLED.

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
    from pgcli.config.presets import stale_preset_overrides
    from pgcli.hardware import placement
    from pgcli.training.checks import train_config
    from pgcli.training.console import print_budget_note
    from pgcli.training.preflight import check_train_environment

    task = [*overrides, *([] if tracking else ["tracking=off"])]
    task = [*task, *text_task_overrides(task)]
    preset_drop = stale_preset_overrides(task, multirun=False)
    task = [*task, *preset_drop.overrides]
    cfg = train_config(task)
    labels = job_labels(task)
    run_dir = labels.run_dir if output_dir is None else Path(output_dir)
    check_train_environment(store_plan(cfg, run_dir, "hydra.run.dir" if output_dir is None else "output_dir"))
    preset_drop.announce()
    ctx = RunContext(
        algo_name=labels.algo, env_name=labels.env, preset=labels.preset, output_dir=run_dir, overrides=task
    )
    print_budget_note(cfg, task)
    return train(placement.one_process(cfg) if one_process else placement.fall_back_when_busy(cfg), ctx)


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


def store_plan(cfg: TrainConfig, run_dir: Path, output_key: str) -> StorePlan:
    """What the run will write to: ``cfg``'s tracking store (None with ``tracking=off``) and ``run_dir``."""
    from pgcli.tracking.uri import resolve_tracking_target
    from pgcli.training.preflight import StorePlan

    if cfg.tracking.backend != "mlflow":
        return StorePlan(None, None, run_dir, output_key)
    target = resolve_tracking_target(cfg.tracking)
    return StorePlan(target.uri, target.artifact_root, run_dir, output_key, experiment=cfg.experiment)
