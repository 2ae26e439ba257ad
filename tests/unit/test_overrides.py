"""``pgcli.config.overrides``: a command line's overrides parsed once with Hydra's parser, asked by key."""

from __future__ import annotations

import pytest

from pgcli.config.overrides import Overrides, is_hydra_override, override_key, split_override, task_lines
from pgcli.errors import ConfigError


def test_keys_come_without_hydras_prefixes():
    parsed = Overrides.parse(["+algo.x=1", "++env.kwargs.a=2", "~preset", "~model.d_ff=64", "seed=3"])
    assert parsed.keys() == {"algo.x", "env.kwargs.a", "preset", "model.d_ff", "seed"}
    assert parsed.has("preset") and parsed.has("env.kwargs.a") and not parsed.has("algo")
    assert [override_key(line) for line in parsed.lines] == ["algo.x", "env.kwargs.a", "preset", "model.d_ff", "seed"]
    assert split_override("++env.kwargs.a=2") == ("++", "env.kwargs.a", "2")
    assert split_override("~preset") == ("~", "preset", "")
    assert split_override("+~x=1") == ("+~", "x", "1")


def test_group_choices_and_values():
    parsed = Overrides.parse(["algo=ppo", "env=cartpole", "algo.gamma=0.9", "hydra/sweeper=optuna", "env=acrobot"])
    assert parsed.group_choices() == {"algo": "algo=ppo", "env": "env=acrobot", "hydra/sweeper": "hydra/sweeper=optuna"}
    assert parsed.value_of("env") == "acrobot" and parsed.value_of("algo.gamma") == "0.9"
    assert parsed.value_of("seed") is None


def test_sweeps_are_told_apart_from_fixed_values():
    parsed = Overrides.parse(["seed=0,1", "algo.n_steps=range(64,256,64)", "env=cartpole", "algo.gamma=interval(0,1)"])
    assert parsed.swept_keys() == {"seed", "algo.n_steps", "algo.gamma"} and parsed.is_sweep()
    assert parsed.fixed() == ["env=cartpole"]
    assert parsed.is_fixed("env") and not parsed.is_fixed("seed") and parsed.value_of("seed") is None
    assert not parsed.is_grid()  # interval(...) is Optuna's, not the basic sweeper's
    assert Overrides.parse(["seed=0,1", "algo.n_steps=range(64,256,64)"]).is_grid()
    assert not Overrides.parse(["seed=1"]).is_sweep()


def test_quoted_values_are_one_value():
    parsed = Overrides.parse(["experiment='a,b'", 'tracking.uri="sqlite:///x y.db"'])
    assert not parsed.is_sweep() and parsed.fixed() == parsed.lines
    assert parsed.value_of("experiment") == "'a,b'"  # as typed: the line goes back to Hydra unchanged


def test_hydra_overrides_are_kept_apart():
    lines = ["hydra.run.dir=out", "hydra/launcher=joblib", "++hydra.sweeper.n_trials=3", "algo=ppo", "seed=0,1"]
    parsed = Overrides.parse(lines)
    assert parsed.hydra() == ["hydra.run.dir=out", "hydra/launcher=joblib", "++hydra.sweeper.n_trials=3"]
    assert parsed.task().lines == ["algo=ppo", "seed=0,1"] == task_lines(lines)
    assert is_hydra_override("~hydra.run.dir") and not is_hydra_override("algo=ppo")


def test_an_override_that_does_not_parse_is_one_line():
    with pytest.raises(ConfigError, match=r"^cannot parse override: no viable alternative at input '\['$"):
        Overrides.parse(["algo.gamma=["])
    with pytest.raises(ConfigError, match=r"^cannot parse the search space: "):
        Overrides.parse(["algo.gamma=["], what="the search space")
