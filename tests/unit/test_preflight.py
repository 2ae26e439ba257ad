"""pgcli.tracking.checks and pgcli.training.preflight: what makes a tracking store or an output directory
unusable, found before anything is created."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pgcli.errors import ConfigError, PgcliError
from pgcli.tracking.checks import (
    check_sqlite_store,
    check_tracking_uri,
    check_writable_dir,
    existing_ancestor,
)
from pgcli.training.preflight import check_experiment_name


def test_a_new_or_empty_sqlite_file_is_accepted_and_not_created(tmp_path: Path):
    check_sqlite_store(f"sqlite:///{tmp_path}/new/mlflow.db")
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty.db").touch()
    check_sqlite_store(f"sqlite:///{tmp_path}/empty.db")
    sqlite3.connect(tmp_path / "no_tables.db").close()
    check_sqlite_store(f"sqlite:///{tmp_path}/no_tables.db")


def test_an_mlflow_store_is_accepted_and_left_unchanged(tmp_path: Path, mlflow_schema_db: Path):
    before = mlflow_schema_db.read_bytes()
    check_sqlite_store(f"sqlite:///{mlflow_schema_db}")
    assert mlflow_schema_db.read_bytes() == before


def test_a_foreign_database_or_a_text_file_is_refused_and_left_unchanged(tmp_path: Path):
    con = sqlite3.connect(tmp_path / "app.db")
    con.execute("CREATE TABLE experiments (id INTEGER)")  # one MLflow-like name is not enough
    con.commit()
    con.close()
    (tmp_path / "notes.txt").write_text("hello")
    before = (tmp_path / "app.db").read_bytes()
    with pytest.raises(PgcliError, match=r"another application's SQLite database \(tables: experiments\)"):
        check_sqlite_store(f"sqlite:///{tmp_path}/app.db")
    with pytest.raises(PgcliError, match="is not a SQLite database"):
        check_sqlite_store(f"sqlite:///{tmp_path}/notes.txt")
    assert (tmp_path / "app.db").read_bytes() == before


@pytest.mark.parametrize(
    ("uri", "error", "fragment"),
    [
        ("gopher://host", ConfigError, "cannot track to scheme 'gopher'"),
        ("https://", ConfigError, "has no host"),
        ("http://host:99999999", ConfigError, "is malformed"),
        ("sqlite:relative.db", ConfigError, "is malformed"),
        ("sqlite://host/x.db", ConfigError, "a SQLite store is sqlite:///"),
    ],
)
def test_malformed_or_unsupported_uris_are_bad_input(uri: str, error: type, fragment: str):
    with pytest.raises(error, match=fragment) as info:
        check_tracking_uri(uri)
    assert type(info.value) is error


def test_plugin_free_schemes_that_mlflow_supports_pass_the_scheme_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    check_tracking_uri("sqlite://")  # in memory
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in to its folder store
    check_tracking_uri(f"file://{tmp_path}/mlruns")  # a writable local directory
    check_tracking_uri(str(tmp_path / "mlruns"))  # a plain path is MLflow's file store


@pytest.mark.parametrize("uri", ["mlruns", "./mlruns", "/tmp/x", "file:///tmp/x"])
def test_a_folder_store_is_bad_input_unless_mlflow_allows_it(uri: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"is a folder \(MLflow's file store.*MLFLOW_ALLOW_FILE_STORE=true"):
        check_tracking_uri(uri)


def test_experiment_names_mlflow_refuses_or_that_leave_the_artifact_root():
    check_experiment_name("team/hopper-ablation")
    check_experiment_name("x" * 500)
    with pytest.raises(ConfigError, match="at most 500 characters"):
        check_experiment_name("x" * 501)
    for name in ("..", "../x", "a/../../x", "a\\..\\x"):
        with pytest.raises(ConfigError, match=r"must not contain '\.\.'"):
            check_experiment_name(name)


def test_sync_checks_the_form_of_a_server_uri_without_asking_it():
    check_tracking_uri("http://127.0.0.1:1", reach=False)  # nothing listens there; not asked
    with pytest.raises(ConfigError, match="did you mean http://"):
        check_tracking_uri("htp://127.0.0.1:1", reach=False)


def test_directory_checks_walk_up_to_what_exists(tmp_path: Path):
    assert existing_ancestor(tmp_path / "a" / "b") == tmp_path
    check_writable_dir(tmp_path / "a" / "b", what="x")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    with pytest.raises(PgcliError, match=r"has only .* KiB free"):
        check_writable_dir(tmp_path, what="x", min_free=2**62)
