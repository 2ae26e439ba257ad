"""Presets apply only to the env they were tuned for (docs/configuration.md, "Labels and presets follow the env
id").

``conf/preset/<algo>_<env>.yaml`` is chosen by the group names (Hydra's specialisation pattern), so it was tuned for
the env option's own id. When ``env.id`` is overridden to another id, :func:`stale_preset_overrides` adds ``~preset``
before Hydra composes the job and says so in one line; an explicit ``preset=...`` / ``~preset`` on the command line is
left alone. The run records the preset it got (:func:`pgcli.config.labels.preset_label`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pgcli.config.compose import CONF_DIR, hydra_compose, job_overrides
from pgcli.config.labels import applied_preset, env_option_ids
from pgcli.config.overrides import override_key, task_lines
from pgcli.errors import ConfigError


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


def stale_preset_overrides(overrides: list[str], *, multirun: bool) -> PresetDrop:
    """``~preset`` when the command line overrides ``env.id`` away from the id its preset was tuned for.

    Each job of the command line is composed (only when ``env.id`` is overridden) to learn its preset and env choice.
    An explicit ``preset=...`` or ``~preset`` wins; a command line that does not compose returns ``[]`` and is left
    to validation to report.

    Args:
        overrides: the command line's ``key=value`` overrides.
        multirun: ``-m``: a sweep's jobs are expanded as validation expands them.

    Raises:
        ConfigError: a sweep over ``env.id`` where some jobs keep their preset's id and others do not (one Hydra
            command line cannot drop the preset for only some jobs).
    """
    keys = {override_key(o) for o in task_lines(overrides)}
    if "env.id" not in keys or "preset" in keys:
        return PresetDrop()
    try:
        composed = [hydra_compose(job, hydra_node=True) for job in job_overrides(overrides, multirun=multirun)]
    except ConfigError:
        return PresetDrop()
    stale: list[tuple[str, str, str]] = []  # (preset, env choice, env id in use)
    for cfg in composed:
        choices = cfg.hydra.runtime.choices
        preset, choice = applied_preset(choices, CONF_DIR), choices.get("env")
        if preset is not None and cfg.env.id != env_option_ids(CONF_DIR).get(choice):
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
        tuned_for = env_option_ids(CONF_DIR)[choice]
        same = [name for name, option_id in env_option_ids(CONF_DIR).items() if option_id == env_id]
        hint = f"; env={same[0]} has this env's own settings" if same else ""
        notices.append(
            f"pgcli: env.id={env_id} replaces env={choice}'s {tuned_for}, so preset {preset} (tuned for {tuned_for}) "
            f"is not applied{hint}"
        )
    return PresetDrop(["~preset"], notices)
