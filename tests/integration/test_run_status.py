"""Every MLflow run ends FINISHED, FAILED or KILLED, never RUNNING: Ctrl-C, `kill` and crashes mid-training.

The signal tests start a real `pgcli train` subprocess, poll (with a timeout) until it is training, signal it, and read
the run back. The crash tests make training raise after the run exists: a real env that accepts a bad keyword at
`gymnasium.make` but fails at its first step (subprocess), and a trainer hook raising mid-training (in process).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Store, run_pgcli, start_pgcli, wait_until


@pytest.fixture
def store(migrated_store: Store) -> Store:
    """A temporary store whose schema already exists, so the test process can read it while pgcli writes."""
    return migrated_store


def assert_never_running(store: Store) -> None:
    client = store.client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs, "no run was created"
    assert all(r.info.status in ("FINISHED", "FAILED", "KILLED") for r in runs), [r.info.status for r in runs]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_mid_training_ends_the_run_killed_with_a_checkpoint_and_model(signum: int, store: Store, workdir: Path):
    from stable_baselines3 import PPO

    from pgcli.training.resume import plan_resume

    stderr, run_dir = workdir / "stderr.txt", workdir / "run"
    args = [
        "train",
        f"tracking.uri={store.uri}",
        "total_steps=10000000",
        "eval.every=0",
        "eval.episodes=1",
        "progress=true",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)  # SIGINT raises KeyboardInterrupt there, as in a terminal
    try:
        # The progress bar shows a speed once the first update is done: the run exists and is training.
        wait_until(
            lambda: "sps=" in stderr.read_text(), "the first training update", timeout=180, proc=proc, stderr=stderr
        )
        (running,) = store.runs("cartpole")
        assert running.info.status == "RUNNING"
        proc.send_signal(signum)
        returncode = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err_text = stderr.read_text()
    assert returncode == 128 + signum, err_text[-3000:]  # 130, 143, 129: as a shell reports a signal
    assert "stopping after this update" in err_text and "Traceback" not in err_text
    (run,) = store.runs("cartpole")
    # the last line says how the run continues (the store named as the command line named it)
    assert err_text.splitlines()[-1] == (
        f"pgcli: interrupted; continue the run with: pgcli train resume={run.info.run_id} tracking.uri={store.uri}"
    )
    if signum == signal.SIGINT:  # the run directory holds what docs/runs.md lists after its Ctrl-C
        assert sorted(p.name for p in run_dir.iterdir()) == documented_run_dir(without={"best_model"})
    assert run.info.status == "KILLED" and run.info.end_time is not None
    client = store.client()
    sps = client.get_metric_history(run.info.run_id, "time/sps")
    assert sps and max(m.step for m in sps) < 10_000_000  # buffered metrics were flushed; training stopped early
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.csv", "model", "checkpoints"} <= artifacts
    # the final model loads, and the final checkpoint is where `resume=` would continue (at the last update)
    model = PPO.load(run_dir / "model" / "model.zip")
    plan = plan_resume(str(run_dir), [])
    assert plan.point.run_id == run.info.run_id and plan.point.step == model.num_timesteps
    assert plan.point.step >= max(m.step for m in sps)  # the checkpoint of the last update, after the last log
    assert plan.point.checkpoint.name == f"step_{plan.point.step}"
    assert_never_running(store)


def test_sigterm_during_the_final_evaluation_ends_the_run_killed(store: Store, workdir: Path):
    # training is done (its last update saved step_256), then the final evaluation plays many episodes: a `kill` there
    # stops it like one during training, KILLED with exit 143, not swallowed into a FINISHED run with exit 0
    import time

    run_dir, stderr = workdir / "run", workdir / "stderr.txt"
    args = [
        "train",
        "algo=trpo",
        "algo.n_steps=64",
        "env.n_envs=2",
        "algo.batch_size=64",
        "total_steps=256",
        "checkpoint_every=256",
        "eval.every=0",
        "eval.episodes=100000",
        f"tracking.uri={store.uri}",
        "progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)
    try:
        wait_until(
            lambda: (run_dir / "checkpoints" / "step_256" / "monitor.json").is_file(),
            "the last update",
            timeout=180,
            proc=proc,
            stderr=stderr,
        )
        time.sleep(1.0)  # past the checkpoint's upload: the final evaluation (100,000 episodes) runs now
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err_text = stderr.read_text()
    assert returncode == 143, err_text[-3000:]
    assert "Traceback" not in err_text and err_text.splitlines()[-1].startswith("pgcli: interrupted")
    (run,) = store.runs("cartpole")
    assert run.info.status == "KILLED"
    assert (run_dir / "model").is_dir()  # training was complete: its agent is saved
    assert "eval/return_mean" not in run.data.metrics  # the final evaluation was abandoned
    assert not (run_dir / ".owner").exists()


def documented_run_dir(without: set[str]) -> list[str]:
    """The names docs/runs.md's `ls -A` of an interrupted run lists (``without`` those this test does not make:
    ``best_model`` needs an evaluation)."""
    text = (REPO / "docs" / "runs.md").read_text()
    listing = text.split("$ ls -A outputs/runs/demo_sigint\n", 1)[1].splitlines()[0]
    return sorted(set(listing.split()) - without)


SLOW_ENV = """
import time
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

made = 0


class SlowToMake(CartPoleEnv):
    def __init__(self, **kwargs):
        global made
        made += 1
        if made > 1:  # the first one is the throwaway that checks the spaces; the run's envs take long to build
            time.sleep(120)
        super().__init__(**kwargs)


gym.register(id="SlowToMake-v0", entry_point=f"{__name__}:SlowToMake", max_episode_steps=500)
"""


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(store: Store, workdir: Path):
    (workdir / "slow_envs.py").write_text(SLOW_ENV)
    run_dir = workdir / "run"
    args = [
        "train",
        "env.id=slow_envs:SlowToMake-v0",
        "env.n_envs=2",
        f"tracking.uri={store.uri}",
        "progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    err = workdir / "stderr.txt"
    proc = start_pgcli(args, cwd=workdir, stderr=err, PYTHONPATH=str(workdir))
    try:
        # run.json is written when the MLflow run exists, before its envs are built
        wait_until(lambda: (run_dir / "run.json").is_file(), "the run's creation", timeout=180, proc=proc, stderr=err)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.read_text()
    assert proc.returncode == 130, stderr[-3000:]
    client = store.client()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    assert stderr.splitlines()[-1] == (
        f"pgcli: interrupted before the run's first checkpoint: nothing to resume (run {run.info.run_id} ended "
        "KILLED); start it again"
    )


def test_env_failing_mid_training_ends_the_run_failed(store: Store, workdir: Path):
    # Pendulum accepts any `g` at make and reset, but its first step computes 3 * g / (2 * l): a str g raises there,
    # after the MLflow run has been created and its params logged.
    proc = run_pgcli(
        [
            "train",
            "algo=a2c",
            "env=pendulum",
            "+env.kwargs.g=abc",
            f"tracking.uri={store.uri}",
            "total_steps=2000",
            "progress=false",
        ],
        cwd=workdir,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "TypeError" in proc.stderr
    (run,) = store.runs("pendulum")
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert run.data.params["env.kwargs.g"] == "abc"
    assert_never_running(store)


# --------------------------------------------------------------------------------------------------------------------
# in process: pgcli.training.build.train with a training hook that raises after a few updates
# --------------------------------------------------------------------------------------------------------------------


def train_raising_after(n_updates: int, exc: BaseException, store: Store, tmp_path: Path, monkeypatch) -> Any:
    """Run pgcli.training.build.train on PPO/CartPole; the SB3 rollout-end hook raises ``exc`` at the n-th update."""
    from pgcli.algo import sb3
    from pgcli.training.build import RunContext, train
    from pgcli.training.checks import train_config

    original = sb3._MonitorCallback._on_rollout_end
    calls = {"n": 0}

    def on_rollout_end(self: Any) -> None:
        original(self)
        calls["n"] += 1
        if calls["n"] == n_updates:
            raise exc

    monkeypatch.setattr(sb3._MonitorCallback, "_on_rollout_end", on_rollout_end)
    cfg = train_config([f"tracking.uri={store.uri}", "total_steps=100000", "eval.every=0", "progress=false"])
    ctx = RunContext(algo_name="ppo", env_name="cartpole", output_dir=tmp_path / "run", overrides=["test"])
    with pytest.raises(type(exc)):
        train(cfg, ctx)
    (run,) = store.runs("cartpole")
    return run


def test_exception_mid_training_ends_failed_with_metrics_flushed(store: Store, tmp_path: Path, monkeypatch):
    run = train_raising_after(5, RuntimeError("disk on fire"), store, tmp_path, monkeypatch)
    assert run.info.status == "FAILED"
    client = store.client()
    episodes = client.get_metric_history(run.info.run_id, "rollout/ep_return")
    assert episodes and max(m.step for m in episodes) <= 5 * 256  # logged before the crash, flushed by close
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "metrics.csv" in artifacts and "model" not in artifacts  # reports yes, a final model no
    assert_never_running(store)


def test_keyboard_interrupt_mid_training_ends_killed(store: Store, tmp_path: Path, monkeypatch):
    run = train_raising_after(3, KeyboardInterrupt(), store, tmp_path, monkeypatch)
    assert run.info.status == "KILLED"
    assert_never_running(store)


def test_interrupt_right_after_the_run_is_created_ends_killed(store: Store, tmp_path: Path, monkeypatch):
    # Ctrl-C while the progress bar is being set up, between MLflow's create_run and the first update.
    from pgcli.training import monitor
    from pgcli.training.build import RunContext, train
    from pgcli.training.checks import train_config

    def interrupted_bar(total: int) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(monitor, "_progress_bar", interrupted_bar)
    cfg = train_config([f"tracking.uri={store.uri}", "total_steps=1000", "progress=true"])
    with pytest.raises(KeyboardInterrupt):
        train(cfg, RunContext(algo_name="ppo", env_name="cartpole", output_dir=tmp_path / "run"))
    (run,) = store.runs("cartpole")
    assert run.info.status == "KILLED"


def test_a_run_whose_reports_cannot_be_written_ends_failed_and_says_what_is_missing(store: Store, tmp_path: Path):
    # A real filesystem fault: `metrics.csv` in the run directory is a directory, so writing the report fails with
    # IsADirectoryError after training went well. The run must not end FINISHED.
    import json

    from pgcli.training.build import RunContext, train
    from pgcli.training.checks import train_config

    run_dir = tmp_path / "run"
    (run_dir / "metrics.csv").mkdir(parents=True)
    cfg = train_config([f"tracking.uri={store.uri}", "total_steps=512", "eval.episodes=1", "progress=false"])
    train(cfg, RunContext(algo_name="ppo", env_name="cartpole", output_dir=run_dir))
    (run,) = store.runs("cartpole")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"].startswith("not written: metrics.csv/learning_curve.png in")
    assert "IsADirectoryError" in run.data.tags["error"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "FAILED" and record["run_id"] == run.info.run_id
    assert len(record["missing"]) == 1 and "metrics.csv" in record["missing"][0]
    # what could be written was: the metrics in the store, the final model
    assert store.client().get_metric_history(run.info.run_id, "time/sps")
    assert "model" in {a.path for a in store.client().list_artifacts(run.info.run_id)}


def test_run_records_its_process_and_a_finished_run_file(store: Store, tmp_path: Path):
    import json
    import os
    import socket

    from pgcli.training.build import RunContext, train
    from pgcli.training.checks import train_config

    cfg = train_config([f"tracking.uri={store.uri}", "total_steps=256", "eval.episodes=1", "progress=false"])
    train(cfg, RunContext(algo_name="ppo", env_name="cartpole", output_dir=tmp_path / "run"))
    (run,) = store.runs("cartpole")
    assert run.info.status == "FINISHED" and "error" not in run.data.tags
    assert run.data.tags["pid"] == str(os.getpid()) and run.data.tags["hostname"] == socket.gethostname()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "FINISHED" and record["missing"] == [] and record["tracking_uri"] == store.uri


def test_a_disk_that_fills_up_mid_run_ends_the_run_failed(store: Store, workdir: Path, tmp_path: Path):
    """A full disk (docs/runs.md, "How a run ends"): the run directory's file system fills up while training writes
    checkpoints: the run ends FAILED with the reason in its `error` tag, one error line, no traceback (a real tmpfs,
    so root only)."""
    import os

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {mounted.stderr.decode().strip()}")
    stderr = tmp_path / "stderr.txt"
    try:
        args = [
            "train",
            f"tracking.uri={store.uri}",
            f"hydra.run.dir={disk / 'run'}",
            "progress=false",
            "total_steps=10000000",
            "checkpoint_every=1024",
            "checkpoint_keep=0",
            "eval.every=0",
        ]
        proc = start_pgcli(args, cwd=workdir, stderr=stderr)
        checkpoints = disk / "run" / "checkpoints"
        wait_until(
            lambda: checkpoints.is_dir() and any(checkpoints.iterdir()),
            "a checkpoint",
            timeout=300,
            proc=proc,
            stderr=stderr,
        )
        with (disk / "filler").open("wb") as f:  # take every free byte, as another program on that disk would
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        proc.wait(timeout=300)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    err_text = stderr.read_text()
    assert proc.returncode == 1, err_text[-3000:]
    assert "Traceback" not in err_text and "pgcli: error:" in err_text, err_text[-3000:]
    (run,) = store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    assert run.info.status == "FAILED"
    assert "No space left on device" in run.data.tags.get("error", ""), run.data.tags.get("error")
