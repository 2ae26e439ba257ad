"""Credentials in a tracking URI reach neither the store, the artifacts, the run directory nor the console
(docs/tracking.md, "Credentials and secrets").

A real ``mlflow server`` on 127.0.0.1 (no auth: it ignores the basic-auth header MLflow's client builds from the URI's
user:password) and a real ``pgcli train`` against ``http://alice:s3cr3t@127.0.0.1:<port>``; then every byte the server
stored (its SQLite file and artifact directory) and everything pgcli wrote or printed is searched for the secret.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli_env, run_pgcli

SECRET, USER = "s3cr3t", "alice"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path, mlflow_schema_db: Path) -> Iterator[tuple[int, Path]]:
    """A local ``mlflow server``; yields (port, its root with server.db and artifacts/)."""
    root = tmp_path / "server"
    root.mkdir()
    shutil.copyfile(mlflow_schema_db, root / "server.db")  # schema in place: no migrations at start-up
    port = free_port()
    store, artifacts = f"sqlite:///{root / 'server.db'}", str(root / "artifacts")
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        store,
        "--artifacts-destination",
        artifacts,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
    )
    ready = threading.Event()

    def watch() -> None:  # the server says when it listens; read its log instead of polling the port
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Uvicorn running on" in line or "Listening at" in line:
                ready.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not ready.wait(timeout=240):
            pytest.fail(f"mlflow server did not start on port {port} within 240 s")
        yield port, root
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_uri_credentials_never_reach_the_store_artifacts_run_dir_or_console(server, tmp_path: Path):
    port, root = server
    workdir = tmp_path / "work"
    workdir.mkdir()
    uri = f"http://{USER}:{SECRET}@127.0.0.1:{port}"
    proc = run_pgcli(
        [
            "train",
            "tracking=server",
            f"tracking.uri={uri}",
            "total_steps=256",
            "algo.n_steps=32",
            "algo.batch_size=32",
            "env.n_envs=2",
            "eval.every=0",
            "eval.episodes=1",
            "progress=false",
        ],
        cwd=workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the run landed on that server: the URI, credentials included, was used to connect
    con = sqlite3.connect(root / "server.db")
    try:
        (status,) = con.execute("SELECT status FROM runs").fetchone()
        params = dict(con.execute("SELECT key, value FROM params").fetchall())
        tags = dict(con.execute("SELECT key, value FROM tags").fetchall())
    finally:
        con.close()
    assert status == "FINISHED"
    shown = f"http://***@127.0.0.1:{port}"
    assert params["tracking.uri"] == shown
    assert f"tracking.uri={shown}" in tags["hydra_overrides"].split()
    assert shown in proc.stdout  # the summary names the store, without the credentials
    # not a byte of the secret anywhere: the server's database and artifacts, the run directory, the console
    stored = [root / "server.db", *sorted((root / "artifacts").rglob("*")), *sorted(workdir.rglob("*"))]
    files = [p for p in stored if p.is_file()]
    assert any(p.name == "config.yaml" and p.parent.name == "hydra" for p in files)  # the logged .hydra artifact
    assert any(p.name == "overrides.yaml" and p.parent.name == ".hydra" for p in files)  # the run directory's copy
    for path in files:
        data = path.read_bytes()
        assert SECRET.encode() not in data and f"{USER}:".encode() not in data, path
    assert SECRET not in proc.stdout + proc.stderr and f"{USER}:" not in proc.stdout + proc.stderr
    assert "***" in (workdir / next(p for p in files if p.name == "overrides.yaml")).read_text()
    assert os.environ.get("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT") is None  # the test process itself unchanged
