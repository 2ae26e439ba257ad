"""`pgcli train resume=<run>`: a real `pgcli train` killed with SIGKILL after its first checkpoint, then resumed.

Each case starts a real subprocess, polls (with a timeout) until the first checkpoint is complete on disk, kills it
with SIGKILL (the run stays RUNNING: nothing can end it), and resumes it with a second real subprocess. The resumed
run must be the same MLflow run, end FINISHED at the requested step count, hold no metric step twice, and continue
its curves (episode counter, evaluations) instead of starting them over.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import Store, busy_cores, run_pgcli, start_pgcli, wait_until

TOTAL_STEPS = 2048
CHECKPOINT_EVERY = 256
COMMON = [f"total_steps={TOTAL_STEPS}", f"checkpoint_every={CHECKPOINT_EVERY}", "eval.every=256", "eval.episodes=2",
          "progress=false", "tracking.flush_every_s=0.1", "seed=1"]  # fmt: skip
CASES = {
    "trpo": ["algo=trpo", "algo.n_steps=64", "algo.n_critic_updates=1", "algo.batch_size=64", "env.n_envs=2"],
    "ppo_kl": ["algo=ppo_kl", "algo.n_steps=64", "algo.n_epochs=1", "algo.batch_size=64", "env.n_envs=2"],
    "grpo": ["algo=grpo", "algo.group_size=4", "algo.n_groups=2", "algo.batch_size=4", "env.n_envs=4"],
    "ppo": ["algo=ppo", "algo.n_steps=64", "algo.n_epochs=1", "algo.batch_size=64", "env.n_envs=2"],
}
MANY_PER_STEP = {"rollout/ep_return", "rollout/ep_len"}
"""One point per episode: several episodes can end in one vector step, so these keys may repeat a step."""


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


def wait_for_checkpoint(
    run_dir: Path, proc: subprocess.Popen[bytes], stderr: Path, timeout: float = 240, after: int = -1
) -> None:
    """Poll until a checkpoint (past step ``after``, when given) with its monitor state is on disk (the monitor writes
    monitor.json last)."""

    def found() -> bool:
        steps = [p.parent.name.removeprefix("step_") for p in (run_dir / "checkpoints").glob("step_*/monitor.json")]
        return any(int(s) > after for s in steps if s.isdigit())

    wait_until(found, f"a checkpoint past step {after}", timeout=timeout, proc=proc, stderr=stderr, interval=0.05)


def histories(store: Store, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = store.client()
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


@pytest.mark.parametrize("algo", list(CASES))
def test_sigkill_then_resume_continues_the_same_run(algo: str, store: Store, workdir: Path):
    run_dir = workdir / "run"
    args = ["train", *CASES[algo], *COMMON, f"tracking.uri={store.uri}", f"hydra.run.dir={run_dir}"]
    proc = start_pgcli(args, cwd=workdir, stderr=workdir / "first.txt")
    try:
        wait_for_checkpoint(run_dir, proc, workdir / "first.txt")
        proc.kill()  # SIGKILL: no handler runs, the run cannot be ended
        assert proc.wait(timeout=60) == -9, "pgcli finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
    (killed,) = store.runs("cartpole")
    run_id = killed.info.run_id
    assert killed.info.status == "RUNNING"
    before = histories(store, run_id)
    checkpoints = sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))

    if algo == "trpo":  # the stale-run finder sees it (its pid is gone); --dry-run leaves it RUNNING for the resume
        stale = run_pgcli(["runs", "--stale", "--dry-run", f"tracking.uri={store.uri}"], cwd=workdir)
        assert stale.returncode == 0, stale.stderr
        assert run_id in stale.stdout and "would mark 1 stale run(s) KILLED" in stale.stderr

    resumed = run_pgcli(["train", f"resume={run_id}", f"tracking.uri={store.uri}"], cwd=workdir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr

    (run,) = store.runs("cartpole")  # one MLflow run: the same one, re-opened
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    resumed_from = int(run.data.tags["resumed_from_step"])
    assert resumed_from in checkpoints and resumed_from < TOTAL_STEPS
    after = histories(store, run_id)

    # the final step count is what the original config asked for (on-policy: the first update boundary past it)
    sps_steps = [s for s, _ in after["time/sps"]]
    assert TOTAL_STEPS <= sps_steps[-1] < TOTAL_STEPS + 1024
    # no metric step logged twice (per-episode keys may legitimately hold several episodes at one step)
    for key, points in after.items():
        if key not in MANY_PER_STEP:
            repeated = [s for s, n in Counter(s for s, _ in points).items() if n > 1]
            assert not repeated, f"{key} has steps logged twice: {repeated}"
    # everything the killed process stored is still there, and the resumed process only added later steps
    for key, points in before.items():
        kept = [p for p in after[key] if p[0] <= points[-1][0]]
        assert kept == points, key
    # the curves continue: the episode counter carries on from the checkpoint instead of restarting at 0
    episodes = [v for _, v in after["time/episodes"]]
    assert episodes == sorted(episodes) and episodes[-1] > episodes[0]
    eval_steps = [s for s, _ in after["eval/return_mean"]]
    assert eval_steps == sorted(set(eval_steps)) and eval_steps[0] <= resumed_from < eval_steps[-1]
    assert (run_dir / "model").is_dir() and (run_dir / "metrics.csv").is_file()
    csv_rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert sum(r.startswith("time/sps,") for r in csv_rows) == len(after["time/sps"])  # the report has both halves


def test_a_run_killed_in_its_final_evaluation_is_resumed_into_its_ending(store: Store, workdir: Path):
    # Issue 34: SIGKILL after the checkpoint at the budget, in the final evaluation (long: many episodes), left the run
    # RUNNING for good, without its final evaluation, model or reports, and resume refused it: "nothing to train".
    run_dir = workdir / "run"
    budget = ["total_steps=256", "checkpoint_every=256", "eval.every=0", "eval.episodes=1500"]
    args = ["train", *CASES["trpo"], *COMMON, *budget, f"tracking.uri={store.uri}", f"hydra.run.dir={run_dir}"]
    proc = start_pgcli(args, cwd=workdir, stderr=workdir / "first.txt")
    try:
        wait_for_checkpoint(run_dir, proc, workdir / "first.txt", after=255)
        proc.kill()  # in the final evaluation: the checkpoint at the budget is on disk, the run not ended
        assert proc.wait(timeout=60) == -9, "pgcli finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "final evaluation at step 256: 1500 episodes..." in (workdir / "first.txt").read_text()
    (killed,) = store.runs("cartpole")
    run_id = killed.info.run_id
    assert killed.info.status == "RUNNING" and "eval/return_mean" not in killed.data.metrics
    assert not (run_dir / "model").exists() and not (run_dir / "learning_curve.png").exists()

    resumed = run_pgcli(["train", f"resume={run_id}", f"tracking.uri={store.uri}"], cwd=workdir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 256 of 256); training is done, the run ends: the final evaluation" in resumed.stderr
    assert "final evaluation at step 256: 1500 episodes..." in resumed.stderr
    (run,) = store.runs("cartpole")  # the same run, ended
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    final = histories(store, run_id)["eval/return_mean"]
    assert [s for s, _ in final] == [256]
    assert f"final eval return  {final[0][1]:.1f} ± " in resumed.stdout
    assert (run_dir / "model").is_dir() and (run_dir / "learning_curve.png").is_file()
    assert (run_dir / "metrics.csv").is_file() and json.loads((run_dir / "run.json").read_text())[
        "status"
    ] == "FINISHED"

    again = run_pgcli(["train", f"resume={run_id}", f"tracking.uri={store.uri}"], cwd=workdir)  # FINISHED: nothing left
    assert again.returncode == 2 and "pass total_steps=<more> to train further" in again.stderr, again.stderr


def test_resume_rejects_bad_targets_and_unloadable_checkpoints_and_changes_nothing(
    store: Store, workdir: Path, monkeypatch
):
    """One tracked run of 512 steps: every checkpoint truncated, then none at all, and bad targets and overrides."""
    import shutil

    from pgcli.errors import ConfigError
    from pgcli.training.resume import plan_resume

    run_dir = workdir / "run"
    args = [
        "train",
        *CASES["trpo"],
        *COMMON,
        "total_steps=512",
        f"tracking.uri={store.uri}",
        f"hydra.run.dir={run_dir}",
    ]
    first = run_pgcli(args, cwd=workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = store.runs("cartpole")
    before = (store.root / "mlflow.db").read_bytes()

    # no checkpoint that loads: one line naming the newest, exit 1, the run left as it was
    for checkpoint in [*(run_dir / "checkpoints").glob("step_*"), run_dir / "model"]:
        truncate(checkpoint / "model.pt")
    proc = run_pgcli(["train", f"resume={run_dir}", "total_steps=1024"], cwd=workdir)
    assert proc.returncode == 1, proc.stderr[-3000:]
    newest = run_dir.resolve() / "checkpoints" / "step_512"
    assert proc.stderr.strip().splitlines() == [
        f"pgcli: error: resume: no checkpoint of {run_dir.resolve()} can be loaded; the newest: cannot read checkpoint "
        f"file {newest}/model.pt: truncated or corrupt (BadZipFile: File is not a zip file)"
    ]
    assert (store.root / "mlflow.db").read_bytes() == before
    (again,) = store.runs("cartpole")
    assert again.info.status == "FINISHED"

    # as a run that failed before its first checkpoint: nothing to continue from
    shutil.rmtree(run_dir / "model")
    shutil.rmtree(run_dir / "checkpoints")

    monkeypatch.chdir(workdir)
    lookup = f"tracking.uri={store.uri}"
    bad = {
        # (resume target, overrides): words of the one-line error
        (run.info.run_id, lookup): "has no checkpoint",
        ("0" * 32, lookup): f"no run '{'0' * 32}' in {store.uri}",
        (str(run_dir), "algo.target_kl=0.5"): "'algo.target_kl' cannot change when a run continues",
        (str(run_dir), "eval.episodes=20"): "'eval.episodes' cannot change",
        (str(run_dir), "total_steps=10"): "total_steps=10 is below the run's 512; it may only grow",
        (str(workdir), ""): "not a pgcli run directory",
        ("nonsense", ""): "neither a run directory nor an MLflow run id",
        (run.info.run_id, "tracking.uri=sqlite:///nowhere/mlflow.db"): (
            f"no run store at {workdir.resolve()}/nowhere/mlflow.db: nothing to resume"
        ),
    }
    for (target, override), words in bad.items():
        with pytest.raises(ConfigError) as info:
            plan_resume(target, [override] if override else [])
        assert words in str(info.value) and "\n" not in str(info.value), (target, override, str(info.value))
    # through the CLI: one line, exit 2, no traceback
    proc = run_pgcli(["train", f"resume={run_dir}", "algo.target_kl=0.5"], cwd=workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "pgcli: error: resume: 'algo.target_kl' cannot change when a run continues (it changes the experiment); "
        "allowed: total_steps, progress, checkpoint_every, checkpoint_keep, hardware.torch_threads, "
        "tracking.flush_every_s; to train with other values start a new run"
    ]
    assert (store.root / "mlflow.db").read_bytes() == before  # nothing changed in the store
    assert not (workdir / "nowhere").exists()


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:100])


def bad_monitor_step(file: Path) -> None:
    file.write_text(json.dumps(json.loads(file.read_text()) | {"step": 999}))


CORRUPT = {
    # damage done to model.pt / monitor.json / state.json: words of the note that skips the checkpoint
    "truncated_model": ("model.pt", truncate, "model.pt: truncated or corrupt (BadZipFile"),
    "monitor_of_another_step": ("monitor.json", bad_monitor_step, "monitor.json is for step 999"),
    "unreadable_state": (
        "state.json",
        lambda f: f.write_text("{"),
        "state.json: truncated or corrupt (JSONDecodeError",
    ),
}


@pytest.fixture(scope="module")
def run_of_512(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FINISHED tracking=off run of 512 steps: checkpoints/step_256, step_512 and its final model/ (at 512)."""
    work = tmp_path_factory.mktemp("resume")
    run_dir = work / "run"
    args = ["train", *CASES["trpo"], *COMMON, "total_steps=512", "tracking=off", f"hydra.run.dir={run_dir}"]
    first = run_pgcli(args, cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_256", "step_512"]
    return run_dir


@pytest.mark.parametrize("damage", list(CORRUPT))
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_note(damage: str, run_of_512: Path, workdir: Path):
    import shutil

    run_dir = workdir / "run"
    shutil.copytree(run_of_512, run_dir)
    file, corrupt, words = CORRUPT[damage]
    for newest in (run_dir / "checkpoints" / "step_512", run_dir / "model"):  # both hold the state at step 512
        corrupt(newest / file)
    resumed = run_pgcli(["train", f"resume={run_dir}", "total_steps=768"], cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = resumed.stderr.strip().splitlines()
    notes = [line for line in lines if line.startswith("pgcli: note: skipped checkpoint")]
    where = run_dir.resolve()
    assert {n.split(": ", 3)[2] for n in notes} == {
        f"skipped checkpoint {where}/checkpoints/step_512",
        f"skipped checkpoint {where}/model",
    }, notes
    assert all(words in note for note in notes), notes
    assert f"from {where}/checkpoints/step_256 (step 256 of 768)" in resumed.stderr
    assert "Traceback" not in resumed.stderr


def test_the_runs_own_overrides_repeated_change_nothing(run_of_512: Path, workdir: Path, monkeypatch):
    # the command that started a run, with resume= and more total_steps: its own overrides, as they were, are no change
    from pgcli.errors import ConfigError
    from pgcli.training.resume import plan_resume

    monkeypatch.chdir(workdir)
    same = [*CASES["trpo"], *COMMON, "total_steps=512", "tracking=off"]
    plan = plan_resume(str(run_of_512), [*same, "total_steps=1024"])
    assert plan.cfg.total_steps == 1024 and plan.cfg.tracking.backend == "off"
    with pytest.raises(ConfigError, match=r"'algo\.n_steps' cannot change when a run continues"):
        plan_resume(str(run_of_512), [*same, "algo.n_steps=32"])  # a value it did not have


def test_ctrl_c_then_resume_without_tracking_keeps_one_history(workdir: Path):
    # tracking=off: the run directory is all there is. Ctrl-C stops cleanly (checkpoint, model, metrics.csv); the
    # resume reads the config and metrics.csv back and ends with one history, no step twice.
    import csv
    import signal

    run_dir = workdir / "run"
    args = ["train", *CASES["trpo"], *COMMON, "tracking=off", f"hydra.run.dir={run_dir}"]
    proc = start_pgcli(args, cwd=workdir, stderr=workdir / "first.txt")
    try:
        wait_for_checkpoint(run_dir, proc, workdir / "first.txt")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (workdir / "first.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    first_text = (workdir / "first.txt").read_text()
    assert "stopping after this update" in first_text and "Traceback" not in first_text
    stopped_at = max(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))
    assert stopped_at < TOTAL_STEPS and (run_dir / "model" / "model.pt").is_file()

    resumed = run_pgcli(["train", f"resume={run_dir}"], cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from {run_dir.resolve()}/checkpoints/step_{stopped_at} (step {stopped_at:,} of {TOTAL_STEPS:,})" in (
        resumed.stderr
    )
    with (run_dir / "metrics.csv").open() as f:
        rows = [(r["key"], int(r["step"])) for r in csv.DictReader(f)]
    sps = [step for key, step in rows if key == "time/sps"]
    assert sps == sorted(set(sps)) and sps[0] <= stopped_at and sps[-1] >= TOTAL_STEPS
    for key in {k for k, _ in rows} - MANY_PER_STEP:
        steps = [s for k, s in rows if k == key]
        assert len(steps) == len(set(steps)), key


def test_one_seed_of_an_n_seeds_job_resumes_alone(store: Store, workdir: Path):
    # n_seeds=2 trains seeds 3 and 4 one after another in <job dir>/seed3 and seed4; the Hydra config is the job's.
    # Resuming seed 4's run continues that run alone, with seed 4, from its own last checkpoint.
    import shutil

    job_dir = workdir / "job"
    args = [
        "train",
        *CASES["trpo"],
        *COMMON[1:-1],
        "total_steps=1024",
        "seed=3",
        "n_seeds=2",
        f"tracking.uri={store.uri}",
        f"hydra.run.dir={job_dir}",
    ]
    first = run_pgcli(args, cwd=workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    client = store.client()
    runs = {
        r.data.params["seed"]: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
    }
    run = runs["4"]
    assert run.data.tags["output_dir"] == str((job_dir / "seed4").resolve()) and not (job_dir / "seed4/.hydra").exists()

    resumed = run_pgcli(
        ["train", f"resume={run.info.run_id}", "total_steps=2048", f"tracking.uri={store.uri}"], cwd=workdir
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{(job_dir / 'seed4').resolve()}/checkpoints/step_1024 (step 1,024 of 2,048)" in resumed.stderr
    assert "trpo on cartpole (seed 4)" in resumed.stdout
    after = client.get_run(run.info.run_id)
    assert after.info.status == "FINISHED" and after.data.params["seed"] == "4"
    history = histories(store, run.info.run_id)
    assert max(s for s, _ in history["time/sps"]) >= 2048
    for key in set(history) - MANY_PER_STEP:
        steps = [s for s, _ in history[key]]
        assert len(steps) == len(set(steps)), key
    assert client.get_run(runs["3"].info.run_id).data.metrics == runs["3"].data.metrics  # seed 3 untouched

    shutil.copytree(job_dir / "seed4", job_dir / "seed7")  # a seed the job never trained (seeds 3..4)
    bad = run_pgcli(["train", f"resume={job_dir / 'seed7'}", "total_steps=4096"], cwd=workdir)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "is seed 7, but its job trained seeds 3..4" in bad.stderr


def test_a_resume_on_a_busy_machine_falls_back_to_one_process_and_says_so(workdir: Path):
    # a two-core run (hardware.vec_env=shm) resumed while other processes keep every core busy continues in one
    # process, like `pgcli train` itself: checkpoints do not depend on the vector env, and the results are the same
    run_dir = workdir / "run"
    args = [
        "train",
        *CASES["trpo"],
        *COMMON[1:],
        "total_steps=512",
        "tracking=off",
        "hardware.vec_env=shm",
        f"hydra.run.dir={run_dir}",
    ]
    first = run_pgcli(args, cwd=workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    with busy_cores():
        resumed = run_pgcli(["train", f"resume={run_dir}", "total_steps=1024"], cwd=workdir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "pgcli: note: no free core (another process is running): this run steps in one process" in resumed.stderr
    assert "(step 512 of 1,024)" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    sps = [ln for ln in (run_dir / "metrics.csv").read_text().splitlines() if ln.startswith("time/sps,")]
    assert max(int(ln.split(",")[1]) for ln in sps) >= 1024


def test_sigkill_then_resume_without_tracking_keeps_every_point_before_the_checkpoint(workdir: Path):
    # tracking=off: metrics.csv is the run's only store. It is rewritten before each checkpoint, so a run killed with
    # no time to write its reports resumes with the points up to its checkpoint, and ends with the metrics of an
    # uninterrupted run (TRPO's resume is exact).
    from tests.integration.test_exact_resume import csv_history

    common = [*CASES["trpo"], *COMMON, "tracking=off"]
    straight, killed = workdir / "straight", workdir / "killed"
    done = run_pgcli(["train", *common, f"hydra.run.dir={straight}"], cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    proc = start_pgcli(["train", *common, f"hydra.run.dir={killed}"], cwd=workdir, stderr=workdir / "first.txt")
    try:
        wait_for_checkpoint(killed, proc, workdir / "first.txt", after=CHECKPOINT_EVERY)
        proc.kill()
        assert proc.wait(timeout=60) == -9, "pgcli finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((killed / "run.json").read_text())["status"] == "RUNNING"
    flushed = csv_history(killed)  # what the killed process left: every point up to a checkpoint it reached
    assert [row for row in flushed if row[0] == "eval/return_mean" and row[1] == CHECKPOINT_EVERY]
    assert flushed == [row for row in csv_history(straight) if row in flushed]

    resumed = run_pgcli(["train", f"resume={killed}"], cwd=workdir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert csv_history(killed) == csv_history(straight)
    log = (killed / "train.log").read_text()  # the resumed process appends its lines to the run's log
    assert log.index("eval at step 256:") < log.index(" - resuming ") < log.index(f"eval at step {TOTAL_STEPS}:")
