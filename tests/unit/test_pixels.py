"""Image envs (docs/pixels.md): the Atari preprocessing on real ALE games, MinAtar's games, the CNN torsos, SB3's CNN
policy, pgcli's own policies and rollout buffers on frames, and the config rules of image runs (the implied model=cnn,
the one-line errors)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pgcli.algo.cnn import FlatTorso, ImpalaCNN, MinAtarCNN, NatureCNN, make_torso, resolve_arch
from pgcli.config import TEXT_ENV_CONFIGS, EnvConfig
from pgcli.config.compose import CONF_DIR, text_task_overrides
from pgcli.config.pixels import IMAGE_ENVS, CNNModelConfig, PixelsConfig
from pgcli.envs.make import make_env
from pgcli.envs.pixels import MINATAR_GAMES, minatar_id
from pgcli.errors import ConfigError
from pgcli.training.checks import train_config

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
pytest.importorskip("minatar", reason="pgcli[pixels] is not installed")

NOOP, FIRE = 0, 1
MINATAR = {"noop_max": 0, "frame_skip": 1, "screen_size": 0, "grayscale": False, "frame_stack": 1,
           "terminal_on_life_loss": False, "clip_reward": False, "fire_reset": False}  # fmt: skip


def atari(game: str, *, training: bool = True, **pixels: object) -> gym.Env:
    env = make_env(EnvConfig(id=f"ale_py:{game}NoFrameskip-v4", pixels=PixelsConfig(**pixels)), training=training)  # type: ignore[arg-type]
    return env


def lives(env: gym.Env) -> int:
    return int(env.unwrapped.ale.lives())  # type: ignore[attr-defined]


def frame_number(env: gym.Env) -> int:
    return int(env.unwrapped.ale.getEpisodeFrameNumber())  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------------------------
# the Atari preprocessing
# --------------------------------------------------------------------------------------------------------------------


def test_pong_frames_are_4x84x84_uint8_channels_first():
    env = atari("Pong")
    obs, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs.max() > 0
    assert np.array_equal(obs[0], obs[3])  # a reset fills the stack with the first frame
    for _ in range(3):
        obs, *_ = env.step(NOOP)
    assert not np.array_equal(obs[0], obs[3])  # ...which the next frames push out, oldest first
    env.close()


def test_the_logged_return_is_the_raw_score_of_whole_games_while_the_learner_sees_signs_and_lives():
    # Space Invaders scores 5 to 30 points per alien over 3 lives. Firing all the time: the learner's episodes end at
    # each lost life with rewards in {-1, 0, 1}; the monitor's one episode is the whole game with its raw score.
    env = atari("SpaceInvaders", noop_max=0)
    env.reset(seed=0)
    clipped, learner_episodes, info = [], 0, {}
    while "episode" not in info:
        _, reward, terminated, truncated, info = env.step(FIRE)
        clipped.append(reward)
        if terminated or truncated:
            learner_episodes += 1
            if "episode" not in info:
                env.reset()
    assert set(clipped) <= {-1.0, 0.0, 1.0} and sum(clipped) > 0
    assert learner_episodes == 3  # one per life
    assert float(info["episode"]["r"]) > sum(clipped)  # the game's points, not the count of rewards
    env.close()

    evaluation = atari("SpaceInvaders", noop_max=0, training=False)  # whole games on the raw rewards
    evaluation.reset(seed=0)
    raw, info = [], {}
    while True:
        _, reward, terminated, truncated, info = evaluation.step(FIRE)
        raw.append(reward)
        if terminated or truncated:
            break
    assert max(raw) > 1 and float(info["episode"]["r"]) == sum(raw) and lives(evaluation) == 0
    evaluation.close()


def test_noop_starts_are_seeded_and_vary():
    starts = []
    for seed in range(6):
        env = atari("Pong", fire_reset=False, frame_stack=1)
        env.reset(seed=seed)
        starts.append(frame_number(env))  # no-ops are single frames, below the frame skip
        env.reset(seed=seed)
        assert frame_number(env) == starts[-1]
        env.close()
    assert all(1 <= n <= 30 for n in starts) and len(set(starts)) > 1


def test_a_lost_life_ends_the_learners_episode_but_not_the_game():
    env = atari("Breakout", noop_max=0)  # FIRE serves the ball; a still paddle soon misses it
    env.reset(seed=0)
    assert lives(env) == 5
    for _ in range(500):
        _, _, terminated, _, info = env.step(NOOP)
        if terminated:
            break
    assert terminated and lives(env) == 4 and "episode" not in info
    before = frame_number(env)
    env.reset()  # the next life, served again: no new game
    assert lives(env) == 4 and frame_number(env) > before
    env.close()

    evaluation = atari("Breakout", noop_max=0, training=False)  # life loss is not an episode end
    evaluation.reset(seed=0)
    for _ in range(500):
        _, _, terminated, _, _ = evaluation.step(NOOP)
        assert not terminated
        if lives(evaluation) < 5:
            break
    assert lives(evaluation) == 4
    evaluation.close()


@pytest.mark.parametrize("fire_reset", [True, False])
def test_fire_reset_serves_the_ball_in_breakout(fire_reset: bool):
    env = atari("Breakout", noop_max=0, terminal_on_life_loss=False, fire_reset=fire_reset)
    env.reset(seed=0)
    for _ in range(300):  # a served ball falls past the still paddle well within 300 steps; an unserved one never
        env.step(NOOP)
    assert lives(env) == (4 if fire_reset else 5)
    env.close()


def test_an_evaluation_game_of_breakout_serves_each_life_so_a_still_paddle_loses_all_five():
    # Issue 34: evaluation plays whole games (no life handling), so nothing reset the game at a lost life and only
    # FireReset served the ball; a deterministic policy that never presses FIRE then sat out the ALE's 108,000-frame
    # limit (27,000 steps). Each lost life is served now, as training's EpisodicLife + FireReset serve it.
    evaluation = atari("Breakout", noop_max=0, training=False)
    evaluation.reset(seed=0)
    steps, lost, info = 0, [], {}
    while "episode" not in info:
        before = lives(evaluation)
        _, _, terminated, truncated, info = evaluation.step(NOOP)
        steps += 1
        lost += [steps] if lives(evaluation) < before else []
        assert steps < 2000, f"the game stalled: lives {lives(evaluation)} after {steps} NOOP steps"
    assert terminated and not truncated and lives(evaluation) == 0 and len(lost) == 5
    assert int(info["episode"]["l"]) == steps + 2 + 4  # the game's length counts FireReset's 2 and 4 served lives
    evaluation.close()

    training = atari("Breakout", noop_max=0, terminal_on_life_loss=False)  # training keeps the agent's own FIRE
    training.reset(seed=0)
    for _ in range(600):
        training.step(NOOP)
    assert lives(training) == 4
    training.close()


def test_pixels_on_an_env_without_frames_or_lives_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^env.pixels.noop_max=30 needs an env whose action 0 is NOOP"):
        make_env(EnvConfig(id="CartPole-v1", pixels=PixelsConfig()))
    with pytest.raises(ConfigError, match=r"^env.pixels needs image observations.*Box\(4\) float32"):
        make_env(EnvConfig(id="CartPole-v1", pixels=PixelsConfig(**MINATAR)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^env.pixels.terminal_on_life_loss=true needs an ALE game"):
        make_env(
            EnvConfig(id=minatar_id("breakout"), pixels=PixelsConfig(**{**MINATAR, "terminal_on_life_loss": True}))
        )  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------------
# MinAtar
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game", MINATAR_GAMES)
def test_minatar_frames_and_a_random_episode(game: str):
    env = make_env(EnvConfig(id=minatar_id(game), pixels=PixelsConfig(**MINATAR)))  # type: ignore[arg-type]
    obs, _ = env.reset(seed=0)
    channels = env.unwrapped.observation_space.shape[2]  # type: ignore[index]
    assert obs.shape == (channels, 10, 10) and obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255}
    env.action_space.seed(0)
    info: dict = {}
    for _ in range(5000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert "episode" in info and int(info["episode"]["l"]) >= 1
    env.close()


def test_minatar_episodes_repeat_with_the_seed():
    def episode(seed: int) -> list[float]:
        env = make_env(EnvConfig(id=minatar_id("asterix"), pixels=PixelsConfig(**MINATAR)))  # type: ignore[arg-type]
        env.reset(seed=seed)
        rewards = [float(env.step(i % 3)[1]) for i in range(200)]
        env.close()
        return rewards

    assert episode(3) == episode(3)


# --------------------------------------------------------------------------------------------------------------------
# the CNN torsos and SB3's CNN policy
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torso", "shape", "features"),
    [
        (NatureCNN, (4, 84, 84), 512),
        (MinAtarCNN, (4, 10, 10), 128),
        (ImpalaCNN, (4, 84, 84), 256),
        (ImpalaCNN, (10, 10, 10), 256),
        (FlatTorso, (4, 10, 10), 256),
    ],
)
def test_torso_output_shapes_and_uint8_scaling(torso: type, shape: tuple[int, ...], features: int):
    torch.manual_seed(0)
    net = torso(shape)
    frames = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)  # [B, C, H, W]
    out = net(frames)
    assert out.shape == (3, features) and net.features_dim == features
    assert torch.allclose(out, net(frames.float() / 255.0), atol=1e-6)  # uint8 is scaled by 1/255 in the torso
    with pytest.raises(ValueError, match=r"frames must be \[B, C, H, W\]"):
        net(frames[0])


def test_auto_picks_the_nature_cnn_for_atari_frames_and_the_small_one_for_minatar():
    assert resolve_arch("auto", (4, 84, 84)) == "nature" and resolve_arch("auto", (4, 10, 10)) == "minatar"
    assert isinstance(make_torso("impala", (4, 10, 10)), ImpalaCNN)


def test_the_flat_torso_with_256_unit_heads_is_gymnax_blines_minatar_mlp():
    """model.arch=flat, pi/vf_hidden_sizes [256], share_features false: per network, the flattened 10x10xC frame into
    two 256-unit ReLU layers and a linear output, as gymnax-blines' CategoricalSeparateMLP."""
    from pgcli.algo.policies import make_policy

    obs_space = gym.spaces.Box(0, 255, (4, 10, 10), np.uint8)
    model = CNNModelConfig(arch="flat", share_features=False, pi_hidden_sizes=[256], vf_hidden_sizes=[256])
    policy = make_policy(obs_space, gym.spaces.Discrete(3), model)
    linears = [m for m in policy.net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(400, 256), (256, 256), (256, 3)]
    assert not [m for m in policy.net.modules() if isinstance(m, torch.nn.Conv2d)]
    frames = torch.randint(0, 256, (2, 4, 10, 10), dtype=torch.uint8)
    assert policy.net(frames).shape == (2, 3)


def test_sb3_ppo_takes_uint8_frames_through_its_cnn_policy():
    from stable_baselines3 import PPO

    from pgcli.algo.sb3 import CNNFeatures, SB3VecEnv, policy_kwargs, sb3_policy
    from pgcli.envs.make import make_vec_env

    env = make_vec_env(EnvConfig(id=minatar_id("breakout"), n_envs=2, pixels=PixelsConfig(**MINATAR)), seed=0)  # type: ignore[arg-type]
    model = CNNModelConfig(share_features=False, pi_hidden_sizes=[32])
    ppo = PPO(sb3_policy(model), SB3VecEnv(env), policy_kwargs=policy_kwargs(model), n_steps=8, batch_size=16, seed=0)
    policy = ppo.policy
    assert isinstance(policy.pi_features_extractor, CNNFeatures) and policy.pi_features_extractor.features_dim == 128
    assert policy.pi_features_extractor is not policy.vf_features_extractor
    assert ppo.rollout_buffer.observations.dtype == np.uint8  # frames stay uint8 in the rollout buffer
    obs, _ = env.reset(seed=0)
    as_tensor = torch.as_tensor(obs)
    with torch.no_grad():  # SB3 scales the uint8 frames to [0, 1] before the torso
        expected = policy.pi_features_extractor.torso(as_tensor)
        pi_features, _ = policy.extract_features(as_tensor)
    assert torch.allclose(pi_features, expected)
    actions, _ = ppo.predict(obs, deterministic=True)
    assert actions.shape == (2,)
    env.close()


# --------------------------------------------------------------------------------------------------------------------
# pgcli's own trainers on frames: uint8 buffers, the torso shared or not
# --------------------------------------------------------------------------------------------------------------------


def minatar_env(n_envs: int = 2):
    from pgcli.envs.make import make_vec_env

    return make_vec_env(EnvConfig(id=minatar_id("breakout"), n_envs=n_envs, pixels=PixelsConfig(**MINATAR)), seed=0)  # type: ignore[arg-type]


class NoMonitor:
    def episodes(self, step: int, info: dict) -> None:
        pass


def test_the_rollout_buffer_keeps_uint8_frames_and_the_networks_scale_them():
    from pgcli.algo.policies import make_actor_critic
    from pgcli.algo.rollout import RolloutCollector

    env = minatar_env()
    policy, value = make_actor_critic(env.single_observation_space, env.single_action_space, CNNModelConfig())
    collector = RolloutCollector(env, n_steps=8, seed=0, device=torch.device("cpu"))
    batch = collector.collect(policy, value, NoMonitor(), 0)  # type: ignore[arg-type]
    assert collector.obs.dtype == collector.final_obs.dtype == batch.obs.dtype == torch.uint8
    assert batch.obs.shape == (8, 2, 4, 10, 10) and set(batch.obs.unique().tolist()) <= {0, 255}  # MinAtar's 0/1
    frames = batch.obs.flatten(0, 1)  # [16, 4, 10, 10] uint8
    with torch.no_grad():  # scaled by 1/255 inside: the uint8 batch and its float twin in [0, 1] agree
        assert torch.allclose(policy.dist_params(frames)[0], policy.dist_params(frames.float() / 255)[0], atol=1e-6)
        assert torch.allclose(value(frames), value(frames.float() / 255), atol=1e-6)
        assert not torch.allclose(value(frames), value(frames.float()))  # a float frame is taken as scaled already
    obs, _ = env.reset(seed=1)
    assert obs.dtype == np.uint8 and policy.predict(obs).shape == (2,)  # numpy frames act as uint8 too
    env.close()


@pytest.mark.parametrize("share", [True, False])
def test_share_features_gives_one_torso_or_one_each(share: bool):
    from pgcli.algo.policies import shares_parameters
    from pgcli.algo.ppo_kl import PPOKL
    from pgcli.config import PPOKLConfig

    trainer = PPOKL(
        PPOKLConfig(n_steps=8, batch_size=8),
        env=minatar_env(),
        model=CNNModelConfig(share_features=share),
        seed=0,
        device=torch.device("cpu"),
    )
    policy, value = trainer.policy, trainer.value
    assert (policy.net.torso is value.net.torso) == share == shares_parameters(policy, value)  # type: ignore[attr-defined]
    n_torso = sum(1 for _ in policy.net.torso.parameters())  # type: ignore[attr-defined]
    n_all = len(policy.actor_parameters()) + len(value.critic_parameters())
    assert len(trainer.params) == len({id(p) for p in trainer.params}) == n_all - (n_torso if share else 0)
    trainer.close()


# --------------------------------------------------------------------------------------------------------------------
# config: the implied model and the one-line errors
# --------------------------------------------------------------------------------------------------------------------


def test_the_image_env_options_are_exactly_those_with_a_pixels_section():
    options = sorted(p.stem for p in (Path(CONF_DIR) / "env").glob("*.yaml"))
    assert set(IMAGE_ENVS) <= set(options)
    from pgcli.config.compose import compose_train_config

    for option in options:
        if option in TEXT_ENV_CONFIGS:
            continue
        cfg = compose_train_config([f"env={option}"])
        assert (cfg.env.pixels is not None) == (option in IMAGE_ENVS), option
        assert isinstance(cfg.model, CNNModelConfig) == (option in IMAGE_ENVS), option  # model=cnn is implied


def test_an_image_env_implies_model_cnn_unless_a_model_is_named():
    assert text_task_overrides(["env=pong"]) == ["model=cnn"]
    assert text_task_overrides(["env=pong,minatar_breakout", "seed=1"]) == ["model=cnn"]  # a sweep of image envs
    assert text_task_overrides(["env=pong", "model=cnn"]) == [] and text_task_overrides(["env=pong,cartpole"]) == []


@pytest.mark.parametrize("algo", ["ppo", "a2c", "sb3_trpo", "trpo", "vpg", "ppo_kl", "grpo"])
@pytest.mark.parametrize("env", ["pong", "minatar_breakout"])
def test_every_control_algo_composes_on_image_envs(algo: str, env: str):
    cfg = train_config([f"algo={algo}", f"env={env}"])
    assert isinstance(cfg.model, CNNModelConfig) and cfg.env.pixels is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["env=pong", "model=mlp"],
            r"^env.id 'ale_py:PongNoFrameskip-v4' is an image env \(env.pixels is set\): "
            r"it needs model=cnn \(got an MLP model option\)$",
        ),
        (
            ["env=cartpole", "model=cnn"],
            r"^model=cnn needs an image env .*; env.id 'CartPole-v1' has none: use "
            r"model=mlp$",
        ),
        (
            ["algo=trpo", "env=minatar_breakout", "algo.critic_process=true"],
            r"^algo.critic_process=true needs "
            r"model.share_features=false: the critic process fits the value network while the policy step moves the "
            r"torso they share$",
        ),
        (
            ["env=minatar_breakout", "model.arch=nature"],
            r"^model.arch=nature needs frames of 36x36 px or more; "
            r"env.id 'MinAtar/Breakout-v1' gives Box\(4, 10, 10\) uint8; use model.arch=auto \(MinAtar's "
            r"network for frames under 36 px\) or model.arch=impala$",
        ),
        (["env=pong", "env.normalize_obs=true"], r"^env.normalize_obs must be false on an image env"),
        (["env=pong", "env.pixels.frame_stack=0"], r"^env.pixels.frame_stack must be >= 1 \(got 0\)"),
        (["env=pong", "model.arch=resnet"], r"^model.arch must be one of auto, nature, minatar, impala"),
    ],
)
def test_image_run_mistakes_are_one_line_errors(overrides: list[str], message: str):
    with pytest.raises(ConfigError, match=message):
        train_config(overrides)


@pytest.mark.parametrize(("env", "package"), [("pong", "ale_py"), ("minatar_breakout", "minatar")])
def test_a_missing_package_names_the_install_command(env: str, package: str, monkeypatch: pytest.MonkeyPatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    dist = package.replace("_", "-")
    with pytest.raises(
        ConfigError, match=rf"needs the {dist} package, which is not installed: pip install 'pgcli\[pixels\]'$"
    ):
        train_config([f"env={env}"])


def test_the_evaluators_envs_play_whole_games_on_raw_rewards():
    # the training-only preprocessing (a lost life ends the episode, reward signs) stays out of every evaluation
    from pgcli.envs.pixels import EpisodicLife, SignReward
    from pgcli.training.evaluation import eval_plan

    cfg = train_config(["algo=ppo", "env=breakout", "tracking=off"])
    env = eval_plan(cfg.env, cfg.eval, seed=0).make_env()
    try:
        chain, sub = [], env.unwrapped.envs[0]  # type: ignore[attr-defined]
        while isinstance(sub, gym.Wrapper):
            chain.append(type(sub))
            sub = sub.env
        assert chain and EpisodicLife not in chain and SignReward not in chain
    finally:
        env.close()


@pytest.mark.parametrize("game", MINATAR_GAMES)
def test_a_minatar_games_checkpointed_state_replays_the_same_frames(game: str):
    import json

    env = gym.make(minatar_id(game)).unwrapped
    env.reset(seed=5)
    rng = np.random.default_rng(0)
    for action in rng.integers(0, env.action_space.n, size=40):
        env.step(int(action))
    saved = json.loads(json.dumps(env.checkpoint_state()))  # as a checkpoint's state.json holds it
    actions = [int(a) for a in rng.integers(0, env.action_space.n, size=60)]
    first = [env.step(a)[:3] for a in actions]
    env.restore_checkpoint_state(saved)
    again = [env.step(a)[:3] for a in actions]
    for (obs_a, r_a, end_a), (obs_b, r_b, end_b) in zip(first, again, strict=True):
        assert np.array_equal(obs_a, obs_b) and r_a == r_b and end_a == end_b
