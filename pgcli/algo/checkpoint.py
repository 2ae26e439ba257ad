"""Checkpoints: everything a trainer needs to continue exactly, written atomically, read without unpickling.

A checkpoint directory holds (docs/checkpoints.md):

- ``model.pt``: the trainer's networks and optimizers as state dicts (ours; loaded with ``weights_only=True``), or
  ``model.zip`` (SB3's own format, with its optimizer and step counters, loaded by SB3's loader);
- ``normalizer.npz``: the VecNormalize statistics, when the env normalises (``pgcli.envs.normalize.save_normalizer``);
- ``state.json``: plain values: the trainer's counters and adaptive scalars (env steps, PPO-Penalty's beta, ...),
  the RNG states of python ``random``, numpy's global generator and torch (CPU and CUDA), and the env's episodes
  in progress (``pgcli.envs.state.env_state``).

A trainer names what it saves once (``{"policy": self.policy, "vf_optimizer": ...}`` plus ``{"steps": ...}``) and
its ``save`` / ``load`` are one call each. Writes go to a hidden sibling directory, are fsynced, and replace the
target by a rename, so a crash never leaves a partial checkpoint under a checkpoint's name. Reading a missing,
truncated or corrupt file raises a one-line :class:`~pgcli.errors.PgcliError` naming the file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from pgcli.envs.normalize import find_normalizer, load_saved_normalizer, save_normalizer
from pgcli.envs.state import env_state, restore_env_state
from pgcli.errors import PgcliError

MODEL_FILE = "model.pt"
NORMALIZER_FILE = "normalizer.npz"
STATE_FILE = "state.json"
STATE_FORMAT = 1
"""Version of ``state.json``'s layout."""

T = TypeVar("T")


class Stateful(Protocol):
    """A module or optimizer: saved as its state dict."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


class Restored(NamedTuple):
    """What :func:`load_training_state` gives back to the trainer."""

    values: dict[str, Any]
    """The plain values the trainer saved (``steps``, ``beta``, ...)."""
    obs: np.ndarray | None
    """The observation batch to act on next (the episodes in progress); None when the env was not restored."""


# -- writing ---------------------------------------------------------------------------------------------------------
@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a fresh hidden directory beside ``path``; on success fsync its files and rename it to ``path``.

    An existing ``path`` (``best_model/``, ``model/``) is replaced: it is renamed aside first and deleted after the
    new directory is in place, so ``path`` is always either the old or the new complete checkpoint (or, for an
    instant between the two renames, absent). On an exception the temporary directory is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                _fsync(file)
        _fsync(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_training_state(path: Path, env: VectorEnv, values: Mapping[str, Any]) -> None:
    """Write ``normalizer.npz`` (when normalising) and ``state.json`` (``values``, RNG states, env episodes)."""
    save_normalizer(env, path)
    state = {"format": STATE_FORMAT, "trainer": dict(values), "rng": rng_state(), "env": env_state(env)}
    (path / STATE_FILE).write_text(json.dumps(state))


def save_checkpoint(
    path: Path, env: VectorEnv, modules: Mapping[str, Stateful | None], values: Mapping[str, Any]
) -> Path:
    """Atomically write our trainers' checkpoint: ``model.pt`` plus :func:`save_training_state`.

    Args:
        path: the checkpoint directory (replaced if it exists).
        env: the training env (normalisation statistics, episodes in progress).
        modules: name -> module or optimizer, saved as state dicts (None: saved as None, e.g. GRPO's reference
            policy when ``beta`` is 0).
        values: plain JSON values (counters, adaptive coefficients, generator states).

    Returns:
        ``path``.
    """
    payload = {name: None if obj is None else obj.state_dict() for name, obj in modules.items()}
    with atomic_dir(path) as tmp:
        torch.save(payload, tmp / MODEL_FILE)
        save_training_state(tmp, env, values)
    return path


# -- reading ---------------------------------------------------------------------------------------------------------
def read_file(file: Path, reader: Callable[[Path], T]) -> T:
    """``reader(file)``, with a missing, truncated or corrupt file as a one-line PgcliError naming it."""
    if not file.is_file():
        raise PgcliError(f"checkpoint file {file} is missing; is {file.parent} a complete pgcli checkpoint?")
    try:
        return reader(file)
    except Exception as exc:  # any parse error of a damaged file: torch, zip, numpy and json all raise their own
        reason = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:200]  # the first sentence
        raise PgcliError(
            f"cannot read checkpoint file {file}: truncated or corrupt ({type(exc).__name__}: {reason})"
        ) from exc


def verify_checkpoint(path: Path) -> int | None:
    """Raise the one-line PgcliError a load would raise when a file of checkpoint ``path`` is missing, unreadable or
    damaged, without loading anything: ``state.json`` and a model file exist, every ``.json`` parses, and every
    ``.pt``, ``.zip`` and ``.npz`` is a zip archive whose members match their CRCs (``torch.save``, SB3 and
    ``np.savez`` all write zip archives). ``pgcli train resume=`` passes over a checkpoint that fails this
    (docs/runs.md, "Resume").

    Returns:
        The trainer's step count ``state.json`` records (None where the trainer keeps it elsewhere: SB3's zip).
    """
    state = read_file(path / STATE_FILE, lambda f: json.loads(f.read_text()))
    files = sorted(path.iterdir())
    if not any(f.suffix in (".pt", ".zip") for f in files):
        raise PgcliError(f"checkpoint file {path / MODEL_FILE} is missing; is {path} a complete pgcli checkpoint?")
    for file in files:
        if file.suffix in (".pt", ".zip", ".npz"):
            read_file(file, _check_zip)
        elif file.suffix == ".json" and file.name != STATE_FILE:
            read_file(file, lambda f: json.loads(f.read_text()))
    values = state.get("trainer", state) if isinstance(state, dict) else None  # pgcli.algo.sft keeps them at the top
    steps = values.get("steps") if isinstance(values, dict) else None
    return steps if isinstance(steps, int) else None


def _check_zip(file: Path) -> None:
    with zipfile.ZipFile(file) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"member {bad} does not match its CRC")


def _read_npz(file: Path) -> dict[str, np.ndarray]:
    with np.load(file, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def load_training_state(path: Path, env: VectorEnv) -> Restored:
    """Restore :func:`save_training_state`'s files: normalisation statistics, RNG states and the env's episodes."""
    if find_normalizer(env) is not None:
        read_file(path / NORMALIZER_FILE, _read_npz)  # validates the file before it is used
    load_saved_normalizer(env, path)  # frozen here; the env state below puts back whether it was still learning
    state = read_file(path / STATE_FILE, lambda f: json.loads(f.read_text()))
    try:
        set_rng_state(state["rng"])
        obs = restore_env_state(env, state["env"])
        return Restored(dict(state["trainer"]), obs)
    except (KeyError, TypeError, ValueError) as exc:
        raise PgcliError(
            f"checkpoint file {path / STATE_FILE} does not fit this run ({type(exc).__name__}: {exc})"
        ) from exc


def load_checkpoint(
    path: Path, env: VectorEnv, device: torch.device, modules: Mapping[str, Stateful | None]
) -> Restored:
    """Load a :func:`save_checkpoint` directory into the trainer's modules, the env and the RNGs.

    Args:
        path: the checkpoint directory.
        env: receives the normalisation statistics and, when it has as many sub-envs as the saved one, the
            episodes in progress.
        device: where tensors are mapped.
        modules: name -> module or optimizer to ``load_state_dict`` into; None (or a name saved as None) is skipped.

    Returns:
        The saved plain values and the observation batch to continue from (:class:`Restored`).
    """
    load_state_dicts(path, device, modules)
    return load_training_state(path, env)


def load_state_dicts(
    path: Path, device: torch.device, modules: Mapping[str, Stateful | None], *, detail_line: int = 1
) -> None:
    """Load ``path/model.pt``'s state dicts into ``modules`` (name -> module or optimizer; None, or a name saved as
    None, is skipped). One that does not fit is a one-line PgcliError quoting line ``detail_line`` of torch's message
    (a header line, then one line per key), or its last line where it has fewer."""
    file = path / MODEL_FILE
    payload: dict[str, Any] = read_file(file, lambda f: torch.load(f, map_location=device, weights_only=True))
    for name, obj in modules.items():
        if obj is not None and payload.get(name) is not None:
            try:
                obj.load_state_dict(payload[name])
            except (KeyError, RuntimeError, ValueError) as exc:
                lines = [line.strip() for line in str(exc).strip().splitlines()] or [""]
                detail = lines[min(detail_line, len(lines) - 1)]
                raise PgcliError(f"checkpoint file {file} does not fit this trainer ({name}: {detail[:200]})") from exc


# -- process-wide RNGs -----------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """python ``random``, numpy's global generator and torch's CPU (and CUDA) generators, as plain values."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, np.asarray(keys).tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
        "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state` (CUDA generators only when as many devices are visible as were saved)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
