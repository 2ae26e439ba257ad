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
:func:`check_hf_files` checks what needs neither torch nor transformers: the directory, its files, and the LoRA
targets against the module names of the weights' headers (a target that names no module is refused in a second, not
after importing the libraries and building the model).
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.errors import ConfigError

if TYPE_CHECKING:
    from pgcli.config import HFModelConfig

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""A fast tokenizer's file, SentencePiece's model, or a BPE / WordPiece vocabulary: one is needed."""
MAX_HEADER = 100_000_000
"""safetensors' own limit on a header's size."""
OUTPUT_HEADS = ("lm_head", "embed_out")
"""Names of a causal LM's output head, which has no tensor of its own in the file when its weights are tied to the
embedding's: a target among them is left to peft."""
SHOWN_NAMES = 12
"""The module names a refused LoRA target lists."""


def check_hf_files(cfg: HFModelConfig) -> Path:
    """What can be checked of ``model=hf`` before torch and transformers are imported: both packages are installed,
    ``model.path`` resolves (its directory is returned), its files are whole, and a LoRA target names a module of it
    (:func:`check_lora_targets`). :func:`pgcli.lm.hf.check_hf_model` checks the rest on the model itself.

    Raises:
        ConfigError: one line naming what is missing.
    """
    import importlib.util

    for package in ("transformers", "peft"):
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"model=hf needs the {package} package: pip install 'pgcli[lm]'")
    directory = resolve_model_dir(cfg.path)
    check_model_dir(directory, f"model.path={cfg.path}")
    if cfg.lora.r > 0:
        check_lora_targets(cfg, directory)
    return directory


def check_lora_targets(cfg: HFModelConfig, directory: Path) -> None:
    """A one-line ConfigError when no target of ``model.lora.target_modules`` names a module (or ends a module's
    dotted name) of the model in ``directory``, as peft would refuse them; read from the safetensors headers. Pickled
    weights, ``all-linear``, dotted names and an output head's name are left to peft (on the empty model)."""
    targets = list(cfg.lora.target_modules)
    if targets == ["all-linear"] or any(t in OUTPUT_HEADS or "." in t for t in targets):
        return  # a dotted name may start with a prefix the file's names lack (a checkpoint saved without its base's)
    shapes = tensor_shapes(directory, f"model.path={cfg.path}")
    if shapes is None:
        return
    names = {".".join(parts[:i]) for parts in (t.split(".")[:-1] for t in shapes) for i in range(1, len(parts) + 1)}
    if any(n == t or n.endswith(f".{t}") for n in names for t in targets):
        return
    matrices = {t.rsplit(".", 2)[-2] for t, shape in shapes.items() if t.endswith(".weight") and len(shape) == 2}
    raise ConfigError(
        f"model.lora.target_modules={targets}: no module of the base model is named {' or '.join(targets)} (module "
        f"names of {cfg.path}: {', '.join(sorted(matrices)[:SHOWN_NAMES])})"
    )


def tensor_shapes(directory: Path, option: str) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor of the model in ``directory``, from its safetensors headers; None for pickled
    weights."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(directory, option):
        if path.suffix != ".safetensors":
            return None
        shapes.update((name, tuple(entry.get("shape", ()))) for name, entry in safetensors_header(path, option).items())
    return shapes


def resolve_model_dir(path: str) -> Path:
    """The local directory of ``model.path``: a model directory, or a hub id's snapshot in the Hugging Face cache
    (fetched now when it is not there yet).

    Raises:
        ConfigError: not a model directory, and the hub id is neither cached nor fetchable (one line).
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(
                f"model.path={path}: {local} has no config.json; pass a directory written by "
                "save_pretrained (a Hugging Face model) or a hub id"
            )
        return local.resolve()
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1
    if looks_local:
        raise ConfigError(f"model.path={path}: no such directory")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(path, local_files_only=True, allow_patterns=patterns))
    except (OSError, HFValidationError):
        pass
    try:
        return Path(snapshot_download(path, allow_patterns=patterns))
    except HFValidationError:
        raise ConfigError(f"model.path={path}: no such directory, and not a Hugging Face hub id") from None
    except Exception as exc:  # network, auth, missing repo: all say the same to the user
        reason = whole_message(exc)
        raise ConfigError(
            f"model.path={path}: no such directory, and the hub id is not in the local Hugging Face "
            f"cache and cannot be fetched ({reason}); download it where there is a network "
            f"(hf download {path}) or pass a local directory"
        ) from None


def whole_message(exc: BaseException) -> str:
    """``exc``'s message whole, on one line (its lines joined; its type when it has none): quoted, never cut."""
    return " ".join(str(exc).split()) or type(exc).__name__


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
