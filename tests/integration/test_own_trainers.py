"""pgcli's own trainers (TRPO, VPG, PPO-Penalty): a tiny real `pgcli train` each, and one in-process update each.

The CLI runs check what a user relies on: a FINISHED MLflow run in the given store with the algorithm's train/*
metrics keyed by env steps, the evaluation, and the saved model with its normalisation statistics. Learning quality is
measured in benchmarks/trpo_learning.py, not here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pgcli.algo.ppo_kl import PPOKL
from pgcli.algo.trpo import TRPO
from pgcli.algo.vpg import VPG
from pgcli.config import EnvConfig, ModelConfig, PPOKLConfig, TRPOConfig, VPGConfig
from pgcli.envs.make import make_vec_env
from pgcli.ops.autodiff import flat_params
from tests.conftest import Store, run_pgcli

COMMON = {"train/value_loss", "train/explained_variance", "train/entropy", "train/approx_kl", "train/kl",
          "train/policy_loss", "rollout/ep_return_mean", "time/sps", "eval/return_mean"}  # fmt: skip
METRICS = {
    "trpo": COMMON
    | {
        "train/surrogate_improvement",
        "train/line_search_steps",
        "train/line_search_success",
        "train/cg_residual",
    },
    "vpg": COMMON | {"train/grad_norm"},
    "ppo_kl": COMMON | {"train/beta", "train/kl_penalty"},
}


@pytest.mark.parametrize(
    ("algo", "env", "overrides"),
    [
        ("trpo", "pendulum", ["algo.n_steps=128", "algo.n_critic_updates=2", "env.normalize_obs=true"]),
        ("vpg", "cartpole", ["algo.n_steps=128", "algo.n_critic_updates=2"]),
        ("ppo_kl", "cartpole", ["algo.n_steps=128", "algo.n_epochs=2"]),
    ],
)
def test_cli_run_lands_a_finished_mlflow_run_with_its_metrics(
    algo, env, overrides, migrated_store: Store, workdir: Path
):
    store = migrated_store  # MLflow's schema already in place: the subprocess skips the migrations
    args = [
        "train",
        f"algo={algo}",
        f"env={env}",
        "~preset",
        f"tracking.uri={store.uri}",
        f"tracking.store_dir={store.root}",
        "total_steps=1024",
        "env.n_envs=2",
        "eval.episodes=2",
        "eval.every=512",
        "progress=false",
        "seed=1",
        *overrides,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs(env)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) >= METRICS[algo], METRICS[algo] - set(run.data.metrics)
    assert run.data.params["algo.n_steps"] == "128"
    history = store.client().get_metric_history(run.info.run_id, "train/value_loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [256, 512, 768, 1024]  # env steps
    model_dir = next(workdir.glob("outputs/runs/*/*/model"))
    assert (model_dir / "model.pt").is_file()
    assert (model_dir / "normalizer.npz").is_file() == (algo == "trpo")


@pytest.mark.parametrize(
    ("trainer_cls", "cfg", "env_id"),
    [
        (TRPO, TRPOConfig(n_steps=64, n_critic_updates=1), "CartPole-v1"),
        (TRPO, TRPOConfig(n_steps=64, n_critic_updates=1), "Pendulum-v1"),
        (VPG, VPGConfig(n_steps=64, n_critic_updates=1), "Pendulum-v1"),
        (PPOKL, PPOKLConfig(n_steps=64, n_epochs=1, batch_size=64), "CartPole-v1"),
    ],
)
def test_one_update_changes_policy_and_value_parameters(trainer_cls, cfg, env_id):
    class Silent:
        def episodes(self, step, info): ...
        def log(self, step, metrics): ...
        def update(self, step, agent): ...

    torch.manual_seed(0)
    env = make_vec_env(EnvConfig(id=env_id, n_envs=2), seed=0)
    trainer = trainer_cls(cfg, env=env, model=ModelConfig(), seed=0, device=torch.device("cpu"))
    policy_before = flat_params(trainer.policy.actor_parameters())
    value_before = flat_params(trainer.value.critic_parameters())
    assert trainer.learn(128, Silent()) == 128
    assert not torch.equal(flat_params(trainer.policy.actor_parameters()), policy_before)
    assert not torch.equal(flat_params(trainer.value.critic_parameters()), value_before)
    trainer.close()
