"""`pgcli train`'s command line before Hydra sees it: flags first, wherever they were typed
(pgcli.commands.train.hydra_argv)."""

from __future__ import annotations

import pytest

from pgcli.commands.train import hydra_argv
from pgcli.errors import ConfigError


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["algo=ppo", "seed=1"], ["algo=ppo", "seed=1"]),
        (["algo=ppo", "-m", "seed=0,1"], ["-m", "algo=ppo", "seed=0,1"]),
        (["seed=0,1", "--multirun", "env=hopper"], ["--multirun", "seed=0,1", "env=hopper"]),
        (["algo=trpo", "--cfg", "job", "seed=2"], ["--cfg", "job", "algo=trpo", "seed=2"]),
        (["algo=trpo", "--cfg=hydra"], ["--cfg", "hydra", "algo=trpo"]),
        (["algo=trpo", "-c", "all", "--resolve"], ["-c", "all", "--resolve", "algo=trpo"]),
        (["algo=trpo", "--info"], ["--info", "all", "algo=trpo"]),  # Hydra's default, never an override as value
        (["algo=trpo", "-i", "defaults", "env=hopper"], ["--info", "defaults", "algo=trpo", "env=hopper"]),
        (["algo=trpo", "--info=plugins"], ["--info", "plugins", "algo=trpo"]),
        (["+from_run=source", "~preset", "-m", "seed=1,2"], ["-m", "+from_run=source", "~preset", "seed=1,2"]),
        (["model.log_std_init=-0.5", "-m", "seed=0,1"], ["-m", "model.log_std_init=-0.5", "seed=0,1"]),
        (["-cd", "conf", "-cn", "train", "x=1"], ["-cd", "conf", "-cn", "train", "x=1"]),
    ],
)
def test_flags_go_first_and_overrides_keep_their_order(args: list[str], expected: list[str]):
    assert hydra_argv(args) == expected
    assert hydra_argv(expected) == expected  # idempotent: applied again after --from-run rewrites the arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option --bogus for pgcli train (see pgcli train --help)"),
        (["-x", "algo=ppo"], "unknown option -x for pgcli train"),
        (["--multirun=1"], "unknown option --multirun=1 for pgcli train"),
        (["--cfg"], "--cfg needs a value (see pgcli train --help)"),
        (["--cfg", "-m"], "--cfg needs a value"),
        (["--cfg", "everything"], "--cfg everything: choose one of job, hydra, all"),
        (["--info=nope"], "--info=nope: choose one of all, config, defaults, defaults-tree, plugins, searchpath"),
    ],
)
def test_a_bad_flag_is_a_config_error(args: list[str], message: str):
    with pytest.raises(ConfigError) as err:
        hydra_argv(args)
    assert str(err.value).startswith(message)


def test_the_command_is_named_in_the_error():
    with pytest.raises(ConfigError, match="unknown option --nope for pgcli sft"):
        hydra_argv(["--nope"], "sft")
