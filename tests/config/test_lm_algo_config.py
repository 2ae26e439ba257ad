"""algo=rloo / reinforce / gspo / reinforce_pp / ppo_lm (docs/algorithms/lm.md): YAML defaults equal the schemas, text
envs only, one-line errors; GRPO's text-only options are refused on a control task."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pgcli.config import (
    CountdownToolEnvConfig,
    FlowGRPOConfig,
    GRPOConfig,
    GSPOConfig,
    PPOLMConfig,
    REINFORCEConfig,
    ReinforcePPConfig,
    RLOOConfig,
)
from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.errors import ConfigError

SCHEMAS = {
    "rloo": RLOOConfig,
    "reinforce": REINFORCEConfig,
    "gspo": GSPOConfig,
    "reinforce_pp": ReinforcePPConfig,
    "ppo_lm": PPOLMConfig,
    "flow_grpo": FlowGRPOConfig,
}


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
    for env in ("countdown_tool",) if algo == "flow_grpo" else ("addition", "sort", "countdown"):
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
        (REINFORCEConfig, {"kl_estimator": "k4"}, "algo.kl_estimator must be one of k1, k2, k3"),
        (GSPOConfig, {"scale_rewards": "std"}, "algo.scale_rewards must be one of group, batch, none"),
        (GSPOConfig, {"group_size": 1}, "algo.group_size must be >= 2"),
        (ReinforcePPConfig, {"baseline": "mean"}, "algo.baseline must be one of none, group"),
        (
            ReinforcePPConfig,
            {"baseline": "group", "group_size": 1, "batch_size": 8},
            "algo.group_size must be >= 2 with",
        ),
        (ReinforcePPConfig, {"gamma": 0.0}, "algo.gamma must be in (0, 1]"),
        (GRPOConfig, {"kl_estimator": "k0"}, "algo.kl_estimator must be one of k1, k2, k3"),
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


def test_gspo_clips_its_sequence_ratio_with_the_papers_small_range():
    gspo = compose_train_config(["algo=gspo", "env=addition"]).algo
    assert (gspo.epsilon, gspo.epsilon_high, gspo.loss_agg) == (3e-4, 4e-4, "seq_mean")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.kl_estimator=k1", "algo.kl_estimator must be k3 on a control task (got 'k1'); k1 and k2 are for text"),
        ("algo.mask_truncated_completions=true", "algo.mask_truncated_completions must be false on a control task"),
    ],
)
def test_grpo_text_only_options_are_one_line_errors_on_a_control_task(override: str, message: str):
    with pytest.raises(ConfigError) as err:
        compose_train_config(["algo=grpo", "env=cartpole", override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    text = compose_train_config(["algo=grpo", "env=addition", override]).algo
    assert (text.kl_estimator, text.mask_truncated_completions) != ("k3", False)


def test_the_countdown_tool_yaml_documents_every_default_of_its_schema():
    path = Path(CONF_DIR) / "env" / "countdown_tool.yaml"
    assert all(f"\n{f.name}:" in path.read_text() for f in dataclasses.fields(CountdownToolEnvConfig))
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(values, dict)
    values.pop("defaults")
    assert CountdownToolEnvConfig(**values) == CountdownToolEnvConfig()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo=flow_grpo", "env=addition"],
            "algo=flow_grpo trains on multi-turn tasks (env=countdown_tool); "
            "env=addition is single-turn: use algo=grpo",
        ),
        (
            ["algo=rloo", "env=countdown_tool"],
            "env=countdown_tool is a multi-turn task: it trains with algo=grpo, sft, flow_grpo (got algo=rloo)",
        ),
        (
            ["algo=grpo", "env=countdown_tool", "algo.loss_agg=seq_mean"],
            "algo.loss_agg must be token_mean or "
            "constant with algo=grpo on a multi-turn task (got 'seq_mean'); a trajectory's turns are separate samples, "
            "so a per-sequence mean would weigh turns, not trajectories; algo=flow_grpo weighs turns",
        ),
        (
            ["algo=flow_grpo", "env=countdown_tool", "env.max_turns=1"],
            "env.max_turns must be in [n_numbers - 1 = 2, 32] (got 1); each turn is one operation",
        ),
        (
            ["algo=flow_grpo", "env=countdown_tool", "env.reward=rm:abc"],
            "env.reward must be {} on a multi-turn task (got 'rm:abc'); its reward is the final verdict: solved or not",
        ),
    ],
)
def test_multi_turn_rules_are_one_line_errors(overrides: list[str], message: str):
    with pytest.raises(ConfigError) as err:
        compose_train_config(overrides)
    assert str(err.value) == message


def test_the_clipped_schemas_share_one_base_and_keep_their_field_order():
    from pgcli.config.lm_algos import SHARED_OPTIONS, ClippedPolicyOptions

    for schema in (GRPOConfig, *SCHEMAS.values(), FlowGRPOConfig):
        assert issubclass(schema, ClippedPolicyOptions) and dataclasses.is_dataclass(schema)
        names = [f.name for f in dataclasses.fields(schema)]
        assert [n for n in names if n in SHARED_OPTIONS] == list(SHARED_OPTIONS), schema.__name__
    # the order users see in --help and docs/configuration.md: a schema's own fields among the shared ones
    assert [f.name for f in dataclasses.fields(GSPOConfig)][:4] == [
        "group_size",
        "n_groups",
        "scale_rewards",
        "drop_degenerate_groups",
    ]
    assert [f.name for f in dataclasses.fields(REINFORCEConfig)][-4:] == [
        "beta",
        "kl_estimator",
        "ent_coef",
        "mask_truncated_completions",
    ]
    assert RLOOConfig().learning_rate == 3e-5 and GRPOConfig().learning_rate == 3e-4  # a schema's own default wins


def test_a_clipped_schema_placed_after_no_field_of_its_own_is_refused():
    from pgcli.config.lm_algos import ClippedPolicyOptions, clipped_schema

    with pytest.raises(TypeError, match="names no field of its own"):

        @clipped_schema(typo="beta")
        class Bad(ClippedPolicyOptions):
            own: int = 1


def test_grpo_on_rows_takes_the_text_defaults_of_grpo_addition():
    # env=dataset from an SFT model: the control defaults (lr 3e-4, 4 epochs of 8, no KL) wreck it within updates
    rows = Path(__file__).parent.parent / "data" / "sums.jsonl"
    on_rows = compose_train_config(["algo=grpo", "env=dataset", f"env.path={rows}"]).algo
    assert on_rows == compose_train_config(["algo=grpo", "env=addition"]).algo
    assert on_rows != compose_train_config(["algo=grpo", "env=dataset", f"env.path={rows}", "~preset"]).algo
