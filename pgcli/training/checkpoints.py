"""A run directory's checkpoints, named, staged, pruned and found in one place (docs/checkpoints.md).

The layout::

    <run dir>/checkpoints/step_<n>/            one per checkpoint, each with monitor.json (written last)
    <run dir>/checkpoints/.step_<n>.staged/    a saved agent waiting for its monitor state (renamed to step_<n>)
    <run dir>/checkpoints/.step_<n>.tmp-<hex>/ an agent being written (pgcli.algo.checkpoint.atomic_dir)
    <run dir>/model/                           the final agent, resumable once its monitor.json is in it
    <run dir>/.best_model.step_<n>/            the agent of an evaluation still running, kept if it is the best

The training monitor decides when a checkpoint is due and what state it holds; this module decides where it goes:
:func:`complete_checkpoint` puts a staged agent in place under its name, :func:`prune_checkpoints` keeps the newest,
and :func:`latest_checkpoint` / :func:`checkpoint_candidates` find them again (``pgcli train resume=``).
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path
from shutil import rmtree
from typing import Any

from pgcli.errors import PgcliError
from pgcli.tracking.spool import not_spooled
from pgcli.training.monitor_state import read_monitor_state, write_monitor_state

CHECKPOINTS_DIR = "checkpoints"
"""``<run dir>/checkpoints``: the ``step_<n>`` directories; also their artifact path in the MLflow run."""
MODEL_DIR = "model"
"""``<run dir>/model``: the final agent (a checkpoint too, once its monitor state is in it)."""


def checkpoints_dir(run_dir: Path) -> Path:
    """Where a run keeps its ``step_<n>`` checkpoints."""
    return run_dir / CHECKPOINTS_DIR


def step_name(step: int) -> str:
    """The name of the checkpoint at env step ``step``, on disk and in the MLflow run's artifacts."""
    return f"step_{step}"


def checkpoint_step(path: Path) -> int | None:
    """The env step of a ``step_<n>`` checkpoint directory (None for any other name)."""
    prefix, _, number = path.name.partition("_")
    return int(number) if prefix == "step" and number.isdigit() else None


def staging_dir(checkpoints: Path, step: int) -> Path:
    """The hidden directory the agent of checkpoint ``step`` is saved to, before its monitor state completes it."""
    return checkpoints / f".{step_name(step)}.staged"


def best_candidate_dir(best_dir: Path, step: int) -> Path:
    """The hidden sibling of ``best_dir`` holding the agent of the evaluation at ``step`` until its result is known."""
    return best_dir.with_name(f".{best_dir.name}.{step_name(step)}")


def put_in_place(path: Path, target: Path) -> None:
    """Move the directory ``path`` to ``target``, replacing what is there."""
    rmtree(target, ignore_errors=True)
    os.replace(path, target)


def discard(path: Path) -> None:
    """Remove a staged or candidate directory (gone already is fine)."""
    rmtree(path, ignore_errors=True)


def complete_checkpoint(checkpoints: Path, step: int, saved: Path, state: dict[str, Any]) -> Path:
    """Write the monitor ``state`` into the saved agent ``saved`` and move it to ``<checkpoints>/step_<step>``: a
    directory under a checkpoint's name is always whole. Returns that directory."""
    write_monitor_state(saved, state)
    final = checkpoints / step_name(step)
    if saved != final:
        put_in_place(saved, final)
    return final


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step_<n>`` checkpoints, and temporary directories a crash left behind."""
    steps = sorted((step, p) for p in checkpoint_dir.iterdir() if (step := checkpoint_step(p)) is not None)
    for path in not_spooled([path for _, path in steps[:-keep]], checkpoint_dir.parent):  # kept until delivered
        rmtree(path, ignore_errors=True)
    for leftover in [*checkpoint_dir.glob(".step_*.tmp-*"), *checkpoint_dir.glob(".step_*.staged")]:
        rmtree(leftover, ignore_errors=True)


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    """The ``step_<N>`` directory with the largest N under ``checkpoint_dir`` (None when there is none)."""
    if not checkpoint_dir.is_dir():
        return None
    found = []
    for path in checkpoint_dir.iterdir():
        step = checkpoint_step(path)
        if step is not None and path.is_dir() and any(path.iterdir()):
            found.append((step, path))
    return max(found) if found else None


def checkpoint_candidates(run_dir: Path) -> list[tuple[int | None, Path, str | None]]:
    """``(step, dir, fault)`` of the run's checkpoints, newest first: each ``checkpoints/step_<N>``, and the final
    ``model/`` at the step of its monitor state (after a ``step_<N>`` of the same step; first when that state cannot
    be read, its step unknown). A ``model/`` without monitor state (saved by an older pgcli) is none."""
    found: list[tuple[int | None, Path, str | None]] = []
    with suppress(OSError):  # no checkpoints/ yet
        for path in checkpoints_dir(run_dir).iterdir():
            step = checkpoint_step(path)
            if step is not None and path.is_dir():
                found.append((step, path, None))
    model = run_dir / MODEL_DIR
    try:
        state = read_monitor_state(model)
    except PgcliError as exc:
        return [(None, model, str(exc)), *sorted(found, key=lambda c: -(c[0] or 0))]
    if state is not None:
        found.append((int(state["step"]), model, None))
    # newest first; at one step the checkpoint before the model
    return sorted(found, key=lambda c: (-(c[0] or 0), c[1].name == MODEL_DIR))


def checkpoint_fault(checkpoint: Path, step: int | None) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (one line naming the file), or None: a file missing, unreadable or
    damaged (:func:`pgcli.algo.checkpoint.verify_checkpoint`), or its monitor state missing (the checkpoint was not
    completed), invalid or of another step than ``step``."""
    from pgcli.algo.checkpoint import verify_checkpoint

    try:
        steps = verify_checkpoint(checkpoint)
        if read_monitor_state(checkpoint, step) is None:
            return f"{checkpoint} has no monitor.json: its process ended before the checkpoint was complete"
        if steps is not None and steps != step:  # the final model/ is named for no step: its files must agree
            return f"checkpoint file {checkpoint / 'monitor.json'} is for step {step}, but state.json for step {steps}"
    except PgcliError as exc:
        return str(exc)
    except OSError as exc:  # the directory itself went away or cannot be listed
        return f"cannot read {checkpoint} ({exc.strerror or type(exc).__name__})"
    return None


def newest_resumable(run_dir: Path) -> tuple[int, Path, list[tuple[Path, str]]] | None:
    """The newest checkpoint of ``run_dir`` that passes :func:`checkpoint_fault`, as ``(step, dir, skipped)`` with
    the newer ones that do not pass, newest first, each as ``(dir, why)``; None when the run has no checkpoint.
    A one-line PgcliError names the newest and why when none passes."""
    candidates = checkpoint_candidates(run_dir)
    if not candidates:
        return None
    skipped: list[tuple[Path, str]] = []
    for step, checkpoint, fault in candidates:
        fault = fault or checkpoint_fault(checkpoint, step)
        if fault is None and step is not None:
            return step, checkpoint, skipped
        skipped.append((checkpoint, str(fault)))
    raise PgcliError(f"resume: no checkpoint of {run_dir} can be loaded; the newest: {skipped[0][1]}")
