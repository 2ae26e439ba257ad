"""SB3's training diagnostics as pgcli logs them (docs/tracking.md, "What is logged"): at the env step of the update
they describe, one value per step, and schedules that stop at their final value when the last rollout overshoots
``total_steps``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pgcli.algo.sb3 import SB3Trainer
from pgcli.config import A2CConfig, EnvConfig, ModelConfig, PPOConfig
from pgcli.envs.make import make_vec_env
from pgcli.tracking.logger import RunLogger
from pgcli.training.monitor import Schedule, TrainingMonitor


def train_sb3(cfg: PPOConfig | A2CConfig, total_steps: int, tmp_path: Path, n_envs: int = 2) -> RunLogger:
    torch.set_num_threads(1)  # as hardware=cpu does: small MLPs, and other tests may run beside this one
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=n_envs), seed=0)
    trainer = SB3Trainer(cfg, env=env, model=ModelConfig(), seed=0, device=torch.device("cpu"))
    logger = RunLogger(tmp_path)
    monitor = TrainingMonitor(logger, Schedule(total_steps), progress=False)
    try:
        steps = trainer.learn(total_steps, monitor)
    finally:
        trainer.close()
    assert steps > total_steps  # the last rollout overshoots: the case the schedules got wrong
    return logger


def test_ppo_linear_schedules_log_each_update_at_its_own_step_and_never_go_negative(tmp_path: Path):
    # rollout 2 * 1024 = 2048 steps (SB3's logger dumped after every update); 5000 is not a multiple, so the 3rd
    # rollout ends at 6144 > total_steps
    cfg = PPOConfig(
        learning_rate=1e-3,
        lr_schedule="linear",
        clip_range=0.2,
        clip_range_schedule="linear",
        n_steps=1024,
        batch_size=1024,
        n_epochs=1,
    )
    logger = train_sb3(cfg, 5000, tmp_path)
    lr = logger.history["train/learning_rate"]
    clip = logger.history["train/clip_range"]
    # one update per rollout, logged at the rollout's last env step, once (was: 2048, 4096, 6144, 6144)
    assert [step for step, _ in lr] == [2048, 4096, 6144]
    assert [step for step, _ in clip] == [2048, 4096, 6144]
    # SB3 computes the schedule from progress_remaining = 1 - step / total_steps at the update's step, so each value
    # says which step it belongs to: one rollout late (the old dump order) would not match
    for step, value in lr:
        assert value == pytest.approx(1e-3 * max(0.0, 1 - step / 5000), abs=1e-12)
    for step, value in clip:
        assert value == pytest.approx(0.2 * max(0.0, 1 - step / 5000), abs=1e-12)
    assert lr[-1][1] >= 0 and clip[-1][1] >= 0  # the last update ran past total_steps: was -2.3e-4 and -0.046


def test_a2c_diagnostics_are_one_value_per_step_at_update_steps(tmp_path: Path):
    # A2C updates every 32 * 8 = 256 steps; pgcli dumps SB3's logger every ceil(2048 / 256) = 8 updates and at the end
    logger = train_sb3(A2CConfig(n_steps=32, lr_schedule="linear"), 4100, tmp_path, n_envs=8)
    for key in ("train/value_loss", "train/policy_loss", "train/entropy", "train/learning_rate"):
        steps = [step for step, _ in logger.history[key]]
        assert steps == sorted(set(steps)), f"{key}: two values at one step or out of order: {steps}"
        assert steps == [2048, 4096, 4352], key
    for step, value in logger.history["train/learning_rate"]:
        assert value == pytest.approx(7e-4 * max(0.0, 1 - step / 4100), abs=1e-12)
