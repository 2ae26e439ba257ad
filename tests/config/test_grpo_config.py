"""algo=grpo composes to GRPOConfig; its YAML, presets and error messages say what the schema says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pgcli.config import TEXT_ENV_CONFIGS, GRPOConfig
from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.errors import ConfigError

GRPO_PRESETS = sorted(
    env
    for env in (p.stem.removeprefix("grpo_") for p in (Path(CONF_DIR) / "preset").glob("grpo_*.yaml"))
    if env.split("_")[0] not in TEXT_ENV_CONFIGS  # grpo_addition*: tests/config/test_lm_algo_config.py
)


def test_the_yaml_defaults_are_the_schema_defaults():
    # conf/algo/grpo.yaml documents every default; it must not drift from pgcli.config.GRPOConfig
    cfg = compose_train_config(["algo=grpo", "~preset"]).algo
    assert cfg == GRPOConfig()
    yaml = (Path(CONF_DIR) / "algo" / "grpo.yaml").read_text()
    assert all(f"\n{f.name}:" in yaml for f in dataclasses.fields(GRPOConfig))


def test_presets_exist_for_the_benchmark_envs():
    assert {"cartpole", "acrobot", "pendulum", "hopper", "halfcheetah"} <= set(GRPO_PRESETS)


@pytest.mark.parametrize("env", GRPO_PRESETS)
def test_each_preset_fills_whole_waves_of_members(env: str):
    # every sub-env plays a member from the first step: n_envs divides the M * G members of a batch
    cfg = compose_train_config(["algo=grpo", f"env={env}"])
    assert isinstance(cfg.algo, GRPOConfig)
    assert (cfg.algo.group_size * cfg.algo.n_groups) % cfg.env.n_envs == 0
    assert not cfg.env.normalize_reward  # the group normalisation is the reward scale


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.group_size=1", "algo.group_size must be >= 2 (got 1)"),
        ("algo.batch_size=33", "algo.batch_size must be in [1, group_size * n_groups = 32] (got 33)"),
        ("algo.advantage=gae", "algo.advantage must be one of outcome, process, step_baseline (got 'gae')"),
        ("algo.scale_rewards=std", "algo.scale_rewards must be one of group, batch, none (got 'std')"),
        ("algo.loss_agg=sum", "algo.loss_agg must be one of seq_mean, token_mean, constant (got 'sum')"),
        ("algo.epsilon_high=0", "algo.epsilon_high must be > 0 (got 0"),
        ("algo.beta=-0.1", "algo.beta must be >= 0 (got -0.1)"),
    ],
)
def test_bad_values_give_one_line_errors(override: str, message: str):
    with pytest.raises(ConfigError) as info:
        compose_train_config(["algo=grpo", "~preset", override])
    assert message in str(info.value) and "\n" not in str(info.value)
