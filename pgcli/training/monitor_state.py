"""The training monitor's state in a checkpoint (``monitor.json``): written last, read back only once validated.

:meth:`pgcli.training.monitor.TrainingMonitor.state_dict` is what continues a run's curves on resume (docs/runs.md,
"Resume"): the episode counter, the window of recent returns, the best evaluation and the next evaluation step. It is
written into each ``checkpoints/step_<N>`` and into the final ``model/`` after the agent, so a directory without it
was never completed. :func:`read_monitor_state` checks every key and type, and that the state is the one of the step
the checkpoint is named for, raising a one-line :class:`~pgcli.errors.PgcliError` naming the file otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgcli.errors import PgcliError

MONITOR_STATE_FILE = "monitor.json"
"""Written into each checkpoint and the final model: what the monitor needs to continue the run's curves."""


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return _int(value) or isinstance(value, float)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "step": (_int, "an integer"),
    "next_eval": (_optional(_int), "an integer or null"),
    "next_checkpoint": (_optional(_int), "an integer or null"),
    "n_episodes": (_int, "an integer"),
    "recent_returns": (_list_of(_number), "a list of numbers"),
    "recent_lengths": (_list_of(_int), "a list of integers"),
    "last_eval_step": (_optional(_int), "an integer or null"),
    "best_step": (_optional(_int), "an integer or null"),
    "best_returns": (_optional(_list_of(_number)), "a list of numbers or null"),
    "best_lengths": (_optional(_list_of(_int)), "a list of integers or null"),
}
"""Every key of the state, with its check and the type it must have."""
LATER_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "last_logged_step": (_optional(_int), "an integer or null"),
}
"""Keys added after the first checkpoints were written: checked when present (an older checkpoint lacks them)."""


def write_monitor_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``<path>/monitor.json`` atomically (a reader sees the whole file or none)."""
    tmp = path / f".{MONITOR_STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path / MONITOR_STATE_FILE)


def read_monitor_state(path: Path, step: int | None = None) -> dict[str, Any] | None:
    """The monitor state saved in checkpoint ``path`` (None when it has none), checked against :data:`FIELDS` and, when
    given, the ``step`` the checkpoint is named for; a one-line PgcliError naming the file when it does not pass."""
    file = path / MONITOR_STATE_FILE
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PgcliError(f"cannot read checkpoint file {file} ({exc.strerror or type(exc).__name__})") from None
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise PgcliError(f"checkpoint file {file} is not valid JSON ({exc})") from None
    fault = state_fault(state, step)
    if fault is not None:
        raise PgcliError(f"checkpoint file {file} {fault}")
    return state  # type: ignore[no-any-return]  # a dict: state_fault checked it


def state_fault(state: Any, step: int | None = None) -> str | None:
    """What is wrong with a monitor ``state`` read back (None: nothing), in words that follow the file's name."""
    if not isinstance(state, dict):
        return f"is not a JSON object (got {type(state).__name__})"
    for key, (check, kind) in (FIELDS | LATER_FIELDS).items():
        if key not in state:
            if key in LATER_FIELDS:
                continue
            return f"lacks '{key}'"
        if not check(state[key]):
            return f"has '{key}': {str(state[key])[:40]!r}, which is not {kind}"
    if step is not None and state["step"] != step:
        return f"is for step {state['step']}, not {step}"
    if (state["best_returns"] is None) != (state["best_lengths"] is None):
        return "has only one of 'best_returns' and 'best_lengths'"
    return None
