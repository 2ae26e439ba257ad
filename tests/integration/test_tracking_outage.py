"""A real `mlflow server` on 127.0.0.1 that dies and comes back while a real `pgcli train` runs (docs/tracking.md,
"When the tracking server goes away").

Training must neither stop nor stall: writes wait in the run directory's spool and reach the server once it answers
again (or through `pgcli sync` afterwards). Nothing is lost and nothing is doubled: the server's metric history of
the run equals the run's own `metrics.csv`, point for point.
"""

from __future__ import annotations

import csv
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcli.tracking.spool import SPOOL_FILE, Spool
from tests.conftest import Store, cli_env, run_pgcli, start_pgcli, wait_until
from tests.forkserver import Forked


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`mlflow server` over a SQLite store, started and killed (SIGKILL: a crash) by the test."""

    def __init__(self, store: Store, port: int, log: Path) -> None:
        self.store, self.port, self.log = store, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import requests

        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            self.store.uri,
            "--artifacts-destination",
            str(self.store.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        env = {**cli_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if requests.get(f"{self.uri}/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise AssertionError(f"mlflow server did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture
def server(migrated_store: Store, tmp_path: Path) -> Iterator[Server]:
    srv = Server(migrated_store, _free_port(), tmp_path / "server.log")
    srv.start()
    yield srv
    srv.kill()


def the_run(store: Store) -> Any:
    client = store.client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return runs[0] if len(runs) == 1 else None


def store_points(store: Store, run: Any) -> Counter[tuple[str, int, float]]:
    client = store.client()
    keys = client.get_run(run.info.run_id).data.metrics
    return Counter((k, m.step, round(m.value, 6)) for k in keys for m in client.get_metric_history(run.info.run_id, k))


def csv_points(run_dir: Path) -> Counter[tuple[str, int, float]]:
    with (run_dir / "metrics.csv").open() as f:
        return Counter((r["key"], int(r["step"]), round(float(r["value"]), 6)) for r in csv.DictReader(f))


def start_training(server: Server, workdir: Path, stderr: Path, *overrides: str) -> subprocess.Popen[bytes] | Forked:
    args = [
        "train",
        f"tracking.uri={server.uri}",
        "progress=false",
        "tracking.flush_every_s=0.2",
        "eval.every=2000",
        "eval.episodes=2",
        *overrides,
    ]
    return start_pgcli(args, cwd=workdir, stderr=stderr)


def test_server_dies_mid_run_and_comes_back(server: Server, workdir: Path, tmp_path: Path) -> None:
    stderr = tmp_path / "train.stderr"
    proc = start_training(server, workdir, stderr, "total_steps=100000000")
    until = functools.partial(wait_until, timeout=180, proc=proc, stderr=stderr, interval=0.5)
    try:
        run = until(
            lambda: (r := the_run(server.store)) is not None and r.data.metrics and r,
            "the run's first metrics on the server",
        )
        server.kill()
        until(lambda: "unreachable" in stderr.read_text(), "the outage warning")
        run_dir = Path(run.data.tags["output_dir"])
        spool = run_dir / "tracking_spool.jsonl"
        until(lambda: spool.is_file() and spool.stat().st_size > 2000, "writes spooled while the server is down")
        assert proc.poll() is None, "training goes on without its server"
        server.start()
        until(lambda: "is back: delivered" in stderr.read_text(), "the spool delivered")
        assert not spool.exists()
        time.sleep(1)  # a little more training online again
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr.read_text()[-3000:]
    final = server.store.client().get_run(run.info.run_id)
    assert final.info.status == "KILLED"
    # every point the run logged is on the server exactly as often as the run logged it
    assert store_points(server.store, final) == csv_points(run_dir)
    assert "Traceback" not in stderr.read_text()


def test_server_down_at_the_end_then_pgcli_sync(server: Server, workdir: Path, tmp_path: Path) -> None:
    stderr = tmp_path / "train.stderr"
    proc = start_training(server, workdir, stderr, "total_steps=12000", "checkpoint_every=2000", "checkpoint_keep=1")
    try:
        run = wait_until(
            lambda: (r := the_run(server.store)) is not None and r.data.metrics and r,
            "the run's first metrics on the server",
            timeout=180,
            stderr=stderr,
            interval=0.5,
        )
        server.kill()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.read_text()
    assert proc.returncode == 0, err[-3000:]  # the training itself succeeded
    run_dir = Path(run.data.tags["output_dir"])
    assert f"pgcli sync {run_dir}" in err and "Traceback" not in err
    assert (run_dir / "tracking_spool.jsonl").is_file()

    down = run_pgcli(["sync", str(run_dir)], cwd=workdir)
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "unreachable" in down.stderr, down.stderr

    # checkpoint_keep=1 keeps every checkpoint the spool still has to deliver
    spooled = [
        op["artifact_path"]
        for op in Spool(run_dir / SPOOL_FILE).operations()
        if op["op"] == "artifact" and str(op["artifact_path"]).startswith("checkpoints/")
    ]
    assert len(spooled) >= 2 and all((run_dir / path).is_dir() for path in spooled), spooled

    server.start()
    assert server.store.client().get_run(run.info.run_id).info.status == "RUNNING"
    # its process is gone, but the run is not stale: its end waits in the spool
    stale = run_pgcli(["runs", "--stale", f"tracking.uri={server.uri}"], cwd=workdir)
    assert stale.returncode == 0 and stale.stdout == "" and f"`pgcli sync {run_dir}`" in stale.stderr, stale.stderr
    assert server.store.client().get_run(run.info.run_id).info.status == "RUNNING"
    sync = run_pgcli(["sync", str(run_dir)], cwd=workdir)
    assert sync.returncode == 0, sync.stderr
    assert f"to run {run.info.run_id}; run ended FINISHED" in sync.stdout
    final = server.store.client().get_run(run.info.run_id)
    assert final.info.status == "FINISHED"
    assert store_points(server.store, final) == csv_points(run_dir)
    from mlflow.tracking import MlflowClient

    artifacts = {a.path for a in MlflowClient(server.uri).list_artifacts(run.info.run_id)}  # served by the server
    assert {"metrics.csv", "model"} <= artifacts
    delivered = {a.path for a in MlflowClient(server.uri).list_artifacts(run.info.run_id, "checkpoints")}
    assert set(spooled) <= delivered
    again = run_pgcli(["sync", str(run_dir)], cwd=workdir)
    assert again.returncode == 2 and "nothing to deliver" in again.stderr
