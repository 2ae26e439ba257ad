"""``pgcli rm env=<text task> ...``: a reward model trained on preference pairs, run as ``pgcli train algo=rm ...``
(docs/lm.md, "Reward models: `pgcli rm`").

A run of its own: the task is ``env=addition`` unless given, the algo is always ``rm``, and a run resumes with its own
algo, so ``resume=`` belongs to ``pgcli train``. ``pgcli rm --help`` is its own page (those choices marked).
"""

from __future__ import annotations

from pgcli.commands import train
from pgcli.config.compose import text_task_overrides
from pgcli.errors import ConfigError

DEFAULT_TASK = "addition"
"""The text task of ``pgcli rm`` without ``env=``."""


def main(args: list[str]) -> int:
    """Entry point of ``pgcli rm``."""
    overrides = train.task_overrides(args)
    algo = [a for a in overrides if a.split("=", 1)[0].lstrip("+~") == "algo"]
    if algo:
        raise ConfigError(f"pgcli rm trains algo=rm; drop {algo[0]} (or use pgcli train {algo[0]})")
    if any(a.startswith("resume=") for a in args):
        raise ConfigError("pgcli rm resume=<run> is pgcli train resume=<run>: a run resumes with its own algo")
    has_env = any(a.split("=", 1)[0].lstrip("+~") == "env" for a in overrides)
    args = ["algo=rm", *([] if has_env else [f"env={DEFAULT_TASK}"]), *args]
    if "-h" in args or "--help" in args:
        own = ["algo=rm", f"env={DEFAULT_TASK}"]  # what `pgcli rm` picks: marked (default) on its page
        chosen = dict(o.split("=", 1) for o in [*own, *text_task_overrides(own)])
        return train.print_help(train.task_overrides(args), command="rm", chosen=chosen)
    return train.main(args, command="rm")
