"""Env-dependent validation (spaces, continuous-only options), env labels and presets that follow ``env.id``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcli.config.compose import CONF_DIR, compose_train_config
from pgcli.config.labels import env_label, env_option_ids
from pgcli.config.presets import stale_preset_overrides
from pgcli.errors import ConfigError
from pgcli.training.checks import train_config

MY_TARGET = "tests.example_envs.my_envs:MyTarget-v0"
ODD = "tests.example_envs.odd_spaces"
FRAME_STACK = "env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, stack_size: 4}]"


@pytest.mark.parametrize(
    "overrides",
    [
        [f"env.id={MY_TARGET}", FRAME_STACK],
        ["algo=trpo", f"env.id={MY_TARGET}", "+env.kwargs.continuous=true", FRAME_STACK, "model.log_std_init=-0.5"],
        ["algo=grpo", f"env.id={MY_TARGET}"],
        [f"env.id={ODD}:DictObs-v0", "env.wrappers=[{_target_: gymnasium.wrappers.FlattenObservation}]"],
        ["algo=a2c", f"env.id={ODD}:MultiBinaryAction-v0"],
        ["algo=sb3_trpo", "env.id=FrozenLake-v1"],  # Discrete observations: SB3 one-hot encodes them
        ["algo=ppo", "env=pendulum", "algo.use_sde=true", "model.log_std_init=-2"],
    ],
    ids=" ".join,
)
def test_envs_and_options_the_trainer_can_take_compose(overrides: list[str]):
    train_config(overrides)  # validation (spaces probed on a throwaway env) accepts them


BAD_ENVS = [
    # (overrides, fragments of the one-line message)
    (["algo=trpo", f"env.id={ODD}:MultiBinaryAction-v0"],
     ["MultiBinary(3) action space", "algo=trpo cannot take", "algo=ppo, a2c, sb3_trpo can"]),
    (["algo=grpo", f"env.id={ODD}:MultiBinaryAction-v0"], ["MultiBinary(3) action space", "algo=grpo cannot take"]),
    (["algo=ppo", f"env.id={ODD}:DictObs-v0"],
     ["Dict(position, target) observation space", "no pgcli algorithm can", "gymnasium.wrappers.FlattenObservation"]),
    (["algo=a2c", "env.id=Blackjack-v1"], ["Tuple(3 spaces) observation space", "algo=a2c cannot take"]),
    (["algo=vpg", "env.id=FrozenLake-v1"], ["Discrete(16) observation space", "algo=ppo, a2c, sb3_trpo can"]),
    (["algo=ppo", "env.id=FrozenLake-v1", "env.normalize_obs=true"], ["env.normalize_obs=true needs a Box"]),
    (["algo=ppo", "algo.use_sde=true"], ["algo.use_sde=true needs continuous (Box) actions", "Discrete(2)"]),
    (["algo=a2c", "env=acrobot", "algo.use_sde=true"], ["algo.use_sde=true", "'Acrobot-v1' has Discrete(3)"]),
    (["algo=sb3_trpo", "algo.use_sde=true"], ["algo.use_sde=true"]),
    (["algo=trpo", "model.log_std_init=-1"], ["model.log_std_init=-1.0 only sets the std of continuous"]),
    ([f"env.id={MY_TARGET}", "env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, size: 4}]"],
     ["env.wrappers[0] gymnasium.wrappers.FrameStackObservation", "it takes: stack_size, padding_type"]),
    (["env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, stack_size: -1}]"],
     ["env.wrappers[0] gymnasium.wrappers.FrameStackObservation(stack_size=-1) failed"]),
    (["env.wrappers=[{_target_: my_missing_pkg.Wrap}]"], ["env.wrappers[0] my_missing_pkg.Wrap: cannot import"]),
    (["env.id=my_missing_pkg:MyTarget-v0"], ["cannot import module 'my_missing_pkg'"]),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "fragments"), BAD_ENVS, ids=lambda v: " ".join(v) if v else "")
def test_env_the_trainer_cannot_take_is_one_line_config_error(overrides: list[str], fragments: list[str]):
    compose_train_config(overrides)  # the values follow their rules: only the world's checks can tell
    with pytest.raises(ConfigError) as info:
        train_config(overrides)
    message = str(info.value)
    assert "\n" not in message
    assert all(fragment in message for fragment in fragments), message


# --------------------------------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------------------------------


def test_env_label_is_the_option_whose_id_runs_else_the_id():
    assert env_option_ids(CONF_DIR)["cartpole"] == "CartPole-v1"
    assert env_label("CartPole-v1", "cartpole", CONF_DIR) == "cartpole"
    assert env_label("Acrobot-v1", "cartpole", CONF_DIR) == "acrobot"  # the option of that id, whatever env= says
    assert env_label("Hopper-v4", "hopper", CONF_DIR) == "Hopper-v4"  # not hopper's Hopper-v5: its own label
    assert env_label(MY_TARGET, "cartpole", CONF_DIR) == "MyTarget-v0"  # without the module path


def test_env_label_prefers_the_chosen_option_among_several_with_one_id(tmp_path: Path):
    (tmp_path / "env").mkdir()
    for name in ("cartpole_fast", "cartpole", "zzz"):
        (tmp_path / "env" / f"{name}.yaml").write_text(f"id: {'Acrobot-v1' if name == 'zzz' else 'CartPole-v1'}\n")
    conf = str(tmp_path)
    assert env_label("CartPole-v1", "cartpole_fast", conf) == "cartpole_fast"
    assert env_label("CartPole-v1", "zzz", conf) == "cartpole"  # the first by name
    assert env_label("Acrobot-v1", "cartpole", conf) == "zzz"


# --------------------------------------------------------------------------------------------------------------------
# presets follow env.id
# --------------------------------------------------------------------------------------------------------------------


def stale(overrides: list[str], multirun: bool = False) -> list[str]:
    drop = stale_preset_overrides(overrides, multirun=multirun)
    drop.announce()
    return drop.overrides


def test_overriding_env_id_drops_the_groups_preset_and_says_so(capsys: pytest.CaptureFixture[str]):
    assert stale(["env.id=Acrobot-v1", "seed=3"]) == ["~preset"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pgcli: env.id=Acrobot-v1 replaces env=cartpole's CartPole-v1")
    assert "preset ppo_cartpole (tuned for CartPole-v1) is not applied; env=acrobot has this env's own settings" in err
    cfg = train_config(["env.id=Acrobot-v1", "~preset"])
    assert cfg.algo.n_steps == 2048 and cfg.algo.lr_schedule == "constant"  # plain PPO defaults, not ppo_cartpole


@pytest.mark.parametrize(
    "overrides",
    [
        ["seed=1"],  # env.id not overridden
        ["env.id=CartPole-v1"],  # the id the preset was tuned for
        ["env.id=Acrobot-v1", "preset=ppo_cartpole"],  # the user's explicit choice wins
        ["env.id=Acrobot-v1", "~preset"],
        ["algo=a2c", "env=acrobot", "env.id=CartPole-v1"],  # no a2c_acrobot preset to drop
        ["env.id=Acrobot-v1", "algo=nope"],  # does not compose: left to validation
    ],
    ids=" ".join,
)
def test_preset_is_kept_or_absent_otherwise(overrides: list[str], capsys: pytest.CaptureFixture[str]):
    assert stale(overrides) == []
    assert capsys.readouterr().err == ""


def test_sweeps_drop_the_preset_only_when_every_job_leaves_its_id(capsys: pytest.CaptureFixture[str]):
    assert stale(["env.id=Acrobot-v1,MountainCar-v0", "seed=0,1"], multirun=True) == ["~preset"]
    assert len(capsys.readouterr().err.splitlines()) == 2  # one notice per distinct env id
    with pytest.raises(ConfigError, match=r"keep env=cartpole's id in some jobs and not in others.*add ~preset"):
        stale(["env.id=CartPole-v1,Acrobot-v1"], multirun=True)
    assert stale(["env=cartpole,acrobot", "algo=grpo"], multirun=True) == []


def test_the_preset_label_is_the_applied_preset_file_or_none():
    from pgcli.config.labels import preset_label

    assert preset_label({"preset": "ppo_cartpole"}, CONF_DIR) == "ppo_cartpole"
    assert preset_label({"preset": "a2c_acrobot"}, CONF_DIR) == "none"  # Hydra records the choice; no such file
    assert preset_label({"preset": None}, CONF_DIR) == "none"
