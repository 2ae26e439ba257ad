"""``pgcli train``: check the whole command line, then hand it to Hydra; and :func:`run_train`, the body of each job.

Hydra has no subcommands and answers bad input with its whole usage or a traceback, so :func:`main` checks first:
flags (accepted anywhere, Hydra's first: :func:`hydra_argv`), ``resume=`` and ``--from-run`` (a run from the past,
:mod:`pgcli.training.resume` / :mod:`pgcli.training.from_run`), the config of every job (:mod:`pgcli.training.checks`),
an Optuna search, where the run will write, and ``init=``. Bad input stops with one line (``pgcli: error: ...``), exit
status 2, before any env or MLflow run exists; only then does Hydra get ``sys.argv``. A sweep's parent MLflow run is
ended here on the paths where Hydra skips its callback: never left RUNNING (docs/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from pgcli.commands.report import debug_requested, report_error, unexpected_error
from pgcli.config.compose import (
    CONF_DIR,
    compose_dictconfig,
    compose_train_config,
    primary_choices,
    to_train_config,
)
from pgcli.errors import ConfigError, PgcliError

if TYPE_CHECKING:
    from hydra.conf import HydraConf
    from omegaconf import DictConfig

    from pgcli.config import TrainConfig
    from pgcli.sweeps.study import TrialLink
    from pgcli.training.build import RunContext

HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "--shell-completion", "-sc")
# Hydra's command-line flags (hydra._internal.utils.get_args_parser): switches, flags with a value (and its choices),
# and --info with an optional value.
HYDRA_SWITCHES = (
    "-h",
    "--help",
    "--hydra-help",
    "--version",
    "--resolve",
    "-r",
    "--run",
    "-m",
    "--multirun",
    "-sc",
    "--shell-completion",
)
CFG_CHOICES = ("job", "hydra", "all")
HYDRA_VALUE_FLAGS: dict[str, tuple[str, ...] | None] = {
    "--cfg": CFG_CHOICES, "-c": CFG_CHOICES, "--package": None, "-p": None, "--config-path": None, "-cp": None,
    "--config-name": None, "-cn": None, "--config-dir": None, "-cd": None, "--experimental-rerun": None,
}  # fmt: skip
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def hydra_argv(args: list[str], command: str = "train") -> list[str]:
    """Hydra's flags first, then the overrides, each in its order; an unknown flag or a bad flag value is a one-line
    error (Hydra's parser prints its whole usage).

    Hydra takes flags only before the first override, so ``pgcli train algo=ppo -m seed=0,1`` would fail there with
    "unrecognized arguments: seed=0,1"; pgcli accepts flags anywhere, as ``--from-run X -m seed=1,2`` needs.
    """
    flags, overrides = split_argv(args, command)
    return [*flags, *overrides]


def split_argv(args: list[str], command: str = "train") -> tuple[list[str], list[str]]:
    """Hydra's flags (each with its value) and the overrides of ``args``, each in its order (:func:`hydra_argv`)."""
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg, nxt = args[i], args[i + 1] if i + 1 < len(args) else ""
        i += 1
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in HYDRA_SWITCHES and not eq:
            flags.append(arg)
            continue
        if name in HYDRA_VALUE_FLAGS:
            value, took_next = _flag_value(name, value if eq else None, nxt, command)
        elif name in ("-i", "--info"):
            name, (value, took_next) = "--info", _info_value(value if eq else None, nxt)
        else:
            raise ConfigError(f"unknown option {arg} for pgcli {command} (see pgcli {command} --help)")
        flags += [name, value]
        i += took_next
    return flags, overrides


def _flag_value(name: str, value: str | None, nxt: str, command: str) -> tuple[str, bool]:
    """The value of a Hydra flag that takes one (``--cfg job``, ``--cfg=job``) and whether it was the next argument."""
    took_next = value is None
    if value is None:
        if not nxt or nxt.startswith("-"):
            raise ConfigError(f"{name} needs a value (see pgcli {command} --help)")
        value = nxt
    choices = HYDRA_VALUE_FLAGS[name]
    if choices is not None and value not in choices:
        raise ConfigError(f"{name} {value}: choose one of {', '.join(choices)}")
    return value, took_next


def _info_value(value: str | None, nxt: str) -> tuple[str, bool]:
    """``--info``'s optional value (Hydra's default ``all``; a bare --info before overrides would take one) and
    whether it was the next argument."""
    if value is not None:
        if value not in INFO_CHOICES:
            raise ConfigError(f"--info={value}: choose one of {', '.join(INFO_CHOICES)}")
        return value or "all", False
    if nxt in INFO_CHOICES:
        return nxt, True
    return "all", False


def main(args: list[str], *, command: str = "train") -> int:
    """Entry point of ``pgcli train`` (and of ``pgcli sft``, ``command="sft"``): ``--help``, ``resume=``, or check
    then run Hydra."""
    if "-h" in args or "--help" in args:
        return print_help(task_overrides(args))
    if any(a in ("-sc", "--shell-completion") for a in args) and not any(a.startswith("query=") for a in args):
        raise ConfigError('shell completion for pgcli is installed with: eval "$(pgcli completion bash)"')
    trained = TrainedRun()
    try:
        if any(a.startswith("resume=") for a in args):
            from pgcli.training.resume import resume_command

            return resume_command(args)
        args = rank_args(args)
        checked, cfg = _checked(args, command=command)
        if cfg is not None and cfg.hardware.processes > 1 and not _launched():
            return _launch(args, cfg, multirun=any(a in ("-m", "--multirun") for a in args))
        return _run_hydra(checked, trained)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: say how the run continues (docs/runs.md)
        print(_interrupted_line(args, trained.run_dir), file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP


@dataclasses.dataclass
class TrainedRun:
    """What the jobs of this process hand back to :func:`main`: the run directory of the run it trains (or last
    trained), which an interrupt continues (None: none started)."""

    run_dir: Path | None = None


def _interrupted_line(args: list[str], run_dir: Path | None) -> str:
    """``pgcli: interrupted``, and the command that continues the interrupted run when it saved a checkpoint."""
    from pgcli.redact import redact_text
    from pgcli.training.console import interrupted_line, lookup_overrides

    if any(a.startswith("resume=") for a in args):  # a resumed run always has a checkpoint: the same command again
        import shlex

        return redact_text(f"pgcli: interrupted; continue the run with: {shlex.join(['pgcli', 'train', *args])}")
    return interrupted_line(run_dir, lookup_overrides(task_overrides(args)))


def rank_args(args: list[str]) -> list[str]:
    """``args`` as a worker of torch.distributed's launcher runs them (``torchrun`` or ``hardware.processes``;
    docs/distributed.md): ``hardware.processes`` is the launcher's ``WORLD_SIZE``, and a rank other than 0 writes no
    run directory (Hydra's goes to a temporary one, removed at exit)."""
    from pgcli.hardware import distributed

    if not distributed.launched():
        return args
    from pgcli.config.overrides import Overrides

    world = distributed.world_size()
    typed = Overrides.parse(task_overrides(args)).value_of("hardware.processes")
    if typed is not None and typed != str(world):
        raise ConfigError(f"hardware.processes={typed} but the launcher started {world} processes (WORLD_SIZE)")
    args = args if typed is not None else [*args, f"hardware.processes={world}"]
    if distributed.is_main():
        return args
    import atexit
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix=f"pgcli-rank{distributed.rank()}-")
    atexit.register(shutil.rmtree, scratch, True)
    own = ("hydra.run.dir=", "hydra.output_subdir=")  # rank 0's run directory is not this rank's
    return [*(a for a in args if not a.startswith(own)), f"hydra.run.dir={scratch}", "hydra.output_subdir=null"]


def _launched() -> bool:
    from pgcli.hardware import distributed

    return distributed.launched()


def _launch(args: list[str], cfg: TrainConfig, *, multirun: bool) -> int:
    """Run ``pgcli train args`` as ``hardware.processes`` workers of torch.distributed's launcher."""
    from pgcli.hardware import distributed

    if multirun:
        raise ConfigError(
            f"hardware.processes={cfg.hardware.processes} runs one job on several processes; a sweep (-m) runs "
            "its jobs with one each"
        )
    return distributed.launch(["train", *args], processes=cfg.hardware.processes, threads=cfg.hardware.torch_threads)


def checked_args(args: list[str], *, command: str = "train") -> list[str]:
    """Hydra's arguments for a ``pgcli train`` command line, once every job it describes has passed the pipeline's
    passes (:mod:`pgcli.training.pipeline`; a one-line ConfigError otherwise): ``--from-run`` resolved, ``init=``'s
    carried-over settings, a text task's implied groups and a stale preset's ``~preset`` added."""
    return _checked(args, command=command)[0]


def _checked(args: list[str], *, command: str = "train") -> tuple[list[str], TrainConfig | None]:
    """:func:`checked_args`, and the checked config of the (last) job (None where no checks ran)."""
    from pgcli.hardware import distributed
    from pgcli.training.from_run import from_run_args, has_from_run, reject_logged_config_dir, split_from_run
    from pgcli.training.pipeline import Preflight, prepare_job

    # an unknown flag is one line now; Hydra gets its flags first (below), wherever they were typed
    hydra_argv(split_from_run(args)[1] if has_from_run(args) else args, command)

    reject_logged_config_dir(args)
    if has_from_run(args):  # the logged run's config, registered in the ConfigStore, under these overrides
        args = from_run_args(args, overrides=task_overrides(args), store_for=_run_store)
    mode = Preflight(
        checks=not any(a in HYDRA_INFO_FLAGS or a.startswith("--info") for a in args),
        writes=not any(a in ("--cfg", "-c") for a in args),  # nothing is written when only the config is printed
        preset_note=True,
        notes=distributed.says_notes(),  # one process of a run on several processes says the notes
        sweep_check=_check_search,
        launcher_checked=distributed.launched_by_pgcli(),  # hardware.processes=N: checked once, by the launcher
    )
    task = task_overrides(args)
    job = prepare_job(task, multirun=any(a in ("-m", "--multirun") for a in args), mode=mode)
    typed = dict(zip(task, job.overrides, strict=False))  # an old algo key renamed in place (pgcli.config.renames)
    args = [*(typed.get(a, a) for a in args), *job.overrides[len(task) :]]  # the passes add overrides at the end
    if "--hydra-help" in args:  # Hydra composes that page without train.yaml: pick pgcli's page here
        args = [*args, "hydra/hydra_help=pgcli"]
    return args, job.cfg


def _check_search(overrides: list[str]) -> None:
    """An Optuna search's checks: settings, search space, the study's budget (imported for ``-m`` only)."""
    from pgcli.sweeps.study import check_search

    check_search(overrides)


def _run_hydra(args: list[str], trained: TrainedRun) -> int:
    """Run the Hydra app on ``args``; 1 when a sweep had failed jobs."""
    for signum in (signal.SIGTERM, signal.SIGHUP):  # `kill` and a closed terminal end the run KILLED, as Ctrl-C does
        signal.signal(signum, _raise_interrupted)
    flags, overrides = split_argv(args)
    if "-m" in flags or "--multirun" in flags:  # the sweep's primary config composes with its first job's groups
        overrides = primary_choices(overrides)
    sys.argv = ["pgcli train", *flags, *overrides]
    from pgcli.sweeps.tree import close_sweep
    from pgcli.training.run import FAILED, FINISHED, KILLED

    # A multirun's parent MLflow run is ended by the sweep callback at multirun end; Hydra skips that hook when the
    # sweeper raises (it re-raises a failed job) or on Ctrl-C, so those paths end it here. Never left RUNNING.
    try:
        _train_app(trained)
    except KeyboardInterrupt as exc:
        if close_sweep(KILLED) is None:
            raise
        # the sweep's summary said what was interrupted and how to finish the sweep (docs/sweeps.md)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    except SystemExit:
        close_sweep(FAILED)
        raise
    outcome = close_sweep(FINISHED)
    return 1 if outcome is not None and not outcome.ok else 0


def _run_store(overrides: list[str]) -> Any:
    from pgcli.tracking.store import open_run_store

    return open_run_store(compose_train_config(overrides).tracking)


def print_help(overrides: list[str], *, command: str = "train", chosen: dict[str, str] | None = None) -> int:
    """Print ``pgcli <command> --help`` (:mod:`pgcli.commands.help`): the groups from conf/ (``chosen``: the options
    the command picks, see :func:`pgcli.commands.help.train_help`) and the config ``overrides`` compose to."""
    from omegaconf import OmegaConf

    from pgcli.commands.help import train_help
    from pgcli.config.presets import stale_preset_overrides
    from pgcli.config.renames import renamed_overrides
    from pgcli.training.checks import check_world

    overrides = renamed_overrides(overrides)
    cfg = compose_dictconfig(overrides + stale_preset_overrides(overrides, multirun=False).overrides)
    check_world(to_train_config(cfg), device=False)  # a bad override gets its one-line error, not a help page
    print(train_help(Path(CONF_DIR), OmegaConf.to_yaml(cfg), command=command, chosen=chosen))
    return 0


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    from pgcli.training.run import Interrupted

    raise Interrupted(signum)


def task_overrides(args: list[str]) -> list[str]:
    """The key=value overrides among Hydra's command-line arguments (flags and their values removed)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in HYDRA_VALUE_FLAGS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        out.append(arg)
    return out


def _train_app(trained: TrainedRun) -> None:
    import hydra

    from pgcli.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
    def train(cfg: DictConfig) -> float:
        return run_train(cfg, trained)

    train()


def run_train(cfg: DictConfig, trained: TrainedRun | None = None) -> float:
    """The body of ``pgcli train`` for one job: validate, train, print the summary; returns the final eval return
    (the mean over the job's seeds); ``trained`` gets the run directory of the run in training. A failure ends this
    job with pgcli's one error line, or, in a sweep, with one line naming the job (its traceback in the job's log) and
    goes to the launcher, which records the failed job while the sweep goes on (:mod:`pgcli.sweeps.failures`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        return _train_job(cfg, hc, multirun=multirun, trained=trained or TrainedRun())
    except Exception as exc:  # Hydra would print it with a traceback; the MLflow run has already ended FAILED
        if multirun:
            _raise_sweep_job_error(exc, hc)  # the launcher records the failed job; the sweep goes on
        if isinstance(exc, PgcliError):
            sys.exit(report_error(exc))
        if debug_requested():
            raise
        sys.exit(report_error(unexpected_error(exc)))


def _raise_sweep_job_error(exc: Exception, hc: HydraConf) -> NoReturn:
    """Raise what a failed sweep job hands its launcher: :class:`~pgcli.sweeps.failures.JobFailed` once the job has
    said so on one line, its traceback in its log; ``exc`` itself for a pruned trial (not a failure) and under
    ``PGCLI_DEBUG=1`` (Hydra prints its traceback)."""
    from pgcli.sweeps.failures import job_failed
    from pgcli.training.run import StoppedEarly

    if isinstance(exc, StoppedEarly) or debug_requested():
        raise exc
    raise job_failed(exc, hc) from None


def _train_job(cfg: DictConfig, hc: HydraConf, *, multirun: bool, trained: TrainedRun) -> float:
    """Train the job's seeds one after another: ``n_seeds > 1`` (a hyperparameter search) runs seeds
    seed..seed+n-1, each its own run under ``<output_dir>/seed<k>``; returns their mean, so a sweeper never optimises
    the seed."""
    from pgcli.redact import redact_hydra_dir
    from pgcli.sweeps.study import TrialLink
    from pgcli.training.build import train
    from pgcli.training.console import print_budget_note, print_summary

    # Jobs of a sweep say which job they are, so the parent's summary can name a failed one.
    sweep_tags = {"sweep_job": str(hc.job.num), "sweep_dir": str(Path(hc.sweep.dir).resolve())} if multirun else {}
    # no credentials in .hydra/*.yaml when they are logged as artifacts (docs/tracking.md, "Credentials and secrets")
    redact_hydra_dir(Path(hc.runtime.output_dir) / ".hydra")
    run_cfg = _placed_config(cfg, hc, multirun=multirun)
    # One trial of an Optuna search (hydra/sweeper=optuna): runs named and tagged by trial number; evaluations
    # reported to the study at the trial's cumulative env steps (seed k after k * total_steps).
    trial = TrialLink.from_job(
        hc.sweeper, n_seeds=run_cfg.n_seeds, total_steps=run_cfg.total_steps, eval_every=run_cfg.eval.every
    )
    if trial is not None:
        sweep_tags["trial"] = str(trial.number)
    returns = []
    for seed in range(run_cfg.seed, run_cfg.seed + run_cfg.n_seeds):
        seed_cfg = dataclasses.replace(run_cfg, seed=seed)
        if not _main_rank():  # a rank other than 0 trains its share and writes nothing
            from pgcli.training.ranks import follow_text

            follow_text(seed_cfg)
            continue
        ctx = _seed_context(hc, run_cfg, seed, trial=trial, sweep_tags=sweep_tags)
        print_budget_note(seed_cfg, list(hc.overrides.task))
        trained.run_dir = ctx.output_dir  # what an interrupt continues
        summary = train(seed_cfg, ctx)

        print_summary(summary, algo=ctx.algo_name, env=ctx.env_name, seed=seed)
        returns.append(summary.final_return)
    return sum(returns) / len(returns) if returns else 0.0


def _main_rank() -> bool:
    from pgcli.hardware import distributed

    return distributed.is_main()


def _placed_config(cfg: DictConfig, hc: HydraConf, *, multirun: bool) -> TrainConfig:
    """The job's checked config, in one process where another process would take a core a job needs."""
    from pgcli.hardware.placement import fall_back_when_busy, one_process, parallel_launcher, uses_second_core
    from pgcli.training.checks import job_config

    run_cfg = job_config(cfg)
    if multirun and parallel_launcher(str(hc.launcher.get("_target_", ""))) and uses_second_core(run_cfg):
        # Parallel jobs share the cores: a busy-waiting env worker would take one from another job. The one-process path
        # gives the same numbers (docs/benchmarks/trpo.md, "On a busy machine: the fallback to one process").
        note = "pgcli: note: a parallel sweep job runs in one process (hardware.vec_env=sync, no evaluation "
        print(
            note + "or critic process): the same results, and the cores stay with the other jobs",
            file=sys.stderr,
            flush=True,
        )
        return one_process(run_cfg)
    return fall_back_when_busy(run_cfg)  # a busy second core: one process, the same numbers


def _seed_context(
    hc: HydraConf, run_cfg: TrainConfig, seed: int, *, trial: TrialLink | None, sweep_tags: dict[str, str]
) -> RunContext:
    """How one seed's run is named, tagged and nested, from Hydra's job record."""
    from pgcli.config.labels import env_label, preset_label
    from pgcli.config.overrides import swept_label
    from pgcli.training.build import RunContext
    from pgcli.training.from_run import source_preset, source_tags
    from pgcli.training.run import PARENT_RUN_ENV, SWEPT_KEYS_ENV

    output_dir = Path(hc.runtime.output_dir)
    return RunContext(
        algo_name=hc.runtime.choices["algo"],
        env_name=env_label(run_cfg.env.id, hc.runtime.choices["env"], CONF_DIR),
        preset=source_preset() or preset_label(hc.runtime.choices, CONF_DIR),  # --from-run: the source's
        output_dir=output_dir if run_cfg.n_seeds == 1 else output_dir / f"seed{seed}",
        overrides=list(hc.overrides.task),
        parent_run_id=os.environ.get(PARENT_RUN_ENV) or None,
        extra_tags=sweep_tags | source_tags(),
        trial=trial.number if trial else None,
        on_eval=trial.reporter(offset=(seed - run_cfg.seed) * run_cfg.total_steps) if trial else None,
        # a grid job named by what it varies (a search trial is named by its number)
        label="" if trial else swept_label(hc.overrides.task, os.environ.get(SWEPT_KEYS_ENV, "").split(",")),
    )
