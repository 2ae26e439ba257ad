"""`pgcli train` on image envs (docs/pixels.md): SB3's PPO with model=cnn (implied) on a MinAtar game and on Pong, and
each of pgcli's own trainers on a MinAtar game, land FINISHED with an evaluation logged; a wrong model is one line
before anything is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
pytest.importorskip("minatar", reason="pgcli[pixels] is not installed")

SMALL = ["algo=ppo", "env.n_envs=4", "algo.n_steps=64", "algo.batch_size=128", "algo.n_epochs=1", "eval.every=0",
         "progress=false", "checkpoint_every=0"]  # fmt: skip


@pytest.mark.parametrize(
    ("env", "extra"),
    [
        ("minatar_breakout", ["total_steps=2048", "eval.episodes=2"]),
        # an untrained Pong policy plays a whole game to -21 (~800 steps); 2,000 frames (500 env steps) bound it
        ("pong", ["total_steps=1024", "eval.episodes=1", "env.max_episode_steps=2000"]),
    ],
)
def test_ppo_trains_on_an_image_env_and_lands_finished(
    env: str, extra: list[str], migrated_store: Store, workdir: Path
):
    proc = run_pgcli(
        ["train", f"env={env}", *SMALL, *extra, f"tracking.uri={migrated_store.uri}"], cwd=workdir, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "A.L.E" not in proc.stderr and "Stella" not in proc.stderr  # no emulator banner per env made
    (run,) = migrated_store.runs(env)
    assert run.info.status == "FINISHED"
    assert "eval/return_mean" in run.data.metrics
    assert run.data.params["model.arch"] == "auto" and run.data.params["env.pixels.frame_stack"] == str(
        4 if env == "pong" else 1
    )


OWN = {
    "trpo": ["algo.n_steps=64", "algo.n_critic_updates=1", "algo.batch_size=128", "algo.cg_max_steps=5"],
    "vpg": ["algo.n_steps=64", "algo.n_critic_updates=1", "algo.batch_size=128"],
    "ppo_kl": ["algo.n_steps=64", "algo.n_epochs=1", "algo.batch_size=128"],
    "grpo": ["algo.group_size=4", "algo.n_groups=1", "algo.batch_size=4", "algo.n_iterations=1"],
}
"""Tiny updates of pgcli's own trainers: 256 env steps (GRPO: one group of 4 whole episodes)."""


@pytest.mark.parametrize("algo", OWN)
def test_own_trainers_train_on_minatar_frames_and_land_finished(algo: str, migrated_store: Store, workdir: Path):
    proc = run_pgcli(
        [
            "train",
            f"algo={algo}",
            "env=minatar_breakout",
            *OWN[algo],
            "env.n_envs=4",
            "total_steps=1024",
            "eval.every=0",
            "eval.episodes=1",
            "progress=false",
            "checkpoint_every=0",
            f"tracking.uri={migrated_store.uri}",
        ],
        cwd=workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = migrated_store.runs("minatar_breakout")
    assert run.info.status == "FINISHED"
    assert "eval/return_mean" in run.data.metrics and "train/entropy" in run.data.metrics
    # one torso for both heads, but where a preset says otherwise (ppo_kl_minatar_breakout: an actor and a critic)
    assert run.data.params["model.share_features"] == str(algo != "ppo_kl")


def test_an_mlp_on_pong_is_one_line_and_creates_nothing(workdir: Path):
    proc = run_pgcli(["train", "env=pong", "model=mlp"], cwd=workdir, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pgcli: error: env.id 'ale_py:PongNoFrameskip-v4' is an image env (env.pixels is set): it needs model=cnn "
        "(got an MLP model option)"
    ]
    assert list(workdir.iterdir()) == []


def test_an_image_run_is_evaluated_and_resumed_from_its_logged_cnn_config(migrated_store: Store, workdir: Path):
    # pgcli eval and resume rebuild the run's config from what it logged: model=cnn, not the MLP schema
    args = [
        "train",
        "algo=trpo",
        "env=minatar_breakout",
        *OWN["trpo"],
        "env.n_envs=4",
        "total_steps=256",
        "eval.every=0",
        "eval.episodes=1",
        "progress=false",
        f"tracking.uri={migrated_store.uri}",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = migrated_store.runs("minatar_breakout")
    run_id = run.info.run_id
    evaluation = run_pgcli(
        ["eval", run_id, "--episodes", "1", f"tracking.uri={migrated_store.uri}"], cwd=workdir, timeout=300
    )
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    resumed = run_pgcli(
        ["train", f"resume={run_id}", "total_steps=512", f"tracking.uri={migrated_store.uri}"], cwd=workdir, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    history = migrated_store.client().get_metric_history(run_id, "train/entropy")
    assert migrated_store.client().get_run(run_id).info.status == "FINISHED" and max(m.step for m in history) == 512
