"""Checks of the world around ``pgcli train``, run once before Hydra makes a run directory or MLflow a run
(docs/tracking.md, "Checked before a run starts").

Config validation (:mod:`pgcli.config`) decides whether the *values* are right; this module decides whether the
*places* they name can be used: the tracking store (a URI scheme MLflow supports, a server that answers within
:data:`SERVER_TIMEOUT_S`, a SQLite file that is an MLflow store or empty, a directory that can be written with some
free space), the experiment name MLflow stores and files artifacts under, and the run or sweep directory (writable,
and no live process writing a run there). Each failure is one line naming the thing and the fix:

- :class:`~pgcli.errors.ConfigError` (exit 2) when what was typed is wrong on its own: a malformed URI, an unsupported
  scheme, a folder store MLflow refuses, an experiment name MLflow refuses or that leaves the artifact root, a run
  directory a live process writes;
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
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pgcli.config import TrackingConfig
from pgcli.errors import ConfigError, PgcliError
from pgcli.redact import redact_text
from pgcli.tracking.uri import (
    FILE_STORE_OPT_IN,
    MLFLOW_TABLES,
    SQLITE_PREFIX,
    file_store_allowed,
    file_store_path,
    probe_health,
    resolve_tracking_target,
    sqlite_path,
    sqlite_tables,
    suggest_scheme,
    supported_schemes,
)
from pgcli.training.owner import check_one_writer

SERVER_TIMEOUT_S = 10.0
"""A tracking server must answer an HTTP request within this (MLflow itself retries for minutes)."""
MIN_FREE_BYTES = 16 * 1024 * 1024
"""Free space a store or run directory needs: a short run writes a few MB (metrics, model, plot, checkpoints)."""
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_FORM = "a SQLite store is sqlite:///<relative path> or sqlite:////<absolute path>"
MAX_EXPERIMENT_NAME_LENGTH = 500
"""MLflow refuses longer experiment names (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)."""


@dataclass(frozen=True)
class StorePlan:
    """What ``pgcli train`` is about to write to: the tracking URI (None: tracking off) and the output directory."""

    tracking_uri: str | None
    artifact_root: str | None
    output_dir: Path
    output_key: str = "hydra.run.dir"
    experiment: str | None = None
    """The ``experiment`` the run was given (None: the env's name, always a valid one)."""


def check_train_environment(plan: StorePlan) -> None:
    """Raise a one-line ConfigError / PgcliError if the store or the output directory cannot be used."""
    check_writable_dir(plan.output_dir, what=plan.output_key)
    check_no_writer(plan.output_dir)  # before Hydra writes .hydra/ there
    if plan.tracking_uri is not None:
        check_tracking_uri(plan.tracking_uri)
        if plan.experiment:
            check_experiment_name(plan.experiment)
    if plan.artifact_root and plan.artifact_root.startswith("file:"):
        root = Path(urllib.request.url2pathname(urllib.parse.urlparse(plan.artifact_root).path))
        check_writable_dir(root, what="the MLflow artifact directory")


# --------------------------------------------------------------------------------------------------------------------
# tracking URI
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


def check_experiment_name(name: str) -> None:
    """A name MLflow accepts, whose artifact folder (``<artifact root>/<name>``) stays inside the artifact root."""
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise ConfigError(
            f"experiment must be at most {MAX_EXPERIMENT_NAME_LENGTH} characters (MLflow's limit; got {len(name)})"
        )
    if ".." in name.replace("\\", "/").split("/"):
        raise ConfigError(
            f"experiment {name!r} must not contain '..' (its artifacts go to <artifact root>/<experiment>, and '..' "
            "would put them outside it); e.g. experiment=hopper-ablation or team/hopper"
        )


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


# --------------------------------------------------------------------------------------------------------------------
# directories
# --------------------------------------------------------------------------------------------------------------------


def check_no_writer(output_dir: Path) -> None:
    """Refuse (one-line ConfigError) a new run into a directory that a live process writes (its ``.owner``; for an
    ``n_seeds`` job, that of one of its ``seed<k>`` runs) before Hydra writes ``.hydra/`` there: the run that
    process writes keeps its files (docs/runs.md, "One writer per run"). Reads only."""
    for run_dir in [output_dir, *sorted(output_dir.glob("seed*"))]:
        check_one_writer(run_dir, f"the run in {run_dir}")


def existing_ancestor(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent (what a ``mkdir -p`` would write into)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(path: Path, option: str, *, empty: bool = False) -> Path:
    """``path``, typed as a command's output directory ``option`` (``--out``): a directory, or one that can be created
    where it is (the nearest existing parent a directory), and with ``empty`` one that holds nothing yet; else a
    one-line ConfigError naming the option, before the command does any work. Nothing is created; a directory that
    cannot be written or is full is :func:`check_writable_dir`'s fault (exit 1)."""
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a directory; pass a directory (made if missing)")
    where = existing_ancestor(path)
    if not where.is_dir():
        raise ConfigError(f"{option} {path}: {where} is a file, not a directory; pass another {option}")
    if empty and path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{option} {path} exists and is not empty; pass another {option}")
    check_writable_dir(path, what=option)
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


# --------------------------------------------------------------------------------------------------------------------
# from the command line
# --------------------------------------------------------------------------------------------------------------------


def plan_from_overrides(overrides: list[str], *, multirun: bool, output_dir: Path | None = None) -> StorePlan:
    """Compose the config (Hydra's own part included) for ``overrides`` and say where the run will write: to
    ``output_dir`` when the caller chose it (:func:`pgcli.training.job.run_job`), else to Hydra's run or sweep
    directory.

    Sweep overrides (``seed=0,1``) are left out: the tracking store and the root of the output directory are the same
    for every job of a sweep unless the sweep varies them, which only the jobs themselves can then report.
    """
    from omegaconf import OmegaConf

    from pgcli.config.compose import hydra_compose
    from pgcli.config.overrides import Overrides, task_lines

    fixed = Overrides.parse(overrides).fixed()
    try:
        cfg = hydra_compose(fixed, hydra_node=True)
    except ConfigError:
        # a hydra.* override this compose cannot take (a sweeper's own keys): Hydra itself judges those; the task
        # overrides were validated already, so the store is still checked, against the default output directory
        cfg = hydra_compose(task_lines(fixed), hydra_node=True)
    tracking: TrackingConfig = OmegaConf.to_object(cfg.tracking)  # type: ignore[assignment]
    experiment = cfg.get("experiment")
    key = "output_dir" if output_dir is not None else "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if output_dir is None:
        output_dir = Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
    return store_plan(tracking, None if experiment is None else str(experiment), output_dir, key)


def store_plan(tracking: TrackingConfig, experiment: str | None, output_dir: Path, output_key: str) -> StorePlan:
    """What a run will write to: ``tracking``'s store (None with ``tracking=off``) and ``output_dir``."""
    if tracking.backend != "mlflow":
        return StorePlan(None, None, output_dir, output_key)
    target = resolve_tracking_target(tracking)
    return StorePlan(target.uri, target.artifact_root, output_dir, output_key, experiment)
