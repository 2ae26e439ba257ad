"""TRPO, VPG and PPO-Penalty updates on tiny real batches: trust region, line-search failure, beta rule, save/load."""

from pathlib import Path

import pytest
import torch

from pgcli.algo.policies import detach_params, make_policy
from pgcli.algo.ppo_kl import PPOKL
from pgcli.algo.trpo import TRPO, fisher_vector_product_fn, linear_schedule
from pgcli.algo.vpg import VPG
from pgcli.config import EnvConfig, ModelConfig, PPOKLConfig, TRPOConfig, VPGConfig
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.ops.autodiff import fisher_vector_product, flat_params
from pgcli.ops.losses import ppo_penalty_beta_update

CPU = torch.device("cpu")


class RecordingMonitor:
    """Stands in for TrainingMonitor: keeps the train/* metrics of each update."""

    def __init__(self) -> None:
        self.updates: list[dict[str, float]] = []

    def episodes(self, step, info) -> None:
        pass

    def log(self, step, metrics) -> None:
        self.updates.append(dict(metrics))

    def update(self, step, agent) -> None:
        pass


def make(trainer_cls, cfg, env_id: str = "CartPole-v1", **env_kwargs):
    torch.manual_seed(0)
    env = make_vec_env(EnvConfig(id=env_id, n_envs=2, **env_kwargs), seed=0)
    return trainer_cls(cfg, env=env, model=ModelConfig(pi_hidden_sizes=[16], vf_hidden_sizes=[16]), seed=0, device=CPU)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_fisher_vector_product_fn_matches_the_ops_reference(env_id):
    env = make_vec_env(EnvConfig(id=env_id, n_envs=1), seed=0)
    torch.manual_seed(0)
    policy = make_policy(env.single_observation_space, env.single_action_space, ModelConfig(pi_hidden_sizes=[8]))
    obs = torch.randn(50, env.single_observation_space.shape[0])
    params = policy.actor_parameters()
    new = policy.dist_params(obs)
    kl = policy.kl_of(detach_params(new), new).mean()
    fvp = fisher_vector_product_fn(kl, params, damping=0.1)
    for _ in range(3):
        v = torch.randn(sum(p.numel() for p in params))
        assert torch.allclose(fvp(v), fisher_vector_product(kl, params, v, damping=0.1), atol=1e-6)


def test_trpo_accepted_steps_stay_inside_the_trust_region():
    trpo = make(TRPO, TRPOConfig(n_steps=128, target_kl=0.005, n_critic_updates=1))
    monitor = RecordingMonitor()
    trpo.learn(4 * 256, monitor)
    assert len(monitor.updates) == 4
    for stats in monitor.updates:
        assert stats["train/line_search_success"] == 1.0
        assert 0.0 < stats["train/kl"] <= 0.005
        assert stats["train/surrogate_improvement"] > 0.0


def test_trpo_line_search_failure_restores_the_policy_bit_for_bit(monkeypatch):
    trpo = make(TRPO, TRPOConfig(n_steps=128, line_search_max_iter=4, n_critic_updates=1))
    kl_of = trpo.policy.kl_of
    # every candidate's KL is over the radius; the constant leaves the gradients, hence CG and the step, unchanged
    monkeypatch.setattr(trpo.policy, "kl_of", lambda old, new: kl_of(old, new) + 1.0)
    before = flat_params(trpo.policy.actor_parameters())
    value_before = flat_params(trpo.value.critic_parameters())
    monitor = RecordingMonitor()
    trpo.learn(256, monitor)
    (stats,) = monitor.updates
    assert stats["train/line_search_success"] == 0.0 and stats["train/line_search_steps"] == 3
    assert stats["train/step_size"] > 0.0  # a real step was proposed, and rejected
    assert torch.equal(flat_params(trpo.policy.actor_parameters()), before)
    assert not torch.equal(flat_params(trpo.value.critic_parameters()), value_before)  # the critic still learns


def test_npg_takes_the_full_trust_region_step_without_search():
    trpo = make(TRPO, TRPOConfig(n_steps=128, npg=True, n_critic_updates=1))
    before = flat_params(trpo.policy.actor_parameters())
    monitor = RecordingMonitor()
    trpo.learn(256, monitor)
    (stats,) = monitor.updates
    moved = (flat_params(trpo.policy.actor_parameters()) - before).norm().item()
    assert stats["train/line_search_steps"] == 0.0
    assert moved == pytest.approx(stats["train/step_size"], rel=1e-4)


def test_ppo_kl_applies_the_adaptive_beta_rule_after_each_update():
    ppo = make(PPOKL, PPOKLConfig(n_steps=128, batch_size=64, n_epochs=2, beta_init=1.0, kl_target=0.01))
    monitor = RecordingMonitor()
    ppo.learn(3 * 256, monitor)
    beta = 1.0
    for stats in monitor.updates:
        assert stats["train/beta"] == beta
        beta = ppo_penalty_beta_update(beta, stats["train/kl"], 0.01)
        assert stats["train/beta_next"] == beta
    assert ppo.beta == beta


@pytest.mark.parametrize(
    ("trainer_cls", "cfg"),
    [
        (TRPO, TRPOConfig(n_steps=64, n_critic_updates=1)),
        (VPG, VPGConfig(n_steps=64, n_critic_updates=1)),
        (PPOKL, PPOKLConfig(n_steps=64, n_epochs=1)),
    ],
)
def test_save_load_round_trip_keeps_networks_and_observation_statistics(trainer_cls, cfg, tmp_path: Path):
    trainer = make(trainer_cls, cfg, "Pendulum-v1", normalize_obs=True, normalize_reward=True)
    trainer.learn(256, RecordingMonitor())
    saved = trainer.save(tmp_path / "model")
    stats = find_normalizer(trainer.env).obs_rms
    assert (saved / "normalizer.npz").is_file() and stats.count > 256

    fresh = make(trainer_cls, cfg, "Pendulum-v1", normalize_obs=True, normalize_reward=True)
    fresh.load(saved)
    loaded = find_normalizer(fresh.env)
    assert loaded.obs_rms.count == stats.count and loaded.training  # as saved: a resumed run keeps learning them
    assert (loaded.obs_rms.mean == stats.mean).all() and (loaded.obs_rms.var == stats.var).all()
    for name in ("policy", "value"):
        a, b = getattr(trainer, name).state_dict(), getattr(fresh, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    for name, optimizer in trainer._stateful().items():
        if isinstance(optimizer, torch.optim.Optimizer):  # Adam's moments come back too: training resumes exactly
            a, b = optimizer.state_dict()["state"], getattr(fresh, name).state_dict()["state"]
            assert a.keys() == b.keys() and all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)
    assert getattr(fresh, "beta", None) == getattr(trainer, "beta", None)  # PPO-Penalty's adaptive beta
    obs = fresh.env.reset(seed=1)[0]
    assert (fresh.act(obs) == trainer.act(obs)).all()  # the same deterministic actions


def test_trpo_falls_back_to_double_backprop_for_other_activations():
    # elu has no explicit Jacobian in pgcli (Policy.fisher_product is None): F v comes from the KL's Hessian
    torch.manual_seed(0)
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0)
    model = ModelConfig(pi_hidden_sizes=[16], vf_hidden_sizes=[16], activation="elu")
    trpo = TRPO(TRPOConfig(n_steps=128, target_kl=0.005, n_critic_updates=1), env=env, model=model, seed=0, device=CPU)
    monitor = RecordingMonitor()
    trpo.learn(2 * 256, monitor)
    assert all(s["train/line_search_success"] == 1.0 and 0.0 < s["train/kl"] <= 0.005 for s in monitor.updates)


def test_linear_schedule_hand_values():
    assert linear_schedule(0.01, 0.001, 0, 1000) == pytest.approx(0.01)
    assert linear_schedule(0.01, 0.001, 250, 1000) == pytest.approx(0.00775)
    assert linear_schedule(0.01, 0.001, 500, 1000) == pytest.approx(0.0055)
    assert linear_schedule(0.01, 0.001, 1000, 1000) == pytest.approx(0.001)
    assert linear_schedule(0.01, 0.001, 1300, 1000) == pytest.approx(0.001)  # a last rollout past the budget
    assert linear_schedule(1e-3, 0.0, 750, 1000) == pytest.approx(2.5e-4)


def test_trpo_linear_trust_region_shrinks_per_update_and_bounds_each_step():
    cfg = TRPOConfig(
        n_steps=128, target_kl=0.01, target_kl_schedule="linear", target_kl_final=0.002, n_critic_updates=1
    )
    trpo = make(TRPO, cfg)
    monitor = RecordingMonitor()
    trpo.learn(4 * 256, monitor)
    # radius by the steps before each update's rollout: 0, 256, 512, 768 of 1024
    expected = [0.01, 0.008, 0.006, 0.004]
    assert [u["train/target_kl"] for u in monitor.updates] == pytest.approx(expected)
    for stats, radius in zip(monitor.updates, expected, strict=True):
        assert stats["train/line_search_success"] == 1.0
        assert 0.0 < stats["train/kl"] <= radius
    assert [u["train/vf_learning_rate"] for u in monitor.updates] == [1e-3] * 4  # not scheduled


def test_trpo_npg_step_follows_the_scheduled_radius():
    # NPG takes the full step: its size is sqrt(2 delta / s^T F s) |s|, so it scales with sqrt(delta) of the update
    steps = {}
    for final in (0.01, 0.0025):
        cfg = TRPOConfig(
            n_steps=128,
            npg=True,
            target_kl=0.01,
            target_kl_schedule="linear",
            target_kl_final=final,
            n_critic_updates=1,
        )
        monitor = RecordingMonitor()
        make(TRPO, cfg).learn(2 * 256, monitor)
        steps[final] = [u["train/step_size"] for u in monitor.updates]
    # the first update has the same radius (0.01) and the same data: the same step
    assert steps[0.0025][0] == pytest.approx(steps[0.01][0], rel=1e-6)
    # the second: radius 0.01 vs 0.01 - 0.0075 / 2 = 0.00625 (different policies, so compare the radius via the log)
    assert steps[0.0025][1] < steps[0.01][1]


def test_trpo_schedule_with_equal_ends_is_bit_identical_to_constant():
    runs = []
    for schedule in ("constant", "linear"):
        cfg = TRPOConfig(n_steps=128, target_kl_schedule=schedule, target_kl_final=0.01, n_critic_updates=2)
        trpo = make(TRPO, cfg)
        trpo.learn(3 * 256, RecordingMonitor())
        runs.append((flat_params(trpo.policy.actor_parameters()), flat_params(trpo.value.critic_parameters())))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_trpo_critic_step_size_decays_linearly_to_zero():
    trpo = make(TRPO, TRPOConfig(n_steps=128, learning_rate=1e-3, lr_schedule="linear", n_critic_updates=1))
    monitor = RecordingMonitor()
    trpo.learn(4 * 256, monitor)
    assert [u["train/vf_learning_rate"] for u in monitor.updates] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    assert trpo.vf_optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)  # the last update's
    assert [u["train/target_kl"] for u in monitor.updates] == [0.01] * 4  # not scheduled


def test_trpo_constant_schedules_leave_the_logged_metrics_and_optimizer_as_before():
    trpo = make(TRPO, TRPOConfig(n_steps=128, n_critic_updates=1))
    monitor = RecordingMonitor()
    trpo.learn(256, monitor)
    (stats,) = monitor.updates
    assert "train/target_kl" not in stats and "train/vf_learning_rate" not in stats
    assert trpo.vf_optimizer.param_groups[0]["lr"] == 1e-3
