"""One writer per run (docs/runs.md, "One writer per run"): a run that a live process writes cannot be resumed.

Each case starts real `pgcli train` processes: two resumes of one run at once (one is refused in one line, the other
finishes with one history), a resume while the run's own process trains (tracked and ``tracking=off``), and a resume
of a run RUNNING on another host (refused, naming that host).
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli, start_pgcli, wait_until
from tests.integration.test_resume import MANY_PER_STEP, histories, wait_for_checkpoint

SMALL = ["algo=trpo", "algo.n_steps=64", "algo.n_critic_updates=1", "algo.batch_size=64", "env.n_envs=2",
         "eval.every=0", "eval.episodes=2", "progress=false", "tracking.flush_every_s=0.1", "seed=1",
         "checkpoint_every=256"]  # fmt: skip


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


def finished_run(store: Store, workdir: Path) -> tuple[str, Path]:
    """A finished run of 256 steps with its checkpoint at 256: resumable with total_steps=<more>."""
    run_dir = workdir / "run"
    first = run_pgcli(
        ["train", *SMALL, "total_steps=256", f"tracking.uri={store.uri}", f"hydra.run.dir={run_dir}"], cwd=workdir
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = store.runs("cartpole")
    return run.info.run_id, run_dir


def test_two_resumes_at_once_one_is_refused_and_one_history_is_written(store: Store, workdir: Path):
    # the winner's budget is far beyond the test: it still trains when the loser checks, however late the loser
    # starts on a busy machine (with a short budget a late loser found the run finished, not running); it is then
    # stopped with SIGTERM, which ends it cleanly
    run_id, run_dir = finished_run(store, workdir)
    args = ["train", f"resume={run_id}", "total_steps=10000000", f"tracking.uri={store.uri}"]
    procs = [start_pgcli(args, cwd=workdir, stderr=workdir / f"resume{i}.txt") for i in range(2)]
    try:
        loser = wait_until(
            lambda: [p for p in procs if p.poll() is not None], "one resume to be refused", timeout=120, interval=0.05
        )[0]
        winner = procs[1 - procs.index(loser)]
        refused = (workdir / f"resume{procs.index(loser)}.txt").read_text()
        assert loser.returncode == 2, refused
        assert refused.strip().splitlines() == [
            f"pgcli: error: resume: run {run_id} is still running (pid {winner.pid} on {socket.gethostname()}); stop "
            "it first, or wait for it to end"
        ]
        assert winner.poll() is None
        wait_for_checkpoint(run_dir, winner, workdir / f"resume{procs.index(winner)}.txt", after=256)
        winner.send_signal(signal.SIGTERM)
        assert winner.wait(timeout=120) == 143
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    (run,) = store.runs("cartpole")
    assert run.info.status == "KILLED" and "error" not in run.data.tags
    for key, points in histories(store, run_id).items():
        if key not in MANY_PER_STEP:
            repeated = [s for s, n in Counter(s for s, _ in points).items() if n > 1]
            assert not repeated, f"{key} has steps logged twice: {repeated}"
    assert not (run_dir / ".owner").exists()  # the claim ends with the run


@pytest.mark.parametrize("tracking", ["mlflow", "off"])
def test_a_resume_while_the_run_trains_is_refused(tracking: str, store: Store, workdir: Path):
    run_dir = workdir / "run"
    where = [f"tracking.uri={store.uri}"] if tracking == "mlflow" else ["tracking=off"]
    proc = start_pgcli(
        ["train", *SMALL, "total_steps=10000000", *where, f"hydra.run.dir={run_dir}"],
        cwd=workdir,
        stderr=workdir / "first.txt",
    )
    try:
        wait_for_checkpoint(run_dir, proc, workdir / "first.txt")
        if tracking == "mlflow":
            (run,) = store.runs("cartpole")
            target, named = run.info.run_id, f"run {run.info.run_id}"
        else:
            target, named = str(run_dir), f"run {run_dir.resolve()}"
        lookup = where if tracking == "mlflow" else []  # a run directory needs no lookup
        resumed = run_pgcli(["train", f"resume={target}", *lookup], cwd=workdir, timeout=60)
        assert resumed.returncode == 2, resumed.stderr[-3000:]
        assert resumed.stderr.strip().splitlines() == [
            f"pgcli: error: resume: {named} is still running (pid {proc.pid} on {socket.gethostname()}); stop it "
            "first, or wait for it to end"
        ]
        assert proc.poll() is None  # the run's own process trains on
        # a new run into the same directory is refused before Hydra writes there: the run's .hydra/ is untouched
        hydra = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in (run_dir / ".hydra").iterdir()}
        new = run_pgcli(["train", *SMALL, "seed=2", *where, f"hydra.run.dir={run_dir}"], cwd=workdir, timeout=60)
        assert new.returncode == 2, new.stderr[-3000:]
        assert new.stderr.strip().splitlines() == [
            f"pgcli: error: the run in {run_dir} is still running (pid {proc.pid} on {socket.gethostname()}); stop "
            "it first, or wait for it to end"
        ]
        assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in (run_dir / ".hydra").iterdir()} == hydra
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run_dir / ".owner").exists()


def test_a_resume_of_a_run_running_on_another_host_is_refused(store: Store, workdir: Path):
    run_id, run_dir = finished_run(store, workdir)
    client = store.client()
    client.update_run(run_id, status="RUNNING")  # as a process on another machine sharing this store leaves it
    client.set_tag(run_id, "hostname", "elsewhere")
    client.set_tag(run_id, "pid", "4242")
    before = (store.root / "mlflow.db").read_bytes()
    resumed = run_pgcli(["train", f"resume={run_id}", "total_steps=512", f"tracking.uri={store.uri}"], cwd=workdir)
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert resumed.stderr.strip().splitlines() == [
        f"pgcli: error: resume: run {run_id} is RUNNING on host elsewhere (pid 4242), whose process cannot be checked "
        "from here; wait for it to end, or if it is gone, run `pgcli runs --stale` on elsewhere first"
    ]
    assert (store.root / "mlflow.db").read_bytes() == before
    assert not (run_dir / ".owner").exists()
