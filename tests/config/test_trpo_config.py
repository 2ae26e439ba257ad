"""algo=trpo / vpg / ppo_kl / sb3_trpo: YAML defaults equal the schemas, zoo presets apply, bad values are one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pgcli.config import PPOKLConfig, SB3TRPOConfig, TRPOConfig, VPGConfig
from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.config.renames import renamed_overrides
from pgcli.errors import ConfigError

SCHEMAS = {"trpo": TRPOConfig, "vpg": VPGConfig, "ppo_kl": PPOKLConfig, "sb3_trpo": SB3TRPOConfig}
ZOO_ENVS = ("cartpole", "pendulum", "hopper", "halfcheetah", "walker2d")
DEPARTURES = {"hopper": {"algo.gamma": 0.995}, "halfcheetah": {"algo.n_steps": 512, "model.log_std_init": -0.5}}
"""Where our TRPO presets leave the zoo's values on measured evidence (docs/benchmarks/trpo.md,
"Ablations: the shipped presets");
sb3-contrib's presets keep the zoo's."""
ZOO = {"algo.gamma": 0.99, "algo.n_steps": 1024, "model.log_std_init": 0.0}
"""The zoo's values of the departed keys (for these envs)."""
SHARED_WITH_SB3_CONTRIB = {
    "n_steps",
    "gamma",
    "gae_lambda",
    "normalize_advantage",
    "target_kl",
    "cg_damping",
    "cg_max_steps",
    "line_search_shrinking_factor",
    "line_search_max_iter",
    "n_critic_updates",
    "batch_size",
    "learning_rate",
}
"""TRPO's keys that mean what sb3-contrib's TRPO means by them, under its names. ``fvp_sub_sampling`` is not one:
sb3-contrib's ``sub_sampling_factor`` sub-samples the whole policy step, ours only the Fisher-vector products."""


@pytest.mark.parametrize("algo", SCHEMAS)
def test_the_yaml_documents_every_default_of_the_schema(algo: str):
    assert compose_train_config([f"algo={algo}", "~preset"]).algo == SCHEMAS[algo]()
    yaml = (Path(CONF_DIR) / "algo" / f"{algo}.yaml").read_text()
    assert all(f"\n{f.name}:" in yaml for f in dataclasses.fields(SCHEMAS[algo]))


@pytest.mark.parametrize("env", ZOO_ENVS)
def test_ours_and_sb3_contrib_get_the_same_zoo_values(env: str):
    departures = DEPARTURES.get(env, {})
    ours = compose_train_config(["algo=trpo", f"env={env}"])
    for key, value in departures.items():
        section, name = key.split(".")
        assert getattr(getattr(ours, section), name) == value, key
    ours = compose_train_config(["algo=trpo", f"env={env}", *(f"{key}={ZOO[key]}" for key in departures)])
    ref = compose_train_config(["algo=sb3_trpo", f"env={env}"])
    for key in SHARED_WITH_SB3_CONTRIB:
        assert getattr(ours.algo, key) == getattr(ref.algo, key), key
    assert ours.algo.fvp_sub_sampling == ref.algo.sub_sampling_factor == 1  # 1: the same (no sub-sampling)
    assert ours.env == ref.env and ours.total_steps == ref.total_steps and ours.model == ref.model


def test_ours_has_sb3_contribs_names_for_what_both_have():
    ours = {f.name for f in dataclasses.fields(TRPOConfig)}
    theirs = {f.name for f in dataclasses.fields(SB3TRPOConfig)}
    assert ours & theirs == SHARED_WITH_SB3_CONTRIB
    assert set(TRPOConfig.renamed.values()) <= ours and not set(TRPOConfig.renamed) & ours


def test_zoo_values_land_where_the_zoo_puts_them():
    cartpole = compose_train_config(["algo=trpo", "env=cartpole"])
    assert (cartpole.algo.n_steps, cartpole.algo.batch_size, cartpole.algo.cg_damping) == (512, 512, 1e-3)
    assert (cartpole.env.n_envs, cartpole.total_steps) == (2, 100_000)
    hopper = compose_train_config(["algo=trpo", "env=hopper"])
    assert (hopper.algo.cg_max_steps, hopper.algo.n_critic_updates, hopper.algo.n_steps) == (25, 20, 1024)
    assert hopper.env.normalize_obs and hopper.env.normalize_reward and hopper.total_steps == 1_000_000
    assert compose_train_config(["algo=trpo", "env=halfcheetah"]).algo.target_kl == 0.04
    pendulum_ref = compose_train_config(["algo=sb3_trpo", "env=pendulum"]).algo
    assert pendulum_ref.use_sde and pendulum_ref.sde_sample_freq == 4  # ours has no gSDE; sb3-contrib keeps it


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=trpo", "algo.target_kl=0"], "algo.target_kl must be > 0 (got 0.0)"),
        (
            ["algo=trpo", "algo.line_search_shrinking_factor=1.0"],
            "algo.line_search_shrinking_factor must be in (0, 1) (got 1.0)",
        ),
        (["algo=trpo", "algo.line_search_max_iter=0"], "algo.line_search_max_iter must be >= 1 (got 0)"),
        (["algo=trpo", "algo.cg_max_steps=0"], "algo.cg_max_steps must be >= 1 (got 0)"),
        (["algo=trpo", "algo.learning_rate=0"], "algo.learning_rate must be > 0"),
        (["algo=trpo", "algo.fvp_sub_sampling=0"], "algo.fvp_sub_sampling must be >= 1 (got 0)"),
        (
            ["algo=trpo", "algo.target_kl_schedule=cosine"],
            "algo.target_kl_schedule must be one of constant, linear (got 'cosine')",
        ),
        (["algo=trpo", "algo.target_kl_final=0"], "algo.target_kl_final must be > 0 (got 0.0)"),
        (["algo=trpo", "algo.lr_schedule=exp"], "algo.lr_schedule must be one of constant, linear (got 'exp')"),
        (["algo=vpg", "algo.gae_lambda=1.5"], "algo.gae_lambda must be in [0, 1] (got 1.5)"),
        (["algo=ppo_kl", "algo.kl_target=-1"], "algo.kl_target must be > 0 (got -1.0)"),
    ],
)
def test_bad_values_are_one_line_errors(overrides: list[str], message: str):
    with pytest.raises(ConfigError) as info:
        compose_train_config(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_old_trpo_key_is_renamed_under_the_algo_the_command_line_chooses():
    # an hparams_search file that picks algo=trpo, and a sweep over both TRPOs (the new name is sb3_trpo's key too)
    assert renamed_overrides(["hparams_search=trpo_cartpole", "algo.cg_iters=5"])[1] == "algo.cg_max_steps=5"
    assert renamed_overrides(["algo=trpo,sb3_trpo", "algo.cg_iters=5"])[1] == "algo.cg_max_steps=5"
    assert renamed_overrides(["algo.cg_iters=5"], ["trpo"]) == ["algo.cg_max_steps=5"]
