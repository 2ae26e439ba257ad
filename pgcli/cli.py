"""``pgcli <command>``: a small dispatcher in front of the ``@hydra.main`` functions.

Hydra has no subcommands, so :func:`main` picks the command, validates the overrides (composing the config with
Hydra's compose API and building the typed schemas) and only then hands ``sys.argv`` to Hydra. Bad input therefore
stops with one line (``pgcli: error: ...``), exit status 2, before any env or MLflow run exists. Heavy modules (torch,
SB3, MLflow) are imported only by the commands that need them, so ``pgcli --help`` answers fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pgcli
from pgcli.config.compose import (
    CONF_DIR,
    compose_dictconfig,
    compose_train_config,
    text_task_overrides,
    to_train_config,
    validate_overrides,
)
from pgcli.errors import ConfigError, PgcliError

if TYPE_CHECKING:
    from omegaconf import DictConfig

USAGE = f"""\
pgcli {pgcli.__version__}: train, sweep and compare policy-gradient agents (Hydra configs, MLflow tracking).

usage: pgcli <command> [options] [key=value ...]

commands:
  train      train one agent, or a sweep with -m        pgcli train algo=trpo env=hopper seed=1
  sft        supervised warm start on a text task        pgcli sft env=addition total_steps=200000
  eval       score a trained agent (and record video)    pgcli eval <run id | run dir> --video
  compare    aggregate runs across seeds (table + plot)  pgcli compare --experiment cartpole
  ui         open the MLflow UI on the run store          pgcli ui
  runs       list runs; mark crashed ones KILLED          pgcli runs --stale
  sync       deliver a run's writes spooled in an outage  pgcli sync <run dir>
  completion print the bash completion script            eval "$(pgcli completion bash)"

examples:
  pgcli train                                       # PPO on CartPole, ~1 minute, tracked in outputs/mlflow.db
  pgcli train algo=a2c env=pendulum total_steps=50000
  pgcli train -m algo=ppo,trpo env=cartpole seed=0,1,2
  pgcli train --cfg job algo=trpo env=hopper        # print the composed config, do not train
  pgcli train resume=<run id | run dir>             # continue a run from its last checkpoint
  pgcli train --from-run <run id> seed=1            # a logged run's exact config again, overrides on top
  pgcli train --help                                # config groups and their options

options:
  -h, --help     show this message
  --version      print the version
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgcli`` console script."""
    try:
        return _main(argv)
    except BrokenPipeError:  # `pgcli train --help | head`: the reader left early; stop quietly, as `cat` would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 128 + signal.SIGPIPE
    except Exception as exc:  # a bug or an unforeseen fault: one line, the traceback only when asked for
        if debug_requested():
            raise
        return _fail(unexpected_error(exc))


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] == "--version":
        print(f"pgcli {pgcli.__version__}")
        return 0
    command, rest = args[0], args[1:]
    commands = _commands()
    if command not in commands:
        close = difflib.get_close_matches(command, commands, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return _fail(ConfigError(f"unknown command '{command}' (commands: {', '.join(commands)}){hint}"))
    try:
        return commands[command](rest)
    except PgcliError as exc:
        return _fail(exc)
    except KeyboardInterrupt as exc:
        print("pgcli: interrupted", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP


def _fail(exc: PgcliError) -> int:
    from pgcli.redact import redact_text

    print(f"pgcli: error: {redact_text(str(exc))}", file=sys.stderr)
    return exc.exit_code


def debug_requested() -> bool:
    """``PGCLI_DEBUG=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``): show tracebacks instead of one-line errors."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("PGCLI_DEBUG", "HYDRA_FULL_ERROR"))


def unexpected_error(exc: BaseException) -> PgcliError:
    """An exception pgcli did not foresee as a one-line PgcliError (exit 1) naming its type and first line."""
    lines = str(exc).strip().splitlines()
    return PgcliError(f"{type(exc).__name__}: {lines[0] if lines else ''} (PGCLI_DEBUG=1 for the traceback)")


# --------------------------------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------------------------------

HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "--shell-completion", "-sc")
# Hydra's command-line flags (hydra._internal.utils.get_args_parser): switches, flags with a value (and its choices),
# and --info with an optional value.
HYDRA_SWITCHES = ("-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run", "-m", "--multirun",
                  "-sc", "--shell-completion")  # fmt: skip
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
        elif name in HYDRA_VALUE_FLAGS:
            if not eq:
                if not nxt or nxt.startswith("-"):
                    raise ConfigError(f"{name} needs a value (see pgcli {command} --help)")
                value, i = nxt, i + 1
            choices = HYDRA_VALUE_FLAGS[name]
            if choices is not None and value not in choices:
                raise ConfigError(f"{name} {value}: choose one of {', '.join(choices)}")
            flags += [name, value]
        elif name in ("-i", "--info"):
            if eq and value not in INFO_CHOICES:
                raise ConfigError(f"--info={value}: choose one of {', '.join(INFO_CHOICES)}")
            if not eq and nxt in INFO_CHOICES:  # its optional value
                value, i = nxt, i + 1
            flags += ["--info", value or "all"]  # Hydra's default; a bare --info before overrides would take one
        else:
            raise ConfigError(f"unknown option {arg} for pgcli {command} (see pgcli {command} --help)")
    return [*flags, *overrides]


def _train_command(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        return _train_help(_task_overrides(args))
    if any(a in ("-sc", "--shell-completion") for a in args) and not any(a.startswith("query=") for a in args):
        raise ConfigError('shell completion for pgcli is installed with: eval "$(pgcli completion bash)"')
    if any(a.startswith("resume=") for a in args):
        from pgcli.training.resume import resume_command

        return resume_command(args)
    from pgcli.training.rerun import from_run_args, has_from_run, reject_logged_config_dir, split_from_run

    # an unknown flag is one line now; Hydra gets its flags first (below), wherever they were typed
    hydra_argv(split_from_run(args)[1] if has_from_run(args) else args, "sft" if args[:1] == ["algo=sft"] else "train")

    reject_logged_config_dir(args)
    if has_from_run(args):  # the logged run's config, registered in the ConfigStore, under these overrides
        args = from_run_args(args, overrides=_task_overrides(args), store_for=_run_store)
    args = [*args, *text_task_overrides(_task_overrides(args))]  # env=addition implies model=tiny_gpt, algo=grpo
    if not any(a in HYDRA_INFO_FLAGS or a.startswith("--info") for a in args):
        from pgcli.config.labels import stale_preset_overrides

        multirun = any(a in ("-m", "--multirun") for a in args)
        preset_drop = stale_preset_overrides(_task_overrides(args), multirun=multirun, conf_dir=CONF_DIR)
        args = [*args, *preset_drop.overrides]
        validate_overrides(_task_overrides(args), multirun=multirun)
        if multirun:
            from pgcli.sweeps.study import check_search

            check_search(_task_overrides(args))  # an Optuna search: settings, search space, the study's budget
        if not any(a in ("--cfg", "-c") for a in args):  # nothing is written when only the config is printed
            from pgcli.training.preflight import check_train_environment, plan_from_overrides

            check_train_environment(plan_from_overrides(_task_overrides(args), multirun=multirun))
            from pgcli.lm.init import check_init_overrides

            check_init_overrides(_task_overrides(args))  # init=<SFT run>: found and fitting, before anything starts
        preset_drop.announce()
    if "--hydra-help" in args:  # Hydra composes that page without train.yaml: pick pgcli's page here
        args = [*args, "hydra/hydra_help=pgcli"]
    for signum in (signal.SIGTERM, signal.SIGHUP):  # `kill` and a closed terminal end the run KILLED, as Ctrl-C does
        signal.signal(signum, _raise_interrupted)
    sys.argv = ["pgcli train", *hydra_argv(args)]
    from pgcli.sweeps.tree import close_sweep
    from pgcli.training.run import FAILED, FINISHED, KILLED

    # A multirun's parent MLflow run is ended by the sweep callback at multirun end; Hydra skips that hook when the
    # sweeper raises (it re-raises a failed job) or on Ctrl-C, so those paths end it here. Never left RUNNING.
    try:
        _train_app()
    except KeyboardInterrupt:
        close_sweep(KILLED)
        raise
    except SystemExit:
        close_sweep(FAILED)
        raise
    outcome = close_sweep(FINISHED)
    return 1 if outcome is not None and not outcome.ok else 0


def _run_store(overrides: list[str]) -> Any:
    from pgcli.tracking.backend import open_run_store

    return open_run_store(compose_train_config(overrides).tracking)


def _train_help(overrides: list[str]) -> int:
    """Print ``pgcli train --help`` (pgcli.commands.help): the groups from conf/ and the config ``overrides`` compose to."""
    from omegaconf import OmegaConf

    from pgcli.commands.help import train_help
    from pgcli.config.labels import stale_preset_overrides

    cfg = compose_dictconfig(overrides + stale_preset_overrides(overrides, multirun=False, conf_dir=CONF_DIR).overrides)
    to_train_config(cfg)  # a bad override gets its one-line error, not a help page
    print(train_help(Path(CONF_DIR), OmegaConf.to_yaml(cfg)))
    return 0


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    from pgcli.training.run import Interrupted

    raise Interrupted(signum)


def _task_overrides(args: list[str]) -> list[str]:
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


def _train_app() -> None:
    import hydra

    from pgcli.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
    def train(cfg: DictConfig) -> float:
        return run_train(cfg)

    train()


def run_train(cfg: DictConfig) -> float:
    """The body of ``pgcli train`` for one job: validate, train, print the summary; returns the final eval return."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from pgcli.config.labels import env_label, preset_label
    from pgcli.hardware.placement import fall_back_when_busy, one_process, parallel_launcher, uses_second_core
    from pgcli.sweeps.study import TrialLink
    from pgcli.training.build import RunContext, train
    from pgcli.training.rerun import source_preset, source_tags
    from pgcli.training.run import PARENT_RUN_ENV

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # Jobs of a sweep say which job they are, so the parent's summary can name a failed one.
    sweep_tags = {"sweep_job": str(hc.job.num), "sweep_dir": str(Path(hc.sweep.dir).resolve())} if multirun else {}
    returns = []
    try:
        from pgcli.redact import redact_hydra_dir

        redact_hydra_dir(Path(hc.runtime.output_dir) / ".hydra")  # before they are logged as artifacts (issue 10)
        run_cfg = to_train_config(cfg)
        if multirun and parallel_launcher(str(hc.launcher.get("_target_", ""))) and uses_second_core(run_cfg):
            # Parallel jobs share the cores: a busy-waiting env worker would take one from another job. The
            # one-process path gives the same numbers (docs/benchmarks.md, "TRPO on two cores").
            run_cfg = one_process(run_cfg)
            note = "pgcli: note: a parallel sweep job runs in one process (hardware.vec_env=sync, no evaluation "
            print(note + "or critic process): the same results, and the cores stay with the other jobs",
                  file=sys.stderr, flush=True)  # fmt: skip
        else:
            run_cfg = fall_back_when_busy(run_cfg)  # a busy second core: one process, the same numbers
        # One trial of an Optuna search (hydra/sweeper=optuna): runs named and tagged by trial number; evaluations
        # reported to the study at the trial's cumulative env steps (seed k after k * total_steps).
        trial = TrialLink.from_job(
            hc.sweeper, n_seeds=run_cfg.n_seeds, total_steps=run_cfg.total_steps, eval_every=run_cfg.eval.every
        )
        if trial is not None:
            sweep_tags["trial"] = str(trial.number)
        # n_seeds > 1 (hyperparameter search): seeds seed..seed+n-1 one after another, each its own run under
        # <output_dir>/seed<k>; the job returns their mean, so the sweeper never optimises the seed.
        for seed in range(run_cfg.seed, run_cfg.seed + run_cfg.n_seeds):
            seed_cfg = dataclasses.replace(run_cfg, seed=seed)
            output_dir = Path(hc.runtime.output_dir)
            ctx = RunContext(
                algo_name=hc.runtime.choices["algo"],
                env_name=env_label(run_cfg.env.id, hc.runtime.choices["env"], CONF_DIR),
                preset=source_preset() or preset_label(hc.runtime.choices, CONF_DIR),  # --from-run: the source's
                output_dir=output_dir if run_cfg.n_seeds == 1 else output_dir / f"seed{seed}",
                overrides=list(hc.overrides.task),
                parent_run_id=os.environ.get(PARENT_RUN_ENV) or None,
                extra_tags=sweep_tags | source_tags(),
                trial=trial.number if trial else None,
                on_eval=trial.reporter(offset=(seed - run_cfg.seed) * run_cfg.total_steps) if trial else None,
            )
            from pgcli.console import print_budget_note, print_summary

            print_budget_note(seed_cfg)
            summary = train(seed_cfg, ctx)

            print_summary(summary, algo=ctx.algo_name, env=ctx.env_name, seed=seed)
            returns.append(summary.final_return)
    except PgcliError as exc:
        if multirun:
            raise  # the launcher records the failed job; the sweep goes on
        sys.exit(_fail(exc))
    except Exception as exc:  # Hydra would print it with a traceback; the MLflow run has already ended FAILED
        if multirun or debug_requested():
            raise
        sys.exit(_fail(unexpected_error(exc)))
    return sum(returns) / len(returns)


# --------------------------------------------------------------------------------------------------------------------
# ui, compare
# --------------------------------------------------------------------------------------------------------------------


def _ui_command(args: list[str]) -> int:
    from pgcli.commands.ui import main as ui_main

    return ui_main(args)


def _runs_command(args: list[str]) -> int:
    from pgcli.commands.runs import main as runs_main

    return runs_main(args)


def _sync_command(args: list[str]) -> int:
    import argparse

    from pgcli.errors import CommandParser

    parser = CommandParser(
        prog="pgcli sync",
        description="Deliver what a run wrote while its tracking server was unreachable (<run dir>/"
        "tracking_spool.jsonl: metrics, params, tags, artifacts and its final status) to the server, in order.",
        epilog="example:\n  pgcli sync outputs/runs/2026-11-23/10-00-00_trpo_hopper_s0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="the run directory named in the run's warning")
    parser.add_argument("--uri", default=None, help="deliver to this tracking URI (default: the run's own server; "
                        "credentials are never stored in the spool, so pass them here or in MLFLOW_TRACKING_USERNAME/"
                        "MLFLOW_TRACKING_PASSWORD)")  # fmt: skip
    ns = parser.parse_args(args)
    from pgcli.tracking.backend import sync_run_dir

    run_id, n, status = sync_run_dir(ns.run_dir, ns.uri)
    ended = f"; run ended {status}" if status else "; the run had not ended (it is still RUNNING in the store)"
    print(f"pgcli: delivered {n} writes to run {run_id}{ended}")
    return 0


def _completion_command(args: list[str]) -> int:
    from pgcli.commands.completion import bash_script

    if args != ["bash"]:
        raise ConfigError('usage: pgcli completion bash  (then: eval "$(pgcli completion bash)", e.g. in ~/.bashrc)')
    print(bash_script(list(_commands())), end="")
    return 0


def _eval_command(args: list[str]) -> int:
    from pgcli.commands.eval import main as eval_main

    return eval_main(args, compose=compose_train_config)


def _compare_command(args: list[str]) -> int:
    try:
        from pgcli.commands.compare import main as compare_main
    except ImportError:
        raise PgcliError("pgcli compare is not available in this build") from None
    return int(compare_main(args) or 0)


def _sft_command(args: list[str]) -> int:
    """``pgcli sft env=<text task> ...``: ``pgcli train algo=sft ...``, a supervised run of its own (issue 12); the
    task is ``env=addition`` unless given."""
    algo = [a for a in _task_overrides(args) if a.split("=", 1)[0].lstrip("+~") == "algo"]
    if algo:
        raise ConfigError(f"pgcli sft trains algo=sft; drop {algo[0]} (or use pgcli train {algo[0]})")
    if any(a.startswith("resume=") for a in args):
        raise ConfigError("pgcli sft resume=<run> is pgcli train resume=<run>: a run resumes with its own algo")
    has_env = any(a.split("=", 1)[0].lstrip("+~") == "env" for a in _task_overrides(args))
    return _train_command(["algo=sft", *([] if has_env else ["env=addition"]), *args])


def _commands() -> dict[str, Callable[[list[str]], int]]:
    """``pgcli <command>`` -> the function that runs it (the completion script lists the same names)."""
    return {"train": _train_command, "sft": _sft_command, "eval": _eval_command, "ui": _ui_command,
            "compare": _compare_command, "runs": _runs_command, "sync": _sync_command,
            "completion": _completion_command}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
