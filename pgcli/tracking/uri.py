"""Where runs are stored: the tracking URI and what can be learnt about its store without MLflow.

One owner for each question every command asks of a store: which URI (:func:`resolve_tracking_target`), which
database file or folder it names (:func:`sqlite_path`, :func:`file_store_path`) and whether it is there
(:func:`store_exists`), whether a SQLite file holds MLflow's tables (:data:`MLFLOW_TABLES`, :func:`sqlite_tables`) and
whether a tracking server answers its ``/health`` endpoint (:func:`probe_health`). The standard library only:
``pgcli train``'s preflight, ``pgcli ui`` and the read-only store check use these before (or instead of) importing
MLflow, which creates and migrates a SQLite store the moment it touches a path.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

SQLITE_PREFIX = "sqlite:///"
MLFLOW_TABLES = frozenset({"experiments", "runs", "alembic_version"})
"""Tables every MLflow SQL store has (created by its alembic migrations; alembic_version: its schema version)."""
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
"""MLflow's built-in tracking-store schemes (mlflow.tracking._tracking_service.utils); plugins add theirs."""
FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"
"""MLflow refuses its file store (a folder: ``./mlruns``, ``file:///...``) unless this environment variable is true
(mlflow.store.tracking.file_store: the folder store is in maintenance mode)."""


class TrackingSettings(Protocol):
    """The part of the ``tracking`` config (``pgcli.config.TrackingConfig``) that says where runs go."""

    @property
    def backend(self) -> str: ...

    @property
    def uri(self) -> str | None: ...

    @property
    def store_dir(self) -> str: ...


@dataclass(frozen=True)
class TrackingTarget:
    """Where runs go: a tracking URI and, for the embedded store, the artifact root of new experiments."""

    uri: str
    artifact_root: str | None


def resolve_tracking_target(cfg: TrackingSettings, cwd: Path | None = None) -> TrackingTarget:
    """``tracking.uri`` if set, else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite store under ``store_dir``.

    Paths are made absolute against the directory pgcli started in, so Hydra's per-run directories never scatter
    stores (hydra-ecosystem/hydra#830).
    """
    uri = cfg.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return TrackingTarget(uri, _artifacts_beside(uri))
    store = (Path(cwd or os.getcwd()) / cfg.store_dir).resolve()
    return TrackingTarget(f"{SQLITE_PREFIX}{store / 'mlflow.db'}", (store / "mlartifacts").as_uri())


def _artifacts_beside(uri: str) -> str | None:
    """For a SQLite file store, ``mlartifacts/`` next to the database (MLflow's own default is ``./mlruns`` in
    whatever directory the first run happens to start in). Servers and other databases manage their own artifacts."""
    path = sqlite_path(uri)
    return None if path is None else (path.resolve().parent / "mlartifacts").as_uri()


def supported_schemes() -> tuple[str, ...]:
    """MLflow's tracking schemes plus those of installed tracking-store plugins (entry point mlflow.tracking_store)."""
    plugins = tuple(ep.name for ep in entry_points(group="mlflow.tracking_store"))
    return TRACKING_SCHEMES + tuple(p for p in plugins if p not in TRACKING_SCHEMES)


def suggest_scheme(scheme: str) -> str | None:
    """The supported scheme ``scheme`` is most likely a typo of (``htp`` -> ``http``), or None."""
    import difflib

    close = difflib.get_close_matches(scheme.lower(), supported_schemes(), n=1, cutoff=0.6)
    return close[0] if close else None


def file_store_allowed() -> bool:
    """Whether the user opted in to MLflow's folder store (``MLFLOW_ALLOW_FILE_STORE``, read as MLflow reads it)."""
    return os.environ.get(FILE_STORE_OPT_IN, "").strip().lower() in ("true", "1")


# --------------------------------------------------------------------------------------------------------------------
# local stores: a SQLite file or a folder
# --------------------------------------------------------------------------------------------------------------------


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI as written (a relative path is relative to the working directory).

    None for an in-memory database (``sqlite://``, ``sqlite:///:memory:``) and for any other kind of store. The
    scheme is matched case-insensitively and a ``?query`` (SQLAlchemy's driver options) is dropped.
    """
    if not uri.lower().startswith(SQLITE_PREFIX):
        return None
    path = uri[len(SQLITE_PREFIX) :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def file_store_path(uri: str) -> Path | None:
    """The folder of a file-store URI (a plain path or ``file:``), absolute; None for a database or a server."""
    if uri.startswith("file:"):
        return Path(urlsplit(uri).path).resolve()
    return None if "://" in uri else Path(uri).resolve()


def store_exists(uri: str) -> bool:
    """Whether there is a local store where ``uri`` points (its SQLite file, or its folder); a server or another
    database counts as there (it answers for itself when opened). Looking creates nothing."""
    path = sqlite_path(uri)
    if path is not None:
        return path.expanduser().is_file()
    folder = file_store_path(uri)
    return folder is None or folder.exists()


def sqlite_tables(path: Path, timeout_s: float = 5.0) -> set[str]:
    """Table names of a SQLite file, opened read-only (so looking never creates or changes it).

    Raises:
        sqlite3.Error: the file is not a SQLite database, or is locked for longer than ``timeout_s``; each caller
            words its own message.
    """
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s)
    try:
        rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        con.close()
    return {str(name) for (name,) in rows}


# --------------------------------------------------------------------------------------------------------------------
# tracking servers
# --------------------------------------------------------------------------------------------------------------------


def health_url(uri: str) -> str:
    """``<server>/health`` for a tracking server's URI, without its credentials, query or fragment.

    Raises:
        ValueError: the URI's port is not a number in range.
    """
    parts = urlsplit(uri)
    port, host = parts.port, parts.hostname or ""
    if ":" in host:  # an IPv6 literal: urlsplit drops its brackets
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))


@dataclass(frozen=True)
class Health:
    """What a tracking server's ``GET /health`` came back with."""

    status: int | None
    """HTTP status of the answer (an error status included); None when nothing answered."""
    failure: object = None
    """Why nothing answered: the socket error or timeout (a URLError's ``reason``), or the malformed URL's error."""

    @property
    def ok(self) -> bool:
        """The server answered 200: it is up and takes requests."""
        return self.status == 200


def probe_health(uri: str, timeout_s: float) -> Health:
    """``GET /health`` of the tracking server at ``uri``, waiting at most ``timeout_s`` for an answer.

    The standard library rather than MLflow's client: MLflow retries an unreachable server for minutes, and
    importing it costs seconds on a command that only needs to know whether the server is there.
    """
    import urllib.error
    import urllib.request  # here, not at the top: it pulls in ssl, and most users of this module never probe

    try:
        with urllib.request.urlopen(health_url(uri), timeout=timeout_s) as response:
            return Health(int(response.status))
    except urllib.error.HTTPError as exc:
        return Health(exc.code)
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; a bad port is a ValueError
        return Health(None, getattr(exc, "reason", exc))
