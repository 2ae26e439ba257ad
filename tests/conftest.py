"""Shared fixtures: a temporary MLflow store and a runner for real `pgcli` subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

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
def _hermetic_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees a tracking URI it did not set: MLflow's ``set_tracking_uri`` exports ``MLFLOW_TRACKING_URI``
    into this process's environment, and pgcli's default store reads it, so an in-process run of one test would
    otherwise point the next test's default store at its temporary one (and a user's own setting would leak in)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


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
    new = Store(tmp_path / "store")
    new.root.mkdir()
    shutil.copyfile(mlflow_schema_db, new.root / "mlflow.db")
    return new


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}, **extra)
    return env


def run_pgcli(args: list[str], *, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real `pgcli` console script (from this venv) in ``cwd``."""
    exe = Path(sys.executable).parent / "pgcli"
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=cli_env(**env)
    )


def start_pgcli(args: list[str], *, cwd: Path, stderr: Path, **env: str) -> subprocess.Popen[bytes]:
    """Start the real `pgcli` console script in ``cwd`` without waiting, its stderr written to the file ``stderr``."""
    exe = Path(sys.executable).parent / "pgcli"
    with stderr.open("w") as err:
        return subprocess.Popen([str(exe), *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=cli_env(**env))


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
