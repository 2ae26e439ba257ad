"""Real `pgcli train -m` sweeps (joblib, Optuna, Ray) read back from a temporary MLflow store.

Each sweep trains tiny jobs (one PPO/A2C update on CartPole or Pendulum) and checks the MLflow tree a user relies on:
one parent run per sweep, every job a child carrying `mlflow.parentRunId`, the parent's summary, failed jobs FAILED
with the sweep exiting non-zero. Learning quality is not asserted (benchmarks/ measures it).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import REPO, Store, cli_env, migrated, run_pgcli, start_pgcli

TINY = ["total_steps=256", "algo.n_steps=32", "eval.episodes=2", "eval.every=0", "progress=false",
        "tracking.log_model=false"]  # fmt: skip


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


def sweep(store: Store, workdir: Path, *overrides: str, timeout: float = 400, **env: str) -> Any:
    return run_pgcli(
        ["train", "-m", f"tracking.uri={store.uri}", *TINY, *overrides], cwd=workdir, timeout=timeout, **env
    )


def tree(store: Store) -> tuple[Any, list[Any]]:
    """The single sweep parent in the store and its children."""
    client = store.client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if r.data.tags.get("pgcli_role") == "sweep"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1, "every run of the sweep is a child of its parent"
    return parent, children


def artifacts(store: Store, run: Any) -> set[str]:
    return {a.path for a in store.client().list_artifacts(run.info.run_id)}


class Sweep(NamedTuple):
    store: Store
    workdir: Path
    stdout: str
    stderr: str
    returncode: int


@pytest.fixture(scope="module")
def joblib_grid(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Sweep:
    """One joblib sweep of four jobs, two at a time, with the progress display on: what the two tests below read."""
    root = tmp_path_factory.mktemp("joblib")
    store, workdir = migrated(root / "store", mlflow_schema_db), root / "work"
    workdir.mkdir()
    # hardware.eval_process asks for a second process per run; parallel jobs run in one process instead
    args = [
        "train",
        "-m",
        f"tracking.uri={store.uri}",
        *TINY,
        "progress=true",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "env=cartpole",
        "algo=ppo,a2c",
        "seed=0,1",
        "hardware.eval_process=true",
    ]
    # the streams' bytes, not text read with universal newlines: that would turn a bar's carriage returns into line ends
    out, err = root / "stdout", root / "stderr"
    proc = start_pgcli(args, cwd=workdir, stderr=err, stdout=out)
    try:
        returncode = proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Sweep(store, workdir, out.read_bytes().decode(), err.read_bytes().decode(), returncode)


def test_joblib_grid_sweep_is_one_parent_with_four_tagged_children(joblib_grid: Sweep) -> None:
    store, proc = joblib_grid.store, joblib_grid
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = tree(store)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["launcher"] == "JoblibLauncher" and parent.data.tags["env"] == "cartpole"
    assert "algo=ppo,a2c" in parent.data.params["sweep.overrides"]
    assert parent.data.params["launcher.n_jobs"] == "2"
    assert Path(parent.data.params["sweep.dir"]).is_dir()
    assert {"children.md", "children.csv", "multirun.yaml"} <= artifacts(store, parent)
    assert parent.data.metrics["sweep/n_jobs"] == 4 and parent.data.metrics["sweep/n_failed"] == 0

    assert len(children) == 4
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.info.experiment_id == parent.info.experiment_id for c in children)
    got = {(c.data.tags["algo"], c.data.tags["env"], c.data.tags["seed"]) for c in children}
    assert got == {(a, "cartpole", s) for a in ("ppo", "a2c") for s in ("0", "1")}
    assert {c.data.tags["sweep_job"] for c in children} == {"0", "1", "2", "3"}
    assert all("eval/return_mean" in c.data.metrics for c in children)
    assert "all finished" in proc.stderr and f"pgcli compare --parent {parent.info.run_id}" in proc.stderr
    assert all(c.data.params["hardware.eval_process"] == "False" for c in children)
    assert proc.stderr.count("a parallel sweep job runs in one process") == 4


def test_a_parallel_sweep_prints_whole_lines_and_one_summary_block_per_job(joblib_grid: Sweep) -> None:
    # Two jobs at once with the progress display on (docs/sweeps.md, "Launchers"): no live bars redrawing one line
    # in turn, no joblib machinery, each job's summary a block of its own that names the job
    stdout, stderr = joblib_grid.stdout, joblib_grid.stderr
    assert joblib_grid.returncode == 0, stderr[-3000:]
    assert "\r" not in stdout + stderr and "step/s" not in stderr, "a live progress bar in a parallel sweep"
    assert "Joblib.Parallel(" not in stderr and "loky" not in stderr
    assert all(f"\t#{job} : " in stderr for job in range(4))  # which job runs which overrides
    lines = stdout.splitlines()
    _, children = tree(joblib_grid.store)
    for child in children:
        job, algo, seed = (child.data.tags[key] for key in ("sweep_job", "algo", "seed"))
        (start,) = [i for i, ln in enumerate(lines) if ln.startswith(f"{algo} on cartpole (seed {seed}, job #{job}): ")]
        block = lines[start : start + 6]
        assert [ln.split()[0] for ln in block[1:]] == ["final", "device", "MLflow", "output", "compare"], stdout
        assert block[4].endswith(f"/{job}_{algo}_cartpole_s{seed}")


def test_jobs_that_differ_in_one_value_get_their_own_names_and_lines_as_typed(store: Store, workdir: Path) -> None:
    proc = sweep(store, workdir, "env=cartpole", "algo=ppo", "algo.learning_rate=0.001,0.002")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, children = tree(store)
    names = {c.info.run_name for c in children}
    assert names == {"ppo-cartpole-algo.learning_rate=0.001-s0", "ppo-cartpole-algo.learning_rate=0.002-s0"}
    jobs = [line for line in proc.stderr.splitlines() if "[HYDRA] \t#" in line]
    assert len(jobs) == 2 and all(f"tracking.uri={store.uri}" in line and "\\" not in line for line in jobs), jobs


def test_a_sweep_over_algorithms_takes_a_key_the_default_algorithm_lacks(store: Store, workdir: Path) -> None:
    # Hydra composes a sweep's primary config without its sweep lines (train.yaml's algo: ppo), where algo.beta does
    # not exist; pgcli composes it with the first swept algorithm, and each job still trains its own
    proc = run_pgcli(
        ["train", "-m", f"tracking.uri={store.uri}", "env=addition", "algo=grpo,rloo", "algo.beta=0.1",
         "total_steps=64", "eval.episodes=8", "progress=false", "tracking.log_model=false"],
        cwd=workdir, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, children = tree(store)
    assert sorted((c.data.params["algo"], c.data.params["algo.beta"]) for c in children) == [
        ("grpo", "0.1"),
        ("rloo", "0.1"),
    ]
    assert {c.info.status for c in children} == {"FINISHED"}


def test_a_parallel_jobs_progress_is_a_line_now_and_then_naming_the_job(capsys) -> None:
    from pgcli.training.progress import JobProgress

    progress = JobProgress("#1", total=1000, every_s=0.0)
    progress.set_postfix({"sps": "3,120", "return": "87.5"}, refresh=False)
    progress.update(400)
    progress.update(600)  # the end: the job's summary follows
    progress.close()
    assert capsys.readouterr().err == "pgcli: job #1: 400/1,000 steps (40%), sps 3,120, return 87.5\n"


def test_a_parallel_jobs_notes_are_whole_lines(capsys) -> None:
    # The monitor writes its notes (a busy core, the device) through the display, as through tqdm's bar
    from pgcli.training.progress import JobProgress

    JobProgress("#0", total=10).write("pgcli: note: something", file=sys.stderr)
    JobProgress("#0", total=10).write("pgcli: note: else")
    assert capsys.readouterr().err == "pgcli: note: something\npgcli: note: else\n"


def test_a_failing_job_fails_alone_and_the_sweep_exits_nonzero(store: Store, workdir: Path) -> None:
    # env.kwargs go to gymnasium.make: the last job's kwarg passes validation but CartPole rejects it at make time.
    # The basic launcher (one process, no worker start-up) keeps this test short; the joblib launcher stores a job's
    # exception the same way and the same sweeper re-raises it after the batch.
    kwargs = "++env.kwargs={},{sutton_barto_reward:true},{sutton_barto_reward:false},{no_such_kwarg:1}"
    proc = sweep(store, workdir, "algo=ppo", kwargs)
    assert proc.returncode != 0
    parent, children = tree(store)
    statuses = sorted(c.info.status for c in children)
    assert statuses == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    failed = next(c for c in children if c.info.status == "FAILED")
    assert failed.data.tags["sweep_job"] == "3" and "no_such_kwarg" in failed.data.tags["error"]
    assert parent.info.status == "FAILED" and parent.data.metrics["sweep/n_failed"] == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pgcli: sweep failed: 4 jobs, 1 failed: #3 ") and "no_such_kwarg" in last
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]


def test_a_failed_job_is_one_line_and_its_traceback_is_in_its_log(store: Store, workdir: Path) -> None:
    # The job fails in a joblib worker: it says so in one line (job, overrides, reason, where the traceback went);
    # Hydra prints neither "Error executing job" nor a traceback (docs/sweeps.md, "Failure isolation").
    proc = sweep(
        store,
        workdir,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "algo=ppo",
        "++env.kwargs={},{no_such_kwarg:1}",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgcli: job #1 ")]
    reason = "TypeError: CartPoleEnv.__init__() got an unexpected keyword argument 'no_such_kwarg'"
    assert line.startswith(f"pgcli: job #1 ++env.kwargs={{no_such_kwarg:1}} failed: {reason}"), line
    head, _, log = line.removesuffix(")").rpartition(" (traceback in ")
    assert head and log.endswith("/1_ppo_cartpole_s0/train.log"), line
    text = (workdir / log).read_text()
    assert "Traceback (most recent call last):" in text and reason in text
    assert proc.stderr.strip().splitlines()[-1].startswith("pgcli: sweep failed: 2 jobs, 1 failed: #1 ")


def test_optuna_sweep_records_best_params_on_the_parent(store: Store, workdir: Path) -> None:
    proc = sweep(
        store,
        workdir,
        "hparams_search=ppo_pendulum",
        "n_seeds=1",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.pruner=none",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "outputs" / "optuna.db").is_file()  # the resumable study
    parent, children = tree(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper"] == "OptunaSweeper"
    assert "sweeper.params.algo.learning_rate" in parent.data.params  # the search space
    best = {k: v for k, v in parent.data.params.items() if k.startswith("best.")}
    assert {"best.algo.learning_rate", "best.algo.gamma", "best.algo.clip_range"} <= set(best)
    returns = [c.data.metrics["eval/return_mean"] for c in children]
    assert len(children) == 3 and parent.data.metrics["best_value"] == pytest.approx(max(returns))
    best_child = max(children, key=lambda c: c.data.metrics["eval/return_mean"])
    assert float(best["best.algo.learning_rate"]) == pytest.approx(float(best_child.data.params["algo.learning_rate"]))
    assert "optimization_results.yaml" in artifacts(store, parent)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.ray
def test_make_ray_up_on_a_fresh_home_then_a_ray_sweep(store: Store, workdir: Path, tmp_path: Path) -> None:
    """`make ray-up` as a new user runs it: no ~/.ray/auth_token yet (Ray's token auth refused to start without one;
    docs/sweeps.md, "Ray")."""
    pytest.importorskip("ray", reason="Ray is not installed (make install installs the ray extra)")
    home, state = tmp_path / "home", tmp_path / "ray"
    home.mkdir()
    env = {**cli_env(), "HOME": str(home)}
    port = _free_port()
    # -o: the venv running this test is the installed one; never re-run `make install` from a test.
    make = [
        "make",
        "--no-print-directory",
        "-C",
        str(REPO),
        "-o",
        "install",
        "-o",
        ".venv/.installed",
        f"PY={sys.executable}",
        f"RAY_PORT={port}",
        f"RAY_DIR={state}",
    ]
    up = subprocess.run([*make, "ray-up"], capture_output=True, text=True, env=env, timeout=180)
    try:
        assert up.returncode == 0, (up.stdout + up.stderr)[-3000:]
        assert f"ray head on 127.0.0.1:{port}" in up.stdout
        token = home / ".ray" / "auth_token"
        assert token.is_file() and token.stat().st_mode & 0o077 == 0, "token created, readable by its owner only"
        proc = sweep(
            store,
            workdir,
            "hydra/launcher=ray",
            f"hydra.launcher.address=127.0.0.1:{port}",
            "algo=ppo",
            "env=cartpole",
            "seed=0,1",
            HOME=str(home),
        )
    finally:
        down = subprocess.run([*make, "ray-down"], capture_output=True, text=True, env=env, timeout=120)
    assert down.returncode == 0 and "ray head stopped" in down.stdout, down.stdout + down.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = tree(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["launcher"] == "RayLauncher"
    assert sorted(c.data.tags["seed"] for c in children) == ["0", "1"]
    assert all(c.info.status == "FINISHED" for c in children)
    # the jobs ran in Ray workers, not in the driver, and still found their parent; Ray names each job's lines
    out = proc.stdout + proc.stderr
    assert "(job #0 pid=" in out and "(job #1 pid=" in out
    assert "\x1b[" not in out and "deduplicates logs" not in out  # no colour codes in a pipe, no late repeats


def test_ctrl_c_ends_the_parent_and_running_children_killed(store: Store, workdir: Path) -> None:
    # A sweep long enough to be interrupted while its first job trains (basic launcher: the job runs in-process).
    args = [
        "train",
        "-m",
        f"tracking.uri={store.uri}",
        "progress=false",
        "tracking.log_model=false",
        "algo=ppo",
        "env=cartpole",
        "total_steps=1000000",
        "tracking.flush_every_s=0.2",
        "seed=0,1",
    ]
    err = workdir / "stderr.txt"
    proc = start_pgcli(args, cwd=workdir, stderr=err)
    try:
        deadline = time.monotonic() + 120
        running = []
        while not running and time.monotonic() < deadline and proc.poll() is None:
            client = store.client()
            exps = [e.experiment_id for e in client.search_experiments()]
            # an episode's return is logged: the first job is training (a Ctrl-C then stops it with a checkpoint)
            query = "tags.sweep_job = '0' and attributes.status = 'RUNNING' and metrics.`rollout/ep_return` > -1e9"
            running = client.search_runs(exps, query) if exps else []
            time.sleep(1)
        assert running, "the first job never started"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.read_text()
    assert proc.returncode == 130, stderr[-2000:]
    parent, children = tree(store)
    assert parent.info.status == "KILLED"
    assert [c.info.status for c in children] == ["KILLED"]  # the second job never started
    # the stopped job is not a failure; the summary says what is left and how to finish the sweep
    summary, finish = stderr.splitlines()[-2:]
    assert summary == (
        f"pgcli: sweep killed: 2 jobs, 1 interrupted, 1 not started (parent run {parent.info.run_id} ended KILLED)"
    )
    assert "failed" not in summary
    assert finish == (
        f"pgcli: to finish the sweep: pgcli train resume={children[0].info.run_id} tracking.uri={store.uri} "
        f"(job #0); pgcli train -m tracking.uri={store.uri} progress=false tracking.log_model=false algo=ppo "
        "env=cartpole total_steps=1000000 tracking.flush_every_s=0.2 seed=1 (job #1, not started)"
    )
