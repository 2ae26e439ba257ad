"""algo=rloo / reinforce / ppo_lm (docs/algorithms/lm.md): YAML defaults equal the schemas, text envs only, one-line
errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pgcli.config import GRPOConfig, PPOLMConfig, REINFORCEConfig, RLOOConfig
from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.errors import ConfigError

SCHEMAS = {"rloo": RLOOConfig, "reinforce": REINFORCEConfig, "ppo_lm": PPOLMConfig}


@pytest.mark.parametrize("algo", SCHEMAS)
def test_the_yaml_documents_every_default_of_the_schema(algo: str):
    yaml = (Path(CONF_DIR) / "algo" / f"{algo}.yaml").read_text()
    assert all(f"\n{f.name}:" in yaml for f in dataclasses.fields(SCHEMAS[algo]))
    values = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "algo" / f"{algo}.yaml"))
    assert isinstance(values, dict)
    values.pop("defaults")
    assert SCHEMAS[algo](**values) == SCHEMAS[algo]()


@pytest.mark.parametrize("algo", SCHEMAS)
def test_a_gymnasium_env_is_refused_in_one_line(algo: str):
    with pytest.raises(ConfigError, match=f"algo={algo} trains on text tasks only") as err:
        compose_train_config([f"algo={algo}", "env=cartpole"])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("algo", SCHEMAS)
def test_composes_on_every_text_env_with_the_schema_defaults(algo: str):
    for env in ("addition", "sort", "countdown"):
        cfg = compose_train_config([f"algo={algo}", f"env={env}", "~preset"])
        assert cfg.algo == SCHEMAS[algo]()


@pytest.mark.parametrize(
    ("schema", "kwargs", "message"),
    [
        (RLOOConfig, {"group_size": 1}, "algo.group_size must be >= 2"),
        (REINFORCEConfig, {"batch_size": 200}, "algo.batch_size must be in [1, group_size * n_groups = 128]"),
        (PPOLMConfig, {"gae_lambda": 1.5}, "algo.gae_lambda must be in [0, 1]"),
        (PPOLMConfig, {"clip_range_vf": -0.1}, "algo.clip_range_vf must be > 0"),
        (RLOOConfig, {"loss_agg": "sum"}, "algo.loss_agg must be one of seq_mean, token_mean, constant"),
        (REINFORCEConfig, {"beta": float("nan")}, "algo.beta must be a finite number"),
    ],
)
def test_bad_values_are_one_line_errors(schema: type, kwargs: dict, message: str):
    with pytest.raises(ConfigError) as err:
        schema(**kwargs)
    assert str(err.value).startswith(message)


def test_grpo_on_a_text_env_takes_outcome_advantages_only():
    GRPOConfig().check_text_env()
    with pytest.raises(ConfigError, match=r"algo\.advantage=process needs per-step rewards"):
        GRPOConfig(advantage="process").check_text_env()


def test_the_grpo_presets_of_addition_set_grpo_and_dr_grpo():
    grpo = compose_train_config(["algo=grpo", "env=addition"]).algo
    dr = compose_train_config(["algo=grpo", "env=addition", "preset=grpo_addition_dr"]).algo
    assert (grpo.scale_rewards, grpo.loss_agg) == ("group", "seq_mean")
    assert (dr.scale_rewards, dr.loss_agg) == ("none", "constant")
    assert grpo.learning_rate == dr.learning_rate == 3e-5 and grpo.group_size * grpo.n_groups == 128
