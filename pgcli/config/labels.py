"""Labels that follow the env that actually runs, and the preset a run got.

docs/configuration.md, "Labels and presets follow the env id":

``pgcli train env.id=Acrobot-v1`` keeps ``env=cartpole``'s group choice (and its settings: n_envs, normalisation), but
it trains Acrobot, so its **env label** (experiment, run name ``<algo>-<label>-s<seed>``, ``tags.env``) is the name of
the ``conf/env`` option whose ``id`` is the env id in use (the chosen option when its id matches, else the first by
name): ``env.id=Acrobot-v1`` is labelled ``acrobot`` whichever ``env=`` was chosen; an id no option has is its own
label, without the module path (``tests.example_envs.my_envs:MyTarget-v0`` -> ``MyTarget-v0``). ``tags.env_id`` is the
id exactly as given.

The **preset** tag and param name the ``conf/preset`` file the job was composed with (``none`` if none);
:mod:`pgcli.config.presets` drops a preset whose env id was overridden.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NO_PRESET = "none"
"""The ``preset`` tag and param of a run trained without one."""


@functools.lru_cache(maxsize=8)
def env_option_ids(conf_dir: str) -> dict[str, str]:
    """``{option name: gymnasium id}`` of every ``conf/env/*.yaml`` option, sorted by name."""
    from omegaconf import DictConfig, OmegaConf

    ids = {}
    for path in sorted(Path(conf_dir, "env").glob("*.yaml")):
        option = OmegaConf.load(path)
        env_id = option.get("id") if isinstance(option, DictConfig) else None
        if isinstance(env_id, str):
            ids[path.stem] = env_id
    return ids


def env_label(env_id: str, env_choice: str | None, conf_dir: str) -> str:
    """The label of a run on ``env_id`` whose ``env=`` group choice was ``env_choice`` (rule: module docstring)."""
    options = env_option_ids(conf_dir)
    if env_choice is not None and options.get(env_choice) == env_id:
        return env_choice
    same = [name for name, option_id in options.items() if option_id == env_id]
    return same[0] if same else env_id.rpartition(":")[2]


def register_resolver(conf_dir: str) -> None:
    """``${pgcli.env_label:<env id>,<env choice>}`` for ``hydra.run.dir``: the env label, '/' made '-' (idempotent).

    Only the single-run directory uses it: a sweep's job directories are resolved in launcher worker processes, which
    do not register pgcli's resolvers, so they keep the group choice (and the job number).
    """
    from omegaconf import OmegaConf

    def dir_label(env_id: str, env_choice: str) -> str:
        return env_label(str(env_id), str(env_choice), conf_dir).replace("/", "-")

    OmegaConf.register_new_resolver("pgcli.env_label", dir_label, replace=True)


def applied_preset(choices: Mapping[str, Any], conf_dir: str) -> str | None:
    """The preset a job was composed with, from Hydra's ``runtime.choices``, or None.

    The choice of the optional ``preset: ${algo}_${env}`` entry is recorded even when no such file exists (a2c_acrobot),
    so the file decides.
    """
    preset = choices.get("preset")
    return str(preset) if preset and Path(conf_dir, "preset", f"{preset}.yaml").is_file() else None


def preset_label(choices: Mapping[str, Any], conf_dir: str) -> str:
    """The ``preset`` tag and param of a run: the applied preset's name, or ``none``."""
    return applied_preset(choices, conf_dir) or NO_PRESET
