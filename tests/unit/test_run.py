"""A run's decisions: the final status (pgcli.training.run), the latest checkpoint (pgcli.training.checkpoints), and
which RUNNING runs are stale (pgcli.training.owner)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pgcli.tracking.store import RunRecord
from pgcli.training.checkpoints import latest_checkpoint
from pgcli.training.owner import process_alive, process_start_time, stale_reason
from pgcli.training.run import Interrupted, final_status, sweep_status


@pytest.mark.parametrize(
    ("exc", "missing", "status"),
    [
        (None, [], "FINISHED"),
        (None, ["metrics.csv: OSError: [Errno 28] No space left on device"], "FAILED"),
        (RuntimeError("boom"), [], "FAILED"),
        (KeyboardInterrupt(), [], "KILLED"),
        (Interrupted(signal.SIGHUP), ["metrics.csv: ..."], "KILLED"),
    ],
)
def test_final_status(exc: BaseException | None, missing: list[str], status: str):
    assert final_status(exc, missing) == status


def test_sweep_status():
    assert sweep_status("FINISHED", 0) == "FINISHED"
    assert sweep_status("FINISHED", 1) == "FAILED"  # a failed job fails the sweep
    assert sweep_status("FAILED", 0) == "FAILED"
    assert sweep_status("KILLED", 3) == "KILLED"


def test_interrupted_exit_codes():
    assert [Interrupted(s).exit_code for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == [130, 143, 129]
    assert isinstance(Interrupted(signal.SIGTERM), KeyboardInterrupt)  # every `except KeyboardInterrupt` sees it


def test_latest_checkpoint_takes_the_largest_complete_step(tmp_path: Path):
    assert latest_checkpoint(tmp_path / "checkpoints") is None
    for name in ("step_512", "step_1024", "step_4096.tmp", ".step_8192", "step_abc"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.pt").write_bytes(b"x")
    (tmp_path / "step_2048").mkdir()  # empty: a checkpoint that was never written
    assert latest_checkpoint(tmp_path) == (1024, tmp_path / "step_1024")


def record(tags: dict[str, str], status: str = "RUNNING") -> RunRecord:
    return RunRecord("id", "0", "name", status, 0, {}, tags, {})


def test_stale_reason():
    host, me = socket.gethostname(), os.getpid()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert stale_reason(record({"pid": str(done.pid), "hostname": host})) == f"process {done.pid} on {host} is gone"
    assert stale_reason(record({"pid": str(me), "hostname": host, "pid_start": process_start_time(me)})) is None
    assert stale_reason(record({"pid": str(me), "hostname": host, "pid_start": "1"})) is not None  # pid reused
    assert stale_reason(record({"pid": str(done.pid), "hostname": "elsewhere"})) is None  # cannot be checked here
    assert stale_reason(record({})) is None
    assert stale_reason(record({"pid": str(done.pid), "hostname": host}, status="FINISHED")) is None
    assert process_alive(me) and not process_alive(done.pid)


def test_a_dead_process_not_yet_reaped_is_not_alive():
    # kill -9 of a whole job leaves its workers as zombies until an init reaps them (a container's may never): the
    # run they held is free to resume
    import time

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while (Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polling interval: the child exits on its own
        assert not process_alive(zombie.pid, process_start_time(zombie.pid))
        assert stale_reason(record({"pid": str(zombie.pid), "hostname": socket.gethostname()})) is not None
    finally:
        zombie.wait()
