"""``pgcli sft env=<text task> ...``: a supervised warm start, run as ``pgcli train algo=sft ...`` (docs/lm.md).

A run of its own: the task is ``env=addition`` unless given, the algo is always ``sft``, and a run resumes with its
own algo, so ``resume=`` belongs to ``pgcli train``. ``pgcli sft --help`` is its own page (those choices marked).
"""

from __future__ import annotations

from pgcli.commands import train
from pgcli.config.compose import text_task_overrides
from pgcli.errors import ConfigError

DEFAULT_TASK = "addition"
"""The text task of ``pgcli sft`` without ``env=``."""


def main(args: list[str]) -> int:
    """Entry point of ``pgcli sft``."""
    overrides = train.task_overrides(args)
    algo = [a for a in overrides if a.split("=", 1)[0].lstrip("+~") == "algo"]
    if algo:
        raise ConfigError(f"pgcli sft trains algo=sft; drop {algo[0]} (or use pgcli train {algo[0]})")
    if any(a.startswith("resume=") for a in args):
        raise ConfigError("pgcli sft resume=<run> is pgcli train resume=<run>: a run resumes with its own algo")
    has_env = any(a.split("=", 1)[0].lstrip("+~") == "env" for a in overrides)
    args = ["algo=sft", *([] if has_env else [f"env={DEFAULT_TASK}"]), *args]
    if "-h" in args or "--help" in args:
        own = ["algo=sft", f"env={DEFAULT_TASK}"]  # what `pgcli sft` picks: marked (default) on its page
        chosen = dict(o.split("=", 1) for o in [*own, *text_task_overrides(own)])
        return train.print_help(train.task_overrides(args), command="sft", chosen=chosen)
    return train.main(args, command="sft")
