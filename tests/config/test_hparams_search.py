"""conf/hparams_search/: every preset composes, validates, and configures an Optuna search that maximises the
final return over fixed seeds in a resumable SQLite study."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pgcli.compose import CONF_DIR, compose_train_config, validate_overrides
from pgcli.config import PPOConfig, TRPOConfig, register_configs

PRESETS = {"ppo_pendulum": (PPOConfig, "Pendulum-v1"), "trpo_cartpole": (TRPOConfig, "CartPole-v1")}


def test_every_preset_file_is_covered() -> None:
    assert {p.stem for p in (Path(CONF_DIR) / "hparams_search").glob("*.yaml")} == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_composes_into_an_optuna_search(name: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"hparams_search={name}"], return_hydra_config=True)
    algo_type, env_id = PRESETS[name]
    run_cfg = compose_train_config([f"hparams_search={name}"])
    assert isinstance(run_cfg.algo, algo_type) and run_cfg.env.id == env_id
    assert run_cfg.n_seeds >= 2 and run_cfg.seed == 0  # the objective averages fixed seeds
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.storage == "sqlite:///outputs/optuna.db" and sweeper.study_name == name
    assert "seed" not in sweeper.params and all(k.startswith("algo.") for k in sweeper.params)
    validate_overrides([f"hparams_search={name}"], multirun=True)  # what `pgcli train -m` checks first
