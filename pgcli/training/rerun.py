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
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgcli.errors import ConfigError

FROM_RUN_FLAG = "--from-run"
FROM_RUN_GROUP = "from_run"
SOURCE_RUN_ENV = "PGCLI_SOURCE_RUN_ID"
"""Set for the job (and sweep workers): the run id the job re-runs, logged as the ``source_run_id`` tag."""
SOURCE_CONFIG_ENV = "PGCLI_SOURCE_CONFIG"
SOURCE_PRESET_ENV = "PGCLI_SOURCE_PRESET"
"""Set for the job: the logged run's preset label, the re-run's ``preset`` (its values are in the config)."""
RUN_ID_LENGTH = 32
GROUPS = ("algo", "env", "model", "hardware", "tracking")


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
    from pgcli.agent import hydra_run_config

    source, rest = split_from_run(args)
    groups = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides if "=" in o and "." not in o.split("=", 1)[0]}
    for group in ("algo", "env"):
        if group in groups:
            raise ConfigError(
                f"--from-run keeps the logged run's {group}; '{groups[group]}' would train something else "
                "(start a new run with pgcli train instead)"
            )
    with _hydra_dir(source, overrides, store_for) as (hydra_dir, run_id):
        values, algo, env = hydra_run_config(hydra_dir)
        preset = logged_preset(hydra_dir)
    # A group chosen on the command line (hardware=cuda, tracking=off) replaces the logged section of that group.
    values = {k: v for k, v in values.items() if k not in groups}
    register_source(values)
    os.environ[SOURCE_CONFIG_ENV] = str(source)
    os.environ[SOURCE_PRESET_ENV] = preset  # the values it set are in the logged config; the label comes along
    if run_id:
        os.environ[SOURCE_RUN_ENV] = run_id
    else:
        os.environ.pop(SOURCE_RUN_ENV, None)
    return [f"+{FROM_RUN_GROUP}=source", f"algo={algo}", f"env={env}", "~preset", *rest]


def register_source(values: dict[str, Any]) -> None:
    """Store the logged values as ``from_run/source`` (package ``_global_``: they merge at the config's root)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=FROM_RUN_GROUP, name="source", node=values, package="_global_")


def logged_preset(hydra_dir: Path) -> str:
    """The preset label of the logged run (its ``hydra.yaml`` choices), ``none`` without one."""
    import yaml

    from pgcli.config.compose import CONF_DIR
    from pgcli.config.labels import preset_label

    choices = yaml.safe_load((hydra_dir / "hydra.yaml").read_text())["hydra"]["runtime"]["choices"]
    return preset_label(choices, CONF_DIR)


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


@contextmanager
def _hydra_dir(
    source: str, overrides: list[str], store_for: Callable[[list[str]], Any]
) -> Iterator[tuple[Path, str | None]]:
    """``(.hydra dir, run id or None)`` of a run dir or a run id (downloaded when its directory is gone)."""
    path = Path(source)
    tracking = [o for o in overrides if o.lstrip("+~").startswith("tracking")]
    if path.is_dir():
        hydra = path / ".hydra" if (path / ".hydra").is_dir() else path
        if not (hydra / "config.yaml").is_file() or not (hydra / "hydra.yaml").is_file():
            raise ConfigError(f"{source} is not a run directory (no .hydra/config.yaml and hydra.yaml)")
        yield hydra, _run_id_of_dir(hydra.parent, store_for(tracking))
        return
    if len(source) != RUN_ID_LENGTH or any(c not in "0123456789abcdef" for c in source):
        raise ConfigError(f"--from-run {source!r} is neither a directory nor an MLflow run id (32 hex digits)")
    store = store_for(tracking)
    if store is None:
        raise ConfigError("tracking=off has no run store to find a run id in; pass --from-run <run dir>")
    run = store.find(source)
    if run is None:
        raise ConfigError(f"no run {source} in {store.uri}; pass tracking.uri=... for another store")
    local = Path(run.tags.get("output_dir", "")) / ".hydra"
    if run.tags.get("output_dir") and (local / "config.yaml").is_file() and (local / "hydra.yaml").is_file():
        yield local, run.run_id
        return
    tmp = Path(tempfile.mkdtemp(prefix="pgcli-from-run-"))
    try:
        hydra = store.download(run.run_id, "hydra", tmp)
        if hydra is None or not (hydra / "config.yaml").is_file():
            raise ConfigError(f"run {source} has no logged config (artifact hydra/config.yaml)")
        yield hydra, run.run_id
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_id_of_dir(run_dir: Path, store: Any) -> str | None:
    """The id of the run logged from ``run_dir``, when the store has exactly one."""
    if store is None:
        return None
    runs = store.search(store.experiment_ids(), f"tags.output_dir = '{run_dir.resolve()}'")
    return runs[0].run_id if len(runs) == 1 else None


def reject_logged_config_dir(args: list[str]) -> None:
    """``--config-dir <run>/.hydra --config-name config`` composes a schema-less dict; say what works instead."""
    values = {flag: args[i + 1] for i, flag in enumerate(args[:-1])
              if flag in ("--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp")}  # fmt: skip
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
