"""Config loading: compose ``conf/`` with Hydra's compose API, build the typed schemas, and turn every failure into a
one-line :class:`~pgcli.errors.ConfigError`.

:func:`hydra_compose` is the one call of Hydra's compose API, and :func:`job_overrides` the one expansion of a sweep's
command line into the overrides of each job. The CLI validates a command line with these functions before Hydra runs
(bad input stops with exit 2 before any env or MLflow run exists); ``pgcli compare``, ``pgcli ui`` and resume read
tracking settings and logged configs through them too. A config composed here has passed every rule of its values;
the checks that need the world (env ids, spaces, a GPU) are :mod:`pgcli.training.checks`'s, which a run goes through.
Heavy modules (torch, SB3, MLflow) are never imported here.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config.algos import ALGOS
from pgcli.config.hf import HFModelConfig
from pgcli.config.labels import register_resolver
from pgcli.config.overrides import Overrides, split_override, task_lines
from pgcli.config.pixels import IMAGE_ENVS, CNNModelConfig
from pgcli.config.run import EnvConfig, HardwareConfig, ModelConfig, TrackingConfig, TrainConfig
from pgcli.config.text import TEXT_ENV_CONFIGS, LMModelConfig
from pgcli.errors import ConfigError, PgcliError

if TYPE_CHECKING:
    from omegaconf import DictConfig


def find_conf_dir() -> str:
    """``conf/`` beside the package (a checkout or editable install), else the copy shipped inside the package."""
    here = Path(__file__).resolve().parents[1]  # the pgcli package
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise PgcliError(f"cannot find pgcli's conf/ directory (looked beside {here})")


CONF_DIR = find_conf_dir()


def register_configs() -> None:
    """Register every schema in Hydra's ConfigStore, and the ``pgcli.env_label`` resolver (idempotent)."""
    register_resolver(CONF_DIR)  # ${pgcli.env_label:...} in hydra.run.dir
    nodes: list[tuple[str | None, str, type]] = [(None, "train_schema", TrainConfig)]
    nodes += [
        ("schema/algo", name, entry.schema) for name, entry in ALGOS.items()
    ]  # one registered since last call too
    nodes += [("schema/env", "env", EnvConfig)]
    nodes += [("schema/env", name, schema) for name, schema in TEXT_ENV_CONFIGS.items()]
    nodes += [("schema/model", "model", ModelConfig), ("schema/model", "tiny_gpt", LMModelConfig)]
    nodes += [("schema/model", "hf", HFModelConfig), ("schema/model", "cnn", CNNModelConfig)]
    nodes += [("schema/hardware", "hardware", HardwareConfig), ("schema/tracking", "tracking", TrackingConfig)]
    for group, name, node in nodes:
        _store(group, name, node)


_STORED: dict[tuple[str | None, str], type] = {}


def _store(group: str | None, name: str, node: type) -> None:
    """``node`` in Hydra's ConfigStore under ``group/name``, unless this process stored it there already (storing
    converts the dataclass to a config: ~0.1 s for all of them, in every composition before)."""
    from hydra.core.config_store import ConfigStore

    if _STORED.get((group, name)) is not node:
        ConfigStore.instance().store(group=group, name=name, node=node)
        _STORED[(group, name)] = node


def hydra_compose(overrides: list[str], *, hydra_node: bool = False) -> DictConfig:
    """``conf/train.yaml`` composed under ``overrides`` by Hydra's compose API (the schemas registered first).

    Args:
        overrides: Hydra overrides, applied as given (see :func:`compose_dictconfig` for pgcli's own additions).
        hydra_node: keep Hydra's own node (``hydra.run.dir``, ``hydra.sweeper``, ...) in the result.

    Raises:
        ConfigError: composition failed (an unknown option or key, a wrong type), in one line.
    """
    # The checks before a run ask for the same job's config several times (its values, its preset, its store): one
    # composition, 0.3-0.5 s on an idle machine. Without Hydra's node it is the same config with that node deleted,
    # which is what Hydra's compose does itself.
    from omegaconf import open_dict

    cfg = copy.deepcopy(_compose_with_hydra_node(tuple(overrides)))
    if not hydra_node:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


@functools.lru_cache(maxsize=16)
def _compose_with_hydra_node(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="pgcli"):
            return compose("train", overrides=list(overrides), return_hydra_config=True)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(describe_config_error(exc)) from None


def job_overrides(overrides: list[str], *, multirun: bool) -> list[list[str]]:
    """The config overrides of each job a command line describes (``hydra.*`` overrides left out).

    With ``multirun`` a grid sweep (``a=1,2 b=x,y``) is expanded into its jobs, as Hydra's basic sweeper does; a sweep
    with other syntax (Optuna's ``interval(...)``) is one list without its swept keys, which only the sweeper fills
    in. Without ``multirun`` the command line is the one job.

    Raises:
        ConfigError: an override does not parse.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    task = task_lines(overrides)
    parsed = Overrides.parse(task)
    if not multirun or not parsed.is_sweep():
        return [task]
    if parsed.is_grid():
        return [job for batch in BasicSweeper.split_arguments(list(parsed), None) for job in batch]
    return [parsed.fixed()]


def primary_choices(overrides: list[str]) -> list[str]:
    """``overrides`` with each swept config group's first choice set once just before its sweep line
    (``algo=grpo,rloo`` -> ``algo=grpo algo=grpo,rloo``).

    Hydra composes a sweep's primary config (its launcher, its sweep directory) without the sweep lines, so a swept
    group falls back to train.yaml's default (``algo: ppo``), where keys of the swept choices (``algo.beta=0.1``) or a
    preset that sets them do not exist and the whole sweep fails. With the first choice set, the primary config is
    that of the sweep's first job; each job still gets its own choice, as Hydra's sweepers take the last line per key.
    """
    from hydra.core.override_parser.types import ValueType

    groups = {path.name for path in Path(CONF_DIR).iterdir() if path.is_dir()} - {"hydra"}
    out: list[str] = []
    for override in Overrides.parse(overrides):
        line = override.input_line or ""
        if (
            override.key_or_group in groups
            and override.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP)
            and not override.is_add()
            and not override.is_delete()
        ):
            first = next(iter(override.sweep_string_iterator()), None)
            if first is not None:
                out.append(f"{override.key_or_group}={first}")
        out.append(line)
    return out


def primary_overrides(overrides: list[str]) -> list[str]:
    """What a sweep's primary config is composed from: its fixed overrides and each swept group's first choice
    (:func:`primary_choices`); for a single run, its overrides."""
    return Overrides.parse(primary_choices(overrides)).fixed()


def fixed_overrides(overrides: list[str]) -> list[str]:
    """``overrides`` without the sweep ones (``seed=0,1``, ``interval(...)``): what every job of a sweep shares.

    Raises:
        ConfigError: an override does not parse.
    """
    return Overrides.parse(overrides).fixed()


def compose_train_config(overrides: list[str]) -> TrainConfig:
    """The :class:`~pgcli.config.TrainConfig` for ``overrides``, every rule of its values checked (raises a one-line
    ConfigError). A run takes its config from :func:`pgcli.training.checks.train_config`, which also checks the world.
    """
    return to_train_config(compose_dictconfig(overrides))


def text_task_overrides(overrides: list[str]) -> list[str]:
    """The group choices a text task or an image env implies when the command line leaves them out (docs/lm.md,
    docs/pixels.md).

    ``env=addition`` (a text task) without ``model=`` adds ``model=tiny_gpt`` (the MLP default cannot read text), and
    without ``algo=`` adds ``algo=grpo`` (PPO is SB3's, for gymnasium envs); so does a sweep over text tasks only
    (``env=addition,sort``). ``env=pong`` (an image env) without ``model=`` adds ``model=cnn``; so does a sweep over
    image envs only.
    """
    values = {}  # a plain choice only (+model=... appends to the config; Hydra refuses it for a chosen group)
    for line in overrides:
        prefix, key, value = split_override(line)
        if "=" in line and not prefix:
            values[key] = value.strip()
    envs = [env.strip() for env in values.get("env", "").split(",")]
    if all(env in IMAGE_ENVS for env in envs):
        return [] if "model" in values else ["model=cnn"]
    if not all(env in TEXT_ENV_CONFIGS for env in envs):
        return []
    return [f"{group}={option}" for group, option in (("model", "tiny_gpt"), ("algo", "grpo")) if group not in values]


def compose_dictconfig(overrides: list[str]) -> DictConfig:
    """The composed (not yet validated) DictConfig for ``overrides``, with the group choices a text task implies; a
    composition error is a one-line ConfigError."""
    reject_unknown_preset(overrides)
    return hydra_compose([*overrides, *text_task_overrides(overrides)])


def reject_unknown_preset(overrides: list[str]) -> None:
    """Raise a ConfigError for ``preset=<name>`` naming no conf/preset file.

    The preset group is optional in the defaults list (pairs without a preset compose without one), so Hydra skips a
    misspelt choice such as ``preset=ppo_hopper_zo`` silently and the run would train without any preset.
    """
    available = sorted(p.stem for p in (Path(CONF_DIR) / "preset").glob("*.yaml"))
    for override in overrides:
        prefix, key, value = split_override(override)
        if key == "preset" and "~" not in prefix and value not in ("", "null") and value not in available:
            close = difflib.get_close_matches(value, available, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see conf/preset/"
            raise ConfigError(f"unknown preset option '{value}' ({hint}); presets are named <algo>_<env>[_<variant>]")


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """DictConfig -> TrainConfig dataclasses, running every ``__post_init__`` rule once."""
    from omegaconf import OmegaConf

    try:
        run_cfg = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(describe_config_error(exc)) from None
    if not isinstance(run_cfg, TrainConfig):
        raise ConfigError(f"the config is not a train config (got {type(run_cfg).__name__})")
    reject_unknown_keys(run_cfg)
    return run_cfg


def reject_unknown_keys(obj: Any, prefix: str = "") -> None:
    """Raise a ConfigError for a key a schema does not define.

    ``+algo.clip_rnge=0.1`` (Hydra's append syntax) gets past composition, and ``OmegaConf.to_object`` sets such keys
    as extra attributes of the dataclass, so a typo would silently do nothing; only ``env.kwargs`` (a dict) is open.
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    names = [f.name for f in dataclasses.fields(obj)]
    for key in vars(obj):
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown key '{prefix}{key}' ({type(obj).__name__} has no field '{key}'){hint}")
    for name in names:
        reject_unknown_keys(getattr(obj, name), f"{prefix}{name}.")


def describe_config_error(exc: BaseException) -> str:
    """One line naming what is wrong, from a Hydra / OmegaConf composition error."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, ValidationError

    cause = exc.__cause__ or exc
    # a key set by a config file (a preset for another algorithm), not on the command line: name the file (Hydra
    # raises that error while handling OmegaConf's, which is its context, not its cause)
    source = str(exc).split("'", 2)[1] if str(exc).startswith("In '") else ""
    by = f", set by {source}" if source else ""
    if source and exc.__cause__ is None and exc.__context__ is not None:
        cause = exc.__context__
    if isinstance(exc, MissingConfigException) or isinstance(cause, MissingConfigException):
        text = str(exc)
        missing = text.split("Could not find '", 1)[-1].split("'", 1)[0] if "Could not find '" in text else ""
        group, _, option = missing.rpartition("/")
        options = [line.strip() for line in text.split("Available options in", 1)[-1].splitlines()[1:]]
        options = [o for o in options if o and not o.startswith(("Config search path", "provider="))]
        if group and options:
            return f"unknown {group} option '{option}' (available: {', '.join(options)})"
        return text.splitlines()[0]
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        key = getattr(cause, "full_key", "") or ""
        obj = getattr(cause, "object_type", None)
        valid = [f.name for f in dataclasses.fields(obj)] if obj and dataclasses.is_dataclass(obj) else []
        leaf = key.rpartition(".")[2]
        close = difflib.get_close_matches(leaf, valid, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if not close and valid:
            hint = f"; valid keys: {', '.join(valid)}"
        if obj is dict:  # an open mapping such as env.kwargs: new keys need Hydra's append syntax
            return f"unknown key '{key}'; to add a new key use '+{key}=...'"
        owner = obj.__name__ if obj else "the config"
        return f"unknown key '{key}' ({owner} has no field '{leaf}'){by}{hint}"
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", "") or ""
        msg = str(getattr(cause, "msg", cause)).splitlines()[0]
        return f"{key}: {msg}" if key else msg
    if isinstance(cause, MissingMandatoryValue):  # a ??? value the option leaves to the command line
        key = getattr(cause, "full_key", "") or str(cause).rpartition(": ")[2]
        return f"{key} is required: set {key}=..."
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
