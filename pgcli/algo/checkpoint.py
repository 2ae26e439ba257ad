"""Checkpoints of pgcli's own trainers: ``model.pt`` (state dicts and plain values) and ``normalizer.npz``.

A trainer names what it saves once (``{"policy": self.policy, "vf_optimizer": ..., "beta": self.beta}``) and its
``save`` / ``load`` are one call each. Modules and optimizers are stored as state dicts, numbers as they are, so the
file loads with ``torch.load(..., weights_only=True)``. The env's normalisation statistics go beside it
(``pgcli.env.save_normalizer``) and come back frozen, as evaluation needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from gymnasium.vector import VectorEnv

from pgcli.env import load_saved_normalizer, save_normalizer

MODEL_FILE = "model.pt"


def save_checkpoint(path: Path, env: VectorEnv, state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``path/model.pt`` and the env's normaliser to ``path/normalizer.npz``.

    Args:
        path: directory, created if missing.
        env: the training env (its VecNormalize statistics, if any, are saved).
        state: name -> module or optimizer (saved as its state dict), or a plain value (int, float, None).

    Returns:
        ``path``.
    """
    path.mkdir(parents=True, exist_ok=True)
    payload = {name: obj.state_dict() if hasattr(obj, "state_dict") else obj for name, obj in state.items()}
    torch.save(payload, path / MODEL_FILE)
    save_normalizer(env, path)
    return path


def load_checkpoint(path: Path, env: VectorEnv, device: torch.device, stateful: Mapping[str, Any]) -> dict[str, Any]:
    """Load a :func:`save_checkpoint` directory into the trainer's objects.

    Args:
        path: the checkpoint directory.
        env: receives the saved normalisation statistics (frozen).
        device: where tensors are mapped.
        stateful: name -> module or optimizer to ``load_state_dict`` into; ``None`` (or a name saved as ``None``)
            is skipped, e.g. GRPO's reference policy when ``beta`` is 0.

    Returns:
        The whole saved payload, for the plain values the caller restores itself.
    """
    payload: dict[str, Any] = torch.load(path / MODEL_FILE, map_location=device, weights_only=True)
    for name, obj in stateful.items():
        if obj is not None and payload.get(name) is not None:
            obj.load_state_dict(payload[name])
    load_saved_normalizer(env, path)
    return payload
