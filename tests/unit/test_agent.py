"""pgcli.agent: a saved agent read back from plain files, and the raw-observation policy inside the MLflow Model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.agent import RawPolicy, write_agent_files
from pgcli.algo.checkpoint import save_checkpoint
from pgcli.algo.policies import make_policy
from pgcli.config import EnvConfig, HardwareConfig, ModelConfig, TrainConfig, TRPOConfig
from pgcli.config.logged import train_config_from_dict
from pgcli.config.saved_agent import read_agent_spec
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.errors import ConfigError


def pendulum_model_dir(
    tmp_path: Path, *, torch_threads: int = 1
) -> tuple[Path, TrainConfig, torch.nn.Module, np.ndarray, np.ndarray]:
    """A TRPO-style model dir for Pendulum with observation normalisation and known statistics."""
    cfg = TrainConfig(
        algo=TRPOConfig(),
        env=EnvConfig(id="Pendulum-v1", n_envs=1, normalize_obs=True, clip_obs=2.0),
        model=ModelConfig(),
        hardware=HardwareConfig(torch_threads=torch_threads),
    )
    env = make_vec_env(cfg.env, seed=0)
    torch.manual_seed(0)
    policy = make_policy(env.single_observation_space, env.single_action_space, cfg.model)
    mean, var = np.array([0.5, -0.5, 1.0]), np.array([4.0, 0.25, 9.0])
    norm = find_normalizer(env)
    assert norm is not None
    norm.obs_rms.mean, norm.obs_rms.var = mean.copy(), var.copy()
    model_dir = save_checkpoint(tmp_path / "model", env, {"policy": policy}, {"steps": 0})
    write_agent_files(model_dir, cfg, algo_name="trpo", env_name="pendulum", env=env)
    env.close()
    return model_dir, cfg, policy, mean, var


def test_agent_json_round_trips_the_config(tmp_path: Path):
    model_dir, cfg, *_ = pendulum_model_dir(tmp_path)
    spec = read_agent_spec(model_dir)
    assert spec["algo"] == "trpo" and spec["env"] == "pendulum" and spec["backend"] == "torch"
    assert spec["env_action_space"] == {"type": "box", "shape": [1], "low": [-2.0], "high": [2.0]}
    assert spec["policy_action_space"]["low"] == [-1.0]
    assert train_config_from_dict(spec["config"], spec["algo"]) == cfg


def test_raw_policy_normalises_clips_and_rescales_like_the_env(tmp_path: Path):
    model_dir, _, policy, mean, var = pendulum_model_dir(tmp_path)
    obs = np.array([[1.0, 0.0, 8.0], [-1.0, 0.5, -8.0], [0.5, -0.5, 1.0]])
    # by hand: (obs - mean) / sqrt(var + 1e-8) clipped to +-clip_obs (2), the policy's mean, clipped to [-1, 1],
    # then [-1, 1] -> Pendulum's [-2, 2]
    z = np.clip((obs - mean) / np.sqrt(var + 1e-8), -2.0, 2.0).astype(np.float32)
    with torch.no_grad():
        mu = policy.net(torch.as_tensor(z)).numpy()
    expected = 2.0 * np.clip(mu, -1.0, 1.0)
    actions = RawPolicy(model_dir)(obs)
    assert actions.dtype == np.float32 and actions.shape == (3, 1)
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(RawPolicy(model_dir)(obs[2]), expected[2], rtol=1e-6, atol=1e-6)


def test_raw_policy_rejects_observations_of_the_wrong_shape(tmp_path: Path):
    model_dir, *_ = pendulum_model_dir(tmp_path)
    with pytest.raises(ValueError, match=r"observations must have shape \[B, 3\], got \(2, 4\)"):
        RawPolicy(model_dir)(np.zeros((2, 4)))


def test_a_model_dir_without_agent_json_or_with_a_bad_one_is_a_one_line_error(tmp_path: Path):
    model_dir, *_ = pendulum_model_dir(tmp_path)
    spec = json.loads((model_dir / "agent.json").read_text())
    (model_dir / "agent.json").write_text(json.dumps(spec | {"format": 99}))
    with pytest.raises(ConfigError, match="unsupported format 99"):
        read_agent_spec(model_dir)
    (model_dir / "agent.json").unlink()
    with pytest.raises(ConfigError, match=r"has no agent\.json"):
        read_agent_spec(model_dir)


def test_a_logged_config_that_breaks_a_rule_is_a_config_error():
    values = {"env": {"id": "CartPole-v1"}, "algo": {"target_kl": -1.0}}
    with pytest.raises(ConfigError, match=r"algo\.target_kl must be > 0"):
        train_config_from_dict(values, "trpo")
    with pytest.raises(ConfigError, match="is not an algo option"):
        train_config_from_dict(values, "nope")
    with pytest.raises(ConfigError, match=r"does not fit this pgcli's schema"):
        train_config_from_dict({**values, "algo": {"no_such_key": 1}}, "trpo")


def test_truncated_weights_are_a_config_error(tmp_path: Path):
    model_dir, *_ = pendulum_model_dir(tmp_path)
    data = (model_dir / "model.pt").read_bytes()
    (model_dir / "model.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"cannot load .*model\.pt"):
        RawPolicy(model_dir)


def test_discrete_actions_are_int64(tmp_path: Path):
    cfg = TrainConfig(algo=TRPOConfig(), env=replace(EnvConfig(id="CartPole-v1"), n_envs=1), model=ModelConfig())
    env = make_vec_env(cfg.env, seed=0)
    policy = make_policy(env.single_observation_space, env.single_action_space, cfg.model)
    model_dir = save_checkpoint(tmp_path / "model", env, {"policy": policy}, {"steps": 0})
    write_agent_files(model_dir, cfg, algo_name="trpo", env_name="cartpole", env=env)
    obs = np.random.default_rng(0).normal(size=(6, 4))
    actions = RawPolicy(model_dir)(obs)
    assert actions.dtype == np.int64 and actions.shape == (6,)
    assert np.array_equal(actions, policy.predict(obs.astype(np.float32), True))


def test_pgcli_eval_of_a_control_run_plays_on_one_torch_thread(tmp_path: Path, capsys, monkeypatch):
    """A run trained with hardware.torch_threads=2 is evaluated on one thread: a step's batch is a few observations,
    where more threads beside other busy processes make a CNN's forward pass 10 to 60 times slower."""
    from pgcli.commands.eval import main
    from pgcli.envs import episodes

    threads_seen: list[int] = []
    steps = episodes.episode_steps

    def seen_steps(*args, **kwargs):  # the threads torch has while the episodes are played
        threads_seen.append(torch.get_num_threads())
        return steps(*args, **kwargs)

    monkeypatch.setattr(episodes, "episode_steps", seen_steps)
    model_dir, *_ = pendulum_model_dir(tmp_path, torch_threads=2)
    assert read_agent_spec(model_dir)["config"]["hardware"]["torch_threads"] == 2
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main([str(model_dir), "--episodes", "1", "--no-log", "tracking=off"]) == 0
        assert threads_seen == [1] and torch.get_num_threads() == 2  # and given back after
    finally:
        torch.set_num_threads(before)
    assert "1 episodes, deterministic" in capsys.readouterr().out
