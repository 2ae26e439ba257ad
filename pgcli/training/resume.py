"""``pgcli train resume=<run id | run dir>``: continue a run from its last checkpoint, in the same MLflow run.

Everything is checked before anything changes: the run is found (in the store named by ``tracking.uri`` /
``tracking.store_dir`` for a run id, or through ``<run dir>/run.json``), its config is read back from
``<run dir>/.hydra/``, the overrides are checked against :data:`RESUME_OVERRIDES`, and the last checkpoint
(``<run dir>/checkpoints/step_<N>``) is located. :class:`pgcli.training.run.Run` then loads the checkpoint and only then
re-opens the MLflow run (RUNNING again, then FINISHED / FAILED / KILLED like any run).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgcli.config import TrainConfig
from pgcli.config.compose import CONF_DIR, compose_dictconfig, compose_train_config, to_train_config
from pgcli.config.labels import applied_preset, env_label
from pgcli.errors import ConfigError
from pgcli.training.run import RUN_FILE, ResumePoint, latest_checkpoint, process_alive, read_run_file

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pgcli.tracking.backend import RunStore

RESUME_OVERRIDES = ("total_steps", "progress", "checkpoint_every", "checkpoint_keep", "hardware.torch_threads",
                    "tracking.flush_every_s")  # fmt: skip
"""The only keys a resume may change: none of them changes what is learned or what the logged curves mean.
``total_steps`` may only grow. Everything else (``eval.*`` included: evaluation shares the run's RNG streams and its
curve must stay comparable) is an error; ``pgcli train --from-run`` starts a new run with other values."""
LOOKUP_OVERRIDES = ("tracking.uri", "tracking.store_dir")
"""Where to look a run id up (as for ``pgcli compare``); they cannot move the run to another store."""


@dataclass(frozen=True)
class ResumePlan:
    """A checked resume: the run's config with the accepted overrides, its context, and where it continues."""

    cfg: TrainConfig
    algo_name: str
    env_name: str
    output_dir: Path
    overrides: list[str]
    """The run's original command-line overrides (its ``hydra_overrides`` tag)."""
    parent_run_id: str | None
    point: ResumePoint
    resume_overrides: list[str]
    preset: str = "none"
    """The preset label the run was started with (its tags and params keep it)."""


def plan_resume(target: str, overrides: list[str]) -> ResumePlan:
    """Find the run ``target`` names and check that it can continue with ``overrides``; raise a one-line
    :class:`~pgcli.errors.ConfigError` otherwise. Reads only: nothing is written to the store or the run dir."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    for key, override in zip(keys, overrides, strict=True):
        if "=" not in override:
            raise ConfigError(f"resume takes key=value overrides, got '{override}'")
        if key not in RESUME_OVERRIDES + LOOKUP_OVERRIDES:
            raise ConfigError(
                f"resume: '{key}' cannot change when a run continues (it changes the experiment); allowed: "
                f"{', '.join(RESUME_OVERRIDES)}; to train with other values start a new run"
            )
    lookup = [o for o, k in zip(overrides, keys, strict=True) if k in LOOKUP_OVERRIDES]
    changes = [o for o, k in zip(overrides, keys, strict=True) if k in RESUME_OVERRIDES]
    run_dir, run_id, uri, parent_run_id = locate_run(target, lookup)

    hydra_dir, seed = logged_config_dir(run_dir)
    hydra = _load_yaml(hydra_dir / "hydra.yaml", target)
    saved = _load_yaml(hydra_dir / "config.yaml", target)
    choices = {k: v for k, v in hydra.hydra.runtime.choices.items() if not str(k).startswith("hydra/")}
    original = [str(o) for o in hydra.hydra.overrides.task]
    # The group choices select the schemas (TRPOConfig, ...); the logged values then pin every field exactly, even
    # if conf/ changed since. Overrides that select a group (algo=trpo) are among the choices already.
    group_choices = [f"{k}={v}" for k, v in choices.items() if v is not None and k not in ("hparams_search", "preset")]
    # Hydra records the optional preset's choice even where no such file exists (ppo_kl_cartpole): that is no preset.
    preset = applied_preset(choices, CONF_DIR)
    group_choices.append(f"preset={preset}" if preset else "~preset")
    from omegaconf import DictConfig, OmegaConf

    base = compose_dictconfig(group_choices)
    try:
        merged = OmegaConf.merge(base, saved)
        if not isinstance(merged, DictConfig):
            raise ConfigError(f"resume: the logged config of {run_dir} is not a mapping")
        original_total = int(merged.total_steps)
        if seed is not None:  # one seed of an n_seeds job: that seed alone, as the job trained it
            first, n = int(merged.seed), int(merged.n_seeds)
            if not first <= seed < first + n:
                raise ConfigError(
                    f"resume: {run_dir} is seed {seed}, but its job trained seeds {first}..{first + n - 1}"
                )
            OmegaConf.update(merged, "seed", seed)
            OmegaConf.update(merged, "n_seeds", 1)
        for change in changes:
            key, value = change.lstrip("+~").split("=", 1)
            OmegaConf.update(merged, key, value, force_add=False)  # typed fields convert '20000', 'false'
        if uri is not None:  # the store the run is in, whatever the current directory or $MLFLOW_TRACKING_URI
            OmegaConf.update(merged, "tracking.uri", uri)
    except ConfigError:
        raise
    except Exception as exc:
        from pgcli.config.compose import describe_config_error

        raise ConfigError(
            f"resume: the logged config of {run_dir} does not load: {describe_config_error(exc)}"
        ) from None
    cfg = to_train_config(merged)
    if cfg.total_steps < original_total:
        raise ConfigError(
            f"resume: total_steps={cfg.total_steps} is below the run's {original_total}; it may only grow"
        )

    found = latest_checkpoint(run_dir / "checkpoints")
    if found is None:
        raise ConfigError(
            f"resume: run {run_id or run_dir} has no checkpoint in {run_dir / 'checkpoints'} (checkpoint_every="
            f"{cfg.checkpoint_every}, and it ended before a checkpoint or a clean stop saved one); nothing to "
            "continue from"
        )
    step, checkpoint = found
    if step >= cfg.total_steps:
        raise ConfigError(
            f"resume: the last checkpoint is at step {step:,} and the run asks for total_steps={cfg.total_steps:,}; "
            f"pass total_steps=<more> to train further"
        )
    if cfg.tracking.backend == "mlflow" and run_id is None:
        raise ConfigError(f"resume: {run_dir} has no MLflow run id in {RUN_FILE}; it cannot continue a tracked run")
    return ResumePlan(
        cfg=cfg,
        algo_name=str(choices.get("algo")),
        env_name=env_label(
            cfg.env.id, str(choices.get("env")), CONF_DIR
        ),  # as the run was labelled (pgcli.config.labels)
        preset=preset or "none",
        output_dir=run_dir,
        overrides=original,
        parent_run_id=parent_run_id,
        point=ResumePoint(run_id=run_id, checkpoint=checkpoint, step=step),
        resume_overrides=changes,
    )


def logged_config_dir(run_dir: Path) -> tuple[Path, int | None]:
    """Where a run's Hydra config is: ``<run dir>/.hydra``, or for one seed of an ``n_seeds`` job (its runs are
    ``<job dir>/seed<k>``) the job's ``.hydra`` with that seed ``k``; the seed is None for a run of its own."""
    import re

    match = re.fullmatch(r"seed(\d+)", run_dir.name)
    if not (run_dir / ".hydra").is_dir() and match and (run_dir.parent / ".hydra").is_dir():
        return run_dir.parent / ".hydra", int(match.group(1))
    return run_dir / ".hydra", None


def locate_run(target: str, lookup: list[str]) -> tuple[Path, str | None, str | None, str | None]:
    """``(run dir, MLflow run id, tracking URI, parent run id)`` of a run id or run directory (ids and URI are None
    for a ``tracking=off`` run); the run must not be running."""
    from pgcli.tracking.backend import resolve_tracking_target

    path = Path(target).expanduser()
    if path.is_dir():
        info = read_run_file(path)
        if info is None:
            raise ConfigError(f"resume: {path} is not a pgcli run directory (no readable {RUN_FILE})")
        run_id, uri = info.get("run_id"), info.get("tracking_uri")
        if run_id is None:
            return path.resolve(), None, None, None  # trained with tracking=off
        uri = str(uri)
        store = _open_store(uri)
        record = store.find(str(run_id))
        if record is None:
            raise ConfigError(f"resume: run {run_id} of {path} is not in its store {uri}")
    else:
        uri = resolve_tracking_target(compose_train_config(lookup).tracking).uri
        if not _looks_like_run_id(target):
            raise ConfigError(f"resume: '{target}' is neither a run directory nor an MLflow run id")
        store = _open_store(uri)
        record = store.find(target)
        if record is None:
            raise ConfigError(
                f"resume: no run '{target}' in {uri}; a run from another store needs tracking.uri=<that store> "
                "(or pass its run directory)"
            )
        if "output_dir" not in record.tags:
            raise ConfigError(f"resume: run {target} was not made by pgcli train (no output_dir tag)")
        path = Path(record.tags["output_dir"])
        if not path.is_dir():
            raise ConfigError(f"resume: the run directory of {target} is not on this machine: {path}")
    if record.status == "RUNNING":
        pid, host = record.tags.get("pid", ""), record.tags.get("hostname")
        import socket

        if pid.isdigit() and host == socket.gethostname() and process_alive(int(pid), record.tags.get("pid_start", "")):
            raise ConfigError(f"resume: run {record.run_id} is still running (pid {pid}); stop it first")
    return path.resolve(), record.run_id, uri, record.tags.get("mlflow.parentRunId")


def _open_store(uri: str) -> RunStore:
    from pgcli.tracking.backend import RunStore

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"resume: no tracking store at {uri}")
    return RunStore(uri)


def _looks_like_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _load_yaml(path: Path, target: str) -> DictConfig:
    from omegaconf import DictConfig, OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"resume: {target} has no logged config ({path} is missing)") from None
    except Exception as exc:
        raise ConfigError(f"resume: cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"resume: {path} is not a config mapping")
    return cfg


def resume_command(args: list[str]) -> int:
    """``pgcli train resume=<run> [overrides]``: plan, continue, print the summary."""
    from pgcli.console import print_summary
    from pgcli.hardware.placement import fall_back_when_busy
    from pgcli.training.build import RunContext, train

    targets = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise ConfigError(f"resume: {flags[0]} cannot be combined with resume= (it continues one run)")
    if len(targets) != 1 or not targets[0]:
        raise ConfigError("resume= takes one run id or run directory: pgcli train resume=<run id | run dir>")
    plan = plan_resume(targets[0], [a for a in args if not a.startswith("resume=")])
    ctx = RunContext(
        algo_name=plan.algo_name,
        env_name=plan.env_name,
        preset=plan.preset,
        output_dir=plan.output_dir,
        overrides=plan.overrides,
        parent_run_id=plan.parent_run_id,
        extra_tags={"resumed_from_step": str(plan.point.step), "resume_overrides": " ".join(plan.resume_overrides)},
    )
    print(f"pgcli: resuming {plan.point.run_id or plan.output_dir} from {plan.point.checkpoint} "
          f"(step {plan.point.step:,} of {plan.cfg.total_steps:,})", file=sys.stderr)  # fmt: skip
    summary = train(fall_back_when_busy(plan.cfg), ctx, resume=plan.point)
    print_summary(summary, algo=ctx.algo_name, env=ctx.env_name, seed=plan.cfg.seed)
    return 0
