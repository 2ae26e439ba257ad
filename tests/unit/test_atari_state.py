"""An Atari game's state in checkpoints (docs/checkpoints.md, "Episodes in progress are restored"): the ALE emulator
with its RNG (``pgcli.envs.atari_state``) and the state of pgcli's Atari wrappers (life handling, frame stack), so a
restored game steps on exactly as the original: the same frames, rewards, life losses and game ends."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from pgcli.config import EnvConfig
from pgcli.config.pixels import PixelsConfig
from pgcli.envs.atari_state import ale_state, restore_ale_state
from pgcli.envs.make import make_vec_env
from pgcli.envs.state import env_state, restore_env_state

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")

STICKY = {"repeat_action_probability": 0.25}
"""Sticky actions (Machado et al., 2018): the ALE's own RNG decides each frame whether the last action repeats."""


def play(env: gym.Env, actions: np.ndarray) -> list[tuple]:
    """Step ``env`` through ``actions`` (resetting at game ends): the frames, rewards and flags it gives."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(int(action))
        out.append((obs.copy(), reward, terminated, truncated, info["lives"]))
        if terminated or truncated:
            env.reset()
    return out


def test_the_ale_state_round_trip_replays_the_game_with_sticky_actions():
    actions = np.random.default_rng(0).integers(0, 4, size=600)
    original = gym.make("ale_py:BreakoutNoFrameskip-v4", **STICKY).unwrapped
    original.reset(seed=1)
    play(original, actions[:100])
    saved = json.loads(json.dumps(ale_state(original)))  # plain values only
    expected = play(original, actions[100:])

    restored = gym.make("ale_py:BreakoutNoFrameskip-v4", **STICKY).unwrapped
    restored.reset(seed=2)
    play(restored, actions[:37])  # elsewhere in another game
    restore_ale_state(restored, saved)
    got = play(restored, actions[100:])
    assert len({e[4] for e in expected}) > 1  # lives were lost on the way
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        np.testing.assert_array_equal(g[0], e[0], err_msg=f"frame {step}")
        assert g[1:] == e[1:], step


@pytest.mark.parametrize(
    ("game", "kwargs", "vectorization"),
    [
        ("BreakoutNoFrameskip-v4", {}, "sync"),
        ("BreakoutNoFrameskip-v4", STICKY, "shm"),
        ("PongNoFrameskip-v4", {}, "async"),
    ],
)
def test_a_restored_atari_vector_env_continues_its_games_exactly(game: str, kwargs: dict, vectorization: str):
    # the training preprocessing: no-op starts, frame skip, life loss ends an episode, FIRE, reward signs, 4 frames
    cfg = EnvConfig(id=f"ale_py:{game}", n_envs=2, pixels=PixelsConfig(), kwargs=kwargs)
    original = make_vec_env(cfg, seed=1, vectorization=vectorization)
    actions = [original.action_space.sample() for _ in range(260)]
    for a in actions[:60]:
        last = original.step(a)[0]
    snapshot = json.loads(json.dumps(env_state(original)))
    expected = [original.step(a) for a in actions[60:]]

    restored = make_vec_env(cfg, seed=99, vectorization=vectorization)
    obs = restore_env_state(restored, snapshot)
    np.testing.assert_array_equal(obs, last)
    ends = 0
    for step, ((e_obs, e_rew, e_term, e_trunc, e_info), a) in enumerate(zip(expected, actions[60:], strict=True)):
        obs, rew, term, trunc, info = restored.step(a)
        np.testing.assert_array_equal(obs, e_obs, err_msg=f"step {step}")
        np.testing.assert_array_equal(rew, e_rew)
        np.testing.assert_array_equal(term, e_term)
        np.testing.assert_array_equal(trunc, e_trunc)
        ends += int(e_term.sum())
        if "episode" in e_info.get("final_info", {}):  # whole games: the raw score, counted from before the snapshot
            np.testing.assert_array_equal(info["final_info"]["episode"]["r"], e_info["final_info"]["episode"]["r"])
            np.testing.assert_array_equal(info["final_info"]["episode"]["l"], e_info["final_info"]["episode"]["l"])
    if game.startswith("Breakout"):
        assert ends > 0  # lives lost after the snapshot: the life handling and the frame stack's refill were replayed
    original.close()
    restored.close()
