"""``pgcli completion bash``: tab completion of commands and of ``pgcli train`` overrides.

Hydra's own completion (``-sc install=bash``) registers the completer for ``pgcli train`` as if that were one program
name and calls ``pgcli -sc query=bash``, which is not a pgcli command. This script completes the command word itself
and, after ``train``, asks Hydra's completion query for the override being typed (``algo=t`` -> ``algo=trpo``,
``algo.cl`` -> ``algo.clip_range=``), with the ``train`` word removed from the line as Hydra expects.
"""

from __future__ import annotations

from pgcli.errors import ConfigError

BASH = r"""# pgcli bash completion: eval "$(pgcli completion bash)"  (e.g. in ~/.bashrc)
_pgcli_complete()
{
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if (( COMP_CWORD == 1 )); then
        COMPREPLY=( $(compgen -W "__COMMANDS__" -- "$cur") )
        return
    fi
    if [[ "${COMP_WORDS[1]}" == "train" && "$cur" != -* ]]; then
        # Hydra completes `<app> <overrides>`: drop the first ` train` and move the cursor back by its length.
        local line="${COMP_LINE/ train/}"
        local point=$(( COMP_POINT - 6 ))
        local choices
        choices=$(COMP_LINE="$line" COMP_POINT=$point "${COMP_WORDS[0]}" train -sc query=bash 2>/dev/null)
        COMPREPLY=( $(compgen -W "$choices" -- "$cur") )
        return
    fi
    COMPREPLY=( $(compgen -f -- "$cur") )
}
# `algo=t` is one word to complete, not `algo` `=` `t`
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _pgcli_complete pgcli
"""


def bash_script(commands: list[str]) -> str:
    """The bash completion script for a pgcli with these commands."""
    return BASH.replace("__COMMANDS__", " ".join([*commands, "--help", "--version"]))


def main(args: list[str], *, commands: list[str]) -> int:
    """Entry point of ``pgcli completion``: print the script for a pgcli with these ``commands``."""
    if args != ["bash"]:
        raise ConfigError('usage: pgcli completion bash  (then: eval "$(pgcli completion bash)", e.g. in ~/.bashrc)')
    print(bash_script(commands), end="")
    return 0
