"""Shared fixtures: a temporary MLflow store and a runner for real `pgcli` subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.forkserver import SERVERS, Forked, ForkServer

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Store:
    """A temporary embedded MLflow store (SQLite + artifact dir) and a client on it."""

    root: Path

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def runs(self, experiment: str):
        client = self.client()
        exp = client.get_experiment_by_name(experiment)
        assert exp is not None, f"experiment {experiment!r} not found in {self.uri}"
        return client.search_runs([exp.experiment_id])


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees an environment variable another test set, nor a tracking URI it did not set itself.

    pgcli's code run in-process exports variables (MLflow's ``set_tracking_uri`` exports ``MLFLOW_TRACKING_URI``,
    which pgcli's default store reads; the video code ``MUJOCO_GL``; the launcher ``OMP_NUM_THREADS``): without this,
    an in-process run of one test would point the next test's default store at its temporary one, and change what
    every later ``pgcli`` command of the worker inherits (a user's own tracking URI would leak in too)."""
    saved = dict(os.environ)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture(scope="session")
def mlflow_schema_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store with its schema in place, made once per session.

    A brand-new store runs MLflow's ~60 alembic migrations on first use (2-5 s on a busy 2-core machine); tests that
    only need *a* store copy this file instead of paying that in every subprocess.
    """
    root = tmp_path_factory.mktemp("mlflow_schema")
    Store(root).client().search_experiments()  # creates and migrates root/mlflow.db
    return root / "mlflow.db"


@pytest.fixture
def migrated_store(tmp_path: Path, mlflow_schema_db: Path) -> Store:
    """Like ``store``, but the SQLite file already exists with MLflow's schema (and no runs)."""
    return migrated(tmp_path / "store", mlflow_schema_db)


def migrated(root: Path, mlflow_schema_db: Path) -> Store:
    """A store in the new directory ``root`` whose SQLite file is a copy of ``mlflow_schema_db`` (the fixture): the
    first command on it skips MLflow's migrations (4-5 s of CPU), for tests that are not about a new store."""
    root.mkdir(parents=True)
    shutil.copyfile(mlflow_schema_db, root / "mlflow.db")
    return Store(root)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}, **extra)
    return env


def run_pgcli(
    args: list[str], *, cwd: Path, timeout: float = 300, fork: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``pgcli <args>`` in ``cwd`` in a process of its own, and wait for it.

    The process is forked from a server that has torch, MLflow, SB3 and Hydra imported already (tests/forkserver.py:
    what that covers and what it does not); ``fork=False``, an environment that changes what those libraries read at
    import, or ``PGCLI_TEST_EXEC=1`` run the console script itself.
    """
    argv, full, server = _launch(args, fork, env)
    if server is None:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full)
    return server.run(argv, cwd=cwd, env=full, timeout=timeout)


_SERVER = SERVERS


def _launch(args: list[str], fork: bool, env: dict[str, str]) -> tuple[list[str], dict[str, str], ForkServer | None]:
    """The console script's argv, the command's environment, and the server that forks it (None: run the console
    script; a warning in pytest's summary names the variables that stopped a fork)."""
    full = cli_env(**env)
    server = _forkserver(fork)
    stopping = [] if server is None else server.stopping(full)
    if stopping:
        warnings.warn(
            f"pgcli ran through the console script, not forked: the environment changes {stopping}", stacklevel=3
        )
    return [str(Path(sys.executable).parent / "pgcli"), *args], full, None if stopping else server


def _forkserver(fork: bool) -> ForkServer | None:
    """This pytest process's fork server, or None when commands run the console script.

    Started on first use, and again when this process's own environment changed a variable the server's libraries
    read at import (an in-process test or fixture set it): a command inherits this process's environment, as the
    console script would.
    """
    if not fork or os.environ.get("PGCLI_TEST_EXEC") == "1":
        return None
    base = cli_env()
    if _SERVER and _SERVER[0].stopping(base):
        _SERVER.pop().close()
    if not _SERVER:
        _SERVER.append(ForkServer(base, cwd=REPO))
    return _SERVER[0]


@pytest.fixture(scope="session", autouse=True)
def _close_forkserver() -> Iterator[None]:
    yield
    if _SERVER:
        _SERVER.pop().close()


def start_pgcli(
    args: list[str], *, cwd: Path, stderr: Path, stdout: Path | None = None, fork: bool = True, **env: str
) -> subprocess.Popen[bytes] | Forked:
    """Start ``pgcli <args>`` in ``cwd`` without waiting, its stderr written to the file ``stderr`` (its stdout to
    ``stdout``, or nowhere): forked as :func:`run_pgcli` does (the returned process has Popen's ``pid``, ``poll``,
    ``wait``, ``send_signal``, ``kill`` and ``returncode``), or the console script itself."""
    argv, full, server = _launch(args, fork, env)
    if server is None:
        with stderr.open("w") as err, open(stdout or os.devnull, "w") as out:
            return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=full)
    return server.start(argv, cwd=cwd, env=full, stdout=stdout or Path(os.devnull), stderr=stderr)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory to run pgcli in (its outputs/ land here)."""
    d = tmp_path / "work"
    d.mkdir()
    yield d


def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float,
    proc: subprocess.Popen[Any] | None = None,
    stderr: Path | None = None,
    interval: float = 0.1,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Fails the test, with the tail of ``stderr``, if ``proc`` exits first or ``timeout`` seconds pass (the process
    is killed then). ``interval`` is a polling interval, not a synchronisation delay.
    """
    deadline = time.monotonic() + timeout
    tail = lambda: stderr.read_text()[-3000:] if stderr is not None and stderr.exists() else ""  # noqa: E731
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"pgcli exited ({proc.returncode}) before {what}:\n{tail()}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
            pytest.fail(f"timed out after {timeout} s waiting for {what}:\n{tail()}")
        time.sleep(interval)


@contextmanager
def busy_cores() -> Iterator[None]:
    """Another process keeping every usable CPU busy while the block runs (started 0.3 s before, so that they show
    in /proc/loadavg), then killed."""
    from pgcli.hardware.placement import usable_cpus

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus())]
    try:
        time.sleep(0.3)
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama with a trained BPE tokenizer, written once per session with ``save_pretrained``: the offline
    model of every ``model=hf`` test (nothing is downloaded)."""
    from pgcli.lm.random_hf import write_random_model

    return write_random_model(tmp_path_factory.mktemp("hf") / "tiny-llama")
