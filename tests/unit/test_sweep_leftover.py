"""What a stopped sweep has left and the commands that finish it (pgcli.sweeps.leftover), and the line an interrupted
run ends with (pgcli.training.console.interrupted_line)."""

from __future__ import annotations

import json
from pathlib import Path

from pgcli.config.compose import job_overrides
from pgcli.sweeps.leftover import SweepPlan, leftover
from pgcli.sweeps.tree import SweepOutcome, summary_line
from pgcli.tracking.store import RunRecord
from pgcli.training.console import interrupted_line


def child(job: int, status: str, output_dir: Path, **tags: str) -> RunRecord:
    tags = {"sweep_job": str(job), "output_dir": str(output_dir), **tags}
    return RunRecord(f"run{job}", "1", f"job{job}", status, 0, {}, tags, {})


def checkpoint(run_dir: Path) -> None:
    (run_dir / "checkpoints" / "step_64").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_64" / "model.zip").write_bytes(b"")


def grid(*task: str) -> SweepPlan:
    return SweepPlan(list(task), ["hydra/launcher=joblib"], jobs=job_overrides(list(task), multirun=True))


def test_a_stopped_grid_resumes_its_checkpointed_job_and_reruns_the_rest_in_few_commands(tmp_path: Path):
    plan = grid("tracking.uri=sqlite:///x.db", "algo=ppo,a2c", "seed=0,1,2")  # jobs 0-5: ppo s0-2, a2c s0-2
    checkpoint(tmp_path / "j1")
    children = [
        child(0, "FINISHED", tmp_path / "j0"),
        child(1, "KILLED", tmp_path / "j1"),
        child(2, "KILLED", tmp_path / "j2"),
    ]
    left = leftover(plan, children, no_run=[])
    assert (left.interrupted, left.not_started) == (2, 3)
    assert left.commands == [
        "pgcli train resume=run1 tracking.uri=sqlite:///x.db (job #1)",
        "pgcli train -m tracking.uri=sqlite:///x.db algo=ppo seed=2 hydra/launcher=joblib (job #2, to run again)",
        "pgcli train -m tracking.uri=sqlite:///x.db algo=a2c seed=0,1,2 hydra/launcher=joblib (jobs #3, #4, #5, "
        "not started)",
    ]
    outcome = SweepOutcome("p", "KILLED", 6, [], 0, left)
    assert (
        summary_line(outcome)
        == "pgcli: sweep killed: 6 jobs, 1 finished, 2 interrupted, 3 not started (parent run p ended KILLED)"
    )


def test_a_stopped_optuna_search_continues_with_the_trials_left(tmp_path: Path):
    plan = SweepPlan(["hparams_search=ppo_pendulum"], ["hydra.sweeper.n_trials=5"], n_trials=5)
    pruned = child(1, "KILLED", tmp_path / "j1", pruned="true")
    left = leftover(plan, [child(0, "FINISHED", tmp_path), pruned, child(2, "KILLED", tmp_path)], no_run=[])
    assert (left.interrupted, left.not_started) == (1, 2)
    assert left.commands == [
        "pgcli train -m hparams_search=ppo_pendulum hydra.sweeper.n_trials=3 (the 3 trials left; the study continues "
        "when hydra.sweeper.storage is set)"
    ]


def test_an_interrupted_run_names_the_command_that_continues_it(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "run"
    assert interrupted_line(None, []) == "pgcli: interrupted"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": None}))  # tracking=off
    assert interrupted_line(run_dir, []) == (
        "pgcli: interrupted before the run's first checkpoint: nothing to resume; start it again"
    )
    checkpoint(run_dir)
    assert interrupted_line(run_dir, []) == "pgcli: interrupted; continue the run with: pgcli train resume=outputs/run"
    (run_dir / "run.json").write_text(json.dumps({"run_id": "abc"}))
    assert interrupted_line(run_dir, ["tracking.uri=http://u:secret@host:5000"]) == (
        "pgcli: interrupted; continue the run with: pgcli train resume=abc tracking.uri=http://***@host:5000"
    )
