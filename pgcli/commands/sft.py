"""``pgcli sft env=<text task> ...``: a supervised warm start, run as ``pgcli train algo=sft ...`` (docs/lm.md).

A run of its own: the task is ``env=addition`` unless given, the algo is always ``sft``, and a run resumes with its
own algo, so ``resume=`` belongs to ``pgcli train``. ``pgcli sft --help`` is its own page (those choices marked).
"""

from __future__ import annotations

from pgcli.commands import train
from pgcli.config.compose import text_task_overrides
from pgcli.config.overrides import override_key, split_override
from pgcli.errors import ConfigError

DEFAULT_TASK = "addition"
"""The text task of ``pgcli sft`` (and ``pgcli rm``) without ``env=``."""


def main(args: list[str]) -> int:
    """Entry point of ``pgcli sft``."""
    return fixed_algo_main(args, algo="sft")


def fixed_algo_main(args: list[str], *, algo: str) -> int:
    """``pgcli <algo> ...`` as ``pgcli train algo=<algo> ...``: the algo is fixed, the task is ``env=addition``
    unless given, ``resume=`` belongs to ``pgcli train``, and ``--help`` is the command's own page (``pgcli sft``,
    ``pgcli rm``)."""
    overrides = train.task_overrides(args)
    typed = [a for a in overrides if override_key(a) == "algo"]
    if typed:
        raise ConfigError(f"pgcli {algo} trains algo={algo}; drop {typed[0]} (or use pgcli train {typed[0]})")
    if any(a.startswith("resume=") for a in args):
        raise ConfigError(f"pgcli {algo} resume=<run> is pgcli train resume=<run>: a run resumes with its own algo")
    has_env = any(override_key(a) == "env" for a in overrides)
    args = [f"algo={algo}", *([] if has_env else [f"env={DEFAULT_TASK}"]), *args]
    if "-h" in args or "--help" in args:
        own = [f"algo={algo}", f"env={DEFAULT_TASK}"]  # what the command picks: marked (default) on its page
        chosen = {key: value for _, key, value in map(split_override, [*own, *text_task_overrides(own)])}
        return train.print_help(train.task_overrides(args), command=algo, chosen=chosen)
    return train.main(args, command=algo)
