"""Exact continuation from a checkpoint, at the trainer level, on real gymnasium envs (docs/checkpoints.md, "What a
checkpoint holds").

For each trainer: train 2 updates straight, versus 1 update + ``save`` + ``load`` into a trainer freshly built with
another seed (so that everything that matters has to come from the checkpoint) + 1 update. Parameters, optimizer
states, counters and the env's episodes in progress must be bit-identical: the RNG streams (python, numpy, torch,
each sub-env's ``np_random``), the normalisation statistics and the in-progress episodes are all restored.
"""

from __future__ import annotations

import random
from pathlib import Path

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
from pgcli.config.pixels import CNNModelConfig, PixelsConfig
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.envs.state import env_state
from pgcli.tracking.logger import RunLogger
from pgcli.training.build import seed_everything
from pgcli.training.monitor import Outputs, Schedule, TrainingMonitor

CPU = torch.device("cpu")
MODEL = ModelConfig(pi_hidden_sizes=[16], vf_hidden_sizes=[16])
N_ENVS = 2

CASES = {
    "trpo-pendulum": (TRPO, TRPOConfig(n_steps=64, n_critic_updates=2, batch_size=32), "Pendulum-v1"),
    "trpo_scheduled-pendulum": (
        TRPO,
        TRPOConfig(n_steps=64, n_critic_updates=2, batch_size=32, target_kl_schedule="linear", lr_schedule="linear"),
        "Pendulum-v1",
    ),
    "trpo_critic_process-pendulum": (  # the critic fitted in a second process (scheduled step size included)
        TRPO,
        TRPOConfig(n_steps=64, n_critic_updates=2, batch_size=32, lr_schedule="linear", critic_process=True),
        "Pendulum-v1",
    ),
    "vpg-cartpole": (VPG, VPGConfig(n_steps=64, n_critic_updates=2, batch_size=32), "CartPole-v1"),
    "ppo_kl-pendulum": (PPOKL, PPOKLConfig(n_steps=64, n_epochs=2, batch_size=32), "Pendulum-v1"),
    "grpo-cartpole": (
        GRPO,
        GRPOConfig(group_size=2, n_groups=2, batch_size=2, beta=0.04, ref_update_interval=1, max_grad_norm=0.5),
        "CartPole-v1",
    ),
    "sb3_ppo-pendulum": (
        SB3Trainer,
        PPOConfig(n_steps=64, batch_size=32, n_epochs=2, lr_schedule="linear", clip_range_schedule="linear"),
        "Pendulum-v1",
    ),
}


def build(case: str, seed: int, vectorization: str = "sync"):
    """As pgcli.training.build.train builds a trainer: seeded process RNGs, a seeded normalising env, then the
    trainer."""
    trainer_cls, cfg, env_id = CASES[case]
    seed_everything(seed)
    env = make_vec_env(
        EnvConfig(id=env_id, n_envs=N_ENVS, normalize_obs=True, normalize_reward=True),
        seed=seed,
        gamma=cfg.gamma,
        vectorization=vectorization,
    )
    return trainer_cls(cfg, env=env, model=MODEL, seed=seed, device=CPU)


def train(trainer, total_steps: int, checkpoint_dir: Path) -> None:
    """``learn`` under a real TrainingMonitor that checkpoints after every update (checkpoint_every=1)."""
    monitor = TrainingMonitor(
        RunLogger(checkpoint_dir.parent),
        Schedule(total_steps, checkpoint_every=1),
        outputs=Outputs(checkpoints=checkpoint_dir),
        progress=False,
    )
    trainer.learn(total_steps, monitor)


def module_states(trainer) -> dict[str, dict]:
    if isinstance(trainer, SB3Trainer):
        return {"policy": trainer.model.policy.state_dict(), "optimizer": trainer.model.policy.optimizer.state_dict()}
    return {name: obj.state_dict() for name, obj in trainer._stateful().items() if obj is not None}


def assert_identical(a, b, path: str = "") -> None:
    """Nested state dicts equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_identical(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def steps_of(trainer) -> int:
    return int(trainer.model.num_timesteps) if isinstance(trainer, SB3Trainer) else trainer.steps


@pytest.mark.parametrize(
    ("case", "vectorization"),
    [(case, "sync") for case in CASES] + [("trpo-pendulum", "worker"), ("trpo-pendulum", "shm")],
    ids=[*CASES, "trpo-pendulum-worker_env", "trpo-pendulum-shm_env"],
)
def test_one_update_save_load_one_update_equals_two_updates(case: str, vectorization: str, tmp_path: Path):
    probe = build(case, seed=3, vectorization=vectorization)
    train(probe, 1, tmp_path / "probe")  # stops at the first update boundary
    one_update = steps_of(probe)
    probe.close()

    # straight: 2 updates (a budget one step past the first update), checkpointing after each
    straight = build(case, seed=3, vectorization=vectorization)
    train(straight, one_update + 1, tmp_path / "straight")
    two_updates = steps_of(straight)
    assert two_updates > one_update

    # resumed: a trainer built with another seed, the process RNGs moved on, then the first checkpoint loaded
    resumed = build(case, seed=11, vectorization=vectorization)
    random.random(), np.random.rand(), torch.rand(3)
    resumed.load(tmp_path / "straight" / f"step_{one_update}")
    assert steps_of(resumed) == one_update
    assert find_normalizer(resumed.env).training  # resume keeps learning the normalisation statistics
    train(resumed, one_update + 1, tmp_path / "resumed")

    assert steps_of(resumed) == two_updates
    assert_identical(module_states(straight), module_states(resumed))
    assert_identical(find_normalizer(straight.env).state_dict(), find_normalizer(resumed.env).state_dict())
    # the envs are in the same place: simulator states, counters, RNGs, return accumulator, last observations
    state_a, state_b = env_state(straight.env), env_state(resumed.env)
    for sub in state_a["sub_envs"] + state_b["sub_envs"]:  # all but the episodes' wall-clock durations
        sub["wrappers"] = [
            [name, {k: v for k, v in (st or {}).items() if k != "elapsed_s"}] for name, st in sub["wrappers"]
        ]
    assert state_a == state_b
    if isinstance(straight, PPOKL):
        assert straight.beta == resumed.beta != CASES[case][1].beta_init
    if isinstance(straight, GRPO):
        assert straight.n_updates == resumed.n_updates == 2
    if isinstance(straight, SB3Trainer):
        assert straight.model._current_progress_remaining == resumed.model._current_progress_remaining < 1.0
        assert straight.model._n_updates == resumed.model._n_updates
    straight.close()
    resumed.close()


# a real `pgcli train`: a FINISHED run whose budget ends below checkpoint_every continues from its final model/
EXTEND = ["algo=trpo", "algo.n_steps=256", "algo.n_critic_updates=1", "algo.batch_size=256", "env.n_envs=4",
          "eval.every=1024", "eval.episodes=2", "checkpoint_every=4096", "progress=false", "tracking=off",
          "seed=1"]  # fmt: skip
"""Updates of 1,024 env steps: both runs log rollout statistics (at most every 1,000 steps) and evaluate at 1,024."""


def csv_history(run_dir: Path) -> list[tuple[str, int, str]]:
    """``metrics.csv`` as (key, step, value) rows, without the wall-clock rates."""
    import csv

    with (run_dir / "metrics.csv").open(newline="") as f:
        return [
            (r["key"], int(r["step"]), r["value"])
            for r in csv.DictReader(f)
            if not r["key"].startswith("time/") or r["key"] == "time/episodes"
        ]


def test_a_finished_run_below_checkpoint_every_extends_exactly_from_its_final_model(tmp_path: Path):
    from tests.conftest import run_pgcli

    straight, short = tmp_path / "straight", tmp_path / "short"
    for run_dir, total in ((straight, 2048), (short, 1024)):
        proc = run_pgcli(["train", *EXTEND, f"total_steps={total}", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(short.glob("checkpoints/step_*"))  # only its final model/ holds the state at 1,024

    resumed = run_pgcli(["train", f"resume={short}", "total_steps=2048"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from {short.resolve()}/model (step 1,024 of 2,048)" in resumed.stderr
    assert csv_history(short) == csv_history(straight)


# --------------------------------------------------------------------------------------------------------------------
# frames (docs/pixels.md): TRPO with a CNN, uint8 rollout buffers and observations in the checkpoint
# --------------------------------------------------------------------------------------------------------------------


class CartPoleFrames(gym.ObservationWrapper):
    """CartPole drawn as a (10, 10, 2) bool frame (cart position x pole angle; their velocities): an image env whose
    simulator state pgcli's checkpoints hold (CartPole's), so that a resume can be exact."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 1, (10, 10, 2), dtype=bool)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        cells = np.clip(((observation / np.array([2.4, 2.0, 0.21, 2.0])) + 1) * 5, 0, 9).astype(int)
        frame = np.zeros((10, 10, 2), dtype=bool)
        frame[cells[0], cells[2], 0] = frame[cells[1], cells[3], 1] = True
        return frame


gym.register(
    "PgcliTestCartPoleFrames-v0",
    entry_point=lambda: CartPoleFrames(gym.make("CartPole-v1").unwrapped),
    max_episode_steps=500,
)
FRAMES = {"noop_max": 0, "frame_skip": 1, "screen_size": 0, "grayscale": False, "frame_stack": 1,
          "terminal_on_life_loss": False, "clip_reward": False, "fire_reset": False}  # fmt: skip
"""MinAtar's preprocessing (docs/pixels.md): frames as the env draws them, uint8 channels first, nothing stacked."""


def build_on_frames(env_id: str, seed: int) -> TRPO:
    seed_everything(seed)
    env = make_vec_env(EnvConfig(id=env_id, n_envs=N_ENVS, pixels=PixelsConfig(**FRAMES)), seed=seed)  # type: ignore[arg-type]
    cfg = TRPOConfig(n_steps=32, n_critic_updates=2, batch_size=32, cg_max_steps=5)
    return TRPO(cfg, env=env, model=CNNModelConfig(pi_hidden_sizes=[16]), seed=seed, device=CPU)


@pytest.mark.parametrize(
    "env_id",
    [
        "PgcliTestCartPoleFrames-v0",
        "MinAtar/Breakout-v1",
    ],
)
def test_trpo_on_frames_continues_exactly_from_a_checkpoint(env_id: str, tmp_path: Path):
    pytest.importorskip("minatar", reason="pgcli[pixels] is not installed")
    straight = build_on_frames(env_id, seed=3)
    frames = straight.collector.obs  # [T + 1, N, C, 10, 10]
    assert frames.dtype == torch.uint8 and frames.shape[3:] == (10, 10)
    one_update = straight.cfg.n_steps * N_ENVS
    train(straight, one_update + 1, tmp_path / "straight")
    resumed = build_on_frames(env_id, seed=11)
    random.random(), np.random.rand(), torch.rand(3)
    resumed.load(tmp_path / "straight" / f"step_{one_update}")
    assert resumed.collector.last_obs.dtype == np.uint8  # the frames to act on next, as they were
    train(resumed, one_update + 1, tmp_path / "resumed")
    assert straight.steps == resumed.steps == 2 * one_update
    assert_identical(module_states(straight), module_states(resumed))
    assert torch.equal(straight.collector.obs, resumed.collector.obs)  # the second rollout's frames, bit for bit
    straight.close()
    resumed.close()
