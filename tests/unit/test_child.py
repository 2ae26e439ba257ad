"""pgcli.hardware.child: a spawned helper process answers over its pipe; its errors and its death are one-line errors
in the parent, never a hang; Ctrl-C does not reach it; closing it stops it."""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection

import pytest

from pgcli.errors import PgcliError
from pgcli.hardware.child import ChildProcess, describe


class HelperError(PgcliError):
    pass


def _echo(conn: Connection, side: Connection, prefix: str) -> None:
    """Answers each message with ``prefix + message`` (an error for "raise"), and on the side pipe too, until None."""
    while (message := conn.recv()) is not None:
        try:
            if message == "raise":
                raise ValueError("boom")
            conn.send(("ok", prefix + message))
        except ValueError as exc:
            conn.send(("error", describe(exc)))
        side.send(message)


def start() -> ChildProcess:
    return ChildProcess(
        _echo,
        "> ",
        name="pgcli-test-child",
        error=HelperError,
        side_pipes=1,
        died="the helper (pid {pid}) died during {doing} (exit code {code})",
        failed="the helper's {doing} failed: {message}",
    )


def test_a_child_answers_and_its_error_is_one_line():
    child = start()
    try:
        child.send("hi")
        assert child.answer() == "> hi" and child.side[0].recv() == "hi"
        child.send("raise")
        with pytest.raises(HelperError) as err:
            child.answer("echo")
        message = str(err.value)
        assert message.startswith("the helper's echo failed: ValueError: boom (") and "test_child.py:" in message
        assert "\n" not in message
        os.kill(child.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group; the child ignores it
        time.sleep(0.2)
        child.send("still here")
        assert child.answer() == "> still here"
    finally:
        start_s = time.perf_counter()
        child.close(None)
        assert time.perf_counter() - start_s < 4 and child.process.exitcode == 0  # told to stop, not terminated


def test_a_dead_child_is_a_one_line_error_not_a_hang():
    child = start()
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    with pytest.raises(HelperError, match=rf"^the helper \(pid {child.pid}\) died during step \(exit code -9\)$"):
        child.send("hi", "step")
        child.answer("step")
    with pytest.raises(HelperError, match="died during recv"):
        child.recv("recv")
    child.close(None)  # closing after the child died does not raise or hang


def test_describe_is_one_line_with_or_without_the_place():
    try:
        raise KeyError("x")
    except KeyError as exc:
        assert describe(exc).startswith("KeyError: 'x' (") and describe(exc).endswith(")")
        assert describe(exc, where=False) == "KeyError: 'x'"
