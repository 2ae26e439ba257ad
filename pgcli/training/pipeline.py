"""How a training job is prepared before anything is created: one ordered list of passes over its overrides, used by
``pgcli train`` (:func:`pgcli.commands.train.checked_args`) and by :func:`pgcli.training.job.run_job` alike.

The passes (:data:`REWRITES`, then :data:`CHECKS`), in order:

1. ``init=<run>`` carry-over: the init run's task settings and model sizes the command line leaves out
   (:func:`init_overrides`, with its ``pgcli: note:`` line); then, likewise, the task settings ``pgcli export``
   recorded in the directory ``model.path`` names (:func:`export_overrides`);
2. the group choices a text task or an image env implies (``env=addition`` adds ``model=tiny_gpt algo=grpo``);
   then an algo key typed under its old name renamed in place (``algo=trpo algo.cg_iters=5`` trains with
   ``algo.cg_max_steps=5``, :func:`pgcli.config.renames.renamed_overrides`, with its ``pgcli: note:`` line);
3. ``~preset`` where ``env.id`` leaves its preset's env (its notice printed once every check passed);
4. every job's config and the world's checks (:func:`pgcli.training.checks.train_config`);
5. a sweep's own checks (``pgcli train -m``: an Optuna search, :func:`pgcli.sweeps.study.check_search`);
6. the tracking store and the run directory (:func:`pgcli.training.preflight.check_train_environment`, on the one
   :class:`~pgcli.training.preflight.StorePlan`);
7. ``init=<run>`` found and fitting (:func:`check_init_overrides`);
8. the references written whole: ``init``, ``env.reward=rm:``, ``model.path``
   (:func:`pgcli.training.references.pin_references`; the errors above quote them as typed);
9. the notices: the dropped preset's, and which preset applies (:func:`preset_note`, ``pgcli train`` only).

Where the two callers differ on purpose it is a field of :class:`Preflight`. A worker of pgcli's own launcher
(``hardware.processes=N``) leaves the checks and notices (:data:`LAUNCHER_CHECKS`) to the launcher, which ran them on
the same command line; a ``torchrun`` rank runs them all. Every failure is one line
(:class:`~pgcli.errors.ConfigError`, exit 2; :class:`~pgcli.errors.PgcliError` for the environment's faults).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from pgcli.config import LMModelConfig, TextEnvConfig, TrainConfig
from pgcli.config.compose import CONF_DIR, compose_train_config, job_overrides, text_task_overrides
from pgcli.config.overrides import Overrides, override_key
from pgcli.config.presets import PresetDrop, stale_preset_overrides
from pgcli.config.renames import renamed_overrides
from pgcli.lm.init import ARCHITECTURE, NOT_CARRIED, InitSource, check_init, source_model
from pgcli.lm.load import TextModelConfig
from pgcli.training.references import locate_init


@dataclass(frozen=True)
class Preflight:
    """Which passes a caller runs: where ``pgcli train`` and :func:`~pgcli.training.job.run_job` differ on purpose."""

    checks: bool = True
    """False: only the passes that add overrides (``--info``, ``--hydra-help``: Hydra prints, nothing runs)."""
    writes: bool = True
    """False: nothing will be written (``--cfg`` prints the config), so the store, run directory and ``init`` are not
    checked and no preset is announced as applied."""
    preset_note: bool = False
    """Print ``pgcli: note: preset <name> applied`` (``pgcli train``; a script's run records its preset itself)."""
    notes: bool = True
    """False: the passes print no note (a rank other than 0, or a worker of pgcli's launcher, which printed them
    before it started the workers: :func:`pgcli.hardware.distributed.says_notes`). Every process of a run completes
    the overrides alike; one of them says what it added or renamed."""
    sweep_check: Callable[[list[str]], None] | None = None
    """A sweep's own check, run with ``multirun`` (``pgcli train -m``: :func:`pgcli.sweeps.study.check_search`)."""
    launcher_checked: bool = False
    """A worker of pgcli's own launcher (``hardware.processes=N``:
    :func:`pgcli.hardware.distributed.launched_by_pgcli`): the launcher ran every check on this command line, and
    printed the notices, before it started the workers, so a worker runs only the passes that complete the overrides
    (:data:`LAUNCHER_CHECKS` are left out). A ``torchrun`` rank has no launcher of pgcli's before it: it checks."""


@dataclass
class JobDraft:
    """A job's overrides as the passes leave them, and what the passes found."""

    overrides: list[str]
    """The command line's ``key=value`` overrides (an old algo key renamed in place), with those the passes add at
    the end."""
    multirun: bool = False
    """``-m``: the overrides describe a sweep (each of its jobs is checked)."""
    output_dir: Path | None = None
    """The run directory a caller chose (None: Hydra's ``hydra.run.dir`` / ``hydra.sweep.dir``)."""
    mode: Preflight = field(default_factory=Preflight)
    cfg: TrainConfig | None = None
    """The checked config of the (last) job, once :func:`check_jobs` ran."""
    preset_drop: PresetDrop = field(default_factory=PresetDrop)

    def add(self, overrides: list[str]) -> None:
        self.overrides = [*self.overrides, *overrides]


def carry_init(job: JobDraft) -> None:
    job.add(init_overrides(job.overrides))


def carry_export(job: JobDraft) -> None:
    job.add(export_overrides(job.overrides))


def imply_groups(job: JobDraft) -> None:
    job.add(text_task_overrides(job.overrides))


def rename_old_keys(job: JobDraft) -> None:
    job.overrides = renamed_overrides(job.overrides)


def drop_stale_preset(job: JobDraft) -> None:
    job.preset_drop = stale_preset_overrides(job.overrides, multirun=job.multirun)
    job.add(job.preset_drop.overrides)


def check_jobs(job: JobDraft) -> None:
    """Compose and check every job of a sweep (a bad value in the fourth stops it before the first starts)."""
    from pgcli.training.checks import train_config

    for overrides in job_overrides(job.overrides, multirun=job.multirun):
        job.cfg = train_config(overrides)


def check_sweep(job: JobDraft) -> None:
    if job.multirun and job.mode.sweep_check is not None:
        job.mode.sweep_check(job.overrides)


def check_store(job: JobDraft) -> None:
    if job.mode.writes:  # preflight is imported only where it checks (pgcli train --cfg job writes nothing)
        from pgcli.training.preflight import check_train_environment, plan_from_overrides

        plan = plan_from_overrides(job.overrides, multirun=job.multirun, output_dir=job.output_dir)
        check_train_environment(plan)


def check_init_source(job: JobDraft) -> None:
    if job.mode.writes:
        check_init_overrides(job.overrides)


def pin(job: JobDraft) -> None:
    """The references as the run records them (:func:`~pgcli.training.references.pin_references`), resolved as the
    checks resolved them; the checked config follows (a launched worker, which checked none, composes the tracking
    settings only where a reference is typed)."""
    from pgcli.training.references import PINNED_KEYS, pin_references

    if not job.mode.writes or not any(override_key(o) in PINNED_KEYS for o in job.overrides):
        return
    last = job_overrides(job.overrides, multirun=job.multirun)[-1]
    pinned = pin_references(job.overrides, (job.cfg or compose_train_config(last)).tracking)
    if pinned != job.overrides:
        job.overrides = pinned
        if job.cfg is not None:
            job.cfg = compose_train_config(job_overrides(pinned, multirun=job.multirun)[-1])


def announce(job: JobDraft) -> None:
    """The notices, once every check passed (an error stays the only line)."""
    job.preset_drop.announce()
    if job.mode.writes and job.mode.preset_note and job.mode.notes:
        note = preset_note(job.overrides, multirun=job.multirun)
        if note:
            print(note, file=sys.stderr, flush=True)


REWRITES: tuple[Callable[[JobDraft], None], ...] = (carry_init, carry_export, imply_groups, rename_old_keys)
"""The passes that add the overrides a command line implies and rename the old keys it types."""
CHECKS: tuple[Callable[[JobDraft], None], ...] = (
    drop_stale_preset,
    check_jobs,
    check_sweep,
    check_store,
    check_init_source,
    pin,
    announce,
)
"""The passes that check the job (and drop a stale preset) before anything is created."""
LAUNCHER_CHECKS = frozenset({check_jobs, check_sweep, check_store, check_init_source, announce})
"""The passes a worker of pgcli's own launcher leaves to the launcher, which ran them on the same command line
(:attr:`Preflight.launcher_checked`); the others complete the overrides, so every process runs them."""


def prepare_job(
    overrides: list[str], *, multirun: bool = False, output_dir: Path | None = None, mode: Preflight | None = None
) -> JobDraft:
    """Run the passes (module docstring) over ``overrides``; returns the job with its overrides completed."""
    job = JobDraft(list(overrides), multirun=multirun, output_dir=output_dir, mode=mode or Preflight())
    # the passes' notes are plain lines on stderr (init carry-over, renamed keys, the preset): held back where
    # another process of the run says them; errors are exceptions, raised whatever the mode
    with contextlib.nullcontext() if job.mode.notes else contextlib.redirect_stderr(io.StringIO()):
        for step in (*REWRITES, *(CHECKS if job.mode.checks else ())):
            if not (job.mode.launcher_checked and step in LAUNCHER_CHECKS):
                step(job)
    return job


def preset_note(overrides: list[str], *, multirun: bool) -> str | None:
    """The line a command starts with when a preset applies (docs/configuration.md: presets apply automatically, so
    a user should see which did): ``pgcli: note: preset ppo_cartpole applied (...)``; once for a whole sweep, with
    how many of its jobs each preset reaches. None when no job gets one (``~preset``, no preset for the pair,
    ``--from-run``: the logged run's values)."""
    from collections import Counter

    from pgcli.config.compose import hydra_compose
    from pgcli.config.labels import applied_preset

    jobs = job_overrides(overrides, multirun=multirun)
    by_groups: dict[tuple[str, ...], list[list[str]]] = {}  # the group choices alone decide the preset
    for job in jobs:
        by_groups.setdefault(tuple(o for o in job if "." not in override_key(o)), []).append(job)
    applied: Counter[str] = Counter()
    for same in by_groups.values():
        preset = applied_preset(hydra_compose(same[0], hydra_node=True).hydra.runtime.choices, CONF_DIR)
        if preset is not None:
            applied[preset] += len(same)
    if not applied:
        return None
    where = "conf/preset/<name>.yaml; ~preset trains without them"
    if len(applied) > 1:
        names = ", ".join(f"{name} ({n} of {len(jobs)} jobs)" for name, n in sorted(applied.items()))
        return f"pgcli: note: presets {names} applied ({where})"
    ((name, n),) = applied.items()
    some = f" to {n} of {len(jobs)} jobs" if n < len(jobs) else ""
    return f"pgcli: note: preset {name} applied{some} (conf/preset/{name}.yaml; ~preset trains without it)"


def check_init_overrides(overrides: list[str]) -> None:
    """``pgcli train``'s check of ``init=<run>`` before Hydra or MLflow create anything: the source exists and fits.

    Only an ``init`` given as one value is checked here (a sweep over ``init`` is checked by each job when it builds).
    """
    parsed = Overrides.parse(overrides)
    if not parsed.is_fixed("init"):
        return
    cfg = compose_train_config(parsed.fixed())
    if cfg.init is None or not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, TextModelConfig):
        return
    check_init(locate_init(cfg.init, cfg.tracking), cfg.env, cfg.model, cfg.init, cfg.algo)


def init_overrides(overrides: list[str]) -> list[str]:
    """The overrides ``pgcli train`` adds for ``init=<run>``: the source's task settings (``env.*`` but the task and
    its reward) and model sizes (:data:`~pgcli.lm.init.ARCHITECTURE`), each where it differs from what the command
    line composes to and the command line does not set it; announced in one ``pgcli: note:`` line on stderr.

    A 2-digit SFT model thus trains 2-digit addition unless ``env.n_digits`` is typed. The resulting config is checked
    against the source (:func:`~pgcli.lm.init.check_init`) and the world (:func:`pgcli.training.checks.check_world`)
    first, so a setting the weights cannot take is one ConfigError and no note. Nothing is added for an ``init`` swept
    over (each job checks its own) or under ``--from-run`` (the logged run's values stand).
    """
    if not any(override_key(o) == "init" for o in overrides):
        return []  # no init= typed: nothing to parse or import (every `pgcli train` passes here)
    from pgcli.training.checks import check_world
    from pgcli.training.from_run import FROM_RUN_GROUP

    parsed = Overrides.parse(overrides)
    typed = parsed.keys()
    if not parsed.is_fixed("init") or FROM_RUN_GROUP in typed:
        return []
    lines = parsed.fixed()
    cfg = compose_train_config(lines)
    if cfg.init is None or not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, TextModelConfig):
        return []
    init = cfg.init
    source = locate_init(init, cfg.tracking)
    carried = _model_choice(source, typed) + _differing(source, cfg.env, cfg.model, typed)
    if carried:
        cfg = compose_train_config([*lines, *carried])
    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # the same groups as above
    check_init(source, cfg.env, cfg.model, init, cfg.algo)
    check_world(cfg, device=False)
    if carried:
        print(
            f"pgcli: note: init={init} sets {' '.join(carried)} (the init run's model and task settings; "
            "a value on the command line wins)",
            file=sys.stderr,
            flush=True,
        )
    return carried


def export_overrides(overrides: list[str]) -> list[str]:
    """The task settings ``pgcli export`` recorded in the directory ``model.path`` names (``pgcli_task.json``), each
    where it differs from what the command line composes to and the command line does not set it, announced as
    :func:`init_overrides` announces its own: an export of a 2-digit SFT run trains 2-digit addition. Only for the
    task the export was trained on, and not with ``init=`` (whose own settings apply) or ``--from-run``."""
    if not any(override_key(o) == "model.path" for o in overrides):
        return []  # no model.path typed: nothing to read (every `pgcli train` passes here)
    from pgcli.config.saved_agent import read_export_task
    from pgcli.training.from_run import FROM_RUN_GROUP

    parsed = Overrides.parse(overrides)
    typed = parsed.keys()
    if not parsed.is_fixed("model.path") or "init" in typed or FROM_RUN_GROUP in typed:
        return []
    path = parsed.value_of("model.path") or ""
    record = read_export_task(Path(path).expanduser())
    if record is None:
        return []
    cfg = compose_train_config(parsed.fixed())
    if not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, TextModelConfig):
        return []
    if cfg.env.id != record.get("config", {}).get("env", {}).get("id"):
        return []  # another task: the export's settings are not this task's
    source = InitSource(Path(path), record, record.get("source_run_id"))
    shared = {f"env.{f.name}" for f in fields(TextEnvConfig)}
    carried = sorted(_differing(source, cfg.env, cfg.model, typed), key=lambda o: override_key(o) in shared)
    if carried:  # the task's own settings (n_digits) first
        print(
            f"pgcli: note: model.path={path} sets {' '.join(carried)} (the exported run's task settings; "
            "a value on the command line wins)",
            file=sys.stderr,
            flush=True,
        )
    return carried


def _model_choice(source: InitSource, typed: set[str]) -> list[str]:
    """``model=hf model.path=<base>`` for a source fine-tuned from a Hugging Face model, unless ``model`` is typed (a
    text task implies ``model=tiny_gpt`` otherwise)."""
    kind, src_model = source_model(source)
    if kind != "hf" or "model" in typed:
        return []
    return ["model=hf", *([] if "model.path" in typed else [f"model.path={src_model.get('path')}"])]


def _differing(source: InitSource, env: TextEnvConfig, model: TextModelConfig, typed: set[str]) -> list[str]:
    """``key=value`` for each of the source's task settings and model sizes that differs from ``env`` and ``model``
    and is not among the ``typed`` keys."""
    logged = source.spec.get("config", {})
    ours = {"env": asdict(env), "model": asdict(model)}
    sizes = set(ARCHITECTURE) if isinstance(model, LMModelConfig) else set()
    wanted = {"env": set(ours["env"]) - set(NOT_CARRIED), "model": sizes}
    return [
        f"{group}.{key}={value}"
        for group in ("env", "model")
        for key, value in logged.get(group, {}).items()
        if key in wanted[group]
        and f"{group}.{key}" not in typed
        and isinstance(value, int)
        and value != ours[group][key]
    ]
