"""The saved-agent format: the files of a model directory (``<run dir>/model``, ``best_model``, the ``model``
artifact) and its ``agent.json`` read back, the run's config typed again. Writing them and loading the policy they
hold is :mod:`pgcli.agent`'s (it needs the trainers); reading the format needs only the config, so every layer can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgcli.config.logged import train_config_from_dict
from pgcli.config.run import TrainConfig
from pgcli.errors import ConfigError

AGENT_FILE = "agent.json"
TORCH_FILE = "model.pt"
SB3_FILE = "model.zip"
TEXT_POLICY_FILE = "policy.pt"
"""A text policy's weights (``pgcli.lm.model.POLICY_FILE``)."""
NORMALIZER_FILE = "normalizer.npz"
SB3_NORMALIZER_FILE = "vecnormalize.pkl"
FORMAT_VERSION = 1


def is_model_dir(path: Path) -> bool:
    """Whether ``path`` holds a saved agent (``model.pt``, SB3's ``model.zip`` or a text policy's ``policy.pt``)."""
    return any((path / name).is_file() for name in (TORCH_FILE, SB3_FILE, TEXT_POLICY_FILE))


def read_agent_spec(model_dir: Path) -> dict[str, Any]:
    """The parsed ``agent.json`` of a model directory (one-line error when it is missing or unreadable)."""
    path = model_dir / AGENT_FILE
    try:
        spec: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{model_dir} has no {AGENT_FILE} (saved by an older pgcli?); pass its run dir") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if spec.get("format") != FORMAT_VERSION:
        raise ConfigError(f"{path}: unsupported format {spec.get('format')!r} (this pgcli reads {FORMAT_VERSION})")
    return spec


def agent_config(spec: dict[str, Any]) -> TrainConfig:
    """The run's config stored in an ``agent.json``, typed as every logged config is
    (:func:`pgcli.config.logged.train_config_from_dict`)."""
    return train_config_from_dict(spec["config"], spec["algo"])


EXPORT_TASK_FILE = "pgcli_task.json"
"""What ``pgcli export`` records beside the Hugging Face files: the task the exported run trained on (its ``env``
section), so ``model=hf model.path=<export>`` trains that task as ``init=`` would (``pgcli.training.pipeline``)."""


def write_export_task(out: Path, spec: dict[str, Any], run_id: str | None) -> Path:
    """Record the task of the run whose ``agent.json`` is ``spec`` in the export directory ``out``."""
    record = {
        "format": FORMAT_VERSION,
        "algo": spec.get("algo"),
        "env": spec.get("env"),
        "source_run_id": run_id,
        "config": {"env": spec.get("config", {}).get("env", {})},
    }
    path = out / EXPORT_TASK_FILE
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_export_task(model_dir: Path) -> dict[str, Any] | None:
    """The task ``pgcli export`` recorded in ``model_dir`` (None: not an export, or unreadable)."""
    try:
        record = json.loads((model_dir / EXPORT_TASK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT_VERSION else None
