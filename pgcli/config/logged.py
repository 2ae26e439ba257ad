"""A logged config typed again: :func:`train_config_from_dict` is the one way a config that a run logged (its
``.hydra/config.yaml``, or the ``config`` of a saved agent's ``agent.json``) becomes a
:class:`~pgcli.config.TrainConfig`, with every schema rule run again. Finding the run that logged it is
:mod:`pgcli.training.logged`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgcli.config import ALGOS, TEXT_ENV_CONFIGS, EnvConfig, HFModelConfig, LMModelConfig, ModelConfig, TrainConfig
from pgcli.config.pixels import CNNModelConfig
from pgcli.config.renames import renamed_section
from pgcli.errors import ConfigError


def _logged_model_schema(model: Any, *, text: bool) -> type:
    """The model schema a logged ``model`` section was written from: its keys tell the options apart (``path``:
    model=hf; ``arch``: model=cnn; otherwise TinyGPT on a text task, the MLP on a gymnasium env)."""
    keys = set(model) if isinstance(model, Mapping) else set()
    if text:
        return HFModelConfig if "path" in keys else LMModelConfig
    return CNNModelConfig if "arch" in keys else ModelConfig


def train_config_from_dict(
    values: Mapping[str, Any], algo_name: str, changes: Sequence[str] = (), *, context: str = ""
) -> TrainConfig:
    """A validated :class:`TrainConfig` from a logged config (``asdict`` or ``.hydra/config.yaml``) and its algo.

    The algo option picks the schema of ``algo`` (every algo section is a plain mapping once logged; a key logged
    under an old name is read under its new one, :mod:`pgcli.config.renames`), the env id that of ``env`` and
    ``model``; the logged values then pin every field, even if ``conf/`` changed since. Each of
    ``changes`` (``key=value``, a key the schema has) is set on top, its value converted to the field's type; every
    rule in the schemas' ``__post_init__`` runs again. Errors from ``changes`` are prefixed with ``context``.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from pgcli.config.compose import describe_config_error
    from pgcli.config.overrides import split_override

    if algo_name not in ALGOS:
        raise ConfigError(f"logged algo {algo_name!r} is not an algo option ({', '.join(ALGOS)})")
    if "algo" in values:  # logged before an algo key was renamed: read under its new name
        values = {**values, "algo": renamed_section(algo_name, values["algo"])}
    schema = OmegaConf.structured(TrainConfig)
    schema.algo = OmegaConf.structured(ALGOS[algo_name].schema)
    env_id = values.get("env", {}).get("id") if isinstance(values.get("env"), Mapping) else None
    text_env = TEXT_ENV_CONFIGS.get(str(env_id))  # a text task is logged under its own name (env.id=addition)
    schema.env = OmegaConf.structured(text_env or EnvConfig)
    schema.model = OmegaConf.structured(_logged_model_schema(values.get("model"), text=text_env is not None))
    try:
        merged = OmegaConf.merge(schema, values)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"the logged config does not fit this pgcli's schema: {str(exc).splitlines()[0]}") from None
    for change in changes:
        _, key, value = split_override(change)
        try:
            OmegaConf.update(merged, key, value, force_add=False)  # typed fields convert '20000', 'false'
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{context}{describe_config_error(exc)}") from None
    try:
        run_cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"the logged config does not fit this pgcli's schema: {str(exc).splitlines()[0]}") from None
    assert isinstance(run_cfg, TrainConfig)
    return run_cfg
