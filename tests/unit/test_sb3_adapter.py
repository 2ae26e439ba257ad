"""pgcli.algo.sb3: SB3VecEnv (SB3's VecEnv API over a pgcli env) and the model -> policy_kwargs mapping."""

from __future__ import annotations

import numpy as np
import pytest

from pgcli.algo.sb3 import SB3VecEnv, policy_kwargs
from pgcli.config import EnvConfig, ModelConfig
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer


def adapter(cfg: EnvConfig, seed: int = 0) -> SB3VecEnv:
    return SB3VecEnv(make_vec_env(cfg, seed=seed))


def test_truncation_carries_terminal_observation_timelimit_flag_and_episode():
    vec = adapter(EnvConfig(id="Pendulum-v1", n_envs=2, max_episode_steps=4))
    twin = make_vec_env(EnvConfig(id="Pendulum-v1", n_envs=2, max_episode_steps=5), seed=0)  # no reset at step 4
    vec.seed(0)
    np.testing.assert_array_equal(vec.reset(), twin.reset(seed=0)[0])  # SB3's seed() reaches the pgcli env
    actions = np.full((2, 1), 0.3, dtype=np.float32)
    total = np.zeros(2)
    for t in range(4):
        obs, rewards, dones, infos = vec.step(actions)
        twin_obs, twin_rewards, *_ = twin.step(actions)
        total += twin_rewards
        assert rewards.dtype == np.float32 and dones.dtype == bool
        np.testing.assert_allclose(rewards, twin_rewards, rtol=1e-6)
        if t < 3:
            assert not dones.any() and infos == [{}, {}]
    assert dones.all()
    for i, info in enumerate(infos):
        assert info["TimeLimit.truncated"] is True
        np.testing.assert_allclose(info["terminal_observation"], twin_obs[i], rtol=1e-6)  # the true last state
        assert info["episode"]["l"] == 4
        assert info["episode"]["r"] == pytest.approx(total[i], rel=1e-5)
    assert not np.allclose(obs, twin_obs)  # the returned obs is already the next episode's first observation
    vec.close()
    twin.close()


def test_termination_is_not_flagged_as_truncation():
    vec = adapter(EnvConfig(id="CartPole-v1", n_envs=2))
    vec.reset()
    for _ in range(100):  # pushing left drops the pole within ~10 steps
        _, _, dones, infos = vec.step(np.zeros(2, dtype=np.int64))
        if dones.any():
            break
    i = int(np.flatnonzero(dones)[0])
    assert infos[i]["TimeLimit.truncated"] is False
    assert "terminal_observation" in infos[i] and infos[i]["episode"]["l"] < 100
    vec.close()


def test_attribute_access_reaches_the_sub_envs_through_normalisation():
    vec = adapter(EnvConfig(id="Pendulum-v1", n_envs=3, normalize_obs=True))
    assert find_normalizer(vec.venv) is not None
    assert vec.render_mode is None
    assert [spec.id for spec in vec.get_attr("spec")] == ["Pendulum-v1"] * 3
    assert len(vec.get_attr("spec", indices=[1])) == 1
    assert vec.env_method("get_wrapper_attr", "spec", indices=[0, 2])[1].id == "Pendulum-v1"
    vec.close()


def test_policy_kwargs_from_the_backend_neutral_model():
    import torch

    kwargs = policy_kwargs(ModelConfig(pi_hidden_sizes=[32], vf_hidden_sizes=[16, 8], activation="relu"))
    assert kwargs["net_arch"] == {"pi": [32], "vf": [16, 8]}
    assert kwargs["activation_fn"] is torch.nn.ReLU
    assert kwargs["ortho_init"] is True and kwargs["log_std_init"] == 0.0


def test_sb3_ppo_trains_on_the_adapter():
    from stable_baselines3 import PPO

    vec = adapter(EnvConfig(id="CartPole-v1", n_envs=2))
    model = PPO("MlpPolicy", vec, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu", verbose=0)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(128)
    assert model.num_timesteps == 128
    assert any(not torch_equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))
    assert len(model.ep_info_buffer) > 0  # SB3 saw the episode statistics the adapter forwards
    vec.close()


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b.detach()))


def test_the_monitor_sees_each_update_after_it_is_applied():
    # SB3 trains between one rollout's end and the next one's start: the monitor's bookkeeping (evaluation included)
    # must come after the update, or an evaluation at the final step scores the policy one update old (the objective
    # of a search trial, and the reported final return, would then miss the last update).
    import torch

    from pgcli.algo.sb3 import SB3Trainer
    from pgcli.config import PPOConfig

    class Recorder:
        def __init__(self) -> None:
            self.seen: list[tuple[int, int]] = []

        def update(self, step: int, agent: SB3Trainer) -> None:
            self.seen.append((step, agent.model._n_updates))

        def log(self, step: int, metrics: dict[str, float]) -> None:
            pass

        def add_episodes(self, step: int, returns: list[float], lengths: list[int]) -> None:
            pass

    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0)
    trainer = SB3Trainer(
        PPOConfig(n_steps=32, batch_size=32, n_epochs=1),
        env=env,
        model=ModelConfig(),
        seed=0,
        device=torch.device("cpu"),
    )
    recorder = Recorder()
    assert trainer.learn(192, recorder) == 192  # type: ignore[arg-type]
    assert recorder.seen == [(64, 1), (128, 2), (192, 3)]  # (env steps, updates applied) at each call
    trainer.close()


@pytest.mark.parametrize("tf_like", [False, True])
def test_a2c_rmsprop_is_torchs_or_tensorflows_with_the_configured_eps(tf_like: bool):
    # rl-baselines3-zoo's Atari A2C trains with SB3's RMSpropTFLike (the a2c_breakout / a2c_pong presets);
    # otherwise SB3's default, torch's RMSprop. Both with alpha 0.99 and algo.rms_prop_eps.
    import torch
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    from pgcli.algo.sb3 import SB3Trainer
    from pgcli.config import A2CConfig

    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0)
    cfg = A2CConfig(rms_prop_eps=1e-3, rms_prop_tf_like=tf_like)
    trainer = SB3Trainer(cfg, env=env, model=ModelConfig(pi_hidden_sizes=[32]), seed=0, device=torch.device("cpu"))
    optimizer = trainer.model.policy.optimizer
    assert type(optimizer) is (RMSpropTFLike if tf_like else torch.optim.RMSprop)
    assert (optimizer.defaults["alpha"], optimizer.defaults["eps"]) == (0.99, 1e-3)
    assert trainer.model.policy.mlp_extractor.policy_net[0].out_features == 32  # the model's own kwargs still apply
    trainer.close()


def test_the_atari_a2c_presets_train_with_tensorflows_rmsprop():
    from pgcli.config.compose import compose_train_config

    for game in ("breakout", "pong"):
        cfg = compose_train_config(["algo=a2c", f"env={game}"])
        assert cfg.algo.rms_prop_tf_like and cfg.algo.rms_prop_eps == 1e-5  # type: ignore[union-attr]


def test_ppo_clip_range_vf_reaches_sb3_on_the_clip_ranges_schedule():
    import torch

    from pgcli.algo.sb3 import SB3Trainer
    from pgcli.config import PPOConfig

    for cfg, at_half in (
        (PPOConfig(n_steps=32), None),
        (PPOConfig(n_steps=32, clip_range_vf=0.2), 0.2),
        (PPOConfig(n_steps=32, clip_range_vf=0.2, clip_range_schedule="linear"), 0.1),
    ):
        env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0)
        trainer = SB3Trainer(cfg, env=env, model=ModelConfig(), seed=0, device=torch.device("cpu"))
        clip_vf = trainer.model.clip_range_vf  # SB3 makes a schedule of it: progress remaining (1 -> 0) -> value
        assert (clip_vf if clip_vf is None else clip_vf(0.5)) == at_half
        trainer.close()


def test_a_bad_clip_range_vf_is_one_line():
    from pgcli.config import PPOConfig
    from pgcli.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^algo.clip_range_vf must be > 0 \(got 0.0\); typical: 0.2; null turns"):
        PPOConfig(clip_range_vf=0.0)
