"""`pgcli compare` and `pgcli ui` on bad input and faults, as real subprocesses (docs/configuration.md, "Validation"):
one line `pgcli: error: ...`, exit 2 for bad input and 1 for faults, no traceback, and nothing created or changed."""

from __future__ import annotations

import shutil
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_pgcli


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mlflow_store(work: Path, schema_db: Path) -> str:
    """An MLflow store with no runs (the migrated schema), as a tracking.uri override."""
    shutil.copyfile(schema_db, work / "runs.db")
    return f"tracking.uri=sqlite:///{work / 'runs.db'}"


def corrupt_store(work: Path, schema_db: Path) -> str:
    (work / "runs.db").write_bytes(b"this is not a database\n" * 100)
    return f"tracking.uri=sqlite:///{work / 'runs.db'}"


def foreign_sqlite(work: Path, schema_db: Path) -> str:
    with sqlite3.connect(work / "runs.db") as con:
        con.execute("CREATE TABLE notes (text TEXT)")
    return f"tracking.uri=sqlite:///{work / 'runs.db'}"


def nothing(work: Path, schema_db: Path) -> str:
    return ""  # the default store, outputs/mlflow.db, which this empty folder does not have


def closed_port_server(work: Path, schema_db: Path) -> str:
    return f"tracking.uri=http://127.0.0.1:{free_port()}"


Setup = Callable[[Path, Path], str]
# (argv, store setup, exit status, message fragment); the costlier cases (MLflow imported) run as real subprocesses
SUBPROCESS_CASES: list[tuple[list[str], Setup, int, str]] = [
    (["compare"], nothing, 2, "no run store at "),
    (["compare", "--filter", "params.algo = ppo"], mlflow_store, 2, "invalid search filter 'params.algo = ppo'"),
    (["compare"], corrupt_store, 1, "(file is not a database)"),
    (["compare"], closed_port_server, 1, "is not reachable"),
    (["ui"], nothing, 2, "no run store at "),
    (["ui", "--port", "70000"], mlflow_store, 2, "--port must be between 1 and 65535 (got 70000)"),
    (["ui"], corrupt_store, 1, "(file is not a database)"),
    (["runs"], nothing, 2, "no run store at "),
    (["runs", "--stale"], corrupt_store, 1, "(file is not a database)"),
    (["runs"], closed_port_server, 1, "is not reachable"),
]
IN_PROCESS_CASES: list[tuple[list[str], Setup, int, str]] = [
    (["compare", "--filter", "foo bar"], mlflow_store, 2, "invalid search filter 'foo bar'"),
    (["compare", "--experiment", "nope"], mlflow_store, 2, "--experiment: unknown experiment among nope"),
    (["compare", "--parent", "0123abc"], mlflow_store, 2, "--parent: no run with id '0123abc'"),
    (["compare"], mlflow_store, 2, "no sweep in sqlite:///"),
    (["compare", "--n-boot", "0"], nothing, 2, "--n-boot must be >= 1"),
    (["compare", "--n-boot", "many"], nothing, 2, "argument --n-boot: invalid int value: 'many'"),
    (["compare", "--no-such-flag"], nothing, 2, "unrecognized arguments: --no-such-flag"),
    (["compare", "tracking.uri=no/such/folder"], nothing, 2, "no run store at "),
    (["compare"], foreign_sqlite, 1, "is a SQLite database but not an MLflow store"),
    (["ui", "--port", "-1"], mlflow_store, 2, "--port must be between 1 and 65535 (got -1)"),
    (["ui", "--port", "http"], mlflow_store, 2, "argument --port: invalid int value: 'http'"),
    (["ui", "--workers", "0"], mlflow_store, 2, "--workers must be >= 1"),
    (["ui"], foreign_sqlite, 1, "is a SQLite database but not an MLflow store"),
    (["runs"], foreign_sqlite, 1, "is a SQLite database but not an MLflow store"),
]


def case_id(case: tuple[list[str], Setup, int, str]) -> str:
    return f"{' '.join(case[0])}-{case[1].__name__}"


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("argv", "setup", "code", "fragment"), SUBPROCESS_CASES, ids=map(case_id, SUBPROCESS_CASES))
def test_bad_input_and_faults_are_one_line_with_their_exit_status_and_create_nothing(
    argv: list[str], setup: Setup, code: int, fragment: str, workdir: Path, mlflow_schema_db: Path
) -> None:
    override = setup(workdir, mlflow_schema_db)
    before = files_under(workdir)
    proc = run_pgcli([*argv, *([override] if override else [])], cwd=workdir, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pgcli: error: "), proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and proc.stdout == ""
    assert files_under(workdir) == before  # no store, no outputs/, no report; the given store file unchanged


@pytest.mark.parametrize(("argv", "setup", "code", "fragment"), IN_PROCESS_CASES, ids=map(case_id, IN_PROCESS_CASES))
def test_more_bad_input_in_process(
    argv: list[str],
    setup: Setup,
    code: int,
    fragment: str,
    workdir: Path,
    mlflow_schema_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pgcli.cli import main

    override = setup(workdir, mlflow_schema_db)
    before = files_under(workdir)
    monkeypatch.chdir(workdir)
    assert main([*argv, *([override] if override else [])]) == code
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("pgcli: error: ") and fragment in err, err
    assert out == ""
    assert files_under(workdir) == before


def test_ui_on_a_port_in_use_says_so(workdir: Path, mlflow_schema_db: Path) -> None:
    override = mlflow_store(workdir, mlflow_schema_db)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_pgcli(["ui", "--port", str(port), override], cwd=workdir, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr
        == f"pgcli: error: 127.0.0.1:{port} is in use (another pgcli ui or server?); pick another with --port N\n"
    )
