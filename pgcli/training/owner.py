"""Who writes a run: its process (pid, host, start time), and the claim that makes it the run's one writer.

A run has one writer at a time (docs/runs.md, "One writer per run"). Before anything of a run is written, its process
claims the run directory: :func:`claim_run` creates ``<run dir>/.owner`` exclusively (``O_CREAT | O_EXCL``) with its
pid, host and process start time, and :func:`release_run` removes it when the run ends, FINISHED, FAILED or KILLED.
A second claimant is refused with one line naming the owner. A marker whose process is provably gone (same host, the
pid dead or reused by a process that started later: SIGKILL, power loss) is taken over; one from another host is not
(its process cannot be checked from here). A tracked run is also judged by its MLflow record: RUNNING with a live
process here, or RUNNING on another host, is refused the same way.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgcli.errors import ConfigError
from pgcli.tracking.client import STALE_MARK
from pgcli.tracking.status import KILLED, RUNNING

if TYPE_CHECKING:
    from pgcli.tracking.store import RunRecord, RunStore

OWNER_FILE = ".owner"
"""``<run dir>/.owner``: the process writing the run now (``pid``, ``hostname``, ``pid_start``), while it runs."""

_held: dict[Path, tuple[int, int]] = {}
"""Run directories this process claimed: (thread, depth). The thread that claimed a run may claim it again (``pgcli
train resume=`` claims before it prints a line, :class:`pgcli.training.run.Run` when the run opens); others may not."""
_held_lock = threading.Lock()


def process_start_time(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``); '' where unknown."""
    fields = _stat_fields(pid)
    return fields[19] if fields else ""  # field 22


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from its third field on (the state); [] where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()  # the command name in (...) may contain spaces


def process_tags() -> dict[str, str]:
    pid = os.getpid()
    return {"pid": str(pid), "hostname": socket.gethostname(), "pid_start": process_start_time(pid)}


def process_alive(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` (started at ``start``, when known) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        pass
    fields = _stat_fields(pid)
    if fields and fields[0] in ("Z", "X"):
        # dead, not yet reaped: a killed job's workers wait for an init that may never reap them (a container's)
        return False
    return not start or (fields[19] if fields else "") in ("", start)


def check_one_writer(run_dir: Path, what: str, record: RunRecord | None = None) -> None:
    """Refuse (one-line :class:`~pgcli.errors.ConfigError`) when another process writes the run in ``run_dir``: its
    ``.owner`` names a live process, or its MLflow ``record`` is RUNNING with a live process here or on another host.
    Reads only; ``what`` names the run in the message (``resume: run <id>``)."""
    if record is not None:
        _check_record(record, what)
    owner = _read_owner(run_dir / OWNER_FILE)
    if owner and not _gone(owner, run_dir):  # an unreadable one may be being written: the claim decides
        raise ConfigError(_busy(what, owner, run_dir / OWNER_FILE))


def claim_run(run_dir: Path, what: str, record: RunRecord | None = None) -> None:
    """Make this process the one writer of the run in ``run_dir`` (created if missing), atomically; refused as
    :func:`check_one_writer` says. Released by :func:`release_run`, once per claim."""
    key = run_dir.resolve()
    with _held_lock:
        thread, depth = _held.get(key, (threading.get_ident(), 0))
        if depth and thread == threading.get_ident():
            _held[key] = (thread, depth + 1)
            return
    if record is not None:
        _check_record(record, what)
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / OWNER_FILE
    with _locked(run_dir):  # claimants take over a dead owner's marker one at a time
        owner = _create(marker)
        if owner is not None and _gone(owner, run_dir):
            marker.unlink(missing_ok=True)
            owner = _create(marker)
    if owner is not None:
        raise ConfigError(_busy(what, owner, marker))
    with _held_lock:
        _held[key] = (threading.get_ident(), 1)


def release_run(run_dir: Path) -> None:
    """End this process's claim on ``run_dir`` (the last release removes ``.owner``, if it is still this process's)."""
    key = run_dir.resolve()
    with _held_lock:
        thread, depth = _held.pop(key, (0, 0))
        if depth > 1:
            _held[key] = (thread, depth - 1)
            return
    if depth and _read_owner(run_dir / OWNER_FILE) == process_tags():
        with suppress(OSError):
            (run_dir / OWNER_FILE).unlink()


def _check_record(record: RunRecord, what: str) -> None:
    """A RUNNING MLflow run whose process lives on this host, or runs on another host, has a writer."""
    if record.status != RUNNING:
        return
    pid, host = record.tags.get("pid", ""), record.tags.get("hostname")
    if not pid.isdigit() or not host:
        return  # an older pgcli's run, without a process: nothing to judge it by
    if host != socket.gethostname():
        raise ConfigError(
            f"{what} is RUNNING on host {host} (pid {pid}), whose process cannot be checked from here; wait for it to "
            f"end, or if it is gone, run `pgcli runs --stale` on {host} first"
        )
    if process_alive(int(pid), record.tags.get("pid_start", "")):
        raise ConfigError(f"{what} is still running (pid {pid} on {host}); stop it first, or wait for it to end")


def _busy(what: str, owner: Mapping[str, str], marker: Path) -> str:
    pid, host = owner.get("pid", "?"), owner.get("hostname", "?")
    if host != socket.gethostname():
        return (
            f"{what} is being written by pid {pid} on host {host}, whose process cannot be checked from here; "
            f"wait for it to end, or if it is gone, delete {marker}"
        )
    return f"{what} is still running (pid {pid} on {host}); stop it first, or wait for it to end"


def _gone(owner: Mapping[str, str], run_dir: Path) -> bool:
    """Whether the marker's process provably no longer writes the run: on this host, its pid dead or reused; this
    very process when it holds no claim (left by a run of it that could not release)."""
    if not owner:
        return True  # unreadable: claimants write it under the lock, so its writer died while writing it
    pid, host = owner.get("pid", ""), owner.get("hostname")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if owner == process_tags():
        with _held_lock:
            return run_dir.resolve() not in _held
    return not process_alive(int(pid), owner.get("pid_start", ""))


def _create(marker: Path) -> dict[str, str] | None:
    """Create ``marker`` with this process's tags; None when created, else the owner it already names."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return _read_owner(marker) or {}
    with os.fdopen(fd, "w") as f:
        json.dump(process_tags(), f)
    return None


def _read_owner(marker: Path) -> dict[str, str] | None:
    """The process a marker names ({} when unreadable), None when there is no marker."""
    try:
        data = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the run directory while a claimant reads, takes over and creates the marker."""
    import fcntl

    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# Stale runs: RUNNING in the store, their process gone ----------------------------------------------------------------


def stale_reason(record: RunRecord, host: str | None = None) -> str | None:
    """Why a RUNNING run is stale ('process 123 on host is gone'), or None when it may still be running (its process
    lives, it ran on another host, or it has no pid tag)."""
    host = host or socket.gethostname()
    pid = record.tags.get("pid", "")
    if record.status != RUNNING or not pid.isdigit() or record.tags.get("hostname") != host:
        return None
    if process_alive(int(pid), record.tags.get("pid_start", "")):
        return None
    return f"process {pid} on {host} is gone"


@dataclass(frozen=True)
class StaleRun:
    run_id: str
    name: str
    experiment_id: str
    reason: str


def find_stale_runs(store: RunStore, experiment_ids: list[str] | None = None) -> tuple[list[StaleRun], int]:
    """RUNNING runs of this host whose process is gone, and how many other RUNNING runs could not be judged
    (another host, or no pid tag)."""
    running = store.search(
        store.experiment_ids() if experiment_ids is None else experiment_ids, f"attributes.status = '{RUNNING}'"
    )
    stale, unknown = [], 0
    for record in running:
        reason = stale_reason(record)
        if reason is not None:
            stale.append(StaleRun(record.run_id, record.name, record.experiment_id, reason))
        elif record.tags.get("hostname") != socket.gethostname() or not record.tags.get("pid", "").isdigit():
            unknown += 1
    return stale, unknown


def mark_killed(store: RunStore, runs: Sequence[StaleRun]) -> None:
    """End stale runs KILLED, with the reason in their ``error`` tag."""
    for run in runs:
        store.set_tags(run.run_id, {"error": f"{STALE_MARK}: {run.reason}"})
        store.end(run.run_id, KILLED)
