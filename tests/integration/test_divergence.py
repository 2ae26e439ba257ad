"""Divergence guard (docs/checkpoints.md) on injected NaNs: a real CartPole whose observations turn NaN after k steps,
and a NaN learning rate. Training stops with a DivergenceError naming the quantity and the env step, the last
checkpoint on disk is a good one, and through ``pgcli.training.build.train`` the MLflow run ends FAILED."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from pgcli.algo.grpo import GRPO
from pgcli.algo.ppo_kl import PPOKL
from pgcli.algo.sb3 import SB3Trainer
from pgcli.algo.trpo import TRPO
from pgcli.algo.vpg import VPG
from pgcli.config import EnvConfig, GRPOConfig, ModelConfig, PPOConfig, PPOKLConfig, TRPOConfig, VPGConfig
from pgcli.envs.make import make_vec_env
from pgcli.errors import DivergenceError
from pgcli.tracking.logger import RunLogger
from pgcli.training.build import seed_everything
from pgcli.training.monitor import Outputs, Schedule, TrainingMonitor
from tests.conftest import Store

CPU = torch.device("cpu")
MODEL = ModelConfig(pi_hidden_sizes=[16], vf_hidden_sizes=[16])
NAN_AFTER = 100
"""Each sub-env's observations are NaN from its 101st step on."""
NAN_ENV = "PgcliTestNaNCartPole-v0"
N_ENVS = 2


class NaNObservationsAfter(gym.Wrapper):
    """Returns NaN observations once the env has taken more than ``after`` steps (over all its episodes)."""

    def __init__(self, env: gym.Env, after: int) -> None:
        super().__init__(env)
        self.after, self.n_steps = after, 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.n_steps += 1
        if self.n_steps > self.after:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


def make_nan_cartpole(**kwargs: Any) -> gym.Env:
    from gymnasium.envs.classic_control import CartPoleEnv

    return NaNObservationsAfter(CartPoleEnv(**kwargs), NAN_AFTER)


if NAN_ENV not in gym.registry:
    gym.register(NAN_ENV, entry_point=make_nan_cartpole, max_episode_steps=500)

UPDATE_STEPS = 64 * N_ENVS
TRAINERS = {
    "trpo": (TRPO, TRPOConfig(n_steps=64, n_critic_updates=1, batch_size=64)),
    "vpg": (VPG, VPGConfig(n_steps=64, n_critic_updates=1, batch_size=64)),
    "ppo_kl": (PPOKL, PPOKLConfig(n_steps=64, n_epochs=1, batch_size=64)),
    "grpo": (GRPO, GRPOConfig(group_size=2, n_groups=1, batch_size=2)),
    "sb3_ppo": (SB3Trainer, PPOConfig(n_steps=64, batch_size=64, n_epochs=1)),
}


def build(name: str, env_id: str):
    trainer_cls, cfg = TRAINERS[name]
    seed_everything(0)
    env = make_vec_env(EnvConfig(id=env_id, n_envs=N_ENVS, normalize_obs=True), seed=0)
    return trainer_cls(cfg, env=env, model=MODEL, seed=0, device=CPU)


def monitor(tmp_path: Path, checkpoint_every: int) -> TrainingMonitor:
    return TrainingMonitor(
        RunLogger(tmp_path),
        Schedule(10**5, checkpoint_every=checkpoint_every),
        outputs=Outputs(checkpoints=tmp_path / "checkpoints"),
        progress=False,
    )


def parameters(trainer) -> list[torch.Tensor]:
    module = trainer.model.policy if isinstance(trainer, SB3Trainer) else trainer.policy
    return list(module.parameters())


@pytest.mark.parametrize("name", list(TRAINERS))
def test_nan_observation_stops_training_and_keeps_the_last_good_checkpoint(name: str, tmp_path: Path):
    trainer = build(name, NAN_ENV)
    mon = monitor(tmp_path, checkpoint_every=1)  # a checkpoint after every update
    with pytest.raises(DivergenceError) as caught:
        trainer.learn(10**5, mon)
    err = caught.value
    assert err.quantity == "observation" and err.value == "nan"
    assert "\n" not in str(err) and str(err).startswith("non-finite observation at env step ")
    if name == "grpo":  # episodes, not a step-by-step rollout: the step of the update that collected them
        assert err.step >= (NAN_AFTER + 1) * N_ENVS
    else:  # the first NaN comes back from vector step NAN_AFTER + 1
        assert err.step == (NAN_AFTER + 1) * N_ENVS
    # the last checkpoint (written before the NaN) is named, complete, and loads finite parameters
    assert err.last_checkpoint == str(mon.last_checkpoint) and f"last good checkpoint: {err.last_checkpoint}" in str(
        err
    )
    fresh = build(name, NAN_ENV)
    fresh.load(Path(err.last_checkpoint))
    assert all(torch.isfinite(p).all() for p in parameters(fresh))
    trainer.close()
    fresh.close()


def nan_learning_rate(trainer) -> None:
    if isinstance(trainer, SB3Trainer):
        trainer.model.lr_schedule = lambda _: math.nan  # SB3 sets the optimizer's lr from it every update
        return
    for optimizer in (v for k, v in trainer._stateful().items() if k.endswith("optimizer")):
        for group in optimizer.param_groups:
            group["lr"] = math.nan


@pytest.mark.parametrize("name", list(TRAINERS))
def test_nan_learning_rate_stops_training_at_the_first_update(name: str, tmp_path: Path):
    trainer = build(name, "CartPole-v1")
    nan_learning_rate(trainer)
    mon = monitor(tmp_path, checkpoint_every=0)
    with pytest.raises(DivergenceError) as caught:
        trainer.learn(10**5, mon)
    err = caught.value
    # the first update's parameters (or the losses computed with them) are NaN; SB3's show up when the next
    # rollout starts, at the same env step
    assert err.quantity in ("parameter", "train/value_loss", "train/policy_loss", "train/loss")
    first_update = trainer.steps if not isinstance(trainer, SB3Trainer) else UPDATE_STEPS
    assert err.step == first_update and err.last_checkpoint is None
    assert str(err).endswith("no checkpoint was written yet")
    trainer.close()


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


@pytest.mark.parametrize(("algo", "name"), [("trpo", "trpo"), ("ppo", "sb3_ppo")])
def test_diverged_run_ends_failed_naming_the_quantity(algo: str, name: str, store: Store, tmp_path: Path):
    from pgcli.training.build import RunContext, train
    from pgcli.training.checks import train_config

    # ~preset: another env id drops the cartpole preset, as `pgcli train` does (its batch_size needs 8 envs)
    cfg = train_config(
        [
            f"algo={algo}",
            "~preset",
            f"env.id={NAN_ENV}",
            "env.n_envs=2",
            "algo.n_steps=64",
            "checkpoint_every=128",
            f"tracking.uri={store.uri}",
            "total_steps=100000",
            "eval.every=0",
            "progress=false",
        ]
    )
    ctx = RunContext(algo_name=algo, env_name="nan_cartpole", output_dir=tmp_path / "run")
    with pytest.raises(DivergenceError, match=r"^non-finite observation at env step 202 \(nan\); last good"):
        train(cfg, ctx)
    (run,) = store.runs("nan_cartpole")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"].startswith("DivergenceError: non-finite observation at env step 202")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_128"]
    assert not (tmp_path / "run" / "model").exists()  # no final model from a diverged run
