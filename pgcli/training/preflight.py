"""Checks of the world around ``pgcli train``, run once before Hydra makes a run directory or MLflow a run (issue 10).

Config validation (:mod:`pgcli.config`) decides whether the *values* are right; this module decides whether the
*places* they name can be used: the tracking store (a URI scheme MLflow supports, a server that answers within
:data:`SERVER_TIMEOUT_S`, a SQLite file that is an MLflow store or empty, a directory that can be written with some
free space) and the run or sweep directory. Each failure is one line naming the thing and the fix:

- :class:`~pgcli.errors.ConfigError` (exit 2) when what was typed is wrong on its own: a malformed URI, an unsupported
  scheme;
- :class:`~pgcli.errors.PgcliError` (exit 1) for a fault of the environment: a server that does not answer, a file
  that is not an MLflow store, a directory that cannot be written or is full.

Nothing here creates a file that outlives the check (the write probe is an unnamed temporary file), and nothing
imports MLflow: a tracking server that is down is reported in at most 10 s instead of MLflow's minutes of retries.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pgcli.config import TrackingConfig
from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_text

SERVER_TIMEOUT_S = 10.0
"""A tracking server must answer an HTTP request within this (MLflow itself retries for minutes)."""
MIN_FREE_BYTES = 16 * 1024 * 1024
"""Free space a store or run directory needs: a short run writes a few MB (metrics, model, plot, checkpoints)."""
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
"""MLflow's built-in tracking-store schemes (mlflow.tracking._tracking_service.utils); plugins add theirs."""
SQLITE_HEADER = b"SQLite format 3\x00"
MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}
"""Tables every MLflow SQL store has (created by its alembic migrations)."""


@dataclass(frozen=True)
class StorePlan:
    """What ``pgcli train`` is about to write to: the tracking URI (None: tracking off) and the output directory."""

    tracking_uri: str | None
    artifact_root: str | None
    output_dir: Path
    output_key: str = "hydra.run.dir"


def check_train_environment(plan: StorePlan) -> None:
    """Raise a one-line ConfigError / PgcliError if the store or the output directory cannot be used."""
    check_writable_dir(plan.output_dir, what=plan.output_key)
    if plan.tracking_uri is not None:
        check_tracking_uri(plan.tracking_uri)
    if plan.artifact_root and plan.artifact_root.startswith("file:"):
        root = Path(urllib.request.url2pathname(urllib.parse.urlparse(plan.artifact_root).path))
        check_writable_dir(root, what="the MLflow artifact directory")


# --------------------------------------------------------------------------------------------------------------------
# tracking URI
# --------------------------------------------------------------------------------------------------------------------


def supported_schemes() -> tuple[str, ...]:
    """MLflow's tracking schemes plus those of installed tracking-store plugins (entry point mlflow.tracking_store)."""
    plugins = tuple(ep.name for ep in entry_points(group="mlflow.tracking_store"))
    return TRACKING_SCHEMES + tuple(p for p in plugins if p not in TRACKING_SCHEMES)


def check_tracking_uri(uri: str) -> None:
    """A URI MLflow can track to and that answers: raise ConfigError (malformed) or PgcliError (unusable)."""
    shown = redact_text(uri)
    if "://" not in uri:
        if ":" in uri.split("/", 1)[0] and len(uri.split(":", 1)[0]) > 1:  # 'http:host', 'sqlite:x.db'
            raise ConfigError(f"tracking.uri {shown!r} is malformed: expected <scheme>://..., e.g. http://host:5000")
        check_writable_dir(Path(uri).expanduser(), what="the MLflow file store")  # a plain path: MLflow's file store
        return
    scheme = uri.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]  # postgresql+psycopg2://
    schemes = supported_schemes()
    if base not in schemes:
        raise ConfigError(
            f"tracking.uri {shown!r}: MLflow cannot track to scheme '{scheme}' (supported: {', '.join(schemes)}); "
            "e.g. http://127.0.0.1:5000 or sqlite:///outputs/mlflow.db"
        )
    if base in ("http", "https"):
        check_server(uri)
    elif base == "sqlite":
        check_sqlite_store(uri)
    elif base == "file":
        path = urllib.request.url2pathname(urllib.parse.urlparse(uri).path)
        check_writable_dir(Path(path), what="the MLflow file store")


def check_server(uri: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """The tracking server at ``uri`` answers an HTTP request within ``timeout_s`` (any HTTP status counts)."""
    shown = redact_text(uri)
    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"tracking.uri {shown!r} is malformed ({exc}); e.g. http://127.0.0.1:5000") from None
    if not parts.hostname:
        raise ConfigError(f"tracking.uri {shown!r} has no host; e.g. http://127.0.0.1:5000")
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # IPv6 literal
        netloc = f"[{parts.hostname}]" + ("" if port is None else f":{port}")
    health = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(health, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered (401 behind an auth proxy, 404 on an older server): reachable
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            why = f"no answer within {timeout_s:g} s"
        else:
            why = str(getattr(reason, "strerror", None) or reason)
        port_hint = f" --port {port}" if port else ""
        raise PgcliError(
            f"tracking server {shown} is not reachable ({why}); start it (mlflow server --host "
            f"{parts.hostname}{port_hint}) or track locally with tracking=local"
        ) from None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for an in-memory database)."""
    shown = redact_text(uri)
    if not uri.lower().startswith("sqlite:///"):
        if uri.lower().rstrip("/") == "sqlite:":
            return None  # sqlite:// is SQLAlchemy's in-memory database
        raise ConfigError(
            f"tracking.uri {shown!r} is malformed: a SQLite store is sqlite:///<relative path> or "
            "sqlite:////<absolute path>"
        )
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(path).expanduser()


def check_sqlite_store(uri: str) -> None:
    """The file is an MLflow store, an empty file or database, or does not exist yet in a writable directory.

    Another application's database or a file that is not SQLite at all is refused: MLflow would add its tables to
    the first and fail with a traceback on the second (issue 10: "a new SQLite file only becomes an MLflow store if it
    is empty or already one").
    """
    path = sqlite_path(uri)
    if path is None:
        return
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
    tables = sqlite_tables(path)
    if tables and not tables >= MLFLOW_TABLES:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise PgcliError(
            f"tracking store {path} is another application's SQLite database (tables: {listed}), not an MLflow "
            "store; point tracking.uri or tracking.store_dir at another file"
        )


def sqlite_tables(path: Path) -> set[str]:
    """Table names of a SQLite file, opened read-only (so the check never creates or changes it)."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=SERVER_TIMEOUT_S)
        try:
            rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise PgcliError(f"tracking store {path} cannot be read as a SQLite database ({exc})") from None
    return {str(name) for (name,) in rows}


# --------------------------------------------------------------------------------------------------------------------
# directories
# --------------------------------------------------------------------------------------------------------------------


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
        reason = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS:
                  "read-only file system"}.get(exc.errno or 0, "cannot create files there")  # fmt: skip
        raise PgcliError(
            f"{what} {shown} is not writable ({reason}); choose another path or fix its permissions"
        ) from None
    free = shutil.disk_usage(where).free
    if free < min_free:
        raise PgcliError(
            f"{what} {shown} has only {free // 1024} KiB free (pgcli needs at least {min_free // 2**20} MiB); "
            "free some space or choose another path"
        )


# --------------------------------------------------------------------------------------------------------------------
# from the command line
# --------------------------------------------------------------------------------------------------------------------


def plan_from_overrides(overrides: list[str], *, multirun: bool) -> StorePlan:
    """Compose the config (Hydra's own part included) for ``overrides`` and say where the run will write.

    Sweep overrides (``seed=0,1``) are left out: the tracking store and the root of the output directory are the same
    for every job of a sweep unless the sweep varies them, which only the jobs themselves can then report.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from pgcli.config import register_configs
    from pgcli.config.compose import describe_config_error
    from pgcli.tracking.backend import resolve_tracking_target

    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line or "" for o in parsed if not o.is_sweep_override()]
    register_configs()
    try:
        cfg = _compose_with_hydra(fixed)
    except Exception:
        # a hydra.* override this compose cannot take (a sweeper's own keys): Hydra itself judges those; the task
        # overrides were validated already, so the store is still checked, against the default output directory
        try:
            cfg = _compose_with_hydra([o for o in fixed if not o.lstrip("+~").startswith("hydra")])
        except Exception as exc:
            raise ConfigError(describe_config_error(exc)) from None
    output = cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir
    tracking: TrackingConfig = OmegaConf.to_object(cfg.tracking)  # type: ignore[assignment]
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if tracking.backend != "mlflow":
        return StorePlan(None, None, Path(str(output)), key)
    target = resolve_tracking_target(tracking)
    return StorePlan(target.uri, target.artifact_root, Path(str(output)), key)


def _compose_with_hydra(overrides: list[str]) -> Any:
    """The composed config with Hydra's own node (``hydra.run.dir`` and friends resolved)."""
    from hydra import compose, initialize_config_dir

    from pgcli.config.compose import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="pgcli"):
        return compose("train", overrides=overrides, return_hydra_config=True)
