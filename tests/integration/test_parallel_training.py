"""Training on two cores (docs/benchmarks/trpo.md, "Two cores"): ``hardware.vec_env=worker|shm``,
``hardware.eval_process=true``, ``hardware.eval_in_worker`` and ``algo.critic_process=true`` change where the work
runs, not what is learned.

An end-to-end TRPO Hopper run through ``pgcli.training.build.train`` gives the same metric history (wall-clock
``time/*`` aside), best model and checkpoints as the one-process run; a real ``pgcli train`` whose env worker is killed
mid-training ends with a one-line error and a FAILED run instead of hanging.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pgcli.training.build import RunContext, train
from pgcli.training.checks import train_config
from tests.conftest import Store, busy_cores, run_pgcli, start_pgcli

# the Hopper preset (2 envs x 1024 steps, normalised) cut to 3 updates with an evaluation after each
TINY = ["algo=trpo", "env=hopper", "total_steps=6144", "eval.every=2048", "eval.episodes=2", "algo.n_critic_updates=2",
        "algo.cg_max_steps=5", "tracking=off", "progress=false", "checkpoint_every=4096", "seed=3"]  # fmt: skip


def run(out: Path, *overrides: str) -> list[tuple[str, str, str]]:
    cfg = train_config([*TINY, *overrides])
    summary = train(cfg, RunContext(algo_name="trpo", env_name="hopper", output_dir=out))
    with (summary.output_dir / "metrics.csv").open() as f:
        rows = [(r["key"], r["step"], r["value"]) for r in csv.DictReader(f) if not r["key"].startswith("time/")]
    return sorted(rows)  # evaluations in the background are logged when they finish, after later train/* rows


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str, str]]]:
    """The one-process run every two-core variant below must match: its directory and its metric rows (trained
    once for the three)."""
    out = tmp_path_factory.mktemp("parallel") / "serial"
    return out, run(out, "hardware.vec_env=sync", "hardware.eval_process=false", "algo.critic_process=false")


@pytest.mark.parametrize(
    ("vec_env", "eval_process", "critic_process"),
    [("worker", "true", "false"), ("shm", "true", "true"), ("shm", "false", "false")],  # the last: the preset's
    ids=["worker-eval_process", "shm-eval_process-critic_process", "shm-eval_in_worker"],
)
def test_worker_env_and_eval_process_learn_exactly_what_one_process_learns(
    vec_env: str, eval_process: str, critic_process: str, serial_run: tuple[Path, list], tmp_path: Path
):
    serial_dir, serial = serial_run
    # eval_process=false on shm: the env worker plays the evaluations (hardware.eval_in_worker, the default)
    parallel = run(
        tmp_path / "parallel",
        f"hardware.vec_env={vec_env}",
        f"hardware.eval_process={eval_process}",
        f"algo.critic_process={critic_process}",
        "hardware.eval_in_worker=true",
    )
    evals = [(step, value) for key, step, value in serial if key == "eval/return_mean"]
    assert [step for step, _ in evals] == ["2048", "4096", "6144"]
    assert serial == parallel
    # the best model is the agent as it was at its evaluation, in both runs
    dirs = (serial_dir, tmp_path / "parallel")
    best = [torch.load(run_dir / "best_model" / "model.pt", weights_only=False) for run_dir in dirs]
    for name in best[0]["policy"]:
        assert torch.equal(best[0]["policy"][name], best[1]["policy"][name]), name
    assert not list((tmp_path / "parallel").glob(".best_model.step_*"))  # candidates of other evaluations removed
    assert [p.name for p in (tmp_path / "parallel" / "checkpoints").iterdir()] == ["step_4096"]
    # the checkpoint was completed when the evaluation at its step came back: the same monitor state and networks
    ckpts = [run_dir / "checkpoints" / "step_4096" for run_dir in dirs]
    assert json.loads((ckpts[0] / "monitor.json").read_text()) == json.loads((ckpts[1] / "monitor.json").read_text())
    models = [torch.load(ckpt / "model.pt", weights_only=False) for ckpt in ckpts]
    for name in models[0]["policy"]:
        assert torch.equal(models[0]["policy"][name], models[1]["policy"][name]), name


def spawned_children(pid: int) -> list[int]:
    """The processes ``pid`` started with multiprocessing's spawn (not its resource tracker or other helpers)."""
    kids = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from /proc")
@pytest.mark.parametrize("vec_env", ["worker", "shm"])
def test_a_killed_env_worker_ends_the_run_failed_with_one_line(vec_env: str, migrated_store: Store, workdir: Path):
    stderr = workdir / "stderr.txt"
    args = [
        "train",
        "algo=trpo",
        "env=hopper",
        "total_steps=10000000",
        "eval.every=0",
        f"hardware.vec_env={vec_env}",
        "hardware.eval_process=false",
        "algo.critic_process=false",
        "hardware.busy_fallback=false",  # the worker even when another test process keeps a core busy
        "progress=true",
        f"tracking.uri={migrated_store.uri}",
        f"hydra.run.dir={workdir / 'run'}",
    ]
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)
    try:
        deadline = time.monotonic() + 180
        while "sps=" not in stderr.read_text():  # the first update is done: the run exists and is training
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "no training update within 180 s"
            time.sleep(0.1)  # polling interval
        (worker,) = spawned_children(proc.pid)  # the env worker (evaluation is off)
        subprocess.run(["kill", "-KILL", str(worker)], check=True)
        returncode = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    text = stderr.read_text()
    assert returncode == 1, text[-3000:]
    (line,) = [ln for ln in text.splitlines() if ln.startswith("pgcli: error:")]
    assert "the env worker process" in line and "died during" in line and "hardware.vec_env=sync" in line
    assert "Traceback" not in text
    (failed,) = migrated_store.runs("hopper")
    assert failed.info.status == "FAILED" and failed.info.end_time is not None


def test_a_run_on_a_busy_machine_falls_back_to_one_process_and_says_so(workdir: Path):
    # another process keeps every core busy: the preset's two-core path would make each step wait for a worker that
    # shares a core, so the run steps in one process (the same results) and says why
    with busy_cores():
        args = [a for a in TINY if not a.startswith("total_steps=")] + ["total_steps=2048"]
        proc = run_pgcli(["train", *args], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pgcli: note: no free core (another process is running): this run steps in one process" in proc.stderr


def test_a_run_whose_env_worker_shares_a_busy_core_logs_the_wait_and_says_so(workdir: Path):
    # the two-core path kept on a busy machine (hardware.busy_fallback=false): every vector step waits for a worker
    # that shares its core with another process. The run logs how much of its time went to that wait
    # (time/env_wait_frac) and says at the end that one process may be faster.
    with busy_cores():
        args = [a for a in TINY if not a.startswith("total_steps=")] + [
            "total_steps=4096",
            "hardware.vec_env=shm",
            "hardware.busy_fallback=false",
        ]
        proc = run_pgcli(["train", *args, f"hydra.run.dir={workdir / 'run'}"], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (workdir / "run" / "metrics.csv").open() as f:
        waits = [float(r["value"]) for r in csv.DictReader(f) if r["key"] == "time/env_wait_frac"]
    assert waits and all(0 <= w <= 1 for w in waits)
    (note,) = [ln for ln in proc.stderr.splitlines() if "used this run's cores" in ln]
    assert note.startswith("pgcli: note: another process used this run's cores (") and "hardware.vec_env=sync" in note
    assert "no free core" not in proc.stderr  # the fallback was off


def test_the_busy_cores_note_speaks_only_for_a_large_share():
    from pgcli.hardware.watch import BUSY_SHARE, WAIT_SHARE, busy_cores_note

    # the run queue decides where the kernel tells it; the worker waits alone never do then
    assert busy_cores_note(0.0, 90.0, 100.0) is None
    assert busy_cores_note(BUSY_SHARE * 100 - 1, 0.0, 100.0) is None
    assert "its two processes waited for a core 35% of the time" in (busy_cores_note(35.0, 0.0, 100.0) or "")
    # without it, the trainer's waits for the worker, with the higher bar
    assert busy_cores_note(None, WAIT_SHARE * 100 - 1, 100.0) is None
    assert "it waited for its env worker 60% of the time" in (busy_cores_note(None, 60.0, 100.0) or "")
    assert busy_cores_note(1.0, 1.0, 0.0) is None


def test_a_worker_that_loses_its_core_brings_its_envs_home_with_the_same_results(tmp_path: Path, capfd):
    # other processes take every core after the run has started on the two-core path (build.train does not check
    # for a free core at start; pgcli train's busy fallback does): after two updates that waited long for the
    # worker, the run moves the worker's sub-envs home and goes on in one process, learning exactly what the
    # one-process run learns, evaluations included
    steps = ["total_steps=10240", "eval.every=4096"]
    serial = run(tmp_path / "serial", *steps, "hardware.vec_env=sync", "hardware.eval_in_worker=false")
    with busy_cores():
        moved = run(tmp_path / "moved", *steps, "hardware.vec_env=shm", "hardware.eval_in_worker=true")
    err = capfd.readouterr().err
    assert "another process is using this run's cores" in err, err[-2000:]
    assert moved == serial
