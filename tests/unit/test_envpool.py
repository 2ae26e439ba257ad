"""``hardware.vec_env=envpool`` (docs/pixels.md, "EnvPool"): EnvPool's Atari games behind pgcli's vector-env interface.

What agrees with the gymnasium path (``hardware.vec_env=sync``) exactly, and what cannot:

- Exactly, on a fixed action sequence, with ``noop_max=1``, ``fire_reset=false`` and ``terminal_on_life_loss=false``:
  the learner's rewards (clipped to their signs), ``terminated`` / ``truncated`` at every step, and each finished
  game's raw score and length. Both run the same ALE emulator (no sticky actions) with the same frame skip, so the
  games are the same frame for frame.
- Not exactly, so the test sets them alike or leaves them out:
  - the no-op starts: both draw 1 to ``noop_max`` no-op frames, from different RNGs (``noop_max=1`` draws none);
  - FIRE reset: EnvPool presses FIRE for one frame (counted as one of the no-ops) at every reset; the gymnasium path
    plays a FIRE step and an action-2 step (8 frames, counted in the game's length);
  - a lost life (training only): EnvPool plays its no-ops and FIRE again and keeps the frame stack; the gymnasium
    path plays one NOOP step and fills the stack with the new frame;
  - the pixels: EnvPool greys each frame with the ALE's palette, takes the max of the two grey frames and resizes
    with OpenCV's INTER_AREA; the gymnasium path greys the max of two RGB frames with ITU-R 601 weights and resizes
    with Pillow's box filter. Most pixels are equal; the rest differ at the edges of sprites.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
import torch

from pgcli.algo.sb3 import SB3VecEnv
from pgcli.config import EnvConfig
from pgcli.config.pixels import ENVPOOL_MISSING, PixelsConfig, envpool_task
from pgcli.envs.atari_pool import EnvPoolVectorEnv, pool_options
from pgcli.envs.make import make_vec_env
from pgcli.envs.state import env_state, restore_env_state
from pgcli.errors import ConfigError
from pgcli.training.checks import train_config

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="envpool is not installed")


def atari_cfg(game: str, n_envs: int = 2, **pixels: object) -> EnvConfig:
    return EnvConfig(id=f"ale_py:{game}NoFrameskip-v4", n_envs=n_envs, pixels=PixelsConfig(**pixels))  # type: ignore[arg-type]


def finished(info: dict) -> list[tuple[int, float, int]]:
    """(sub-env, raw return, length) of the games that ended in this step."""
    final = info.get("final_info", {})
    if "episode" not in final:
        return []
    ep = final["episode"]
    return [(int(i), float(ep["r"][i]), int(ep["l"][i])) for i in np.flatnonzero(final["_episode"])]


@needs_envpool
def test_envpool_plays_the_gymnasium_paths_games_on_a_fixed_action_sequence():
    # Space Invaders: raw rewards of 5 to 30 per alien, so the clipped rewards and the raw score differ
    cfg = atari_cfg("SpaceInvaders", noop_max=1, fire_reset=False, terminal_on_life_loss=False)
    sync, pool = make_vec_env(cfg, seed=0, vectorization="sync"), make_vec_env(cfg, seed=0, vectorization="envpool")
    obs_sync, _ = sync.reset(seed=0)
    obs_pool, _ = pool.reset(seed=0)
    assert pool.single_observation_space == sync.single_observation_space  # Box(0, 255, (4, 84, 84), uint8)
    assert obs_pool.shape == obs_sync.shape == (2, 4, 84, 84) and obs_pool.dtype == np.uint8
    actions = np.random.default_rng(1).integers(0, 6, size=(2000, 2))
    games_sync, games_pool, equal_share = [], [], []
    for step, action in enumerate(actions):
        obs_sync, r_sync, term_sync, trunc_sync, info_sync = sync.step(action)
        obs_pool, r_pool, term_pool, trunc_pool, info_pool = pool.step(action)
        assert np.array_equal(r_pool, r_sync) and set(np.unique(r_pool)) <= {-1.0, 0.0, 1.0}, step
        assert np.array_equal(term_pool, term_sync) and np.array_equal(trunc_pool, trunc_sync), step
        assert obs_pool.dtype == np.uint8 and obs_pool.shape == obs_sync.shape
        equal_share.append(np.mean(obs_pool == obs_sync))
        games_sync += finished(info_sync)
        games_pool += finished(info_pool)
        if games_sync:
            break
    assert games_pool == games_sync and len(games_sync) == 1
    assert all(score > 0 and score % 5 == 0 for _, score, _ in games_pool)  # the raw score, not a count of signs
    assert np.mean(equal_share) > 0.8  # the frames: most pixels equal (grey and resize differ at sprite edges)
    sync.close()
    pool.close()


@needs_envpool
@pytest.mark.parametrize("training", [True, False])
def test_a_lost_life_ends_the_learners_episode_only_in_training(training: bool):
    env = make_vec_env(atari_cfg("Breakout"), seed=0, vectorization="envpool", training=training)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n_terminated, games = 0, []
    while not games:
        obs, _, terminated, truncated, info = env.step(rng.integers(0, 4, size=2))
        n_terminated += int(terminated[0])
        games += [g for g in finished(info) if g[0] == 0]
        if terminated[0] or truncated[0]:
            assert info["_final_obs"][0] and info["final_obs"][0].shape == (4, 84, 84)
            assert not np.array_equal(info["final_obs"][0], obs[0])  # autoreset in the same step: the next frames
    assert n_terminated == (5 if training else 1)  # Breakout's five lives: one learner episode each in training
    env.close()


@needs_envpool
def test_the_pools_seed_replays_its_games():
    cfg = atari_cfg("Breakout", noop_max=30)
    first = EnvPoolVectorEnv(cfg, n_envs=2, seed=3, n_threads=2)
    second = EnvPoolVectorEnv(cfg, n_envs=2, seed=3, n_threads=1)
    obs_first, _ = first.reset(seed=3)
    assert np.array_equal(second.reset(seed=3)[0], obs_first)
    actions = np.random.default_rng(0).integers(0, 4, size=(60, 2))
    steps = [first.step(a)[0] for a in actions]
    assert all(np.array_equal(second.step(a)[0], o) for a, o in zip(actions, steps, strict=True))
    assert np.array_equal(first.reset(seed=3)[0], obs_first)  # a seeded reset after steps makes the pool again
    first.close()
    second.close()


@needs_envpool
def test_sb3_and_checkpoints_see_the_interface_of_the_sync_env():
    env = make_vec_env(atari_cfg("Breakout"), seed=0, vectorization="envpool")
    venv = SB3VecEnv(env)
    venv.reset()
    rng, infos = np.random.default_rng(0), []
    while not any("episode" in i for i in infos):
        _, rewards, dones, infos = venv.step(rng.integers(0, 4, size=2))
        assert rewards.dtype == np.float32
        for i in np.flatnonzero(dones):
            assert infos[i]["terminal_observation"].shape == (4, 84, 84) and not infos[i]["TimeLimit.truncated"]
    state = env_state(env)
    obs = restore_env_state(env, state)  # an emulator pgcli cannot read: new games, as on the gymnasium path
    assert obs is not None and obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    venv.close()


@pytest.fixture
def one_torch_thread():
    """hardware.torch_threads' default: two torch threads beside the machine's other work crawl on 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_envpool
@pytest.mark.usefixtures("one_torch_thread")
def test_our_rollouts_store_uint8_frames_and_the_final_frames_of_lost_lives():
    from pgcli.algo.policies import make_actor_critic
    from pgcli.algo.rollout import RolloutCollector
    from pgcli.config.pixels import CNNModelConfig

    class NoMonitor:
        def episodes(self, step: int, info: dict) -> None:
            pass

    env = make_vec_env(atari_cfg("Breakout"), seed=0, vectorization="envpool")
    policy, value = make_actor_critic(env.single_observation_space, env.single_action_space, CNNModelConfig())
    collector = RolloutCollector(env, n_steps=64, seed=0, device=torch.device("cpu"))
    batch = collector.collect(policy, value, NoMonitor(), 0)  # type: ignore[arg-type]
    assert batch.obs.dtype == collector.final_obs.dtype == torch.uint8 and batch.obs.shape == (64, 2, 4, 84, 84)
    ended = batch.dones.bool()
    assert ended.any() and torch.equal(batch.terminated.bool(), ended)  # lost lives end the learner's episodes
    assert (collector.final_obs[ended].flatten(1).amax(1) > 0).all()  # their true final frames, kept
    env.close()


def test_pool_options_follow_env_pixels():
    cfg = atari_cfg("Pong", noop_max=0, screen_size=0, frame_skip=2)
    train, evaluate = pool_options(cfg, training=True), pool_options(cfg, training=False)
    assert train["episodic_life"] and train["reward_clip"] and not evaluate["episodic_life"]
    assert not evaluate["reward_clip"]
    assert (train["noop_max"], train["img_height"], train["img_width"]) == (1, 210, 160)
    assert train["max_episode_steps"] == 54_000 and train["repeat_action_probability"] == 0.0  # 108,000 frames / 2
    assert envpool_task("ale_py:SpaceInvadersNoFrameskip-v4") == "SpaceInvaders-v5"
    assert envpool_task("ALE/Pong-v5") is None and envpool_task("MinAtar/Breakout-v1") is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["env=cartpole"],
            "hardware.vec_env=envpool steps Atari games (env=pong, env=breakout, ...: "
            "<Game>NoFrameskip-v4 ids with env.pixels); env.id 'CartPole-v1' is not one: use hardware.vec_env=sync",
        ),
        (["env=minatar_breakout"], "env.id 'MinAtar/Breakout-v1' is not one: use hardware.vec_env=sync"),
        (["env=pong", "algo=grpo"], "algo=grpo replays seeded start states in single sub-envs"),
        (["env=pong", "+env.kwargs.frameskip=4"], "env.kwargs ['frameskip'] are not options of EnvPool's Atari games"),
    ],
)
@needs_envpool
def test_envpool_mistakes_are_one_line_errors(overrides: list[str], message: str):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train_config([*overrides, "hardware.vec_env=envpool"])


def test_without_envpool_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError) as error:
        train_config(["env=pong", "hardware.vec_env=envpool"])
    assert str(error.value) == ENVPOOL_MISSING and "pip install envpool" in ENVPOOL_MISSING
    monkeypatch.setitem(sys.modules, "envpool", None)  # installed when checked, gone when the pool is made
    with pytest.raises(ConfigError, match="needs the envpool package, which is not installed: pip install envpool"):
        EnvPoolVectorEnv(atari_cfg("Pong"), n_envs=1, seed=0, n_threads=1)
