"""pgcli.envs.spec and the env builder's wrapper chain: module:EnvId ids, env.wrappers, the trainers' space table, and
the spaces pgcli.training.checks probes."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pgcli.config import EnvConfig
from pgcli.config.algos import ALGOS
from pgcli.envs.episodes import finished_episodes
from pgcli.envs.make import make_env, make_vec_env, reward_threshold
from pgcli.envs.spec import algos_taking, check_wrapper, describe_space, registered_id
from pgcli.errors import ConfigError
from pgcli.training.checks import check_env, probe_spaces

MY_TARGET = "tests.example_envs.my_envs:MyTarget-v0"


def frame_stack(n: int = 4) -> dict:
    return {"_target_": "gymnasium.wrappers.FrameStackObservation", "stack_size": n}


# --------------------------------------------------------------------------------------------------------------------
# env.id
# --------------------------------------------------------------------------------------------------------------------


def test_module_env_id_imports_the_module_that_registers_it():
    assert registered_id("CartPole-v1") == "CartPole-v1"
    assert registered_id(MY_TARGET) == "MyTarget-v0"
    assert "tests.example_envs.my_envs" in sys.modules and "MyTarget-v0" in gym.registry
    assert reward_threshold(EnvConfig(id=MY_TARGET)) == -3.0  # from the module's registration


def test_a_module_in_the_working_directory_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "cwd_envs_for_test.py").write_text(
        "import gymnasium as gym\n"
        "gym.register(id='CwdCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])  # as the console script
    assert registered_id("cwd_envs_for_test:CwdCartPole-v0") == "CwdCartPole-v0"
    assert sys.path[-1] == str(tmp_path)  # appended, never in front of installed packages


@pytest.mark.parametrize(
    ("env_id", "fragments"),
    [
        ("no_such_pkg.envs:MyTarget-v0", ["cannot import module 'no_such_pkg.envs'", "No module named 'no_such_pkg'"]),
        ("tests.example_envs.my_envs:MyTargt-v0", ["my_envs' did not register it", "did you mean MyTarget-v0"]),
        ("CartPole-v9", ["not a registered gymnasium environment", "did you mean CartPole-v1"]),
    ],
)
def test_bad_env_id_is_one_line(env_id: str, fragments: list[str]):
    with pytest.raises(ConfigError) as info:
        check_env(EnvConfig(id=env_id))
    assert "\n" not in str(info.value) and all(f in str(info.value) for f in fragments), str(info.value)


def test_a_module_that_fails_on_import_is_named_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "broken_envs_for_test.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing 'broken_envs_for_test' failed: RuntimeError: boom at import"):
        registered_id("broken_envs_for_test:X-v0")


# --------------------------------------------------------------------------------------------------------------------
# env.wrappers
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ({"stack_size": 4}, ["env.wrappers[0] must be a mapping with a _target_"]),
        ("FrameStackObservation", ["env.wrappers[0] must be a mapping"]),
        (
            {"_target_": "gymnasium.wrappers.FrameStak"},
            ["cannot import", "did you mean gymnasium.wrappers.FrameStackObservation"],
        ),
        ({"_target_": "no_such_pkg.Wrapper"}, ["cannot import", "No module named 'no_such_pkg'"]),
        ({"_target_": "FrameStackObservation"}, ["not a dotted path"]),
        ({"_target_": "gymnasium.wrappers.__doc__"}, ["is not callable"]),
        (
            {"_target_": "gymnasium.wrappers.FrameStackObservation", "stack": 4},
            ["no argument 'stack' (did you mean stack_size? it takes: stack_size, padding_type)"],
        ),
        ({"_target_": "gymnasium.wrappers.FrameStackObservation", "stack_size": 4, "size": 2}, ["no argument 'size'"]),
        ({"_target_": "gymnasium.wrappers.FrameStackObservation"}, ["missing a required argument: 'stack_size'"]),
        ({"_target_": "gymnasium.wrappers.FlattenObservation", "x": 1}, ["it takes no arguments besides the env"]),
    ],
    ids=lambda v: str(v)[:60],
)
def test_bad_wrapper_is_one_line_naming_it(spec, fragments: list[str]):
    with pytest.raises(ConfigError) as info:
        check_wrapper(0, spec)
    message = str(info.value)
    assert "\n" not in message and message.startswith("env.wrappers[0]")
    assert all(f in message for f in fragments), message


def test_a_wrapper_that_raises_on_the_env_is_named_with_its_arguments():
    with pytest.raises(ConfigError) as info:
        make_env(
            EnvConfig(
                id="CartPole-v1", wrappers=[{"_target_": "gymnasium.wrappers.FlattenObservation"}, frame_stack(0)]
            )
        )
    assert str(info.value).startswith("env.wrappers[1] gymnasium.wrappers.FrameStackObservation(stack_size=0) failed:")
    assert "ValueError" in str(info.value)


def test_frame_stack_is_flattened_for_the_mlps_and_matches_the_stacked_frames():
    venv = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2, wrappers=[frame_stack(3)]), seed=0)
    assert venv.single_observation_space.shape == (12,)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (2, 12)
    np.testing.assert_array_equal(obs[:, :4], obs[:, 8:])  # padding_type="reset": the reset frame repeated
    first = obs[:, 8:].copy()
    obs, *_ = venv.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(obs[:, 4:8], first)  # frames shift: the newest is last
    venv.close()


COMMON_WRAPPERS = [
    ("CartPole-v1", frame_stack(4)),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.TimeAwareObservation"}),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.ClipReward", "min_reward": 0.0, "max_reward": 0.5}),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.StickyAction", "repeat_action_probability": 0.25}),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.MaxAndSkipObservation", "skip": 2}),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.DelayObservation", "delay": 2}),
    ("CartPole-v1", {"_target_": "gymnasium.wrappers.NormalizeObservation"}),
    ("Pendulum-v1", {"_target_": "gymnasium.wrappers.ClipAction"}),
    ("Pendulum-v1", {"_target_": "gymnasium.wrappers.DtypeObservation", "dtype": "float64"}),
    ("Pendulum-v1", {"_target_": "gymnasium.wrappers.RescaleObservation", "min_obs": -1.0, "max_obs": 1.0}),
]


@pytest.mark.parametrize(("env_id", "spec"), COMMON_WRAPPERS, ids=lambda v: v if isinstance(v, str) else v["_target_"])
def test_common_gymnasium_wrappers_build_and_step(env_id: str, spec: dict):
    venv = make_vec_env(EnvConfig(id=env_id, n_envs=2, wrappers=[spec]), seed=0)
    obs_space = venv.single_observation_space
    assert isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1
    obs, _ = venv.reset(seed=0)
    for action in [venv.action_space.sample() for _ in range(60)]:
        obs, reward, *_ = venv.step(action)
        assert obs.shape == (2, obs_space.shape[0]) and np.isfinite(obs).all() and np.isfinite(reward).all()
    venv.close()


def test_episode_returns_are_the_envs_own_before_user_reward_wrappers():
    # ClipReward halves CartPole's +1 rewards; the recorded episode return is still the env's (= the episode length)
    clip = {"_target_": "gymnasium.wrappers.ClipReward", "min_reward": 0.0, "max_reward": 0.5}
    venv = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2, wrappers=[clip]), seed=0)
    seen = 0
    for _ in range(200):
        _, reward, _, _, info = venv.step(venv.action_space.sample())
        assert np.all(reward == 0.5)  # what the trainer learns from
        episodes = finished_episodes(info)
        assert episodes.returns == [float(n) for n in episodes.lengths]
        seen += len(episodes.returns)
    assert seen > 0
    venv.close()


class _UnboundedActions(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


def test_bounded_box_actions_are_rescaled_and_unbounded_ones_left_alone():
    pendulum = make_env(EnvConfig(id="Pendulum-v1"))
    assert pendulum.action_space == spaces.Box(-1.0, 1.0, (1,), np.float32)  # Pendulum's own bounds are +-2
    gym.register(id="PgcliTestUnboundedActions-v0", entry_point=_UnboundedActions)
    try:
        env = make_env(EnvConfig(id="PgcliTestUnboundedActions-v0"))
        assert np.isinf(env.action_space.high).all()  # RescaleAction would fail on infinite bounds
    finally:
        gym.registry.pop("PgcliTestUnboundedActions-v0")


# --------------------------------------------------------------------------------------------------------------------
# spaces
# --------------------------------------------------------------------------------------------------------------------


def test_probe_reports_the_spaces_training_sees():
    obs_space, action_space = probe_spaces(EnvConfig(id=MY_TARGET, wrappers=[frame_stack(4)]))
    assert obs_space == spaces.Box(-1.0, 1.0, (8,), np.float32) and action_space == spaces.Discrete(3)
    _, continuous = probe_spaces(EnvConfig(id=MY_TARGET, kwargs={"continuous": True}))
    assert isinstance(continuous, spaces.Box) and continuous.shape == (1,)
    assert probe_spaces(EnvConfig(id="CartPole-v1", kwargs={"no_such_kwarg": 1})) is None  # left to the run


class _SpacesEnv(gym.Env):
    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space


CANDIDATES = [
    spaces.Box(-1, 1, (2,)),
    spaces.Discrete(3),
    spaces.MultiDiscrete([2, 3]),
    spaces.MultiBinary(3),
    spaces.Dict({"a": spaces.Box(-1, 1, (2,))}),
    spaces.Tuple([spaces.Discrete(2), spaces.Discrete(2)]),
]


SB3_TRAINERS = [name for name, e in ALGOS.items() if e.trainers.get("control") == "pgcli.algo.sb3:SB3Trainer"]
OWN_TRAINERS = [name for name, e in ALGOS.items() if e.trains_on("control") and name not in SB3_TRAINERS]


def test_the_catalogue_has_sb3_and_own_gymnasium_trainers():
    assert SB3_TRAINERS == ["ppo", "a2c", "sb3_trpo"] and OWN_TRAINERS == ["trpo", "vpg", "ppo_kl", "grpo"]


@pytest.mark.parametrize("name", SB3_TRAINERS)
def test_sb3_space_tables_match_what_sb3_accepts(name: str):
    from sb3_contrib import TRPO
    from stable_baselines3 import A2C, PPO

    cls = {"ppo": PPO, "a2c": A2C, "sb3_trpo": TRPO}[name]

    def accepts(obs_space: spaces.Space, action_space: spaces.Space) -> bool:
        try:
            cls("MlpPolicy", _SpacesEnv(obs_space, action_space), n_steps=8, device="cpu")
            return True
        except (AssertionError, ValueError, NotImplementedError, KeyError):
            return False

    box = spaces.Box(-1, 1, (2,))
    for space in CANDIDATES:
        assert accepts(box, space) == (name in algos_taking("action", space)), f"action space {space}"
        assert accepts(space, spaces.Discrete(2)) == (name in algos_taking("observation", space)), f"obs {space}"


def test_own_trainers_take_what_make_policy_takes():
    from pgcli.algo.policies import make_policy
    from pgcli.config import ModelConfig

    box, model = spaces.Box(-1, 1, (3,)), ModelConfig()
    candidates = [
        spaces.Discrete(3),
        spaces.Box(-1, 1, (2,)),
        spaces.Box(-1, 1, (2, 2)),
        spaces.MultiBinary(3),
        spaces.MultiDiscrete([2, 3]),
    ]
    for action_space in candidates:
        try:
            make_policy(box, action_space, model)
            builds = True
        except ValueError:
            builds = False
        assert builds == (set(OWN_TRAINERS) <= set(algos_taking("action", action_space))), action_space
    for obs_space in (spaces.Discrete(4), spaces.MultiBinary(3)):
        with pytest.raises(ValueError):
            make_policy(obs_space, spaces.Discrete(2), model)
        assert algos_taking("observation", obs_space) == SB3_TRAINERS


def test_describe_space_is_short_for_any_space():
    assert describe_space(spaces.Box(np.zeros(300), np.arange(300.0) + 1, dtype=np.float64)) == "Box(300) float64"
    assert describe_space(spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(3)})) == "Dict(a, b)"
    assert describe_space(spaces.Tuple([spaces.Discrete(2)] * 3)) == "Tuple(3 spaces)"
    assert describe_space(spaces.MultiBinary(4)) == "MultiBinary(4)"
