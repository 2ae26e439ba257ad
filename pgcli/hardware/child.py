"""The run's helper processes (env worker, evaluation process, critic process): each a spawned child on a pipe whose
failure the parent raises as one line, never a hang or a traceback from the other process.

:class:`ChildProcess` spawns ``target(conn, *side_conns, *args)`` with Ctrl-C ignored (the main process stops the
run, and checkpoints). Only the child holds its ends of the pipes, so its death is an EOF here, raised as the owner's
"died" line with its pid and exit code. A child answers a request with ``("ok", value)`` or ``("error", line)``, the
line made by :func:`describe`; :meth:`ChildPipe.answer` returns the value or raises the owner's "failed" line.
:meth:`ChildProcess.close` tells the child to stop, waits for it, and terminates it when it does not.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pgcli.errors import PgcliError

STOP_TIMEOUT_S = 5.0
"""How long :meth:`ChildProcess.close` waits for a child that was told to stop before it terminates it."""


def describe(exc: BaseException, *, where: bool = True) -> str:
    """An exception as one line: its type and message, and (``where``) the file and line that raised it."""
    last = traceback.extract_tb(exc.__traceback__)[-1:] if where else []
    at = f" ({last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{at}"


class ChildPipe:
    """This process's end of a pipe to a child process, raising the child's death and its errors as one line.

    Args:
        conn: this process's end of the pipe.
        process: the child at the other end.
        error: the exception class of both lines.
        died: the line for a child gone away, formatted with ``pid``, ``code`` (its exit code) and ``doing``.
        failed: the line for an ``("error", message)`` answer, formatted with ``message`` and ``doing``.
    """

    def __init__(
        self, conn: Connection, process: BaseProcess, *, error: type[PgcliError], died: str, failed: str
    ) -> None:
        self.conn, self.process = conn, process
        self._error, self._died, self._failed = error, died, failed

    def died(self, doing: str = "") -> PgcliError:
        """The error for the child's death (during ``doing``), once it has exited (waits up to a second)."""
        self.process.join(timeout=1.0)
        return self._error(self._died.format(pid=self.process.pid, code=self.process.exitcode, doing=doing))

    def failed(self, message: str, doing: str = "") -> PgcliError:
        """The error for the child's one-line ``message`` about ``doing``."""
        return self._error(self._failed.format(message=message, doing=doing))

    def send(self, message: Any, doing: str = "") -> None:
        """Send ``message``; a child that is gone raises its last error, if it sent one, else :meth:`died`."""
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError
            last = self.recv(doing)  # what the child said before it went (its death raises here)
            if isinstance(last, tuple) and len(last) == 2 and last[0] == "error":
                raise self.failed(last[1], doing) from None
            raise self.died(doing) from None

    def recv(self, doing: str = "") -> Any:
        """The child's next message (waits for it); its death raises :meth:`died`."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise self.died(doing) from None

    def answer(self, doing: str = "") -> Any:
        """The value of the child's next ``("ok", value)`` message; ``("error", line)`` raises :meth:`failed`."""
        return self.unpack(self.recv(doing), doing)

    def unpack(self, message: tuple[str, Any], doing: str = "") -> Any:
        """The value of an ``("ok", value)`` message; ``("error", line)`` raises :meth:`failed`."""
        status, value = message
        if status == "error":
            raise self.failed(value, doing)
        return value

    def poll(self) -> bool:
        """Whether a message is waiting."""
        return self.conn.poll()


def _child_main(target: Callable[..., None], *args: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run through the main process, which checkpoints
    target(*args)


class ChildProcess(ChildPipe):
    """Spawn ``target(conn, *side_conns, *args)`` as a daemon process named ``name`` (spawned, not forked: torch's
    threads do not survive a fork) and hold this end of its pipe (:class:`ChildPipe`, with the owner's ``error``,
    ``died`` and ``failed`` lines) and of ``side_pipes`` more (:attr:`side`)."""

    def __init__(
        self,
        target: Callable[..., None],
        *args: Any,
        name: str,
        error: type[PgcliError],
        died: str,
        failed: str,
        side_pipes: int = 0,
    ) -> None:
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(1 + side_pipes)]
        children = [child for _, child in pipes]
        process = ctx.Process(target=_child_main, args=(target, *children, *args), daemon=True, name=name)
        process.start()
        for child in children:  # only the child holds its ends: its death is an EOF here, never a hang
            child.close()
        super().__init__(pipes[0][0], process, error=error, died=died, failed=failed)
        self.side = [conn for conn, _ in pipes[1:]]
        """This process's ends of the side pipes, in order."""

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None  # started in __init__
        return pid

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)

    def close(self, farewell: Any = None, *, tell: bool = True) -> None:
        """Send ``farewell`` (``tell``; a child that is gone is fine), wait up to :data:`STOP_TIMEOUT_S` for the child
        to end, terminate it if it has not, and close the pipes."""
        if tell:
            with contextlib.suppress(OSError):
                self.conn.send(farewell)
        self.process.join(timeout=STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self.conn.close()
        for conn in self.side:
            conn.close()
