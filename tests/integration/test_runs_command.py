"""`pgcli runs` and `pgcli runs --stale` on a real MLflow store, through the real `pgcli` console script."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from pgcli.tracking.backend import MLflowBackend
from pgcli.tracking.spool import SPOOL_FILE, Spool
from pgcli.tracking.store import RunStore
from pgcli.tracking.uri import TrackingTarget
from pgcli.training.owner import process_start_time
from tests.conftest import Store, run_pgcli


def gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def running_run(store: Store, name: str, tags: dict[str, str]) -> str:
    backend = MLflowBackend(TrackingTarget(store.uri, None), experiment="cartpole", run_name=name, tags=tags)
    return backend.run_id


def test_stale_runs_are_found_and_marked_killed(migrated_store: Store, workdir: Path):
    store, host, me = migrated_store, socket.gethostname(), os.getpid()
    stale = running_run(store, "crashed", {"pid": str(gone_pid()), "hostname": host})
    alive = running_run(store, "alive", {"pid": str(me), "hostname": host, "pid_start": process_start_time(me)})
    # a live pid that is another process now (pid reuse): its start time differs from the one the run recorded
    reused = running_run(store, "reused", {"pid": str(me), "hostname": host, "pid_start": "1"})
    elsewhere = running_run(store, "elsewhere", {"pid": str(gone_pid()), "hostname": "another-host"})
    untagged = running_run(store, "untagged", {})

    dry = run_pgcli(["runs", "--stale", "--dry-run", f"tracking.uri={store.uri}"], cwd=workdir)
    assert dry.returncode == 0, dry.stderr
    assert {line.split()[0] for line in dry.stdout.splitlines()} == {stale, reused}
    assert "would mark 2 stale run(s) KILLED; 2 RUNNING run(s) of other hosts or without a pid tag" in dry.stderr
    assert all(r.info.status == "RUNNING" for r in store.runs("cartpole"))  # --dry-run changes nothing

    proc = run_pgcli(["runs", "--stale", f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    status = {r.info.run_id: r.info.status for r in store.runs("cartpole")}
    assert status == {stale: "KILLED", reused: "KILLED", alive: "RUNNING", elsewhere: "RUNNING", untagged: "RUNNING"}
    killed = store.client().get_run(stale)
    assert killed.data.tags["error"].startswith("marked KILLED by pgcli runs --stale: process")
    assert killed.info.end_time is not None

    listing = run_pgcli(["runs", f"tracking.uri={store.uri}"], cwd=workdir)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:2] == ["id", "status"] and len(lines) == 1 + 5
    assert any(line.startswith(stale[:8]) and "KILLED" in line for line in lines)


def test_runs_without_a_store_is_one_line_and_creates_nothing(workdir: Path):
    proc = run_pgcli(["runs", "--stale"], cwd=workdir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"pgcli: error: no run store at {workdir.resolve()}/outputs/mlflow.db: nothing to list; run `pgcli train` "
        "first, run pgcli in the folder that holds outputs/, or set tracking.uri=sqlite:///<file>"
    ]
    assert not (workdir / "outputs").exists()


def test_a_run_that_ended_offline_is_not_stale_and_sync_delivers_its_end(migrated_store: Store, workdir: Path):
    """A run that ended while its tracking server was down shows RUNNING with its process gone; its end waits in the
    run directory's spool (docs/tracking.md, "When the tracking server goes away"), so it is not stale."""
    store, host = migrated_store, socket.gethostname()
    run_dir = workdir / "outputs" / "runs" / "offline"
    run_id = running_run(store, "offline", {"pid": str(gone_pid()), "hostname": host, "output_dir": str(run_dir)})
    spool = Spool(run_dir / SPOOL_FILE)
    spool.start(run_id, store.uri)  # a spool written against a server names it; sync delivers to any store
    spool.append({"op": "metrics", "metrics": [["rollout/ep_return", 9.0, 1_000, 64]]})
    spool.append({"op": "end", "status": "FINISHED", "end_time": 2_000})

    proc = run_pgcli(["runs", "--stale", f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"`pgcli sync {run_dir}` delivers it" in proc.stderr
    assert "marked 0 stale run(s) KILLED; 1 that ended offline left for pgcli sync" in proc.stderr
    assert store.client().get_run(run_id).info.status == "RUNNING"

    # a mark made anyway (an older pgcli, a run directory it could not see) is undone by delivering the spool
    backend = MLflowBackend(
        TrackingTarget(store.uri, None), experiment="cartpole", run_name="x", tags={}, run_id=run_id
    )
    backend.set_tags({"error": "marked KILLED by pgcli runs --stale: process 1 is gone"})
    backend.end("KILLED")
    sync = run_pgcli(["sync", str(run_dir)], cwd=workdir)
    assert sync.returncode == 0, sync.stderr
    assert sync.stdout.strip() == f"pgcli: delivered 2 writes to run {run_id}; run ended FINISHED"
    run = store.client().get_run(run_id)
    assert (run.info.status, run.info.end_time, "error" in run.data.tags) == ("FINISHED", 2_000, False)


class Trained(NamedTuple):
    store: Store
    workdir: Path
    run_id: str
    short: str
    """The run's id as the first `pgcli runs` listed it."""
    evaluated: subprocess.CompletedProcess[str]
    resumed: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Trained:
    """One real training run, listed by `pgcli runs`, evaluated by `pgcli eval <the 8 digits listed>` and resumed to
    512 steps by `pgcli train resume=<the 8 digits>`: the two tests below assert on it (each command runs once)."""
    root = tmp_path_factory.mktemp("runs_command")
    store, workdir = Store(root / "store"), root / "work"
    store.root.mkdir()
    workdir.mkdir()
    shutil.copyfile(mlflow_schema_db, store.root / "mlflow.db")
    uri = f"tracking.uri={store.uri}"
    train = run_pgcli(["train", "total_steps=256", "eval.episodes=2", "progress=false", uri], cwd=workdir)
    assert train.returncode == 0, train.stderr[-3000:]
    (run,) = store.runs("cartpole")
    listing = run_pgcli(["runs", uri], cwd=workdir)
    assert listing.returncode == 0, listing.stderr
    short = listing.stdout.splitlines()[1].split()[0]
    evaluated = run_pgcli(["eval", short, "--episodes", "2", uri], cwd=workdir)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    resumed = run_pgcli(["train", f"resume={short}", "total_steps=512", uri], cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return Trained(store, workdir, run.info.run_id, short, evaluated, resumed)


def test_runs_lists_what_each_run_trained_and_scored_and_eval_runs_apart(trained: Trained):
    """A real training run (resumed to 512 steps) and a real `pgcli eval` of it, plus two runs written straight to the
    store: one killed after a resume raised its budget (its `total_steps` tag; docs/runs.md, "Resume"), one text run
    (accuracy)."""
    store, workdir, uri = trained.store, trained.workdir, f"tracking.uri={trained.store.uri}"
    (train,) = [r for r in store.runs("cartpole") if r.info.run_id == trained.run_id]
    (ev,) = [r for r in store.runs("cartpole") if r.info.run_name.startswith("eval-")]

    runs = RunStore(store.uri)
    resumed = runs.create_run(
        "cartpole",
        run_name="trpo-resumed-" + "x" * 80,
        tags={"algo": "trpo", "env_id": "CartPole-v1", "total_steps": "3000"},
    )
    runs.log_params(resumed.run_id, {"total_steps": 500, "algo": "trpo"})
    runs.log_metrics(resumed.run_id, {"rollout/ep_return_mean": 20.0, "eval/return_mean": 31.5}, step=1000)
    runs.end(resumed.run_id, "KILLED")
    text = runs.create_run("countdown", run_name="grpo-countdown-s0", tags={"algo": "grpo", "env_id": "countdown"})
    runs.log_params(text.run_id, {"total_steps": 64})
    runs.log_metrics(text.run_id, {"eval/return_mean": 0.5, "eval/accuracy": 0.75}, step=64)
    runs.end(text.run_id, "FINISHED")

    proc = run_pgcli(["runs", uri], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    header = ["id", "status", "experiment", "algo", "env", "steps", "duration", "return", "started", "name"]
    assert lines[0].split() == header
    split = lines.index("")  # the training runs, a blank line, then the eval runs
    rows = {line.split()[0]: line.split() for line in lines[1:split]}
    assert set(rows) == {train.info.run_id[:8], resumed.run_id[:8], text.run_id[:8]}  # no eval run among them

    final = train.data.metrics["eval/return_mean"]
    row = rows[train.info.run_id[:8]]
    assert row[1:6] == ["FINISHED", "cartpole", "ppo", "CartPole-v1", "512"]
    assert re.fullmatch(r"(\d+m)?\d+s", row[6]) and row[7] == f"{final:.1f}" and row[-1] == "ppo-cartpole-s0"
    row = rows[resumed.run_id[:8]]
    assert row[1:8] == ["KILLED", "cartpole", "trpo", "CartPole-v1", "1k/3k", "0s", "31.5"]  # 1000 of its new 3000
    assert row[-1].startswith("trpo-resume") and "…" in row[-1]  # a long name is cut to fit, in its middle
    assert rows[text.run_id[:8]][1:9] == ["FINISHED", "countdown", "grpo", "countdown", "64", "0s", "acc", "0.750"]

    assert lines[split + 1] == "eval runs (pgcli eval)"
    assert lines[split + 2].split() == [
        "id",
        "status",
        "experiment",
        "algo",
        "env",
        "model",
        "episodes",
        "return",
        "started",
        "name",
    ]
    (eval_row,) = [line.split() for line in lines[split + 3 :]]
    ev_return = ev.data.metrics["eval/return_mean"]
    assert eval_row[:8] == [
        ev.info.run_id[:8],
        "FINISHED",
        "cartpole",
        "ppo",
        "CartPole-v1",
        "final",
        "2",
        f"{ev_return:.1f}",
    ]
    assert eval_row[-1] == "eval-ppo-cartpole-s0"
    assert f"pgcli: 3 of 3 runs, 1 of 1 eval runs in {store.uri}" in proc.stderr

    only = run_pgcli(["runs", "--experiment", "countdown", "--limit", "1", uri], cwd=workdir)
    assert only.returncode == 0, only.stderr
    assert [line.split()[0] for line in only.stdout.splitlines()] == ["id", text.run_id[:8]]
    assert f"pgcli: 1 of 1 runs in {store.uri}" in only.stderr


def test_names_that_share_their_start_stay_apart(migrated_store: Store, workdir: Path):
    runs = RunStore(migrated_store.uri)
    names = [f"ppo_lm-addition-lora-algo.learning_rate=0.000{i}-s0" for i in range(1, 6)]
    tags = {"algo": "ppo_lm", "env_id": "a-long-custom-env-id-v0"}
    for name in names:
        runs.end(runs.create_run("a-long-experiment-name", run_name=name, tags=tags).run_id, "FINISHED")
    proc = run_pgcli(["runs", f"tracking.uri={migrated_store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    shown = [line.split()[-1] for line in proc.stdout.splitlines()[1:]]
    assert len(shown) == 5 and len(set(shown)) == 5 and all("…" in cell for cell in shown), shown
    assert {cell[-7:] for cell in shown} == {name[-7:] for name in names}  # where they differ: their end


def test_an_id_as_pgcli_runs_lists_it_names_the_run_for_eval_and_resume(trained: Trained):
    """`pgcli runs` shows the first 8 hex digits of a run id; every command that takes a run takes them (docs/runs.md,
    "Run ids"), and what it writes names the whole id."""
    store, run_id = trained.store, trained.run_id
    assert trained.short == run_id[:8]
    (ev,) = [r for r in store.runs("cartpole") if r.info.run_name.startswith("eval-")]  # the other test adds runs
    assert ev.data.tags["source_run_id"] == run_id and ev.data.tags["mlflow.parentRunId"] == run_id
    assert f"pgcli: resuming {run_id} from " in trained.resumed.stderr
    run = store.client().get_run(run_id)
    assert (run.info.status, run.data.tags["total_steps"]) == ("FINISHED", "512")
