"""pgcli.training.preflight: what makes a tracking store or an output directory unusable, found before anything is
created."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pgcli.errors import ConfigError, PgcliError
from pgcli.training.preflight import check_sqlite_store, check_tracking_uri, check_writable_dir, existing_ancestor


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


def test_plugin_free_schemes_that_mlflow_supports_pass_the_scheme_check(tmp_path: Path):
    check_tracking_uri(f"file://{tmp_path}/mlruns")  # a writable local directory
    check_tracking_uri("sqlite://")  # in memory
    check_tracking_uri(str(tmp_path / "mlruns"))  # a plain path is MLflow's file store


def test_directory_checks_walk_up_to_what_exists(tmp_path: Path):
    assert existing_ancestor(tmp_path / "a" / "b") == tmp_path
    check_writable_dir(tmp_path / "a" / "b", what="x")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    with pytest.raises(PgcliError, match=r"has only .* KiB free"):
        check_writable_dir(tmp_path, what="x", min_free=2**62)
