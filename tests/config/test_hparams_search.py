"""conf/hparams_search/: every preset composes, validates, and configures pgcli's Optuna sweeper to maximise the
final return over fixed seeds in a resumable SQLite study, pruning on the periodic evaluations."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcli.config import PPOConfig, TRPOConfig
from pgcli.config.compose import CONF_DIR, compose_train_config, hydra_compose
from pgcli.errors import ConfigError
from pgcli.sweeps.study import SWEEPER_TARGET, SearchSpace, check_search, search_config
from pgcli.training.checks import validate_overrides

PRESETS = {"ppo_pendulum": (PPOConfig, "Pendulum-v1"), "trpo_cartpole": (TRPOConfig, "CartPole-v1")}


def test_every_preset_file_is_covered() -> None:
    assert {p.stem for p in (Path(CONF_DIR) / "hparams_search").glob("*.yaml")} == set(PRESETS)


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # check_search reads the study in outputs/optuna.db when it exists: not this checkout's own
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_composes_into_an_optuna_search(name: str) -> None:
    cfg = hydra_compose([f"hparams_search={name}"], hydra_node=True)
    algo_type, env_id = PRESETS[name]
    run_cfg = compose_train_config([f"hparams_search={name}"])
    assert isinstance(run_cfg.algo, algo_type) and run_cfg.env.id == env_id
    assert run_cfg.n_seeds >= 2 and run_cfg.seed == 0  # the objective averages fixed seeds
    sweeper = search_config(cfg.hydra.sweeper)  # pgcli's sweeper, its settings validated
    assert sweeper._target_ == SWEEPER_TARGET and sweeper.direction == "maximize"
    assert sweeper.storage == "sqlite:///outputs/optuna.db" and sweeper.study_name == name
    assert "seed" not in sweeper.params and all(k.startswith("algo.") for k in sweeper.params)
    assert sweeper.pruner == "median" and run_cfg.eval.every > 0  # pruning on the periodic evaluations
    space = SearchSpace.parse(sweeper.params, [])  # the presets' Hydra sweep syntax maps onto Optuna
    assert len(space.distributions) == len(sweeper.params)
    validate_overrides([f"hparams_search={name}"], multirun=True)  # what `pgcli train -m` checks first
    check_search([f"hparams_search={name}"])


def test_a_pruned_search_without_periodic_evaluations_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"pruner=median prunes on the periodic evaluations, but eval.every=0"):
        check_search(["hparams_search=ppo_pendulum", "eval.every=0"])
    check_search(["hparams_search=ppo_pendulum", "eval.every=0", "hydra.sweeper.pruner=none"])


def test_a_typo_in_the_search_space_is_caught_before_the_search() -> None:
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        check_search(["hparams_search=ppo_pendulum", "algo.learning_rte=choice(0.1,0.2)"])  # a command-line dimension
