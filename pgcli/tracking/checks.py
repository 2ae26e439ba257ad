"""The one check before a command opens a tracking store (:func:`check_store`): to train into it (it may be created),
to read its runs, or to write to a store the command did not create. Each problem is one line, raised before MLflow
opens the store (MLflow would create a store where there is none, or retry a dead server for minutes), and nothing is
written (docs/tracking.md, "Checked before a run starts").
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Literal

from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_text, redact_uri
from pgcli.tracking.uri import (
    FILE_STORE_OPT_IN,
    MLFLOW_TABLES,
    SQLITE_PREFIX,
    file_store_allowed,
    file_store_path,
    probe_health,
    sqlite_path,
    sqlite_tables,
    suggest_scheme,
    supported_schemes,
)

SERVER_TIMEOUT_S = 10.0
"""A tracking server must answer an HTTP request within this (MLflow itself retries for minutes)."""
MIN_FREE_BYTES = 16 * 1024 * 1024
"""Free space a store or run directory needs: a short run writes a few MB (metrics, model, plot, checkpoints)."""
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_FORM = "a SQLite store is sqlite:///<relative path> or sqlite:////<absolute path>"


StoreIntent = Literal["read", "write", "train"]
"""What a command will do with a store it did not create: read its runs (``pgcli runs``, ``compare``, ``ui``, a
resume's lookup), write to it (``pgcli eval`` logging its run, ``pgcli runs --stale`` ending runs), or train into it
(``pgcli train``, ``pgcli sync``: :func:`check_tracking_uri`, the store may not exist yet)."""


def check_store(uri: str, intent: StoreIntent, *, doing: str = "", fix: str = "", timeout_s: float = 10.0) -> None:
    """The one check before a command opens the store at ``uri`` for ``intent``: a one-line error (nothing written)
    when it cannot (:func:`check_readable_store` for reading, :func:`check_writable_store` for writing,
    :func:`check_tracking_uri` for training).

    Args:
        uri: the tracking URI the command would open.
        intent: ``read``, ``write`` or ``train`` (:data:`StoreIntent`).
        doing: what the command does with the runs, for the message ("compare", "log the evaluation").
        fix: for writing, what the user can do instead, for the message.
        timeout_s: for reading, how long a tracking server may take to answer its health check.
    """
    if intent == "read":
        check_readable_store(uri, doing=doing, timeout_s=timeout_s)
    elif intent == "write":
        check_writable_store(uri, doing=doing, fix=fix)
    else:
        check_tracking_uri(uri)


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
    path = path.resolve()
    if not path.is_file():
        what = "a directory, not a store file" if path.is_dir() else "no run store"
        raise ConfigError(f"{what} at {path}: nothing to {doing}; {fix}")
    try:
        tables = sqlite_tables(path)
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


def check_writable_store(uri: str, *, doing: str, fix: str) -> None:
    """Raise a one-line PgcliError (exit 1) when the SQLite store at ``uri`` cannot take writes, before a command
    that writes to a store it did not create (``pgcli eval`` logging its run, ``pgcli runs --stale``) starts: MLflow
    would fail at its first write with a SQLAlchemy traceback. Writes nothing.

    SQLite writes a journal beside the file, so the file and its folder must both be writable (or, with no store yet,
    the folder it would be created in). ``os.access`` answers for a read-only mount as for permissions, root
    included. A server or another database answers for itself.

    Args:
        uri: the tracking URI the command writes to.
        doing: what the command would write, for the message ("log the evaluation").
        fix: what the user can do instead, for the message.
    """
    path = sqlite_path(uri)
    if path is None:
        return
    path = Path(os.path.abspath(path.expanduser()))
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    for where in (path, folder) if path.exists() else (folder,):
        if os.access(where, os.W_OK):
            continue
        why = "read-only file system" if os.statvfs(where).f_flag & os.ST_RDONLY else f"no write permission on {where}"
        what = f"the run store {path} is read-only" if path.exists() else f"the run store {path} cannot be created"
        raise PgcliError(f"cannot {doing}: {what} ({why}); {fix}")


def _check_server(uri: str, timeout_s: float) -> None:
    health, shown = probe_health(uri, timeout_s), redact_uri(uri, keep_user=True)
    if health.status is None:
        raise PgcliError(f"tracking server {shown} is not reachable ({health.failure}); start it or fix tracking.uri")
    if health.status >= 400:
        raise PgcliError(f"tracking server {shown} answered {health.status} to its health check; is it MLflow?")


# --------------------------------------------------------------------------------------------------------------------
# before a run trains into a store (which may not exist yet)
# --------------------------------------------------------------------------------------------------------------------


def check_tracking_uri(uri: str, *, reach: bool = True) -> None:
    """A URI MLflow can track to and that answers: raise ConfigError (malformed) or PgcliError (unusable).

    ``reach=False`` leaves out asking a server whether it answers (``pgcli sync`` says that in its own words).
    """
    shown = redact_text(uri)
    if "://" not in uri:
        scheme = uri.split(":", 1)[0] if ":" in uri.split("/", 1)[0] else ""
        if len(scheme) > 1:  # 'http:host', 'sqlite:/x.db' (one letter is a Windows drive)
            example = SQLITE_FORM if scheme.lower() == "sqlite" else "expected <scheme>://..., e.g. http://host:5000"
            raise ConfigError(f"tracking.uri {shown!r} is malformed: {example}")
        check_file_store(uri)  # a plain path: MLflow's file store
        return
    scheme = uri.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]  # postgresql+psycopg2://
    schemes = supported_schemes()
    if base not in schemes:
        typo = suggest_scheme(base)
        hint = f"did you mean {typo}://?; " if typo else ""
        raise ConfigError(
            f"tracking.uri {shown!r}: MLflow cannot track to scheme '{scheme}' ({hint}supported: "
            f"{', '.join(schemes)}); e.g. http://127.0.0.1:5000 or sqlite:///outputs/mlflow.db"
        )
    if base in ("http", "https"):
        check_server(uri, reach=reach)
    elif base == "sqlite":
        check_sqlite_store(uri)
    elif base == "file":
        check_file_store(uri)


def check_file_store(uri: str) -> None:
    """A folder store (a plain path or ``file:``): refused unless the user opted in as MLflow asks, since MLflow
    itself refuses it -- after pgcli had made the run directory (docs/tracking.md, "Checked before a run starts")."""
    folder = file_store_path(uri)
    assert folder is not None  # a plain path or file: URI, by the caller
    if not file_store_allowed():
        typed = os.path.normpath(urllib.request.url2pathname(urllib.parse.urlsplit(uri).path) if "://" in uri else uri)
        raise ConfigError(
            f"tracking.uri {redact_text(uri)!r} is a folder (MLflow's file store, which MLflow refuses unless "
            f"{FILE_STORE_OPT_IN}=true): use e.g. tracking.uri=sqlite:///{typed}/mlflow.db or a tracking server "
            "(http://host:5000); mlflow migrate-filestore moves an existing folder store"
        )
    check_writable_dir(folder.expanduser(), what="the MLflow file store")


def check_server(uri: str, timeout_s: float = SERVER_TIMEOUT_S, *, reach: bool = True) -> None:
    """The tracking server at ``uri`` answers an HTTP request within ``timeout_s`` (any HTTP status counts);
    with ``reach=False`` only that the URI names a host and a port."""
    shown = redact_text(uri)
    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"tracking.uri {shown!r} is malformed ({exc}); e.g. http://127.0.0.1:5000") from None
    if not parts.hostname:
        raise ConfigError(f"tracking.uri {shown!r} has no host; e.g. http://127.0.0.1:5000")
    if not reach:
        return
    health = probe_health(uri, timeout_s)
    if health.status is not None:
        return  # it answered (401 behind an auth proxy, 404 on an older server): reachable
    if isinstance(health.failure, (socket.timeout, TimeoutError)):
        why = f"no answer within {timeout_s:g} s"
    else:
        why = str(getattr(health.failure, "strerror", None) or health.failure)
    port_hint = f" --port {port}" if port else ""
    raise PgcliError(
        f"tracking server {shown} is not reachable ({why}); start it (mlflow server --host "
        f"{parts.hostname}{port_hint}) or track locally with tracking=local"
    )


def check_sqlite_store(uri: str) -> None:
    """The file is an MLflow store, an empty file or database, or does not exist yet in a writable directory.

    Another application's database or a file that is not SQLite at all is refused: MLflow would add its tables to
    the first and fail with a traceback on the second (docs/tracking.md, "Checked before a run starts").
    """
    # sqlite:// is SQLAlchemy's in-memory database; anything else but sqlite:///<path> is a typo
    if not uri.lower().startswith(SQLITE_PREFIX) and uri.lower().rstrip("/") != "sqlite:":
        raise ConfigError(f"tracking.uri {redact_text(uri)!r} is malformed: {SQLITE_FORM}")
    path = sqlite_path(uri)
    if path is None:
        return
    path = path.expanduser()
    if path.is_dir():
        raise PgcliError(f"tracking store {path} is a directory; give a file, e.g. sqlite:///{path}/mlflow.db")
    if not path.exists():
        check_writable_dir(path.parent, what="the directory of the tracking store")
        return
    check_writable_dir(path.parent, what="the directory of the tracking store")
    if not os.access(path, os.R_OK | os.W_OK):
        raise PgcliError(f"tracking store {path} is not readable and writable by this user; fix its permissions")
    if path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        header = f.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise PgcliError(
            f"tracking store {path} is not a SQLite database (an MLflow store is); "
            "point tracking.uri or tracking.store_dir at another file"
        )
    try:
        tables = sqlite_tables(path, timeout_s=SERVER_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise PgcliError(f"tracking store {path} cannot be read as a SQLite database ({exc})") from None
    if tables and not tables >= MLFLOW_TABLES:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise PgcliError(
            f"tracking store {path} is another application's SQLite database (tables: {listed}), not an MLflow "
            "store; point tracking.uri or tracking.store_dir at another file"
        )


def existing_ancestor(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent (what a ``mkdir -p`` would write into)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: Path, *, what: str, min_free: int = MIN_FREE_BYTES) -> None:
    """``path`` (or the directory it would be created in) is a directory this process can write with free space.

    Writability is probed by writing into an unnamed temporary file rather than by ``os.access``: that also catches
    read-only mounts and a full disk, and is right for root (whom permission bits do not stop).
    """
    where = existing_ancestor(path)
    shown = str(path) if where == Path(os.path.abspath(path)) else f"{path} (in {where})"
    if not where.is_dir():
        raise PgcliError(f"{what} {shown}: {where} is not a directory; choose another path")
    try:
        with tempfile.TemporaryFile(dir=where) as probe:
            os.write(probe.fileno(), b"\0" * 4096)
            os.fsync(probe.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PgcliError(f"{what} {shown} is on a full disk; free some space or choose another path") from None
        reason = {
            errno.EACCES: "permission denied",
            errno.EPERM: "permission denied",
            errno.EROFS: "read-only file system",
        }.get(exc.errno or 0, "cannot create files there")
        raise PgcliError(
            f"{what} {shown} is not writable ({reason}); choose another path or fix its permissions"
        ) from None
    free = shutil.disk_usage(where).free
    if free < min_free:
        raise PgcliError(
            f"{what} {shown} has only {free // 1024} KiB free (pgcli needs at least {min_free // 2**20} MiB); "
            "free some space or choose another path"
        )
