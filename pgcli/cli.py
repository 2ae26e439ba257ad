"""``pgcli <command>``: the usage page, and a small dispatcher in front of the commands in :mod:`pgcli.commands`.

Each command is one module there with a ``main(args)``; it is imported only when run, so ``pgcli --help`` answers
fast, with neither torch, SB3 nor MLflow imported. What a command raises ends here: a
:class:`~pgcli.errors.PgcliError` as one line (``pgcli: error: ...``, exit 2 for bad input, 1 otherwise), Ctrl-C /
SIGTERM / SIGHUP as ``128 + signal``, anything unforeseen as one line naming it (``PGCLI_DEBUG=1`` for the traceback).
Nothing imports this module; ``pgcli/__main__.py`` and the console script call :func:`main`.
"""

from __future__ import annotations

import difflib
import os
import signal
import sys
from collections.abc import Callable, Sequence

import pgcli
from pgcli.commands.report import debug_requested, report_error, unexpected_error
from pgcli.errors import ConfigError, PgcliError

USAGE = f"""\
pgcli {pgcli.__version__}: train, sweep and compare policy-gradient agents (Hydra configs, MLflow tracking).

usage: pgcli <command> [options] [key=value ...]

commands:
  train      train one agent, or a sweep with -m        pgcli train algo=trpo env=hopper seed=1
  sft        supervised warm start on a text task        pgcli sft env=addition total_steps=200000
  rm         reward model on a text task's preferences   pgcli rm env=addition algo.label_noise=0.1
  eval       score a trained agent (and record video)    pgcli eval <run id | run dir> --video
  compare    aggregate runs across seeds (table + plot)  pgcli compare --experiment cartpole
  ui         open the MLflow UI on the run store          pgcli ui
  runs       list runs; mark crashed ones KILLED          pgcli runs --stale
  sync       deliver a run's writes spooled in an outage  pgcli sync <run dir>
  export     a text run as a Hugging Face model dir       pgcli export <run id | run dir>
  data       a text task's rows as the model sees them   pgcli data show env=dataset env.path=rows.jsonl
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
        return report_error(unexpected_error(exc))


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
        return report_error(ConfigError(f"unknown command '{command}' (commands: {', '.join(commands)}){hint}"))
    try:
        return commands[command](rest)
    except PgcliError as exc:
        return report_error(exc)
    except KeyboardInterrupt as exc:
        print("pgcli: interrupted", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP


def _commands() -> dict[str, Callable[[list[str]], int]]:
    """``pgcli <command>`` -> the function that runs it (the completion script lists the same names)."""
    return {
        "train": _train,
        "sft": _sft,
        "rm": _rm,
        "eval": _eval,
        "ui": _ui,
        "compare": _compare,
        "runs": _runs,
        "sync": _sync,
        "export": _export,
        "data": _data,
        "completion": _completion,
    }


# Each entry imports its command's module when it runs (pgcli.commands.<name>.main).


def _train(args: list[str]) -> int:
    from pgcli.commands import train

    return train.main(args)


def _sft(args: list[str]) -> int:
    from pgcli.commands import sft

    return sft.main(args)


def _rm(args: list[str]) -> int:
    from pgcli.commands import rm

    return rm.main(args)


def _eval(args: list[str]) -> int:
    from pgcli.commands import eval as eval_command

    return eval_command.main(args)


def _ui(args: list[str]) -> int:
    from pgcli.commands import ui

    return ui.main(args)


def _compare(args: list[str]) -> int:
    try:
        from pgcli.commands.compare import main as compare_main
    except ImportError:
        raise PgcliError("pgcli compare is not available in this build") from None
    return compare_main(args)


def _runs(args: list[str]) -> int:
    from pgcli.commands import runs

    return runs.main(args)


def _sync(args: list[str]) -> int:
    from pgcli.commands import sync

    return sync.main(args)


def _export(args: list[str]) -> int:
    from pgcli.commands import export

    return export.main(args)


def _data(args: list[str]) -> int:
    from pgcli.commands import data

    return data.main(args)


def _completion(args: list[str]) -> int:
    from pgcli.commands import completion

    return completion.main(args, commands=list(_commands()))


if __name__ == "__main__":
    sys.exit(main())
