"""A Hugging Face model directory (``model.path``) checked as a checkpoint is, before anything reads its weights.

A directory written by ``save_pretrained`` holds ``config.json``, the weights (``model.safetensors``, or shards listed
in ``model.safetensors.index.json``; an older ``pytorch_model.bin``) and the tokenizer's files. A damaged or
mismatched one is one line naming the directory and the file (:class:`~pgcli.errors.ConfigError`, exit 2), where the
libraries would stop on an exception cut at its colon or on a hint that a tokenizer package is missing:

- a weights file shorter (or longer) than its safetensors header says (a copy cut short), or a pickle whose zip
  directory is unreadable;
- a tensor whose shape in the file is not the one ``config.json`` gives it (the weights of another model);
- no tokenizer file at all (``tokenizer.json``, ``tokenizer.model``, ``vocab.json``, ``vocab.txt``);
- a run's weights (``policy.pt``) that do not fit the base model as it is now (:func:`check_state_fits`: the base was
  replaced by one of another shape after training).

Only headers are read (a few kilobytes per file) and the model's shapes come from an empty copy on the meta device.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgcli.errors import ConfigError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""A fast tokenizer's file, SentencePiece's model, or a BPE / WordPiece vocabulary: one is needed."""
MAX_HEADER = 100_000_000
"""safetensors' own limit on a header's size."""


def check_model_dir(directory: Path, option: str, shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Raise a one-line ConfigError (``option``: ``model.path=<as typed>``) when the model directory's weights are
    damaged, do not have the ``shapes`` of its ``config.json`` (when given), or it has no tokenizer file."""
    check_tokenizer_files(directory, option)
    for path in weight_files(directory, option):
        if path.suffix == ".safetensors":
            header = safetensors_header(path, option)
            if shapes is not None:
                _check_file_shapes(header, shapes, path, option)
        else:
            _check_zip(path, option)


def check_tokenizer_files(directory: Path, option: str) -> None:
    """One of :data:`TOKENIZER_FILES` is in ``directory``."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{option}: {directory} has no tokenizer file ({', '.join(TOKENIZER_FILES)}); save the model's tokenizer "
            "there (tokenizer.save_pretrained)"
        )


def weight_files(directory: Path, option: str) -> list[Path]:
    """The weights files of ``directory``: ``model.safetensors``, the shards its index lists, or the pickled ones."""
    if (directory / SAFETENSORS).is_file():
        return [directory / SAFETENSORS]
    for index_name in (SAFETENSORS_INDEX, PICKLED[1]):
        index = directory / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{option}: cannot read {index} ({type(exc).__name__})") from None
            missing = [name for name in shards if not (directory / name).is_file()]
            if missing:
                raise ConfigError(f"{option}: {directory / missing[0]} is missing (listed in {index.name})")
            return [directory / name for name in shards]
    if (directory / PICKLED[0]).is_file():
        return [directory / PICKLED[0]]
    raise ConfigError(
        f"{option}: {directory} has no weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or {PICKLED[0]}); pass a "
        "directory written by save_pretrained"
    )


def safetensors_header(path: Path, option: str) -> dict[str, Any]:
    """The tensors a safetensors file describes (name -> dtype, shape, offsets), once its size is the size its header
    says; else a one-line ConfigError naming the file."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(MAX_HEADER, size - 8):
                raise ValueError("header longer than the file")
            header: dict[str, Any] = json.loads(f.read(length))
        tensors = {name: v for name, v in header.items() if name != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"{option}: {path} is not a readable safetensors file ({type(exc).__name__})") from None
    expected = 8 + length + end
    if size != expected:
        cut = "truncated" if size < expected else "longer than its header says"
        raise ConfigError(
            f"{option}: {path} is {cut} ({size:,} bytes, its header describes {expected:,}); copy or save the model "
            "again"
        )
    return tensors


def _check_file_shapes(
    header: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], path: Path, option: str
) -> None:
    for name, entry in header.items():
        want = shapes.get(name)
        if want is not None and tuple(entry.get("shape", ())) != want:
            raise ConfigError(
                f"{option}: {path} holds {name} of shape {list(entry['shape'])} where {path.parent / 'config.json'} "
                f"gives {list(want)}; the weights are another model's"
            )


def _check_zip(path: Path, option: str) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{option}: {path} is damaged ({exc}); copy or save the model again") from None


def check_state_fits(
    state: Mapping[str, tuple[int, ...]],
    base: Mapping[str, tuple[int, ...]],
    weights: Path,
    directory: Path,
    option: str,
) -> None:
    """The tensors of a run's weights file ``weights`` (name -> shape) are the base model's (``directory``, as it is
    now): else one line naming both (the base was replaced after the run trained on it)."""
    for name, shape in state.items():
        want = base.get(name)
        if want is None:
            raise ConfigError(
                f"{option}: {weights} holds {name}, which the base model in {directory} has not; the base is not the "
                "model the run trained (restore it)"
            )
        if tuple(shape) != tuple(want):
            raise ConfigError(
                f"{option}: {weights} holds {name} of shape {list(shape)} and the base model in {directory} "
                f"({directory / 'config.json'}) has {list(want)}; the base is not the model the run trained "
                "(restore it)"
            )
