"""Packaging a saved agent as an MLflow Model (``runs:/<run id>/<name>``), loadable with ``mlflow.pyfunc.load_model``.

The model's loader is :mod:`pgcli.pyfunc` (it stays at that path: saved models name it), and its files are the agent's
own (weights, ``agent.json``, SB3's zip) beside ``MLmodel`` (docs/models.md).
"""

from __future__ import annotations

from pathlib import Path

PYFUNC_LOADER = "pgcli.pyfunc"
MODEL_REQUIREMENTS = ("pgcli", "torch", "numpy", "gymnasium", "stable-baselines3", "sb3-contrib", "pandas")


def save_pyfunc_model(model_dir: Path, path: Path) -> Path:
    """Write an MLflow Model at ``path``: pyfunc with :mod:`pgcli.pyfunc` as loader, the agent's files beside MLmodel.

    A loader module rather than a pickled ``PythonModel``: the model holds plain files only (weights, JSON, SB3's zip),
    and loading it unpickles no object of ours. Requirements are pinned from the installed versions (MLflow's own
    inference would import the model in a subprocess: seconds per run).
    """
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    import mlflow.pyfunc

    requirements = []
    for package in MODEL_REQUIREMENTS:
        try:
            requirements.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    mlflow.pyfunc.save_model(str(path), loader_module=PYFUNC_LOADER, pip_requirements=requirements)
    for item in model_dir.iterdir():
        if item.is_file():
            shutil.copy2(item, path / item.name)
    return path
