"""Labels that follow the env that actually runs, and presets that apply only to the env they were tuned for.

Issue 9 item 2. ``pgcli train env.id=Acrobot-v1`` keeps ``env=cartpole``'s group choice (and its settings: n_envs,
normalisation), but it trains Acrobot, so:

- **env label** (experiment, run name ``<algo>-<label>-s<seed>``, ``tags.env``): the name of the ``conf/env`` option
  whose ``id`` is the env id in use (the chosen option when its id matches, else the first by name), so
  ``env.id=Acrobot-v1`` is labelled ``acrobot`` whichever ``env=`` was chosen; an id no option has is its own label,
  without the module path (``tests.example_envs.my_envs:MyTarget-v0`` -> ``MyTarget-v0``). ``tags.env_id`` is the id
  exactly as given.
- **preset**: ``conf/preset/<algo>_<env>.yaml`` is chosen by the group names (Hydra's specialisation pattern), so it
  was tuned for the env option's own id. When ``env.id`` is overridden to another id, :func:`stale_preset_overrides`
  adds ``~preset`` before Hydra composes the job and says so in one line; an explicit ``preset=...`` / ``~preset``
  on the command line is left alone. The run records the preset it got (tag and param ``preset``, ``none`` if none).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgcli.errors import ConfigError

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


def register_resolver() -> None:
    """``${pgcli.env_label:<env id>,<env choice>}`` for ``hydra.run.dir``: the env label, '/' made '-' (idempotent).

    Only the single-run directory uses it: a sweep's job directories are resolved in launcher worker processes, which
    do not register pgcli's resolvers, so they keep the group choice (and the job number).
    """
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("pgcli.env_label", _dir_label, replace=True)


def _dir_label(env_id: str, env_choice: str) -> str:
    from pgcli.config.compose import CONF_DIR

    return env_label(str(env_id), str(env_choice), CONF_DIR).replace("/", "-")


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


@dataclass
class PresetDrop:
    """What :func:`stale_preset_overrides` decided: overrides to add and the notices that say why."""

    overrides: list[str] = field(default_factory=list)
    """``["~preset"]`` or nothing."""
    notices: list[str] = field(default_factory=list)
    """One line per dropped (preset, env id), for stderr."""

    def announce(self) -> None:
        """Print the notices on stderr (after validation passed, so an error stays the only line)."""
        for line in self.notices:
            print(line, file=sys.stderr)


def stale_preset_overrides(overrides: list[str], *, multirun: bool, conf_dir: str) -> PresetDrop:
    """``~preset`` when the command line overrides ``env.id`` away from the id its preset was tuned for.

    Each job of the command line is composed (only when ``env.id`` is overridden) to learn its preset and env choice.
    An explicit ``preset=...`` or ``~preset`` wins; a command line that does not compose returns ``[]`` and is left
    to validation to report.

    Args:
        overrides: the command line's ``key=value`` overrides.
        multirun: ``-m``: a sweep's jobs are expanded as validation expands them.
        conf_dir: pgcli's ``conf/`` directory.

    Raises:
        ConfigError: a sweep over ``env.id`` where some jobs keep their preset's id and others do not (one Hydra
            command line cannot drop the preset for only some jobs).
    """
    task = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    keys = {_key(o) for o in task}
    if "env.id" not in keys or "preset" in keys:
        return PresetDrop()
    try:
        composed = [_compose(conf_dir, job) for job in _jobs(task, multirun=multirun)]
    except Exception:
        return PresetDrop()
    stale: list[tuple[str, str, str]] = []  # (preset, env choice, env id in use)
    for cfg in composed:
        choices = cfg.hydra.runtime.choices
        preset, choice = applied_preset(choices, conf_dir), choices.get("env")
        if preset is not None and cfg.env.id != env_option_ids(conf_dir).get(choice):
            stale.append((preset, choice, cfg.env.id))
    if not stale:
        return PresetDrop()
    if len(stale) < len(composed):
        raise ConfigError(
            f"this sweep's env.id values keep env={stale[0][1]}'s id in some jobs and not in others, so preset "
            f"{stale[0][0]} would apply to only some; sweep env=<option>,... instead, or add ~preset"
        )
    notices = []
    for preset, choice, env_id in dict.fromkeys(stale):
        tuned_for = env_option_ids(conf_dir)[choice]
        same = [name for name, option_id in env_option_ids(conf_dir).items() if option_id == env_id]
        hint = f"; env={same[0]} has this env's own settings" if same else ""
        notices.append(
            f"pgcli: env.id={env_id} replaces env={choice}'s {tuned_for}, so preset {preset} (tuned for {tuned_for}) "
            f"is not applied{hint}"
        )
    return PresetDrop(["~preset"], notices)


def _jobs(task: list[str], *, multirun: bool) -> list[list[str]]:
    """The override list of each job, expanded as ``pgcli.cli.validate_overrides`` does (grid sweeps only)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(task)
    if not multirun or not any(o.is_sweep_override() for o in parsed):
        return [task]
    if all(o.is_discrete_sweep() or not o.is_sweep_override() for o in parsed):
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    return [[o.input_line or "" for o in parsed if not o.is_sweep_override()]]


def _compose(conf_dir: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from pgcli.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3", job_name="pgcli"):
        return compose("train", overrides=overrides, return_hydra_config=True)


def _key(override: str) -> str:
    """The key of a ``key=value`` override without Hydra's ``+``/``++``/``~`` prefix (``~preset`` -> ``preset``)."""
    return override.split("=", 1)[0].lstrip("+~").strip()
