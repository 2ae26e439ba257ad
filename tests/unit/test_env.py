"""pgcli.envs.make, normalize and episodes: the one env builder, VecNormalize, and the episode / final-observation
helpers, on real gymnasium envs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgcli.config import EnvConfig
from pgcli.envs.episodes import final_observations, finished_episodes
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import VecNormalize, find_normalizer, load_saved_normalizer, normalizer_state, save_normalizer

EPS = 1e-8


def cartpole(**kw) -> EnvConfig:
    return EnvConfig(id="CartPole-v1", **{"n_envs": 3, **kw})


def pendulum(**kw) -> EnvConfig:
    return EnvConfig(id="Pendulum-v1", **{"n_envs": 2, **kw})


def random_actions(venv, n: int, seed: int = 0) -> list[np.ndarray]:
    venv.action_space.seed(seed)
    return [venv.action_space.sample() for _ in range(n)]


# --------------------------------------------------------------------------------------------------------------------
# make_vec_env
# --------------------------------------------------------------------------------------------------------------------


def test_same_seed_same_trajectory_and_sub_envs_differ():
    actions = random_actions(make_vec_env(cartpole(), seed=0), 30)

    def rollout(seed: int) -> np.ndarray:
        venv = make_vec_env(cartpole(), seed=seed)
        obs = [venv.reset(seed=seed)[0]]
        obs += [venv.step(a)[0] for a in actions]
        venv.close()
        return np.stack(obs)  # [T + 1, N, 4]

    a, b, c = rollout(3), rollout(3), rollout(4)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[0], c[0])
    assert not np.allclose(a[0, 0], a[0, 1])  # sub-env i is seeded seed + i


def test_max_episode_steps_and_action_rescaling():
    venv = make_vec_env(pendulum(max_episode_steps=7), seed=0)
    assert venv.single_action_space.low.tolist() == [-1.0] and venv.single_action_space.high.tolist() == [1.0]
    inner = venv.unwrapped.envs[0]
    assert inner.unwrapped.action_space.high.tolist() == [2.0]  # Pendulum's torque bound, reached via RescaleAction
    for t in range(7):
        _, _, terminated, truncated, _ = venv.step(np.ones((2, 1), dtype=np.float32))
        assert not terminated.any()
        assert truncated.all() == (t == 6)
    venv.close()


def test_no_normalisation_builds_no_wrapper():
    venv = make_vec_env(cartpole(), seed=0)
    assert find_normalizer(venv) is None and normalizer_state(venv) is None
    venv.close()


# --------------------------------------------------------------------------------------------------------------------
# finished_episodes / final_observations
# --------------------------------------------------------------------------------------------------------------------


def test_finished_episodes_match_summed_rewards_per_sub_env():
    # Pushing left ends CartPole episodes after ~10 steps, at different times per sub-env.
    venv = make_vec_env(cartpole(n_envs=3), seed=1)
    running = np.zeros(3)
    lengths = np.zeros(3, dtype=int)
    expected_returns: list[float] = []
    expected_lengths: list[int] = []
    seen = 0
    for _ in range(60):
        _, rewards, terminated, truncated, info = venv.step(np.zeros(3, dtype=np.int64))
        running += rewards
        lengths += 1
        done = terminated | truncated
        eps = finished_episodes(info)
        assert sorted(eps.returns) == sorted(running[done].tolist())
        assert sorted(eps.lengths) == sorted(lengths[done].tolist())
        expected_returns += running[done].tolist()
        expected_lengths += lengths[done].tolist()
        seen += len(eps.returns)
        running[done] = 0.0
        lengths[done] = 0
    assert seen >= 9 and len(set(expected_lengths)) > 1  # several episodes, of different lengths
    venv.close()


def test_finished_episodes_is_empty_without_ends():
    venv = make_vec_env(cartpole(), seed=0)
    _, _, _, _, info = venv.step(np.zeros(3, dtype=np.int64))
    assert finished_episodes(info).returns == [] and finished_episodes(info).lengths == []
    venv.close()


def test_final_observations_are_the_true_last_states_on_truncation():
    venv = make_vec_env(pendulum(max_episode_steps=5), seed=0)
    twin = make_vec_env(pendulum(max_episode_steps=6), seed=0)  # same episode, one step longer: no reset at step 5
    action = np.zeros((2, 1), dtype=np.float32)
    for _ in range(5):
        obs, _, _, truncated, info = venv.step(action)
        twin_obs, *_ = twin.step(action)
    assert truncated.all()
    final = final_observations(obs, info)
    np.testing.assert_allclose(final, twin_obs, rtol=1e-6)  # the state the episode ended in
    assert not np.allclose(obs, twin_obs)  # `obs` already holds the next episode's first observation
    assert final is not obs and not np.allclose(obs, final)  # a copy; obs untouched
    # rows of sub-envs whose episode did not end are left as they are
    obs2, _, _, truncated2, info2 = venv.step(action)
    assert not truncated2.any()
    np.testing.assert_array_equal(final_observations(obs2, info2), obs2)
    venv.close()
    twin.close()


# --------------------------------------------------------------------------------------------------------------------
# VecNormalize
# --------------------------------------------------------------------------------------------------------------------


def collect(cfg: EnvConfig, actions: list[np.ndarray], seed: int = 0):
    venv = make_vec_env(cfg, seed=seed)
    obs0 = venv.reset(seed=seed)[0]
    steps = [venv.step(a) for a in actions]
    return venv, obs0, steps


def test_obs_statistics_are_the_running_mean_and_var_of_raw_observations():
    actions = random_actions(make_vec_env(pendulum(), seed=0), 50)
    _, raw0, raw_steps = collect(pendulum(), actions)
    norm_env, _, norm_steps = collect(pendulum(normalize_obs=True), actions)
    norm = find_normalizer(norm_env)
    assert isinstance(norm, VecNormalize)

    # make_vec_env resets once with the seed and we reset again: both resets feed the statistics
    raw = np.concatenate([raw0, raw0, *[s[0] for s in raw_steps]])  # [(2 + T) * N, 3]
    np.testing.assert_allclose(norm.obs_rms.mean, raw.mean(axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(norm.obs_rms.var, raw.var(axis=0), rtol=1e-3, atol=1e-6)
    assert norm.obs_rms.count == pytest.approx(raw.shape[0], abs=1e-3)

    expected = (raw_steps[-1][0] - norm.obs_rms.mean) / np.sqrt(norm.obs_rms.var + EPS)
    np.testing.assert_allclose(norm_steps[-1][0], np.clip(expected, -10, 10), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(norm_steps[-1][1], raw_steps[-1][1])  # rewards untouched without norm_reward


def test_reward_scaled_by_std_of_discounted_return_and_reset_at_episode_end():
    gamma = 0.9
    actions = random_actions(make_vec_env(pendulum(), seed=0), 30)
    _, _, raw_steps = collect(pendulum(max_episode_steps=10), actions)
    venv = make_vec_env(pendulum(max_episode_steps=10, normalize_reward=True), seed=0, gamma=gamma)
    venv.reset(seed=0)
    norm = find_normalizer(venv)
    returns = np.zeros(2)
    history = []
    for action, (_, raw_reward, term, trunc, _) in zip(actions, raw_steps, strict=True):
        _, reward, *_ = venv.step(action)
        returns = returns * gamma + raw_reward
        history.append(returns.copy())
        var = np.var(np.concatenate(history))
        np.testing.assert_allclose(reward, np.clip(raw_reward / np.sqrt(var + EPS), -10, 10), rtol=2e-3)
        returns[term | trunc] = 0.0
    np.testing.assert_array_equal(norm.returns, returns)  # the discounted return restarted at each truncation


def test_final_obs_in_info_is_normalised_too():
    venv = make_vec_env(pendulum(max_episode_steps=3, normalize_obs=True), seed=0)
    twin = make_vec_env(pendulum(max_episode_steps=4), seed=0)  # raw, and no reset at step 3
    norm = find_normalizer(venv)
    action = np.zeros((2, 1), dtype=np.float32)
    for _ in range(3):
        obs, _, _, truncated, info = venv.step(action)
        raw_final, *_ = twin.step(action)
    assert truncated.all()
    expected = np.clip((raw_final - norm.obs_rms.mean) / np.sqrt(norm.obs_rms.var + EPS), -10, 10)
    np.testing.assert_allclose(final_observations(obs, info), expected, rtol=1e-5, atol=1e-6)


def test_frozen_statistics_do_not_move():
    venv = make_vec_env(pendulum(normalize_obs=True, normalize_reward=True), seed=0)
    norm = find_normalizer(venv)
    norm.training = False
    before = normalizer_state(venv)
    for a in random_actions(venv, 20):
        venv.step(a)
    after = normalizer_state(venv)
    for key in ("obs_rms", "ret_rms"):
        for stat in ("mean", "var", "count"):
            np.testing.assert_array_equal(before[key][stat], after[key][stat])


def test_normalizer_save_load_round_trip(tmp_path: Path):
    cfg = pendulum(normalize_obs=True, normalize_reward=True)
    venv = make_vec_env(cfg, seed=0)
    for a in random_actions(venv, 40):
        venv.step(a)
    save_normalizer(venv, tmp_path)
    assert (tmp_path / "normalizer.npz").is_file()

    fresh = make_vec_env(cfg, seed=5)
    load_saved_normalizer(fresh, tmp_path)
    saved, loaded = normalizer_state(venv), normalizer_state(fresh)
    for key in ("obs_rms", "ret_rms"):
        for stat in ("mean", "var", "count"):
            np.testing.assert_allclose(loaded[key][stat], saved[key][stat])
    assert find_normalizer(fresh).training is False  # loaded statistics are frozen (evaluation / enjoy)
    probe = np.array([[0.5, -0.5, 3.0]], dtype=np.float32)
    np.testing.assert_array_equal(
        find_normalizer(fresh).normalize_obs(probe), find_normalizer(venv).normalize_obs(probe)
    )


def test_no_normalizer_file_without_normalisation(tmp_path: Path):
    venv = make_vec_env(cartpole(), seed=0)
    save_normalizer(venv, tmp_path)
    assert not (tmp_path / "normalizer.npz").exists()
    load_saved_normalizer(venv, tmp_path)  # nothing to load: no error
