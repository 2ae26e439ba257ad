"""``pgcli train --from-run <run id | run dir> [overrides]``: train again with a logged run's exact resolved config.

A run's ``.hydra/config.yaml`` holds its resolved config, but not which schema each section had (every algo section is
a plain mapping once saved), so Hydra cannot compose it as a primary config -- that is why
``--config-dir <run>/.hydra --config-name config`` cannot work. Instead the logged values are registered in Hydra's
ConfigStore as the option ``from_run=source`` of a global-package group, and the job composes the usual ``train``
config with::

    +from_run=source algo=<logged algo> env=<logged env> ~preset [user overrides]

The algo/env choices pick the right schemas; the appended ``from_run`` entry comes last in the defaults list, so every
logged value wins over the groups' (and presets') defaults; the preset is dropped since its values are already in the
logged config; command-line overrides apply on top and are validated like any others. The new run is tagged
``source_run_id`` (when the source is in the store) and ``source_config`` (where the config was read).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgcli.config.compose import CONF_DIR
from pgcli.config.labels import preset_label
from pgcli.config.overrides import override_key, split_override
from pgcli.errors import ConfigError
from pgcli.training.logged import LoggedRun, Wording

FROM_RUN_FLAG = "--from-run"
FROM_RUN_GROUP = "from_run"
SOURCE_RUN_ENV = "PGCLI_SOURCE_RUN_ID"
"""Set for the job (and sweep workers): the run id the job re-runs, logged as the ``source_run_id`` tag."""
SOURCE_CONFIG_ENV = "PGCLI_SOURCE_CONFIG"
SOURCE_PRESET_ENV = "PGCLI_SOURCE_PRESET"
"""Set for the job: the logged run's preset label, the re-run's ``preset`` (its values are in the config)."""
FROM_RUN = Wording(
    not_a_run="--from-run {ref!r} is neither a directory nor an MLflow run id (32 hex digits, or a unique prefix of at "
    "least 8)",
    no_store="tracking=off has no run store to find a run id in; pass --from-run <run dir>",
    not_found="no run {ref} in {uri}; pass tracking.uri=... for another store",
    doing="re-run",
)


def has_from_run(args: list[str]) -> bool:
    return any(a == FROM_RUN_FLAG or a.startswith(FROM_RUN_FLAG + "=") for a in args)


def split_from_run(args: list[str]) -> tuple[str, list[str]]:
    """The ``--from-run`` value and the other arguments."""
    rest, source = [], None
    it = iter(args)
    for arg in it:
        if arg == FROM_RUN_FLAG:
            source = next(it, None)
            if source is None or source.startswith("-"):
                raise ConfigError("--from-run needs a run id or a run directory")
        elif arg.startswith(FROM_RUN_FLAG + "="):
            source = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if not source:
        raise ConfigError("--from-run needs a run id or a run directory")
    return source, rest


def from_run_args(args: list[str], *, overrides: list[str], store_for: Callable[[list[str]], Any]) -> list[str]:
    """Hydra arguments that re-run the run ``--from-run`` names, with the user's ``overrides`` on top.

    Registers the logged config in the ConfigStore and sets :data:`SOURCE_RUN_ENV` for the job.

    Args:
        args: ``pgcli train`` arguments including ``--from-run X``.
        overrides: the user's key=value overrides among ``args`` (to find tracking and group overrides).
        store_for: the run store for tracking overrides (None with tracking=off).
    """
    source, rest = split_from_run(args)
    groups = {override_key(o): o for o in overrides if "=" in o and "." not in override_key(o)}
    for group in ("algo", "env"):
        if group in groups:
            raise ConfigError(
                f"--from-run keeps the logged run's {group}; '{groups[group]}' would train something else "
                "(start a new run with pgcli train instead)"
            )
    tracking = [o for o in overrides if override_key(o).startswith("tracking")]
    # tracking=off turns off the new run's logging, not the lookup: a run id is found in the store the other tracking
    # overrides (or the defaults) name (docs/evaluation.md, "pgcli train --from-run")
    lookup = [o for o in tracking if not _turns_tracking_off(o)]
    run = LoggedRun.locate(source, store=lambda: store_for(lookup), wording=FROM_RUN)
    with run.hydra_dir() as found:
        if found is None and run.record is None:
            raise ConfigError(f"{source} is not a run directory (no .hydra/config.yaml and hydra.yaml)")
        if found is None:
            raise ConfigError(f"run {run.run_id} has no logged config (artifact hydra/config.yaml)")
        logged = run.logged_config(found)
    # A group chosen on the command line (hardware=cuda, tracking=off) replaces the logged section of that group.
    values = {k: v for k, v in logged.values.items() if k not in groups}
    register_source(values)
    record = run.record or run.find_in(store_for(tracking))
    # a run named by id (or a prefix of it) is tagged with its whole id, a run directory as it was typed
    os.environ[SOURCE_CONFIG_ENV] = run.record.run_id if run.record is not None else str(source)
    # the values it set are in the logged config; the label comes along
    os.environ[SOURCE_PRESET_ENV] = preset_label(logged.choices, CONF_DIR)
    if record is not None:
        os.environ[SOURCE_RUN_ENV] = record.run_id
    else:
        os.environ.pop(SOURCE_RUN_ENV, None)
    return [f"+{FROM_RUN_GROUP}=source", f"algo={logged.algo}", f"env={logged.env}", "~preset", *rest]


def _turns_tracking_off(override: str) -> bool:
    """Whether ``override`` is ``tracking=off`` or ``tracking.backend=off``, its value quoted or not (Hydra reads
    ``tracking.backend='off'`` as ``off`` too)."""
    _, key, value = split_override(override)
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return key in ("tracking", "tracking.backend") and value == "off"


def register_source(values: dict[str, Any]) -> None:
    """Store the logged values as ``from_run/source`` (package ``_global_``: they merge at the config's root)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=FROM_RUN_GROUP, name="source", node=values, package="_global_")


def source_preset() -> str | None:
    """The preset label of the run ``--from-run`` re-runs (None when this job is not a re-run)."""
    return os.environ.get(SOURCE_PRESET_ENV) or None


def source_tags() -> dict[str, str]:
    """Tags of a job started by ``--from-run`` (empty otherwise)."""
    tags = {}
    if os.environ.get(SOURCE_RUN_ENV):
        tags["source_run_id"] = os.environ[SOURCE_RUN_ENV]
    if os.environ.get(SOURCE_CONFIG_ENV):
        tags["source_config"] = os.environ[SOURCE_CONFIG_ENV]
    return tags


def reject_logged_config_dir(args: list[str]) -> None:
    """``--config-dir <run>/.hydra --config-name config`` composes a schema-less dict; say what works instead."""
    values = {
        flag: args[i + 1]
        for i, flag in enumerate(args[:-1])
        if flag in ("--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp")
    }
    values |= dict(a.split("=", 1) for a in args if a.startswith(("--config-name=", "--config-dir=", "--config-path=")))
    name = values.get("--config-name", values.get("-cn", "train"))
    dirs = [values[k] for k in ("--config-dir", "-cd", "--config-path", "-cp") if k in values]
    logged = any((Path(d) / "hydra.yaml").is_file() for d in dirs)
    if logged:
        raise ConfigError(
            "a run's saved .hydra/config.yaml cannot be composed again (it has no schema); to re-run a logged run "
            "use: pgcli train --from-run <run id | run dir> [overrides]"
        )
    if name != "train":
        raise ConfigError(
            f"--config-name {name}: pgcli train always composes its 'train' config; to re-run a logged run use: "
            "pgcli train --from-run <run id | run dir> [overrides]"
        )
