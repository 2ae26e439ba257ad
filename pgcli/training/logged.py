"""A run from the past: ``<run id | run dir>`` found one way, and its logged config read back one way.

``pgcli train resume=``, ``pgcli train --from-run``, ``pgcli eval`` and ``init=`` all name an earlier run by its MLflow
run id (or a unique prefix of at least 8 of its hex digits, as ``pgcli runs`` shows it: :func:`find_run`) or its run
directory (docs/runs.md, "Run ids"). :meth:`LoggedRun.locate` turns either into the run directory on this
machine (when it is here), the run's record in the store (when it is there) and that store; the run's Hydra config is
then :meth:`LoggedRun.config_dir` (or the ``hydra`` artifact, :meth:`LoggedRun.hydra_dir`), read by
:meth:`LoggedConfig.read` and typed by :func:`pgcli.config.logged.train_config_from_dict`, the one way a logged
config (``.hydra/`` or ``agent.json``) becomes a :class:`~pgcli.config.TrainConfig` again.

Locating reads only and creates nothing: a run id is looked up only in a store that is there (a missing one is a
one-line error naming it), and so is a run directory's record (:meth:`LoggedRun.find_in`). Each command keeps its own
words for a reference that names no run (:class:`Wording`); the checks and their order are the same for all, and so
are the words for a prefix that is too short or that several runs share. From there on a run is named by its whole id.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import TrainConfig
from pgcli.config.logged import train_config_from_dict
from pgcli.config.renames import renamed_overrides, renamed_section
from pgcli.errors import ConfigError

if TYPE_CHECKING:
    from pgcli.tracking.store import RunRecord, RunStore

RUN_ID_DIGITS = 32
"""An MLflow run id is 32 lowercase hex digits."""
MIN_PREFIX = 8
"""The fewest leading hex digits of a run id that name it: as many as ``pgcli runs`` shows (as git and docker, a
unique prefix names the run; fewer would often match several runs of a store)."""
RUN_ID_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_PREFIX},{RUN_ID_DIGITS}}}")
"""A run id, or the prefix of one that may name a run."""
SHOWN_MATCHES = 5
"""The ids a prefix shared by several runs lists (more are left as "...")."""
HYDRA_ARTIFACT = "hydra"
"""The artifact path a run's ``.hydra`` directory is logged under."""
CONFIG_FILES = ("config.yaml", "hydra.yaml")
"""What a logged Hydra config consists of: the resolved config and Hydra's record of how it was composed."""


def is_run_id_prefix(text: str) -> bool:
    """Whether ``text`` has the shape of an MLflow run id or of a prefix of one that may name a run."""
    return RUN_ID_PREFIX.fullmatch(text) is not None


def is_too_short(ref: str) -> bool:
    """Whether ``ref`` is fewer hex digits than :data:`MIN_PREFIX` (say ``0123abc``): a prefix too short to name a run
    rather than a mistyped directory or run id."""
    return 0 < len(ref) < MIN_PREFIX and all(c in "0123456789abcdef" for c in ref)


TOO_SHORT = (
    f"{{ref!r}} is not a directory, and too short to name a run: a run id prefix needs at least {MIN_PREFIX} hex "
    f"digits (pgcli runs shows {MIN_PREFIX})"
)
"""The one line for a reference :func:`is_too_short` (``{ref}``: as typed), the same for every command."""


def find_run(store: RunStore, ref: str) -> RunRecord | None:
    """The run of ``store`` that ``ref`` names: the run with this id, else the one run whose id starts with ``ref``
    (:data:`MIN_PREFIX` to 31 hex digits); None when there is none (docs/runs.md, "Run ids").

    A prefix that several runs share is a one-line ConfigError listing them. A whole run id, or anything that is no
    run id nor a prefix of one (too short, not hex), is looked up as it is.
    """
    if not is_run_id_prefix(ref) or len(ref) == RUN_ID_DIGITS:
        return store.find(ref)
    matches = store.runs_with_id_prefix(ref)
    if len(matches) > 1:
        ids = [r.run_id for r in matches[:SHOWN_MATCHES]] + (["..."] if len(matches) > SHOWN_MATCHES else [])
        raise ConfigError(
            f"run id prefix {ref} matches {len(matches)} runs in {store.uri} ({', '.join(ids)}); type more of the id"
        )
    return matches[0] if matches else None


@dataclass(frozen=True)
class Wording:
    """One command's one-line errors for a reference that names no run: ``{ref}`` is the reference as typed, ``{uri}``
    the store it was looked up in. The commands' words differ (docs/runs.md quotes them); the rule does not."""

    not_a_run: str
    """Neither an existing directory nor a run id (nor a prefix of one: :data:`RUN_ID_PREFIX`)."""
    no_store: str
    """A run id, but no store to look it up in (``tracking=off``)."""
    not_found: str
    """A run id (or prefix) the store does not have; ``{ref}`` is the prefix as typed."""
    doing: str = "look up"
    """What the command would do with the run, for a run id and no store there to look it up in: ``no run store at
    <file>: nothing to <doing>; ...`` (:func:`pgcli.tracking.checks.check_store`)."""


@dataclass(frozen=True)
class LoggedRun:
    """A run named by its run id or its run directory: where it is on this machine and in the store."""

    ref: str
    """The reference as the user typed it (a run id prefix, too: the whole id is :attr:`run_id`)."""
    run_dir: Path | None
    """Its run directory on this machine (as typed, ``~`` expanded); None when only the store has the run."""
    record: RunRecord | None
    """Its record, when it was named by run id (a run directory's record: :meth:`find_in`)."""
    store: RunStore | None
    """The store ``record`` came from."""

    @classmethod
    def locate(cls, ref: str, *, store: Callable[[], RunStore | None], wording: Wording) -> LoggedRun:
        """The run ``ref`` names: an existing directory is taken as the run directory; anything else must be a run id,
        or a unique prefix of one (:func:`find_run`), in the store ``store()`` opens (called only then, so a run
        directory needs no store). Its run directory is its ``output_dir`` tag when that directory exists here. Raises
        a one-line ConfigError in ``wording``; a store that is not there, or is no MLflow store, is a one-line error
        before MLflow opens (and would create) it."""
        from pgcli.tracking.checks import check_store

        path = Path(ref).expanduser()
        if path.is_dir():
            return cls(ref, path, None, None)
        if is_too_short(ref):
            raise ConfigError(TOO_SHORT.format(ref=ref))
        if not is_run_id_prefix(ref):
            raise ConfigError(wording.not_a_run.format(ref=ref))
        run_store = store()
        if run_store is None:
            raise ConfigError(wording.no_store.format(ref=ref))
        check_store(run_store.uri, "read", doing=wording.doing)
        record = find_run(run_store, ref)
        if record is None:
            raise ConfigError(wording.not_found.format(ref=ref, uri=run_store.uri))
        output_dir = record.tags.get("output_dir")
        run_dir = Path(output_dir) if output_dir and Path(output_dir).is_dir() else None
        return cls(ref, run_dir, record, run_store)

    @property
    def home(self) -> Path | None:
        """The run directory proper: the parent of a ``.hydra`` directory named directly (see :meth:`config_dir`)."""
        if self.run_dir is not None and _holds_config(self.run_dir) and not (self.run_dir / ".hydra").is_dir():
            return self.run_dir.parent
        return self.run_dir

    def run_file(self) -> dict[str, Any] | None:
        """The run directory's ``run.json`` (its run id and store), None without a readable one."""
        from pgcli.training.run import read_run_file

        return read_run_file(self.home) if self.home is not None else None

    @property
    def run_id(self) -> str | None:
        """The MLflow run id: the record's, else the one ``run.json`` names (None for a ``tracking=off`` run)."""
        if self.record is not None:
            return self.record.run_id
        run_id = (self.run_file() or {}).get("run_id")
        return str(run_id) if run_id else None

    def find_in(self, store: RunStore | None) -> RunRecord | None:
        """This run's record in ``store``: by its run id, else (a run directory without ``run.json``) the one run
        whose ``output_dir`` tag is this directory; None when the store has none (or there is no store: a store
        that is not there is not looked in, so looking creates none)."""
        from pgcli.tracking.uri import store_exists

        if store is None or not store_exists(store.uri):
            return None
        if self.record is not None and self.store is not None and self.store.uri == store.uri:
            return self.record
        if self.run_id is not None:
            return store.find(self.run_id)
        if self.home is None or self.run_file() is not None:
            return None  # a tracking=off run: it is in no store
        runs = store.search(store.experiment_ids(), f"tags.output_dir = '{self.home.resolve()}'")
        return runs[0] if len(runs) == 1 else None

    def config_dir(self) -> tuple[Path, int | None]:
        """Where the run's Hydra config is on this machine (it may be missing), and the seed when the run is one
        seed of an ``n_seeds`` job.

        ``<run dir>/.hydra``; for one seed of an ``n_seeds`` job (its runs are ``<job dir>/seed<k>``, without a
        ``.hydra`` of their own) the job's ``.hydra`` and that seed ``k``; a ``.hydra`` directory named directly is
        itself. Raises a ConfigError for a run that is not on this machine.
        """
        if self.run_dir is None:
            raise ConfigError(f"the run directory of {self.ref} is not on this machine")
        run_dir = self.run_dir
        match = re.fullmatch(r"seed(\d+)", run_dir.name)
        if not (run_dir / ".hydra").is_dir() and match and (run_dir.parent / ".hydra").is_dir():
            return run_dir.parent / ".hydra", int(match.group(1))
        if not (run_dir / ".hydra").is_dir() and _holds_config(run_dir):
            return run_dir, None
        return run_dir / ".hydra", None

    @contextmanager
    def hydra_dir(self) -> Iterator[tuple[Path, int | None] | None]:
        """``(.hydra dir, seed)`` as :meth:`config_dir` when the config is on this machine, else the run's ``hydra``
        artifact downloaded into a temporary directory (removed on exit); None when neither holds the config."""
        if self.run_dir is not None:
            found = self.config_dir()
            if _holds_config(found[0]):
                yield found
                return
        if self.record is None or self.store is None:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="pgcli-logged-") as tmp:
            downloaded = self.store.download(self.record.run_id, HYDRA_ARTIFACT, Path(tmp))
            yield (downloaded, None) if downloaded is not None and _holds_config(downloaded) else None

    def logged_config(self, found: tuple[Path, int | None] | None = None, *, context: str = "") -> LoggedConfig:
        """The run's logged config, read from ``found`` (what :meth:`hydra_dir` yields), else from
        :meth:`config_dir`. One seed of an ``n_seeds`` job comes back as that seed alone (``n_seeds=1``), as the job
        trained it. Errors are one line, prefixed with ``context`` (``resume: ``)."""
        hydra_dir, seed = found or self.config_dir()
        logged = LoggedConfig.read(hydra_dir, ref=self.ref, context=context)
        if seed is None:
            return logged
        first, n = int(logged.values.get("seed", 0)), int(logged.values.get("n_seeds", 1))
        if not first <= seed < first + n:
            raise ConfigError(
                f"{context}{self.run_dir} is seed {seed}, but its job trained seeds {first}..{first + n - 1}"
            )
        return replace(logged, values={**logged.values, "seed": seed, "n_seeds": 1})


@dataclass(frozen=True)
class LoggedConfig:
    """A run's config as its ``.hydra`` directory logged it."""

    values: dict[str, Any]
    """``config.yaml``: the resolved config (for one seed of an ``n_seeds`` job: that seed alone, ``n_seeds=1``)."""
    choices: dict[str, Any]
    """The group options it was composed from (``hydra.yaml``'s runtime choices; Hydra's own groups left out)."""
    overrides: list[str]
    """Its command-line overrides (``hydra.yaml``'s ``overrides.task``; the run's ``hydra_overrides`` tag)."""

    @property
    def algo(self) -> str:
        return str(self.choices.get("algo"))

    @property
    def env(self) -> str:
        return str(self.choices.get("env"))

    @classmethod
    def read(cls, hydra_dir: Path, *, ref: str, context: str = "") -> LoggedConfig:
        """Read ``hydra_dir``; errors are one line, prefixed with ``context``, naming the run as ``ref``."""
        hydra = _read_mapping(hydra_dir / "hydra.yaml", ref, context)
        values = _read_mapping(hydra_dir / "config.yaml", ref, context)
        try:
            runtime, task = hydra["hydra"]["runtime"], hydra["hydra"]["overrides"]["task"]
            choices = {str(k): v for k, v in runtime["choices"].items() if not str(k).startswith("hydra/")}
        except (KeyError, TypeError, AttributeError):
            raise ConfigError(f"{context}{hydra_dir / 'hydra.yaml'} is not Hydra's record of a run") from None
        # a run logged before an algo key was renamed is read under the key's new name (pgcli.config.renames)
        algo = str(choices.get("algo"))
        if "algo" in values:
            values = {**values, "algo": renamed_section(algo, values["algo"], f"{ref}: ")}
        return cls(values, choices, renamed_overrides([str(o) for o in task or []], [algo]))

    def train_config(self, changes: Sequence[str] = (), *, context: str = "") -> TrainConfig:
        """The validated :class:`TrainConfig` the run trained with, ``changes`` (``key=value``) set on top; a change
        that does not fit the schema is a one-line error prefixed with ``context``."""
        return train_config_from_dict(self.values, self.algo, changes, context=context)


def _holds_config(directory: Path) -> bool:
    return all((directory / name).is_file() for name in CONFIG_FILES)


def _read_mapping(path: Path, ref: str, context: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{context}{ref} has no logged config ({path} is missing)") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{context}cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{context}{path} is not a config mapping")
    return data
