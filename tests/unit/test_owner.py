"""The one-writer claim (pgcli.training.owner; docs/runs.md, "One writer per run") on real marker files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgcli.errors import ConfigError
from pgcli.training.owner import OWNER_FILE, check_one_writer, claim_run, process_tags, release_run


def test_claim_is_reentrant_in_its_thread_and_released_once_per_claim(tmp_path: Path):
    run_dir = tmp_path / "run"
    claim_run(run_dir, "run x")
    claim_run(run_dir, "run x")  # pgcli train resume= claims, then the Run
    assert json.loads((run_dir / OWNER_FILE).read_text()) == process_tags()
    release_run(run_dir)
    assert (run_dir / OWNER_FILE).exists()
    release_run(run_dir)
    assert not (run_dir / OWNER_FILE).exists()


def test_a_live_owner_is_refused_a_gone_one_taken_over(tmp_path: Path):
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    marker = tmp_path / OWNER_FILE
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from pgcli.training.owner import process_start_time

        host = process_tags()["hostname"]
        marker.write_text(
            json.dumps({"pid": str(live.pid), "hostname": host, "pid_start": process_start_time(live.pid)})
        )
        with pytest.raises(ConfigError, match=rf"^run x is still running \(pid {live.pid} on {host}\)"):
            claim_run(tmp_path, "run x")
        with pytest.raises(ConfigError):
            check_one_writer(tmp_path, "run x")
        # the same pid, started at another time: reused by another process, the owner is gone
        marker.write_text(json.dumps({"pid": str(live.pid), "hostname": host, "pid_start": "1"}))
        claim_run(tmp_path, "run x")
        release_run(tmp_path)
    finally:
        live.kill()
    marker.write_text(json.dumps({"pid": str(done.pid), "hostname": host, "pid_start": ""}))  # dead
    check_one_writer(tmp_path, "run x")
    claim_run(tmp_path, "run x")
    release_run(tmp_path)
    marker.write_text(json.dumps({"pid": str(done.pid), "hostname": "elsewhere"}))  # cannot be checked from here
    with pytest.raises(ConfigError, match="on host elsewhere"):
        claim_run(tmp_path, "run x")
