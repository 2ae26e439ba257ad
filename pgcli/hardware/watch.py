"""Is another process taking this run's cores? The kernel's answer and the bar it is judged by, for a run on the
two-core path (``hardware.vec_env=shm``; docs/benchmarks/trpo.md, "Two commands side by side").

The signs are read from the kernel: the seconds a process spent runnable but off a core (``/proc/<pid>/schedstat``,
:func:`run_queue_s`); where it does not say, the seconds the trainer waited for its env worker stand in
(:func:`busy_share`). The shared-memory env's own instruments (its worker's waits, bringing its sub-envs home between
updates) are :mod:`pgcli.envs.shm_watch`; a run that kept its worker gets :func:`busy_cores_note` at the end.
Whether a core is free *before* a run starts is :func:`pgcli.hardware.placement.free_core`.
"""

from __future__ import annotations


def run_queue_s(pid: int) -> float | None:
    """Seconds the task ``pid`` (a process's main thread) has spent runnable but waiting for a core: the second field
    of ``/proc/<pid>/schedstat``. None where it cannot be read (another OS, a process that is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


BUSY_SHARE = 0.2
"""The share of wall time the run's two processes may spend waiting for a core before the run counts its cores as
taken (:class:`WorkerWatch`, :func:`busy_cores_note`): near 0 on an otherwise idle machine (0.17 ms in 0.54 s of
a busy loop, one reading), about half the wall time per process with twice as many CPU-bound processes as cores
(0.53 s in 1 s beside three busy loops on 2 cores, one reading)."""


WAIT_SHARE = 0.4
"""Where the kernel does not say: the share of wall time the trainer may wait for its worker (10-28% per update on an
idle machine early in a Hopper run, when episodes end often and the two sub-envs' steps differ in cost)."""


def busy_share(
    queued_s: float | None, waited_s: float, wall_s: float, *, share: float = BUSY_SHARE, wait_share: float = WAIT_SHARE
) -> tuple[float, bool]:
    """The share of ``wall_s`` in which the run's processes waited ``queued_s`` for a core, and whether it is over
    ``share``: the sign that other processes use the run's cores. Where the kernel does not say (``queued_s`` None),
    the trainer's ``waited_s`` for its worker stand in, against ``wait_share``."""
    if queued_s is not None:
        return queued_s / wall_s, queued_s / wall_s > share
    return waited_s / wall_s, waited_s / wall_s > wait_share


def busy_cores_note(queued_s: float | None, waited_s: float, wall_s: float) -> str | None:
    """The end-of-run note for a run that kept its worker (``hardware.busy_fallback=false``) while other processes
    used the cores (:func:`busy_share`); None when the cores were the run's own."""
    if wall_s <= 0:
        return None
    share, over = busy_share(queued_s, waited_s, wall_s)
    if not over:
        return None
    who = "its two processes waited for a core" if queued_s is not None else "it waited for its env worker"
    what = f"{who} {share:.0%} of the time"
    return (
        f"pgcli: note: another process used this run's cores ({what}): hardware.vec_env=sync may be faster "
        "on this machine"
    )


HOME_NOTE = (
    "pgcli: note: another process is using this run's cores (its two processes waited for one {share} of the "
    "time): the run continues in one process, with the same results (hardware.busy_fallback=false keeps the worker)"
)
