"""GRPO trainer: group collection on the vector env, the clipped loss, one update, degenerate groups, save/load."""

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pgcli.algo.grpo import GRPO, EpisodeBatch, collect_groups, grpo_loss
from pgcli.config import EnvConfig, GRPOConfig, ModelConfig
from pgcli.envs.make import make_vec_env

CPU = torch.device("cpu")


def make_trainer(env_id: str = "CartPole-v1", n_envs: int = 4, **algo) -> GRPO:
    torch.manual_seed(0)
    env = make_vec_env(EnvConfig(id=env_id, n_envs=n_envs), seed=0)
    return GRPO(GRPOConfig(**algo), env=env, model=ModelConfig(), seed=0, device=CPU)


def params_of(trainer: GRPO) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.policy.parameters()]


class Recorder:
    """Stands in for TrainingMonitor: keeps what a trainer reports."""

    def __init__(self) -> None:
        self.episodes: list[tuple[int, list[float], list[int]]] = []
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.updates: list[int] = []

    def add_episodes(self, step, returns, lengths):
        self.episodes.append((step, list(returns), list(lengths)))

    def log(self, step, metrics):
        self.metrics.append((step, dict(metrics)))

    def update(self, step, agent):
        self.updates.append(step)


# --- group collection ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env_id", "n_envs"), [("CartPole-v1", 4), ("CartPole-v1", 3), ("Pendulum-v1", 8)])
def test_members_of_a_group_start_from_identical_observations(env_id, n_envs):
    # n_envs = 3 < G = 4 and not dividing E = 12: members are handed to sub-envs as they free up
    trainer = make_trainer(env_id, n_envs)
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[11, 22, 33], group_size=4, device=CPU)
    first = batch.obs[:, 0].view(3, 4, -1)  # [M, G, D]
    assert torch.equal(first, first[:, :1].expand_as(first))  # identical within each group
    assert not torch.equal(first[0, 0], first[1, 0]) and not torch.equal(first[1, 0], first[2, 0])
    expected = torch.as_tensor(gym.make(env_id).reset(seed=22)[0])
    assert torch.equal(first[1, 0], expected)  # the group's start is reset(seed=s)


def test_members_diverge_and_replaying_their_actions_reproduces_them():
    # the gather from [T, N] buffers into [E, L] episodes must keep each member's own steps in order
    trainer = make_trainer("CartPole-v1", n_envs=3)
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[5, 6], group_size=4, device=CPU)
    assert batch.mask.sum(1).tolist() == batch.lengths
    assert len({tuple(batch.actions[e, :5].tolist()) for e in range(8)}) > 1  # stochastic members differ
    for e, length in enumerate(batch.lengths):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=[5, 6][e // 4])
        for t in range(length):
            assert np.allclose(batch.obs[e, t].numpy(), obs)
            obs, reward, terminated, truncated, _ = env.step(int(batch.actions[e, t]))
            assert batch.rewards[e, t] == reward
        assert terminated or truncated  # the episode ended exactly at its recorded length
        assert batch.returns[e] == float(batch.rewards[e, :length].sum())


def test_steps_counted_are_every_env_step_taken():
    trainer = make_trainer("CartPole-v1", n_envs=3)
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[1, 2], group_size=4, device=CPU)
    assert batch.env_steps % 3 == 0  # whole vector steps, idle sub-envs included
    assert batch.env_steps >= sum(batch.lengths)
    assert batch.env_steps < sum(batch.lengths) + 3 * max(batch.lengths)  # only the tail of the batch idles


def test_learn_counts_env_steps_and_reports_to_the_monitor():
    trainer = make_trainer(n_envs=4, group_size=4, n_groups=2, batch_size=4, n_iterations=1)
    monitor = Recorder()
    steps = trainer.learn(300, monitor)  # type: ignore[arg-type]
    assert steps >= 300 and steps == monitor.updates[-1] == trainer.steps
    assert sum(len(returns) for _, returns, _ in monitor.episodes) == 8 * len(monitor.updates)
    keys = set(monitor.metrics[-1][1])
    assert {
        "train/group_return_mean",
        "train/group_return_std",
        "train/degenerate_frac",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/approx_kl",
        "train/entropy",
        "train/policy_loss",
    } <= keys
    assert "train/kl_ref" not in keys  # beta = 0: no reference policy at all
    assert trainer.ref_policy is None


# --- the loss -----------------------------------------------------------------------------------------------------


def test_asymmetric_clip_bounds_clip_the_upper_side_later():
    # ratio 1.25 on positive advantages: clipped by [0.8, 1.2], not by [0.8, 1.28] (DAPO clip-higher);
    # ratio 0.75 on negative advantages: clipped at the low bound by both
    trainer = make_trainer()
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[3], group_size=4, device=CPU)
    with torch.no_grad():
        logp = trainer.policy.log_prob(batch.obs.flatten(0, 1), batch.actions.flatten(0, 1)).view_as(batch.mask)
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None].expand_as(batch.mask).contiguous()
    ratio = torch.tensor([1.25, 1.25, 0.75, 0.75])[:, None]
    old_logp = logp - ratio.log()
    n_real = batch.mask.sum()
    high_share = float(batch.mask[:2].sum() / n_real)
    low_share = float(batch.mask[2:].sum() / n_real)

    def loss(**clip):
        trainer.policy.zero_grad()
        out = grpo_loss(
            trainer.policy,
            GRPOConfig(**clip),
            obs=batch.obs,
            actions=batch.actions,
            old_logp=old_logp,
            ref_logp=None,
            advantages=advantages,
            mask=batch.mask,
            max_len=500,
        )
        out.loss_policy.backward()
        grad = sum(float(p.grad.abs().sum()) for p in trainer.policy.parameters())
        return out, grad

    symmetric, grad_symmetric = loss(epsilon=0.2)
    assert symmetric.clip_frac_high == pytest.approx(high_share)
    assert symmetric.clip_frac_low == pytest.approx(low_share)
    assert grad_symmetric == 0.0  # every step is clipped: no gradient
    asymmetric, grad_asymmetric = loss(epsilon=0.2, epsilon_high=0.28)
    assert asymmetric.clip_frac_high == 0.0
    assert asymmetric.clip_frac_low == pytest.approx(low_share)
    assert grad_asymmetric > 0.0  # the positive-advantage steps still push
    # token_mean of -min(r A, clip(r) A) = -(1.25 * n_pos - 0.8 * n_neg) / n_real
    n_pos, n_neg = float(batch.mask[:2].sum()), float(batch.mask[2:].sum())
    assert asymmetric.loss_policy.item() == pytest.approx(-(1.25 * n_pos - 0.8 * n_neg) / float(n_real), rel=1e-5)


# --- the update ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_agg", ["seq_mean", "token_mean", "constant"])
def test_one_update_changes_the_policy(loss_agg):
    trainer = make_trainer(loss_agg=loss_agg, group_size=4, n_groups=2, batch_size=4, n_iterations=2)
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[1, 2], group_size=4, device=CPU)
    before = params_of(trainer)
    stats = trainer._update(batch)
    assert any(not torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))
    assert stats["train/approx_kl"] > 0.0 and math.isfinite(stats["train/policy_loss"])
    assert stats["train/n_episodes_used"] == 8.0


def fake_batch(returns_per_group: list[list[float]], obs_dim: int = 4) -> EpisodeBatch:
    """One-step episodes with the given returns (reward = return), group after group."""
    rewards = torch.tensor([r for group in returns_per_group for r in group])[:, None]  # [E, 1]
    n_episodes, group_size = rewards.shape[0], len(returns_per_group[0])
    return EpisodeBatch(
        obs=torch.randn(n_episodes, 1, obs_dim),
        actions=torch.randint(0, 2, (n_episodes, 1)),
        rewards=rewards,
        mask=torch.ones(n_episodes, 1),
        group_ids=torch.arange(len(returns_per_group)).repeat_interleave(group_size),
        returns=rewards[:, 0].tolist(),
        lengths=[1] * n_episodes,
        env_steps=n_episodes,
    )


def test_degenerate_groups_are_dropped_when_asked():
    batch = fake_batch([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0]])  # group 0 carries no signal
    kept = make_trainer(group_size=4, n_groups=2, batch_size=8)._update(batch)
    assert kept["train/degenerate_frac"] == 0.5 and kept["train/n_episodes_used"] == 8.0
    dropped = make_trainer(group_size=4, n_groups=2, batch_size=8, drop_degenerate_groups=True)._update(batch)
    assert dropped["train/degenerate_frac"] == 0.5 and dropped["train/n_episodes_used"] == 4.0


def test_an_all_degenerate_batch_leaves_the_policy_alone():
    trainer = make_trainer(group_size=4, n_groups=2, drop_degenerate_groups=True)
    before = params_of(trainer)
    stats = trainer._update(fake_batch([[1.0] * 4, [2.0] * 4]))
    assert stats["train/degenerate_frac"] == 1.0 and stats["train/n_episodes_used"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))


def test_kl_to_the_reference_is_logged_and_the_reference_refreshes():
    trainer = make_trainer(group_size=4, n_groups=2, batch_size=4, beta=0.1, ref_update_interval=2)
    assert trainer.ref_policy is not None
    initial = [p.detach().clone() for p in trainer.ref_policy.parameters()]
    batch = collect_groups(trainer.env, trainer.policy, group_seeds=[1, 2], group_size=4, device=CPU)
    stats = trainer._update(batch)
    assert stats["train/kl_ref"] >= 0.0
    assert all(torch.equal(a, b) for a, b in zip(initial, trainer.ref_policy.parameters(), strict=True))
    trainer._update(batch)  # second update: the reference becomes the current policy
    assert all(torch.equal(a, b) for a, b in zip(params_of(trainer), trainer.ref_policy.parameters(), strict=True))


def test_save_load_round_trip(tmp_path: Path):
    env = make_vec_env(EnvConfig(id="Pendulum-v1", n_envs=2, normalize_obs=True), seed=0)
    trainer = GRPO(GRPOConfig(group_size=2, n_groups=1, batch_size=2), env=env, model=ModelConfig(), seed=0, device=CPU)
    trainer._update(collect_groups(env, trainer.policy, group_seeds=[1], group_size=2, device=CPU))
    path = trainer.save(tmp_path / "model")
    assert (path / "model.pt").is_file() and (path / "normalizer.npz").is_file()
    env2 = make_vec_env(EnvConfig(id="Pendulum-v1", n_envs=2, normalize_obs=True), seed=1)
    restored = GRPO(
        GRPOConfig(group_size=2, n_groups=1, batch_size=2), env=env2, model=ModelConfig(), seed=1, device=CPU
    )
    restored.load(path)
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    assert np.array_equal(trainer.act(obs), restored.act(obs))
