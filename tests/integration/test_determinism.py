"""Same seed on CPU, same run: every trainer gives identical metric histories on one machine.

Each algorithm trains three times through ``pgcli.training.build.train`` (the path ``pgcli train`` takes after
Hydra: seeding, env, trainer, monitor, logger) with a tiny budget and ``tracking=off``; the ``metrics.csv`` of the two
seed-0 runs must match exactly (wall-clock keys ``time/*`` aside), and the seed-1 run must differ, so the comparison
is not vacuous.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

from pgcli.training.build import RunContext, train
from pgcli.training.checks import train_config

COMMON = ["~preset", "env=cartpole", "env.n_envs=2", "total_steps=384", "eval.every=0", "eval.episodes=2",
          "tracking=off", "progress=false", "hardware=cpu"]  # fmt: skip
TINY = {
    "ppo": ["algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=2"],
    "a2c": ["algo.n_steps=8"],
    "sb3_trpo": ["algo.n_steps=64", "algo.batch_size=32", "algo.n_critic_updates=2"],
    "trpo": ["algo.n_steps=64", "algo.batch_size=32", "algo.n_critic_updates=2"],
    "vpg": ["algo.n_steps=64", "algo.batch_size=32", "algo.n_critic_updates=2"],
    "ppo_kl": ["algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=2"],
    "grpo": ["algo.group_size=2", "algo.n_groups=2", "algo.batch_size=4", "algo.n_iterations=2"],
}


def history(algo: str, seed: int, out: Path) -> list[tuple[str, str, str]]:
    cfg = train_config([f"algo={algo}", *COMMON, *TINY[algo]])
    summary = train(
        dataclasses.replace(cfg, seed=seed), RunContext(algo_name=algo, env_name="cartpole", output_dir=out)
    )
    with (summary.output_dir / "metrics.csv").open() as f:
        return [
            (row["key"], row["step"], row["value"]) for row in csv.DictReader(f) if not row["key"].startswith("time/")
        ]


@pytest.mark.parametrize("algo", list(TINY))
def test_same_seed_same_metric_history(algo: str, tmp_path: Path):
    first = history(algo, 0, tmp_path / "a")
    again = history(algo, 0, tmp_path / "b")
    other = history(algo, 1, tmp_path / "c")
    assert any(key.startswith("train/") for key, _, _ in first) and any(
        key == "eval/return_mean" for key, _, _ in first
    )
    assert first == again
    assert first != other
