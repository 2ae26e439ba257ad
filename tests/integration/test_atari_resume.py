"""A resumed Atari run logs what an uninterrupted one logs (docs/checkpoints.md, "Episodes in progress are
restored"; docs/pixels.md, "Resume"): real `pgcli train` runs on ALE games with the full training preprocessing
(no-op starts, frame skip, life loss, FIRE, reward signs, frame stack). A run of 256 steps checkpointed at its end and
resumed to 512 writes the metrics of a straight run of 512, step for step: the games that were in progress at the
checkpoint go on, so their returns and lengths, the updates after them and the evaluations are the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_pgcli
from tests.integration.test_exact_resume import csv_history

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")

COMMON = ["env.n_envs=2", "algo.n_steps=64", "env.max_episode_steps=400", "checkpoint_every=256", "eval.every=256",
          "eval.episodes=1", "progress=false", "tracking=off", "seed=1", "env.pixels.screen_size=42"]  # fmt: skip
"""Updates of 128 env steps; games of at most 400 frames (100 env steps), so that games end on both sides of the
checkpoint at 256 and the evaluations are short; 42x42 frames (the Nature CNN still), a quarter of the convolutions'
work."""
CASES = {
    "trpo-breakout": [
        "algo=trpo",
        "env=breakout",
        "algo.n_critic_updates=1",
        "algo.batch_size=128",
        "algo.cg_max_steps=5",
    ],
    "sb3_ppo-pong": ["algo=ppo", "env=pong", "~preset", "algo.batch_size=64", "algo.n_epochs=1"],
}


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_atari_run_logs_what_a_straight_run_logs(case: str, tmp_path: Path):
    straight, short = tmp_path / "straight", tmp_path / "short"
    for run_dir, total in ((straight, 512), (short, 256)):
        proc = run_pgcli(
            ["train", *CASES[case], *COMMON, f"total_steps={total}", f"hydra.run.dir={run_dir}"], cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    resumed = run_pgcli(["train", f"resume={short}", "total_steps=512"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 256 of 512)" in resumed.stderr
    history = csv_history(straight)
    assert [row for row in history if row[0] == "rollout/ep_len" and row[1] > 256]  # games ended after the resume
    logged = {(key, step) for key, step, _ in history}
    flushed = [row for row in csv_history(short) if (row[0], row[1]) not in logged]
    assert {step for _, step, _ in flushed} <= {256}  # what the short run's end flushed: rolling means, SB3's train/*
    assert [row for row in csv_history(short) if row not in flushed] == history
