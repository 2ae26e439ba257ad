"""Checks of the world around ``pgcli train``, run once before Hydra makes a run directory or MLflow a run
(docs/tracking.md, "Checked before a run starts").

Config validation (:mod:`pgcli.config`) decides whether the *values* are right; this module decides whether the
*places* they name can be used: the tracking store (a URI scheme MLflow supports, a server that answers within
:data:`SERVER_TIMEOUT_S`, a SQLite file that is an MLflow store or empty, a directory that can be written with some
free space), the experiment name MLflow stores and files artifacts under, and the run or sweep directory (writable,
and no live process writing a run there). Each failure is one line naming the thing and the fix:

- :class:`~pgcli.errors.ConfigError` (exit 2) when what was typed is wrong on its own: a malformed URI, an unsupported
  scheme, a folder store MLflow refuses, an experiment name MLflow refuses or that leaves the artifact root, a run
  directory a live process writes;
- :class:`~pgcli.errors.PgcliError` (exit 1) for a fault of the environment: a server that does not answer, a file
  that is not an MLflow store, a directory that cannot be written or is full.

Nothing here creates a file that outlives the check (the write probe is an unnamed temporary file), and nothing
imports MLflow: a tracking server that is down is reported in at most 10 s instead of MLflow's minutes of retries.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pgcli.config import TrackingConfig
from pgcli.errors import ConfigError
from pgcli.tracking.checks import check_store, check_writable_dir, existing_ancestor
from pgcli.tracking.uri import (
    resolve_tracking_target,
)
from pgcli.training.owner import check_one_writer

MAX_EXPERIMENT_NAME_LENGTH = 500
"""MLflow refuses longer experiment names (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)."""


@dataclass(frozen=True)
class StorePlan:
    """What ``pgcli train`` is about to write to: the tracking URI (None: tracking off) and the output directory."""

    tracking_uri: str | None
    artifact_root: str | None
    output_dir: Path
    output_key: str = "hydra.run.dir"
    experiment: str | None = None
    """The ``experiment`` the run was given (None: the env's name, always a valid one)."""


def check_train_environment(plan: StorePlan) -> None:
    """Raise a one-line ConfigError / PgcliError if the store or the output directory cannot be used."""
    check_writable_dir(plan.output_dir, what=plan.output_key)
    check_no_writer(plan.output_dir)  # before Hydra writes .hydra/ there
    if plan.tracking_uri is not None:
        check_store(plan.tracking_uri, "train")
        if plan.experiment:
            check_experiment_name(plan.experiment)
    if plan.artifact_root and plan.artifact_root.startswith("file:"):
        root = Path(urllib.request.url2pathname(urllib.parse.urlparse(plan.artifact_root).path))
        check_writable_dir(root, what="the MLflow artifact directory")


# --------------------------------------------------------------------------------------------------------------------
# tracking URI
# --------------------------------------------------------------------------------------------------------------------


def check_experiment_name(name: str) -> None:
    """A name MLflow accepts, whose artifact folder (``<artifact root>/<name>``) stays inside the artifact root."""
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise ConfigError(
            f"experiment must be at most {MAX_EXPERIMENT_NAME_LENGTH} characters (MLflow's limit; got {len(name)})"
        )
    if ".." in name.replace("\\", "/").split("/"):
        raise ConfigError(
            f"experiment {name!r} must not contain '..' (its artifacts go to <artifact root>/<experiment>, and '..' "
            "would put them outside it); e.g. experiment=hopper-ablation or team/hopper"
        )


# --------------------------------------------------------------------------------------------------------------------
# directories
# --------------------------------------------------------------------------------------------------------------------


def check_no_writer(output_dir: Path) -> None:
    """Refuse (one-line ConfigError) a new run into a directory that a live process writes (its ``.owner``; for an
    ``n_seeds`` job, that of one of its ``seed<k>`` runs) before Hydra writes ``.hydra/`` there: the run that
    process writes keeps its files (docs/runs.md, "One writer per run"). Reads only."""
    for run_dir in [output_dir, *sorted(output_dir.glob("seed*"))]:
        check_one_writer(run_dir, f"the run in {run_dir}")


def check_out_dir(path: Path, option: str, *, empty: bool = False) -> Path:
    """``path``, typed as a command's output directory ``option`` (``--out``): a directory, or one that can be created
    where it is (the nearest existing parent a directory), and with ``empty`` one that holds nothing yet; else a
    one-line ConfigError naming the option, before the command does any work. Nothing is created; a directory that
    cannot be written or is full is :func:`check_writable_dir`'s fault (exit 1)."""
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a directory; pass a directory (made if missing)")
    where = existing_ancestor(path)
    if not where.is_dir():
        raise ConfigError(f"{option} {path}: {where} is a file, not a directory; pass another {option}")
    if empty and path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{option} {path} exists and is not empty; pass another {option}")
    check_writable_dir(path, what=option)
    return path


# --------------------------------------------------------------------------------------------------------------------
# from the command line
# --------------------------------------------------------------------------------------------------------------------


def plan_from_overrides(overrides: list[str], *, multirun: bool, output_dir: Path | None = None) -> StorePlan:
    """Compose the config (Hydra's own part included) for ``overrides`` and say where the run will write: to
    ``output_dir`` when the caller chose it (:func:`pgcli.training.job.run_job`), else to Hydra's run or sweep
    directory.

    Sweep overrides (``seed=0,1``) are left out: the tracking store and the root of the output directory are the same
    for every job of a sweep unless the sweep varies them, which only the jobs themselves can then report.
    """
    from omegaconf import OmegaConf

    from pgcli.config.compose import hydra_compose, primary_overrides
    from pgcli.config.overrides import task_lines

    fixed = primary_overrides(overrides)
    try:
        cfg = hydra_compose(fixed, hydra_node=True)
    except ConfigError:
        # a hydra.* override this compose cannot take (a sweeper's own keys): Hydra itself judges those; the task
        # overrides were validated already, so the store is still checked, against the default output directory
        cfg = hydra_compose(task_lines(fixed), hydra_node=True)
    tracking: TrackingConfig = OmegaConf.to_object(cfg.tracking)  # type: ignore[assignment]
    experiment = cfg.get("experiment")
    key = "output_dir" if output_dir is not None else "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if output_dir is None:
        output_dir = Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
    return store_plan(tracking, None if experiment is None else str(experiment), output_dir, key)


def store_plan(tracking: TrackingConfig, experiment: str | None, output_dir: Path, output_key: str) -> StorePlan:
    """What a run will write to: ``tracking``'s store (None with ``tracking=off``) and ``output_dir``."""
    if tracking.backend != "mlflow":
        return StorePlan(None, None, output_dir, output_key)
    target = resolve_tracking_target(tracking)
    return StorePlan(target.uri, target.artifact_root, output_dir, output_key, experiment)
