"""Your own rows (``env=dataset``; docs/lm.md, "Your data"): the one place that reads a user's dataset.

``env.path`` names a ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file, a directory written by ``datasets``'
``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``), or a hub dataset id already in the local cache. Everything is
read through the ``datasets`` library, so a file of millions of rows is a memory-mapped Arrow table, not a Python list;
nothing is downloaded (the hub is switched offline before the first read).

The held-out rows come from ``env.eval_path`` (a second source), or ``env.eval_split`` (another split of the same
source), or else ``env.eval_size`` rows taken out of the training split by a split seeded with ``env.eval_seed``: the
same rows for every run, never trained on.

Every problem with the data is a one-line :class:`pgcli.errors.ConfigError` naming the key and what is there, raised
before any MLflow run exists (``pgcli.training.checks`` loads the rows in the preflight).

The rows are read once per process (:func:`rows_of`), and what a pass over them finds is kept with them
(:func:`once`): the checks before a run and the run itself, for every command, share one read and one scan.
:func:`text_chars` is the one rule for the characters a dataset's text holds (TinyGPT's vocabulary on rows), so
``pgcli sft``, ``pgcli rm`` and RL on the same rows and the same ``env`` config read the same token ids.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pgcli.config import DatasetEnvConfig
from pgcli.errors import ConfigError
from pgcli.lm.conversations import PLAIN_CHARS, SYSTEM

if TYPE_CHECKING:
    from datasets import Dataset

T = TypeVar("T")

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""Suffix -> the ``datasets`` builder that reads it."""
TEXT_BATCH = 4096
"""Rows read per batch while collecting characters."""


@dataclass(frozen=True)
class Splits:
    """The training rows and the held-out rows of an ``env=dataset`` config."""

    train: Dataset
    held_out: Dataset
    source: str
    """Where the rows came from, for messages: the path and the split."""

    @property
    def columns(self) -> list[str]:
        """The training rows' column names, in file order."""
        return list(self.train.column_names)


class RowOrder:
    """The order in which training visits ``n`` rows: epochs of a permutation seeded by ``(seed, epoch)`` (file
    order without ``shuffle``), read ``take(k)`` rows at a time across epoch ends. Its state is two integers
    (:meth:`state_dict`), saved with a checkpoint, so a resumed run reads exactly the rows a straight run reads."""

    def __init__(self, n: int, *, seed: int, shuffle: bool = True) -> None:
        if n < 1:
            raise ValueError(f"RowOrder needs at least one row (got {n})")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        """The next ``k`` row indices (an epoch ends when every row has been visited once; the next one reshuffles)."""
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            step = min(k - len(out), self.n - self.position)
            out += self._order[self.position : self.position + step].tolist()
            self.position += step
        return out

    @property
    def rows_seen(self) -> int:
        """Rows handed out so far, over all epochs."""
        return self.epoch * self.n + self.position

    def state_dict(self) -> dict[str, int]:
        """Where the order stands: epoch and position in it."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from :meth:`state_dict`'s values (the permutation is recomputed from the seed)."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def load_splits(cfg: DatasetEnvConfig) -> Splits:
    """The training and held-out rows of ``cfg`` (module docstring).

    Raises:
        ConfigError: a missing source, an unknown format, a split that is not there or is empty, an empty held-out
            set, or held-out rows that do not have the training rows' columns.
    """
    train = read_rows(cfg.path, cfg.split, key="env.path")
    source = f"{cfg.path} (split {cfg.split})"
    if cfg.eval_path is not None:
        held_out = read_rows(
            cfg.eval_path, cfg.split if cfg.eval_split is None else cfg.eval_split, key="env.eval_path"
        )
    elif cfg.eval_split is not None:
        held_out = read_rows(cfg.path, cfg.eval_split, key=f"env.eval_split={cfg.eval_split} of env.path")
    else:
        if cfg.eval_size > len(train) // 2:
            raise ConfigError(
                f"env.eval_size must be <= half of the {len(train)} rows of {source} (got {cfg.eval_size}); lower it, "
                "or give the held-out rows with env.eval_path or env.eval_split"
            )
        parts = train.train_test_split(test_size=cfg.eval_size, seed=cfg.eval_seed, shuffle=True)
        train, held_out = parts["train"], parts["test"]
    if len(held_out) == 0:
        raise ConfigError(f"the held-out rows are empty ({_held_out_source(cfg)}); the evaluation needs at least one")
    missing = [c for c in train.column_names if c not in held_out.column_names]
    if missing:
        raise ConfigError(
            f"the held-out rows ({_held_out_source(cfg)}) lack the column(s) {', '.join(missing)} of the training rows "
            f"(they have: {', '.join(held_out.column_names)})"
        )
    return Splits(train, held_out, source)


@dataclass
class _Read:
    """The rows of one ``env`` config, and what passes over them found (:func:`once`)."""

    splits: Splits
    scans: dict[str, Any] = field(default_factory=dict)


_READ: dict[str, _Read] = {}


def _config_key(cfg: DatasetEnvConfig) -> str:
    """The config, and the size and time of each file of its sources (a file rewritten in this process is new rows)."""
    stamps = [_stamp(Path(p).expanduser()) for p in (cfg.path, cfg.eval_path) if p is not None]
    return json.dumps([asdict(cfg), stamps], default=repr, sort_keys=True)


def _stamp(where: Path) -> list[tuple[str, int, int]]:
    """(name, bytes, mtime) of a source file, or of each file of a ``save_to_disk`` directory (its files and its
    splits'; no deeper: a wrong directory is not walked); a hub id: nothing."""
    try:
        inside = [*where.glob("*"), *where.glob("*/*")] if where.is_dir() else []
        files = [where] if where.is_file() else sorted(f for f in inside if f.is_file())
        return [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    except OSError:  # gone meanwhile: reading it says so
        return []


def rows_of(cfg: DatasetEnvConfig) -> Splits:
    """:func:`load_splits` of ``cfg``, read once per process (the checks before a run and the run ask alike)."""
    key = _config_key(cfg)
    if key not in _READ:
        _READ[key] = _Read(load_splits(cfg))
    return _READ[key].splits


def once(cfg: DatasetEnvConfig, splits: Splits, what: str, scan: Callable[[], T]) -> T:
    """``scan()``, kept under ``what`` with ``splits`` when they are :func:`rows_of`'s (so a pass over them is made
    once per process); recomputed for rows read some other way."""
    read = _READ.get(_config_key(cfg))
    if read is None or read.splits is not splits:
        return scan()
    if what not in read.scans:
        read.scans[what] = scan()
    result: T = read.scans[what]
    return result


# --------------------------------------------------------------------------------------------------------------------
# The characters of the rows' text: TinyGPT's vocabulary, for every command
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextChars:
    """The characters a dataset's text holds (:func:`text_chars`)."""

    chars: str
    """Sorted: TinyGPT's vocabulary on these rows."""
    first_row: dict[str, tuple[str, int]]
    """Each character's first row: (``train`` or ``held-out``, index)."""


def text_columns(cfg: DatasetEnvConfig) -> list[str]:
    """Every text column ``cfg`` names: prompt, completion, messages, chosen, rejected and answer."""
    keys = (cfg.prompt_key, cfg.completion_key, cfg.messages_key, cfg.chosen_key, cfg.rejected_key, cfg.answer_key)
    return list(dict.fromkeys(keys))


def text_chars(cfg: DatasetEnvConfig, splits: Splits) -> TextChars:
    """The characters of the rows' text, whatever the command reads of it (``pgcli sft``, ``pgcli rm``, RL): every
    column of :func:`text_columns` (training and held-out rows; a number as its text, a message list as its roles
    and contents), plus what the plain rendering adds (:data:`~pgcli.lm.conversations.PLAIN_CHARS`) where a row
    holds a message list, and ``env.system_prompt`` with its role (every row is then a conversation). Scanned once
    per process for :func:`rows_of`'s rows (:func:`once`)."""
    return once(cfg, splits, "chars", lambda: _scan_chars(cfg, splits))


def _scan_chars(cfg: DatasetEnvConfig, splits: Splits) -> TextChars:
    seen: dict[str, tuple[str, int]] = {}
    if cfg.system_prompt is not None:  # the system turn leads every row's conversation
        _note(seen, SYSTEM + cfg.system_prompt + PLAIN_CHARS, ("train", 0))
    for name, rows in (("train", splits.train), ("held-out", splits.held_out)):
        present = [k for k in text_columns(cfg) if k in rows.column_names]
        if not present:
            continue
        start = 0
        for batch in rows.select_columns(present).iter(batch_size=TEXT_BATCH):
            for key in present:
                for i, value in enumerate(batch[key]):
                    _note(seen, _value_chars(value), (name, start + i))
            start += len(batch[present[0]])
    return TextChars("".join(sorted(seen)), seen)


def _note(seen: dict[str, tuple[str, int]], text: str, where: tuple[str, int]) -> None:
    for c in set(text).difference(seen):
        seen[c] = where


def _value_chars(value: Any) -> str:
    """A cell's text: a string as it is, a message list as its roles and contents and the plain rendering's
    characters, anything else (a number) as ``str`` (as a reference answer reads it); None: nothing."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if is_messages(value):
        return "".join(m["role"] + m["content"] for m in value) + PLAIN_CHARS
    return str(value)


def is_messages(value: Any) -> bool:
    """``value`` is a non-empty list of ``{role, content}`` mappings with string values (a conversation)."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and bool(value)
        and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    )


def read_rows(path: str, split: str, *, key: str) -> Dataset:
    """One split of one source (a file, a ``save_to_disk`` directory or a cached hub id); ``key`` names the option
    in errors (``env.path``: the message reads ``env.path=<path>: ...``).

    Raises:
        ConfigError: the source is not there, its format is unknown, or the split is missing or empty.
    """
    datasets = _quiet_datasets()
    where = Path(path).expanduser()
    if where.is_file():
        if where.stat().st_size == 0:
            raise ConfigError(f"{key}={path}: the file is empty")
        builder = FILE_BUILDERS.get(_suffix(where))
        if builder is None:
            known = ", ".join(FILE_BUILDERS)
            raise ConfigError(f"{key}={path}: unknown format {where.suffix or '(no suffix)'!r}; pgcli reads {known}")
        rows = _read_file(datasets, builder, where, key=key, split=split)
    elif where.is_dir():
        rows = _read_directory(datasets, where, split, key=key)
    elif _looks_like_hub_id(path):
        rows = _read_cached_hub(datasets, path, split, key=key)
    else:
        raise ConfigError(f"{key}={path}: no such file or directory")
    if len(rows) == 0:
        raise ConfigError(f"{key}={path}: split {split!r} has no rows")
    return rows


def require_columns(rows: Dataset, keys: Sequence[tuple[str, str]], *, source: str) -> None:
    """Each ``(option, column)`` of ``keys`` is a column of ``rows``, or a one-line error naming the columns there
    are."""
    for option, column in keys:
        if column not in rows.column_names:
            raise ConfigError(
                f"{option}={column}: {source} has no column {column!r} (it has: {', '.join(rows.column_names)})"
            )


def _suffix(path: Path) -> str:
    """``.jsonl`` of ``data.jsonl``; ``.jsonl`` of ``data.jsonl.gz`` too (datasets decompresses it)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".bz2", ".xz", ".zst") and len(suffixes) > 1:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def _read_file(datasets: Any, builder: str, path: Path, *, key: str, split: str) -> Dataset:
    if split != "train":
        raise ConfigError(f"{key}={path}: a single file has one split, 'train' (got split {split!r})")
    try:
        rows = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # the library raises many types for a damaged file; all are bad input here
        if "corresponds to no data" in str(exc):  # a csv of a header only: no rows, said in the library's words
            raise ConfigError(f"{key}={path}: split {split!r} has no rows") from None
        raise ConfigError(f"{key}={path}: cannot read it as {builder}: {_first_line(exc)}") from None
    return rows


def _read_directory(datasets: Any, path: Path, split: str, *, key: str) -> Dataset:
    """A ``save_to_disk`` directory (a Dataset or a DatasetDict)."""
    if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise ConfigError(
            f"{key}={path}: a directory must be written by datasets' save_to_disk (no dataset_info.json or "
            "dataset_dict.json there); or name a .jsonl, .json, .csv or .parquet file"
        )
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise ConfigError(f"{key}={path}: cannot load the saved dataset: {_first_line(exc)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ConfigError(f"{key}={path}: no split {split!r} (it has: {', '.join(loaded)})")
        return loaded[split]
    if split != "train":
        raise ConfigError(f"{key}={path}: a saved Dataset has one split, 'train' (got split {split!r})")
    return loaded


def _looks_like_hub_id(path: str) -> bool:
    """``name`` or ``owner/name``: no suffix the file readers know and at most one slash."""
    return path.count("/") <= 1 and not path.startswith((".", "/", "~")) and _suffix(Path(path)) not in FILE_BUILDERS


def _read_cached_hub(datasets: Any, name: str, split: str, *, key: str) -> Dataset:
    """A hub dataset from the local cache only (``HF_DATASETS_OFFLINE``): pgcli downloads nothing."""
    try:
        return datasets.load_dataset(name, split=split)
    except ValueError as exc:  # an unknown split: the message names the ones there are
        raise ConfigError(f"{key}={name}: {_first_line(exc)}") from None
    except Exception:
        raise ConfigError(
            f"{key}={name}: not a file or a directory here, and not a hub dataset in the local cache "
            f"({datasets.config.HF_DATASETS_CACHE}); pgcli downloads nothing: fetch it once with datasets and "
            "save_to_disk, or name a file"
        ) from None


def _held_out_source(cfg: DatasetEnvConfig) -> str:
    if cfg.eval_path is not None:
        return f"env.eval_path={cfg.eval_path}"
    if cfg.eval_split is not None:
        return f"env.eval_split={cfg.eval_split}"
    return f"env.eval_size={cfg.eval_size}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _quiet_datasets() -> Any:
    """The ``datasets`` module, offline and without its progress bars and info logs (pgcli prints its own)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise ConfigError("env=dataset needs the datasets package: pip install 'pgcli[lm]' (or make install)") from None
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    logging.getLogger("datasets").setLevel(logging.ERROR)
    return datasets
