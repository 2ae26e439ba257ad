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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pgcli
from pgcli.errors import ConfigError, PgcliError


def find_conf_dir() -> str:
    """``conf/`` beside the package (a checkout or editable install), else the copy shipped inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise PgcliError(f"cannot find pgcli's conf/ directory (looked beside {here})")


CONF_DIR = find_conf_dir()
PARENT_RUN_ENV = "PGCLI_PARENT_RUN_ID"
"""Set by the sweep callback: children of a multirun attach to this MLflow run."""

USAGE = f"""\
pgcli {pgcli.__version__}: train, sweep and compare policy-gradient agents (Hydra configs, MLflow tracking).

usage: pgcli <command> [options] [key=value ...]

commands:
  train      train one agent, or a sweep with -m        pgcli train algo=trpo env=hopper seed=1
  eval       score a trained agent (and record video)    pgcli eval <run id | run dir> --video
  compare    aggregate runs across seeds (table + plot)  pgcli compare --experiment cartpole
  ui         open the MLflow UI on the run store          pgcli ui

examples:
  pgcli train                                       # PPO on CartPole, ~1 minute, tracked in outputs/mlflow.db
  pgcli train algo=a2c env=pendulum total_steps=50000
  pgcli train -m algo=ppo,trpo env=cartpole seed=0,1,2
  pgcli train --cfg job algo=trpo env=hopper        # print the composed config, do not train
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


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] == "--version":
        print(f"pgcli {pgcli.__version__}")
        return 0
    command, rest = args[0], args[1:]
    commands = {"train": _train_command, "eval": _eval_command, "ui": _ui_command, "compare": _compare_command}
    if command not in commands:
        close = difflib.get_close_matches(command, commands, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return _fail(ConfigError(f"unknown command '{command}' (commands: {', '.join(commands)}){hint}"))
    try:
        return commands[command](rest)
    except PgcliError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print("pgcli: interrupted", file=sys.stderr)
        return 130


def _fail(exc: PgcliError) -> int:
    print(f"pgcli: error: {exc}", file=sys.stderr)
    return exc.exit_code


# --------------------------------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------------------------------

HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "--shell-completion", "-sc")


def _train_command(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        return _train_help(_task_overrides(args))
    from pgcli.rerun import from_run_args, has_from_run, reject_logged_config_dir

    reject_logged_config_dir(args)
    if has_from_run(args):  # the logged run's config, registered in the ConfigStore, under these overrides
        args = from_run_args(args, overrides=_task_overrides(args), store_for=_run_store)
    if not any(a in HYDRA_INFO_FLAGS or a.startswith("--info") for a in args):
        validate_overrides(_task_overrides(args), multirun=any(a in ("-m", "--multirun") for a in args))
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # `kill` ends the MLflow run KILLED, as Ctrl-C does
    sys.argv = ["pgcli train", *args]
    from pgcli.sweep import close_sweep

    # A multirun's parent MLflow run is ended by the sweep callback at multirun end; Hydra skips that hook when the
    # sweeper raises (it re-raises a failed job) or on Ctrl-C, so those paths end it here. Never left RUNNING.
    try:
        _train_app()
    except KeyboardInterrupt:
        close_sweep("KILLED")
        raise
    except SystemExit:
        close_sweep("FAILED")
        raise
    outcome = close_sweep("FINISHED")
    return 1 if outcome is not None and not outcome.ok else 0


def _run_store(overrides: list[str]) -> Any:
    from pgcli.tracking import open_run_store

    return open_run_store(compose_train_config(overrides).tracking)


def _train_help(overrides: list[str]) -> int:
    """Print ``pgcli train --help`` (pgcli.help): the groups from conf/ and the config ``overrides`` compose to."""
    from omegaconf import OmegaConf

    from pgcli.help import train_help

    cfg = compose_dictconfig(overrides)
    to_train_config(cfg)  # a bad override gets its one-line error, not a help page
    print(train_help(Path(CONF_DIR), OmegaConf.to_yaml(cfg)))
    return 0


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _task_overrides(args: list[str]) -> list[str]:
    """The key=value overrides among Hydra's command-line arguments (flags and their values removed)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-dir", "-cd",
                   "--config-path", "-cp", "--experimental-rerun"):  # fmt: skip
            skip = True
            continue
        if arg.startswith("-"):
            continue
        out.append(arg)
    return out


def validate_overrides(overrides: list[str], *, multirun: bool = False) -> None:
    """Compose and type-check the config of every job these overrides describe; raise a one-line ConfigError.

    A grid sweep (``a=1,2 b=x,y``) is expanded and each job validated, so a bad value in the fourth job stops the
    sweep before the first starts. Sweeper-specific syntax (Optuna's ``interval(...)``) is left to the sweeper.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    task = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(task)
    except OverrideParseException as exc:
        raise ConfigError(f"cannot parse override: {str(exc).splitlines()[0]}") from None
    jobs: list[list[str]] = [task]
    if multirun and any(o.is_sweep_override() for o in parsed):
        simple = all(o.is_discrete_sweep() or not o.is_sweep_override() for o in parsed)
        if simple:
            jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        else:
            jobs = [[o.input_line or "" for o in parsed if not o.is_sweep_override()]]
    for job in jobs:
        compose_train_config(job)


def compose_train_config(overrides: list[str]) -> Any:
    """The validated :class:`~pgcli.config.TrainConfig` for ``overrides`` (raises a one-line ConfigError)."""
    run_cfg = to_train_config(compose_dictconfig(overrides))
    if run_cfg.hardware.device == "cuda":
        from pgcli.build import select_device

        select_device(run_cfg.hardware)
    return run_cfg


def compose_dictconfig(overrides: list[str]) -> Any:
    """The composed (not yet validated) DictConfig for ``overrides``; a composition error is a one-line ConfigError."""
    from hydra import compose, initialize_config_dir

    from pgcli.config import register_configs

    register_configs()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="pgcli"):
            return compose("train", overrides=overrides)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(describe_config_error(exc)) from None


def to_train_config(cfg: Any) -> Any:
    """DictConfig -> TrainConfig dataclasses, running every ``__post_init__`` rule once."""
    from omegaconf import OmegaConf

    try:
        run_cfg = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(describe_config_error(exc)) from None
    reject_unknown_keys(run_cfg)
    return run_cfg


def reject_unknown_keys(obj: Any, prefix: str = "") -> None:
    """Raise a ConfigError for a key a schema does not define.

    ``+algo.clip_rnge=0.1`` (Hydra's append syntax) gets past composition, and ``OmegaConf.to_object`` sets such keys
    as extra attributes of the dataclass, so a typo would silently do nothing; only ``env.kwargs`` (a dict) is open.
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    names = [f.name for f in dataclasses.fields(obj)]
    for key in vars(obj):
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown key '{prefix}{key}' ({type(obj).__name__} has no field '{key}'){hint}")
    for name in names:
        reject_unknown_keys(getattr(obj, name), f"{prefix}{name}.")


def describe_config_error(exc: BaseException) -> str:
    """One line naming what is wrong, from a Hydra / OmegaConf composition error."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = exc.__cause__ or exc
    if isinstance(exc, MissingConfigException) or isinstance(cause, MissingConfigException):
        text = str(exc)
        missing = text.split("Could not find '", 1)[-1].split("'", 1)[0] if "Could not find '" in text else ""
        group, _, option = missing.rpartition("/")
        options = [line.strip() for line in text.split("Available options in", 1)[-1].splitlines()[1:]]
        options = [o for o in options if o and not o.startswith(("Config search path", "provider="))]
        if group and options:
            return f"unknown {group} option '{option}' (available: {', '.join(options)})"
        return text.splitlines()[0]
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        key = getattr(cause, "full_key", "") or ""
        obj = getattr(cause, "object_type", None)
        valid = [f.name for f in dataclasses.fields(obj)] if obj and dataclasses.is_dataclass(obj) else []
        leaf = key.rpartition(".")[2]
        close = difflib.get_close_matches(leaf, valid, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if not close and valid:
            hint = f"; valid keys: {', '.join(valid)}"
        if obj is dict:  # an open mapping such as env.kwargs: new keys need Hydra's append syntax
            return f"unknown key '{key}'; to add a new key use '+{key}=...'"
        owner = obj.__name__ if obj else "the config"
        return f"unknown key '{key}' ({owner} has no field '{leaf}'){hint}"
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", "") or ""
        msg = str(getattr(cause, "msg", cause)).splitlines()[0]
        return f"{key}: {msg}" if key else msg
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _train_app() -> None:
    import hydra
    from omegaconf import DictConfig

    from pgcli.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
    def train(cfg: DictConfig) -> float:
        return run_train(cfg)

    train()


def run_train(cfg: Any) -> float:
    """The body of ``pgcli train`` for one job: validate, train, print the summary; returns the final eval return."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from pgcli.build import RunContext, train
    from pgcli.rerun import source_tags

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # Jobs of a sweep say which job they are, so the parent's summary can name a failed one.
    sweep_tags = {"sweep_job": str(hc.job.num), "sweep_dir": str(Path(hc.sweep.dir).resolve())} if multirun else {}
    returns = []
    try:
        run_cfg = to_train_config(cfg)
        # n_seeds > 1 (hyperparameter search): seeds seed..seed+n-1 one after another, each its own run under
        # <output_dir>/seed<k>; the job returns their mean, so the sweeper never optimises the seed.
        for seed in range(run_cfg.seed, run_cfg.seed + run_cfg.n_seeds):
            seed_cfg = dataclasses.replace(run_cfg, seed=seed)
            output_dir = Path(hc.runtime.output_dir)
            ctx = RunContext(
                algo_name=hc.runtime.choices["algo"],
                env_name=hc.runtime.choices["env"],
                output_dir=output_dir if run_cfg.n_seeds == 1 else output_dir / f"seed{seed}",
                overrides=list(hc.overrides.task),
                parent_run_id=os.environ.get(PARENT_RUN_ENV) or None,
                extra_tags=sweep_tags | source_tags(),
            )
            summary = train(seed_cfg, ctx)
            from pgcli.console import print_summary

            print_summary(summary, algo=ctx.algo_name, env=ctx.env_name, seed=seed)
            returns.append(summary.final_return)
    except PgcliError as exc:
        if multirun:
            raise  # the launcher records the failed job; the sweep goes on
        print(f"pgcli: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    return sum(returns) / len(returns)


# --------------------------------------------------------------------------------------------------------------------
# ui, compare
# --------------------------------------------------------------------------------------------------------------------


def _ui_command(args: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="pgcli ui",
        description="Open the MLflow UI on pgcli's run store (the one `pgcli train` logs to with the same "
        "tracking overrides). Runs of a sweep are nested under their parent run; select runs and use the "
        "Chart view to compare learning curves.",
        epilog="comparing a sweep's runs (pgcli train -m ...):\n"
        "  1. open the experiment (the env name, or `sweeps` for a sweep over several envs, or experiment=...)\n"
        "  2. the sweep is one row, `sweep-<date>-<time>`: expand it (+) to see its jobs as child runs;\n"
        "     its Artifacts tab has children.md (each job's status and final return), Optuna's\n"
        "     optimization_results.yaml, and compare/ once `pgcli compare` has run\n"
        "  3. tick the child runs (select all, then untick the parent) and open Chart view: each metric\n"
        "     (eval/return_mean, rollout/ep_return_mean, ...) is one chart against env steps, one line per run\n"
        "  4. to average over seeds with a confidence band, run `pgcli compare --parent <parent run id>`\n"
        "  filter runs in the search box: tags.mlflow.parentRunId = '<id>', params.algo = 'ppo'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    parser.add_argument("--workers", type=int, default=1, help="UI server worker processes (default: 1)")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.store_dir=elsewhere")
    ns = parser.parse_args(args)
    from pgcli.tracking import resolve_tracking_target

    run_cfg = compose_train_config(ns.overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store to show; drop the tracking override")
    target = resolve_tracking_target(run_cfg.tracking)
    if target.uri.startswith(("http://", "https://")):
        print(f"pgcli: runs are on a tracking server; open {target.uri} in a browser")
        return 0
    # One worker and no job runner: ~5 s to healthy instead of ~11 s with MLflow's 4 workers + 7 huey consumers
    # on a 2-core machine (measured on this project's reference machine).
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", target.uri,
           "--host", ns.host, "--port", str(ns.port), "--workers", str(ns.workers)]  # fmt: skip
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    if target.artifact_root:
        cmd += ["--default-artifact-root", target.artifact_root]
    print(f"pgcli: MLflow UI on http://{ns.host}:{ns.port} (store {target.uri}); Ctrl-C to stop", file=sys.stderr)
    os.execv(sys.executable, cmd)
    return 0  # not reached


def _eval_command(args: list[str]) -> int:
    from pgcli.evaluate import main as eval_main

    return eval_main(args, compose=compose_train_config)


def _compare_command(args: list[str]) -> int:
    try:
        from pgcli.compare import main as compare_main
    except ImportError:
        raise PgcliError("pgcli compare is not available in this build") from None
    return int(compare_main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
