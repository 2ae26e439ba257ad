"""Checks of a run store before a command that only reads it (``pgcli compare``, ``pgcli ui``) opens it.

MLflow creates and migrates a SQLite store the moment a client or server touches a path, and answers a file that is
not a database with a long SQLAlchemy traceback. These checks use the standard library only, so a folder without a
store gets one line and nothing created, and a corrupt store file gets one line naming it (issue 10).
"""

from __future__ import annotations

import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pgcli.errors import ConfigError, PgcliError

SQLITE_PREFIX = "sqlite:///"
MLFLOW_TABLES = frozenset({"experiments", "runs", "alembic_version"})
"""Tables every MLflow SQLite store has (alembic_version: its schema version)."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (absolute), or None for any other kind of store."""
    if not uri.startswith(SQLITE_PREFIX) or uri.endswith(":memory:"):
        return None
    return Path(uri[len(SQLITE_PREFIX) :].split("?", 1)[0]).resolve()


def file_store_path(uri: str) -> Path | None:
    """The folder of a file-store URI (a plain path or ``file:``), or None for a database or a server."""
    if uri.startswith("file:"):
        return Path(urlsplit(uri).path).resolve()
    return None if "://" in uri else Path(uri).resolve()


def redact(uri: str) -> str:
    """``uri`` without a password: ``http://user:***@host``, so errors never print credentials."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_readable_store(uri: str, *, doing: str, timeout_s: float = 10.0) -> None:
    """Raise a one-line error unless ``uri`` is an existing MLflow store (a SQLite file) or an answering server.

    Args:
        uri: the tracking URI the command would open.
        doing: what the command does with the runs, for the message ("compare", "show").
        timeout_s: how long a tracking server may take to answer its health check.

    Raises:
        ConfigError: (exit 2) no store where the URI points, or an empty one: wrong folder or ``tracking.uri``.
        PgcliError: (exit 1) the file is not an MLflow store, or the server does not answer.
    """
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout_s)
        return
    fix = "run `pgcli train` first, run pgcli in the folder that holds outputs/, or set tracking.uri=sqlite:///<file>"
    folder = file_store_path(uri)
    if folder is not None and not folder.exists():
        raise ConfigError(f"no run store at {folder}: nothing to {doing}; {fix}")
    path = sqlite_path(uri)
    if path is None:
        return  # another database, or an existing folder store: MLflow checks it when it opens it
    if not path.is_file():
        what = "a directory, not a store file" if path.is_dir() else "no run store"
        raise ConfigError(f"{what} at {path}: nothing to {doing}; {fix}")
    try:
        # Read-only: this check never creates or changes the file.
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise PgcliError(
            f"cannot read the run store {path} ({exc}); point tracking.uri at an MLflow store or move the file aside"
        ) from None
    if not tables:
        raise ConfigError(f"the run store {path} is empty: nothing to {doing}; {fix}")
    if not MLFLOW_TABLES.issubset(tables):
        raise PgcliError(
            f"{path} is a SQLite database but not an MLflow store (no {', '.join(sorted(MLFLOW_TABLES - tables))} "
            "table); point tracking.uri at an MLflow store"
        )


def _check_server(uri: str, timeout_s: float) -> None:
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise PgcliError(
            f"tracking server {redact(uri)} answered {exc.code} to its health check; is it MLflow?"
        ) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PgcliError(
            f"tracking server {redact(uri)} is not reachable ({reason}); start it or fix tracking.uri"
        ) from None
