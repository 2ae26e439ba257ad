"""Is another process taking this run's cores? One owner of that question for a run on the two-core path
(``hardware.vec_env=shm``; docs/benchmarks/trpo.md, "Two commands side by side").

The signs are read from the kernel: the seconds the run's two processes spent runnable but off a core
(``/proc/<pid>/schedstat``, :func:`run_queue_s`); where it does not say, the seconds the trainer waited for its env
worker stand in. Between updates :class:`WorkerWatch` brings the worker's sub-envs home when the cores are taken
(``hardware.busy_fallback``, the same results); a run that kept its worker gets :func:`busy_cores_note` at the end.
Whether a core is free *before* a run starts is :func:`pgcli.hardware.placement.free_core`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from gymnasium.vector import VectorEnv

from pgcli.envs.shm import SharedMemoryVectorEnv


def _with_worker(env: VectorEnv) -> SharedMemoryVectorEnv | None:
    """``env``'s shared-memory vector env (through its wrappers) while its worker process runs, else None."""
    base = env.unwrapped
    return base if isinstance(base, SharedMemoryVectorEnv) and base.worker is not None else None


def worker_wait(env: VectorEnv) -> Callable[[], float] | None:
    """Seconds ``env``'s shared-memory worker has kept :meth:`SharedMemoryVectorEnv.step` waiting so far (a
    counter, through its wrappers), None when ``env`` steps everything in this process."""
    base = _with_worker(env)
    return None if base is None else lambda: base.wait_s


def run_queue_s(pid: int) -> float | None:
    """Seconds the task ``pid`` (a process's main thread) has spent runnable but waiting for a core: the second field
    of ``/proc/<pid>/schedstat``. None where it cannot be read (another OS, a process that is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def run_queue_total(env: VectorEnv) -> float | None:
    """Seconds this process and ``env``'s shared-memory worker have waited for a core so far (:func:`run_queue_s`);
    None without a worker or where the kernel does not say."""
    base = _with_worker(env)
    if base is None or base.worker is None:
        return None
    ours, worker = run_queue_s(os.getpid()), run_queue_s(base.worker.pid)
    return None if ours is None or worker is None else ours + worker


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


class WorkerWatch:
    """Between updates: brings a shared-memory env's worker sub-envs home (:meth:`SharedMemoryVectorEnv.bring_home`,
    the same results) when another process has started to use the run's cores (a second run started beside it, say):
    then the trainer and its busy-waiting worker share two cores with it, and every vector step waits for whichever
    is descheduled, while one process would have a core to itself.

    The sign: for ``patience`` updates in a row, the run's two processes together spent more than ``share`` of the
    wall time runnable but off a core (:func:`run_queue_s`; see :data:`BUSY_SHARE`). Where the kernel does not
    tell, the trainer's waits for the worker (``wait_s``) stand in, with a higher bar (``wait_share``): they are
    also 10-28% per update on an idle machine, when the two sub-envs' steps differ in cost.
    :func:`pgcli.hardware.placement.free_core` cannot tell here: the run's own worker counts as a runnable process
    while it busy-waits.

    Call it only with no evaluation in the worker; it returns the note to print when the sub-envs came home."""

    def __init__(
        self,
        env: SharedMemoryVectorEnv,
        *,
        share: float = BUSY_SHARE,
        wait_share: float = WAIT_SHARE,
        patience: int = 2,
        run_queue: Callable[[], float | None] | None = None,
    ) -> None:
        self.env, self.share, self.wait_share, self.patience = env, share, wait_share, patience
        self.run_queue = run_queue or self._run_queue
        """Seconds the run's processes have waited for a core so far (None: not known here)."""
        self._last = (self.run_queue(), env.wait_s, time.perf_counter())
        self._strikes = 0

    def _run_queue(self) -> float | None:
        return run_queue_total(self.env)

    def __call__(self) -> str | None:
        queued, waited, now = self.run_queue(), self.env.wait_s, time.perf_counter()
        (queued0, waited0, then), self._last = self._last, (queued, waited, now)
        queued_s = None if queued is None or queued0 is None else queued - queued0
        share, busy = busy_share(queued_s, waited - waited0, max(now - then, 1e-9), share=self.share,
                                 wait_share=self.wait_share)  # fmt: skip
        self._strikes = self._strikes + 1 if busy else 0
        if self._strikes < self.patience or not self.env.bring_home():
            return None
        return HOME_NOTE.format(share=f"{share:.0%}")


def worker_watch(env: VectorEnv) -> WorkerWatch | None:
    """A :class:`WorkerWatch` for ``env``'s shared-memory worker (through its wrappers), None without one."""
    base = _with_worker(env)
    return None if base is None else WorkerWatch(base)
