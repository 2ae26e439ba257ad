"""The MLflow Model of a pgcli run: ``mlflow.pyfunc.load_model("runs:/<run id>/model").predict(observations)``.

Every run logs its final agent as ``model`` (and its best one as ``best_model``): an MLflow Model directory whose
``MLmodel`` names this module as the pyfunc ``loader_module``, beside the agent's own files (``model.pt`` or SB3's
``model.zip``, ``normalizer.npz``, ``agent.json``; see :mod:`pgcli.agent`). MLflow calls :func:`_load_pyfunc` with
that directory; ``predict`` maps raw observations (a numpy array, a list, or a pandas DataFrame with one column per
observation dimension) to the actions the gymnasium env takes, normalisation inside, deterministic.

This module never imports MLflow (``pgcli.tracking`` is the only one that does): a loader module needs no MLflow
class, and the model directory holds no pickled Python object of ours -- the weights load with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pgcli.agent import RawPolicy


class AgentPyfunc:
    """What ``mlflow.pyfunc.load_model`` wraps: ``predict(model_input, params=None)``."""

    def __init__(self, model_dir: Path) -> None:
        self.policy = RawPolicy(model_dir)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """Actions for a batch of raw observations: [B] int64 (discrete) or [B, A] float32 (continuous)."""
        import pandas as pd  # installed with MLflow, the only caller

        if isinstance(model_input, pd.DataFrame):  # one row per observation, one column per dimension
            model_input = model_input.to_numpy()
        return self.policy(np.asarray(model_input))


def _load_pyfunc(data_path: str) -> AgentPyfunc:
    """MLflow's loader-module entry point: ``data_path`` is the model directory."""
    return AgentPyfunc(Path(data_path))
