"""The suite's fork server (tests/forkserver.py) gives what the console script gives: exit status, output, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_pgcli, start_pgcli, wait_until

pytestmark = pytest.mark.skipif(
    os.environ.get("PGCLI_TEST_EXEC") == "1", reason="PGCLI_TEST_EXEC=1: every command runs the console script"
)

COMMANDS = [
    ["--version"],
    ["trian"],
    ["train", "algo.clip_rnge=0.1", "tracking=off"],
    ["train", "--cfg", "job", "algo=trpo", "env=hopper", "seed=3"],
    ["eval", "no-such-run", "--tracking-uri", "sqlite:///nowhere/mlflow.db"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_forked_command_exits_and_prints_as_the_console_script(args: list[str], workdir: Path):
    forked = run_pgcli(args, cwd=workdir)
    console = run_pgcli(args, cwd=workdir, fork=False)
    assert (forked.returncode, forked.stdout, forked.stderr) == (console.returncode, console.stdout, console.stderr)


def test_a_forked_command_is_the_servers_child_not_the_tests(workdir: Path):
    """The command really ran forked (so the comparisons above compare two paths), in its own session."""
    proc = start_pgcli(["train", "tracking=off", "total_steps=100000000"], cwd=workdir, stderr=workdir / "err.txt")
    try:
        wait_until(lambda: "it/s" in (workdir / "err.txt").read_text() or "step/s" in (workdir / "err.txt").read_text(),
                   "the progress bar", timeout=120, proc=proc, stderr=workdir / "err.txt")  # fmt: skip
        assert os.getsid(proc.pid) == proc.pid  # its own session: a timeout kills it with what it started
        with pytest.raises(ChildProcessError):
            os.waitpid(proc.pid, os.WNOHANG)  # not this process's child: the server's handler waits for it
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
    assert "interrupted" in (workdir / "err.txt").read_text()


def test_a_forked_command_past_its_timeout_is_killed_with_what_it_started(workdir: Path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_pgcli(["train", "tracking=off", "total_steps=100000000", "hardware.vec_env=async"], cwd=workdir, timeout=20)
    assert time.monotonic() - started < 60
    wait_until(lambda: not processes_in(workdir), "the command and its env workers gone", timeout=10)


def processes_in(directory: Path) -> list[int]:
    """The processes whose working directory is ``directory`` (a command and the workers it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == directory:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
