"""pgcli.envs.state.env_state / restore_env_state: a vector env snapshotted mid-episode (through JSON) and restored
into a fresh env built with another seed steps on exactly as the original, for classic control and MuJoCo, sync and
async."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from pgcli.config import EnvConfig
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.envs.state import env_state, restore_env_state


def actions_for(env, n: int) -> list[np.ndarray]:
    return [env.action_space.sample() for _ in range(n)]


@pytest.mark.parametrize(
    ("env_id", "vectorization"),
    [
        ("CartPole-v1", "sync"),
        ("Pendulum-v1", "sync"),
        ("Acrobot-v1", "sync"),
        ("Hopper-v5", "sync"),
        ("CartPole-v1", "async"),
    ],
)
def test_restored_env_continues_its_episodes_exactly(env_id: str, vectorization: str):
    cfg = EnvConfig(id=env_id, n_envs=3, normalize_obs=True, normalize_reward=True)
    original = make_vec_env(cfg, seed=1, vectorization=vectorization)
    actions = actions_for(original, 260)
    for a in actions[:60]:  # mid-episode for every sub-env; CartPole and Hopper have ended some episodes already
        last = original.step(a)[0]
    snapshot = json.loads(json.dumps(env_state(original)))  # plain values only
    statistics = find_normalizer(original).state_dict()
    expected = [original.step(a) for a in actions[60:]]

    restored = make_vec_env(cfg, seed=99, vectorization=vectorization)
    find_normalizer(restored).load_state_dict(statistics)  # normalizer.npz's part
    obs = restore_env_state(restored, snapshot)
    np.testing.assert_array_equal(obs, last)  # the observation to act on next, normalised as it was
    for (e_obs, e_rew, e_term, e_trunc, e_info), a in zip(expected, actions[60:], strict=True):
        obs, rew, term, trunc, info = restored.step(a)
        np.testing.assert_array_equal(obs, e_obs)
        np.testing.assert_array_equal(rew, e_rew)  # includes the restored return accumulator (reward scaling)
        np.testing.assert_array_equal(term, e_term)
        np.testing.assert_array_equal(trunc, e_trunc)
        if "episode" in e_info.get("final_info", {}):  # episode statistics continue from before the snapshot
            np.testing.assert_array_equal(info["final_info"]["episode"]["r"], e_info["final_info"]["episode"]["r"])
            np.testing.assert_array_equal(info["final_info"]["episode"]["l"], e_info["final_info"]["episode"]["l"])
    original.close()
    restored.close()


def test_an_env_of_another_size_is_left_alone():
    cfg = EnvConfig(id="CartPole-v1", n_envs=2, normalize_obs=True)
    snapshot = env_state(make_vec_env(cfg, seed=0))
    other = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=1, normalize_obs=True), seed=5)

    def episodes() -> list:  # all but the wall-clock durations
        return [{k: v for k, v in sub.items() if k != "wrappers"} for sub in env_state(other)["sub_envs"]]

    before = episodes()
    assert restore_env_state(other, snapshot) is None
    assert episodes() == before


class Unknown(gym.Env):
    """An env whose simulator pgcli cannot read: its state is a private counter."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.np_random.normal()], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], dtype=np.float32), 1.0, False, self.t >= 50, {}


def test_an_unknown_simulator_restarts_its_episodes_from_the_restored_rng():
    if "PgcliTestUnknown-v0" not in gym.registry:
        gym.register("PgcliTestUnknown-v0", entry_point=Unknown)
    cfg = EnvConfig(id="PgcliTestUnknown-v0", n_envs=2, normalize_reward=True)
    env = make_vec_env(cfg, seed=0)
    for _ in range(10):
        env.step(np.zeros(2, dtype=np.int64))
    snapshot = env_state(env)
    assert all(sub["sim"] is None for sub in snapshot["sub_envs"])
    restart = env.unwrapped.envs[0].unwrapped.np_random.normal()  # what a reset from the saved RNG draws

    fresh = make_vec_env(cfg, seed=7)
    obs = restore_env_state(fresh, snapshot)
    assert obs is not None and obs[0, 0] == np.float32(restart)  # a new episode, from the restored np_random
    assert (find_normalizer(fresh).returns == 0).all()  # restarted episodes: no discounted return carried over
