"""The shared-memory vector env's instruments between updates (``hardware.vec_env=shm``): how long the trainer has
waited for its worker (:func:`worker_wait`), how long both processes waited for a core (:func:`run_queue_total`), and
:class:`WorkerWatch`, which brings the worker's sub-envs home when another process takes the run's cores. The bar
they are judged by is :mod:`pgcli.hardware.watch`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from gymnasium.vector import VectorEnv

from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.hardware.watch import BUSY_SHARE, HOME_NOTE, WAIT_SHARE, busy_share, run_queue_s


def _with_worker(env: VectorEnv) -> SharedMemoryVectorEnv | None:
    """``env``'s shared-memory vector env (through its wrappers) while its worker process runs, else None."""
    base = env.unwrapped
    return base if isinstance(base, SharedMemoryVectorEnv) and base.worker is not None else None


def worker_wait(env: VectorEnv) -> Callable[[], float] | None:
    """Seconds ``env``'s shared-memory worker has kept :meth:`SharedMemoryVectorEnv.step` waiting so far (a
    counter, through its wrappers), None when ``env`` steps everything in this process."""
    base = _with_worker(env)
    return None if base is None else lambda: base.wait_s


def run_queue_total(env: VectorEnv) -> float | None:
    """Seconds this process and ``env``'s shared-memory worker have waited for a core so far (:func:`run_queue_s`);
    None without a worker or where the kernel does not say."""
    base = _with_worker(env)
    if base is None or base.worker is None:
        return None
    ours, worker = run_queue_s(os.getpid()), run_queue_s(base.worker.pid)
    return None if ours is None or worker is None else ours + worker


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
        share, busy = busy_share(
            queued_s, waited - waited0, max(now - then, 1e-9), share=self.share, wait_share=self.wait_share
        )
        self._strikes = self._strikes + 1 if busy else 0
        if self._strikes < self.patience or not self.env.bring_home():
            return None
        return HOME_NOTE.format(share=f"{share:.0%}")


def worker_watch(env: VectorEnv) -> WorkerWatch | None:
    """A :class:`WorkerWatch` for ``env``'s shared-memory worker (through its wrappers), None without one."""
    base = _with_worker(env)
    return None if base is None else WorkerWatch(base)
