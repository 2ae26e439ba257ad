"""``pgcli train resume=<run id | run dir>``: continue a run from its last checkpoint, in the same MLflow run.

Everything is checked before anything changes (docs/runs.md, "Resume"): the run is found
(:class:`pgcli.training.logged.LoggedRun`: in the store named by ``tracking.uri`` / ``tracking.store_dir`` for a run
id, or through ``<run dir>/run.json``), its config is read back from ``<run dir>/.hydra/``, the overrides are checked
against :data:`RESUME_OVERRIDES`, and the newest good checkpoint is chosen (:func:`resume_point`: a
``<run dir>/checkpoints/step_<N>``, or the final ``model/`` when it is newer; damaged ones are passed over).
:class:`pgcli.training.run.Run` then loads the checkpoint and only then re-opens the MLflow run (RUNNING again, then
FINISHED / FAILED / KILLED like any run).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pgcli.config import TrainConfig
from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.config.labels import applied_preset, env_label
from pgcli.config.overrides import override_key
from pgcli.config.renames import renamed_overrides
from pgcli.errors import ConfigError
from pgcli.hardware import distributed
from pgcli.tracking.status import FINISHED
from pgcli.training.checkpoints import checkpoints_dir, newest_resumable
from pgcli.training.checks import check_world
from pgcli.training.logged import LoggedRun, Wording
from pgcli.training.owner import check_one_writer, claim_run, release_run
from pgcli.training.references import PINNED_KEYS, pin_references, recorded_references
from pgcli.training.run import RUN_FILE, ResumePoint, read_run_file

log = logging.getLogger("pgcli")

if TYPE_CHECKING:
    from pgcli.tracking.store import RunStore

RESUME_OVERRIDES = (
    "total_steps",
    "progress",
    "checkpoint_every",
    "checkpoint_keep",
    "hardware.torch_threads",
    "tracking.flush_every_s",
)
"""The only keys a resume may change: none of them changes what is learned or what the logged curves mean.
``total_steps`` may only grow. Everything else (``eval.*`` included: evaluation shares the run's RNG streams and its
curve must stay comparable) is an error; ``pgcli train --from-run`` starts a new run with other values."""
LOOKUP_OVERRIDES = ("tracking.uri", "tracking.store_dir")
"""Where to look a run id up (as for ``pgcli compare``); they cannot move the run to another store."""
RESUME = Wording(
    not_a_run="resume: '{ref}' is neither a run directory nor an MLflow run id (32 hex digits, or a unique prefix of "
    "at least 8)",
    no_store="resume: tracking=off has no run store to find '{ref}' in; pass its run directory",
    not_found="resume: no run '{ref}' in {uri}; a run from another store needs tracking.uri=<that store> (or pass "
    "its run directory)",
    doing="resume",
)


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
    lookup = [o for o in _checked_syntax(overrides) if override_key(o) in LOOKUP_OVERRIDES]
    run = locate_run(target, lookup)
    assert run.run_dir is not None  # locate_run found it on this machine
    logged = run.logged_config(context="resume: ")
    # the run's own overrides, repeated as they were (the command that started it, with resume= added), change nothing
    # (an old algo key in either is read under its new name: pgcli.config.renames)
    # The store the run is in, whatever the current directory or $MLFLOW_TRACKING_URI.
    uri = [f"tracking.uri={run.store.uri}"] if run.store is not None else []
    repeated = _as_recorded(renamed_overrides(overrides, [logged.algo]), logged.overrides, logged.train_config(uri))
    changes = resume_changes([o for o in repeated if o not in logged.overrides])
    # init= and rm: as the run found them (their whole id and directory), not looked up again as typed
    recorded = recorded_references(run.record.tags) if run.record is not None else []
    cfg = check_world(logged.train_config([*changes, *uri, *recorded], context="resume: "))
    original_total = int(logged.values["total_steps"])
    if cfg.total_steps < original_total:
        raise ConfigError(
            f"resume: total_steps={cfg.total_steps} is below the run's {original_total}; it may only grow"
        )
    if cfg.tracking.backend == "mlflow" and run.run_id is None:
        raise ConfigError(f"resume: {run.run_dir} has no MLflow run id in {RUN_FILE}; it cannot continue a tracked run")
    return ResumePlan(
        cfg=cfg,
        algo_name=logged.algo,
        env_name=env_label(cfg.env.id, logged.env, CONF_DIR),  # as the run was labelled (pgcli.config.labels)
        # Hydra records the optional preset's choice even where no such file exists (ppo_kl_cartpole): no preset.
        preset=applied_preset(logged.choices, CONF_DIR) or "none",
        output_dir=run.run_dir,
        overrides=logged.overrides,
        parent_run_id=run.record.tags.get("mlflow.parentRunId") if run.record is not None else None,
        point=resume_point(run, cfg),
        resume_overrides=changes,
    )


def _as_recorded(overrides: list[str], recorded: list[str], cfg: TrainConfig) -> list[str]:
    """``overrides`` with a reference typed again as the run was started (``init=<prefix>``) in the whole form the
    run recorded it (:func:`~pgcli.training.references.pin_references`), so repeating the command changes nothing."""
    typed = [o for o in overrides if o not in recorded and override_key(o) in PINNED_KEYS]
    if not typed:
        return overrides
    whole = dict(zip(typed, pin_references(typed, cfg.tracking), strict=True))
    return [whole.get(o, o) for o in overrides]


def _checked_syntax(overrides: list[str]) -> list[str]:
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"resume takes key=value overrides, got '{override}'")
    return overrides


def resume_changes(overrides: list[str]) -> list[str]:
    """The overrides a run continues with (``RESUME_OVERRIDES``); lookup overrides are left out, and any other key is
    a one-line error (it would change the experiment)."""
    for override in _checked_syntax(overrides):
        key = override_key(override)
        if key not in RESUME_OVERRIDES + LOOKUP_OVERRIDES:
            raise ConfigError(
                f"resume: '{key}' cannot change when a run continues (it changes the experiment); allowed: "
                f"{', '.join(RESUME_OVERRIDES)}; to train with other values start a new run"
            )
    return [o for o in overrides if override_key(o) in RESUME_OVERRIDES]


def resume_point(run: LoggedRun, cfg: TrainConfig) -> ResumePoint:
    """Where the run continues: its newest checkpoint that passes :func:`~pgcli.training.checkpoints.checkpoint_fault`
    (:func:`~pgcli.training.checkpoints.newest_resumable`), which must be short of ``cfg.total_steps`` unless the run
    did not end FINISHED (:func:`ended_finished`: then the resume is its ending). The newer ones that do not pass are
    named in :attr:`ResumePoint.skipped`; when none passes, a one-line PgcliError names the newest and why."""
    assert run.run_dir is not None
    found = newest_resumable(run.run_dir)
    if found is None:
        raise ConfigError(
            f"resume: run {run.run_id or run.run_dir} has no checkpoint in {checkpoints_dir(run.run_dir)} "
            f"(checkpoint_every={cfg.checkpoint_every}, and it ended before a checkpoint or a clean stop saved one); "
            "nothing to continue from"
        )
    step, checkpoint, skipped = found
    if step >= cfg.total_steps and ended_finished(run):
        raise ConfigError(
            f"resume: the last checkpoint is at step {step:,} and the run asks for total_steps={cfg.total_steps:,}; "
            f"pass total_steps=<more> to train further"
        )
    skipped_lines = tuple(f"{path}: {fault}" for path, fault in skipped)
    return ResumePoint(run_id=run.run_id, checkpoint=checkpoint, step=step, skipped=skipped_lines)


def ended_finished(run: LoggedRun) -> bool:
    """Whether the run ended FINISHED: its MLflow record says so, or for a ``tracking=off`` run its ``run.json``. A
    run killed after its last checkpoint at the budget (SIGKILL in the final evaluation: still RUNNING, or KILLED by
    ``pgcli runs --stale``) did not, and a resume takes it through its ending (issue 34)."""
    if run.record is not None:
        return run.record.status == FINISHED
    assert run.run_dir is not None
    info = read_run_file(run.run_dir) or {}
    return info.get("status") == FINISHED


def locate_run(target: str, lookup: list[str]) -> LoggedRun:
    """The run ``target`` names (:class:`LoggedRun`), its run directory resolved, with its record and store (both
    None for a ``tracking=off`` run); the run must be on this machine and not running.

    A run id (or a unique prefix of one, as ``pgcli runs`` shows it) is looked up in the store ``lookup`` names; a run
    directory's record is the one its ``run.json`` names, in the store ``run.json`` names. From here on the run is
    named by its whole id.
    """
    from pgcli.tracking.store import RunStore
    from pgcli.tracking.uri import resolve_tracking_target

    def lookup_store() -> RunStore:
        return RunStore(resolve_tracking_target(compose_train_config(lookup).tracking).uri)  # checked by locate

    run = LoggedRun.locate(target, store=lookup_store, wording=RESUME)
    if run.record is None:
        run = _with_own_record(run)
    elif "output_dir" not in run.record.tags:
        raise ConfigError(f"resume: run {run.record.run_id} was not made by pgcli train (no output_dir tag)")
    elif run.run_dir is None:
        raise ConfigError(
            f"resume: the run directory of {run.record.run_id} is not on this machine: {run.record.tags['output_dir']}"
        )
    assert run.run_dir is not None
    run_dir = run.run_dir.resolve()
    # one writer per run (docs/runs.md): not while a live process writes it, here or on another host
    check_one_writer(run_dir, f"resume: run {run.run_id or run_dir}", run.record)
    return replace(run, run_dir=run_dir)


def _with_own_record(run: LoggedRun) -> LoggedRun:
    """A run directory's run: the one its ``run.json`` names, in the store ``run.json`` names."""
    from pgcli.tracking.checks import check_store
    from pgcli.tracking.store import RunStore

    info = run.run_file()
    if info is None:
        raise ConfigError(f"resume: {run.run_dir} is not a pgcli run directory (no readable {RUN_FILE})")
    run_id, uri = info.get("run_id"), info.get("tracking_uri")
    if run_id is None:
        return run  # trained with tracking=off
    check_store(str(uri), "read", doing="resume")  # a one-line error before MLflow opens (and creates) a store
    store = RunStore(str(uri))
    record = store.find(str(run_id))
    if record is None:
        raise ConfigError(f"resume: run {run_id} of {run.run_dir} is not in its store {uri}")
    return replace(run, record=record, store=store)


def resume_tags(plan: ResumePlan) -> dict[str, str]:
    """What the re-opened run is tagged with: where it resumed, with which overrides, and its budget now. MLflow
    params cannot change, so the ``total_steps`` param keeps the budget the run started with; the ``total_steps``
    tag is the one it trains to, and ``pgcli compare`` groups the run by it (docs/runs.md, "Resume")."""
    return {
        "resumed_from_step": str(plan.point.step),
        "resume_overrides": " ".join(plan.resume_overrides),
        "total_steps": str(plan.cfg.total_steps),
    }


@contextmanager
def appended_run_log(output_dir: Path) -> Iterator[None]:
    """The resumed run's log lines (notes, evaluations, the summary) appended to its ``train.log``, as Hydra's job
    logging writes them for a new run (conf/hydra/job_logging/pgcli.yaml); a resume does not go through Hydra."""
    handler = logging.FileHandler(output_dir / "train.log", mode="a", encoding="utf-8")
    import yaml

    job_logging = yaml.safe_load((Path(CONF_DIR) / "hydra" / "job_logging" / "pgcli.yaml").read_text())
    handler.setFormatter(logging.Formatter(job_logging["formatters"]["simple"]["format"]))  # a new run's line format
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def distributed_resume(args: list[str], cfg: TrainConfig) -> int | None:
    """A run on N processes resumes on N (docs/distributed.md): from the command line, the N workers' exit status; in
    a worker other than rank 0, its share trained; in rank 0, None (it resumes the run as one process would)."""
    from pgcli.training.ranks import follow_text

    n = cfg.hardware.processes
    if not distributed.launched():
        return distributed.launch(["train", *args], processes=n, threads=cfg.hardware.torch_threads)
    if distributed.world_size() != n:
        raise ConfigError(
            f"resume: the run trained on hardware.processes={n}; the launcher started {distributed.world_size()}"
        )
    if distributed.is_main():
        return None
    follow_text(cfg)
    return 0


def resume_command(args: list[str]) -> int:
    """``pgcli train resume=<run> [overrides]``: plan, continue, print the summary."""
    from pgcli.hardware.placement import fall_back_when_busy
    from pgcli.training.build import RunContext, train
    from pgcli.training.console import print_summary

    targets = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise ConfigError(f"resume: {flags[0]} cannot be combined with resume= (it continues one run)")
    if len(targets) != 1 or not targets[0]:
        raise ConfigError("resume= takes one run id or run directory: pgcli train resume=<run id | run dir>")
    plan = plan_resume(targets[0], [a for a in args if not a.startswith("resume=")])
    if plan.cfg.hardware.processes > 1 or distributed.launched():  # continues on as many processes as it ran on
        ranks = distributed_resume(args, plan.cfg)
        if ranks is not None:
            return ranks
    ctx = RunContext(
        algo_name=plan.algo_name,
        env_name=plan.env_name,
        preset=plan.preset,
        output_dir=plan.output_dir,
        overrides=plan.overrides,
        parent_run_id=plan.parent_run_id,
        extra_tags=resume_tags(plan),
    )
    # claimed before the first line: a second resume of the run started at the same time is refused in one line
    claim_run(plan.output_dir, f"resume: run {plan.point.run_id or plan.output_dir}")
    try:
        with appended_run_log(plan.output_dir):
            for skipped in plan.point.skipped:
                print(f"pgcli: note: skipped checkpoint {skipped}", file=sys.stderr)
            resuming = (
                f"resuming {plan.point.run_id or plan.output_dir} from {plan.point.checkpoint} "
                f"(step {plan.point.step:,} of {plan.cfg.total_steps:,})"
            )
            if plan.point.step >= plan.cfg.total_steps:  # killed after its last update: only its ending is left
                resuming += "; training is done, the run ends: the final evaluation, the model and the reports"
            print(f"pgcli: {resuming}", file=sys.stderr)
            log.info(resuming)
            summary = train(fall_back_when_busy(plan.cfg), ctx, resume=plan.point)
            print_summary(summary, algo=ctx.algo_name, env=ctx.env_name, seed=plan.cfg.seed)
    finally:
        release_run(plan.output_dir)
    return 0
