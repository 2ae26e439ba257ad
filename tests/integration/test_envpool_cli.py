"""`pgcli train env=pong hardware.vec_env=envpool` (docs/pixels.md, "EnvPool"): SB3's PPO trains on EnvPool's
games and lands FINISHED with an evaluation logged (evaluations play the gymnasium path's whole games); a non-Atari
env is one line before anything is created. (tests/unit/test_envpool.py has the env itself, with our rollouts.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
pytest.importorskip("envpool", reason="envpool is not installed")

SMALL = ["env.n_envs=4", "total_steps=512", "eval.every=0", "eval.episodes=1", "progress=false", "checkpoint_every=0",
         "env.max_episode_steps=2000"]  # fmt: skip
"""An untrained Pong policy plays a whole game to -21 (~800 steps); 2,000 frames (500 env steps) bound it."""
PPO = ["algo=ppo", "algo.n_steps=64", "algo.batch_size=128", "algo.n_epochs=1"]


def test_pong_on_envpool_lands_finished_with_an_evaluation(migrated_store: Store, workdir: Path):
    proc = run_pgcli(
        ["train", "env=pong", "hardware.vec_env=envpool", *PPO, *SMALL, f"tracking.uri={migrated_store.uri}"],
        cwd=workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = migrated_store.runs("pong")
    assert run.info.status == "FINISHED"
    assert "eval/return_mean" in run.data.metrics and run.data.params["hardware.vec_env"] == "envpool"
    assert -21 <= run.data.metrics["eval/return_mean"] <= 21  # the raw score of a (bounded) game


def test_envpool_on_a_non_atari_env_is_one_line_and_creates_nothing(workdir: Path):
    proc = run_pgcli(["train", "env=cartpole", "hardware.vec_env=envpool"], cwd=workdir, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pgcli: error: hardware.vec_env=envpool steps Atari games (env=pong, env=breakout, ...: <Game>NoFrameskip-v4 "
        "ids with env.pixels); env.id 'CartPole-v1' is not one: use hardware.vec_env=sync"
    ]
    assert list(workdir.iterdir()) == []
