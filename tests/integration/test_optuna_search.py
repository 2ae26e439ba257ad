"""Real `pgcli train -m hydra/sweeper=optuna` searches: a study resumed without repeating a parameter set, a second
budget refused, a bad trial pruned on its periodic evaluation (reported from a joblib worker process), and trial
runs named and tagged by trial number. What a search leaves: the history and importance plots (in the sweep directory
and on the parent run), the best trial's re-run command (run here), and `pgcli compare` naming each trial's
parameters. The study (SQLite) and the MLflow store are read back; learning quality is not asserted."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.conftest import Store, run_pgcli

optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")

TINY = ["algo=ppo", "env=pendulum", "n_seeds=1", "algo.n_steps=32", "eval.episodes=2", "progress=false",
        "tracking.log_model=false"]  # fmt: skip
STORAGE = "sqlite:///outputs/optuna.db"


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


def search(store: Store, workdir: Path, study: str, *overrides: str) -> Any:
    args = [
        "train",
        "-m",
        f"tracking.uri={store.uri}",
        *TINY,
        "hydra/sweeper=optuna",
        f"hydra.sweeper.storage={STORAGE}",
        f"hydra.sweeper.study_name={study}",
        *overrides,
    ]
    return run_pgcli(args, cwd=workdir, timeout=400)


def load(workdir: Path, study: str) -> Any:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{workdir / 'outputs' / 'optuna.db'}")


def runs(store: Store) -> list[Any]:
    return [r for r in store.runs("pendulum") if r.data.tags.get("pgcli_role") != "sweep"]


def parent_run(store: Store, proc: Any) -> Any:
    """The sweep's parent run, from the id its first line names."""
    found = re.search(r"pgcli: sweep parent run (\w+)", proc.stderr)
    assert found, proc.stderr[-3000:]
    return store.client().get_run(found.group(1))


def test_a_resumed_study_runs_new_parameter_sets_and_refuses_another_budget(store: Store, workdir: Path) -> None:
    # 8 points; 3 trials, then 3 more on resume. Sampling with replacement would repeat one of them with
    # probability 1 - 8*7*6*5*4*3/8**6 = 0.92 (and the former preset's fixed sampler seed replayed all three).
    space = ["algo.gamma=choice(0.9,0.95,0.99,0.999)", "algo.gae_lambda=choice(0.9,0.95)"]
    settings = [
        "total_steps=128",
        "eval.every=0",
        "hydra.sweeper.sampler=random",
        "hydra.sweeper.seed=0",
        "hydra.sweeper.n_trials=3",
    ]
    procs = [search(store, workdir, "resume", *settings, *space) for _ in range(2)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    check_plots(store, procs)

    study = load(workdir, "resume")
    ran = [t for t in study.trials if "duplicate_of" not in t.user_attrs]
    assert len(ran) == 6 and all(t.state == optuna.trial.TrialState.COMPLETE for t in ran)
    points = [(t.params["algo.gamma"], t.params["algo.gae_lambda"]) for t in ran]
    assert len(set(points)) == 6, points
    assert study.user_attrs["budget"] == {"total_steps": 128, "n_seeds": 1, "eval.episodes": 2}

    # every trial is one MLflow run named and tagged with its trial number, with the trial's parameters
    children = runs(store)
    assert sorted(int(r.data.tags["trial"]) for r in children) == sorted(t.number for t in ran)
    for run in children:
        trial = study.trials[int(run.data.tags["trial"])]
        assert run.info.run_name == f"ppo-pendulum-t{trial.number}-s0"
        assert float(run.data.params["algo.gamma"]) == trial.params["algo.gamma"]
        assert float(run.data.params["algo.gae_lambda"]) == trial.params["algo.gae_lambda"]
        assert run.data.metrics["eval/return_mean"] == pytest.approx(trial.value)

    # the same study with another budget: one line, exit 2, nothing run or created
    n_trials, n_runs = len(study.trials), len(store.runs("pendulum"))
    proc = search(store, workdir, "resume", *settings, *space, "total_steps=256")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"pgcli: error: study 'resume' in {STORAGE} was run with total_steps=128 n_seeds=1 eval.episodes=2; this "
        "search has total_steps=256 n_seeds=1 eval.episodes=2: trials with different budgets cannot be ranked "
        "together; use the study's budget or another study (hydra.sweeper.study_name=resume_2)"
    ]
    assert len(load(workdir, "resume").trials) == n_trials and len(store.runs("pendulum")) == n_runs

    check_compare_names_the_trials_parameters(store, workdir, parent_run(store, procs[1]), study)
    check_rerun_of_the_best_trial(store, workdir, procs[1], study)


def check_plots(store: Store, procs: list[Any]) -> None:
    """The first sweep (3 complete trials) draws the history but not yet the importance (too few trials, said so);
    the second (6 in the study) draws both; each sweep's plots are in its directory and on its parent run."""
    expected = [["optuna_history.png"], ["optuna_history.png", "optuna_importance.png"]]
    for proc, names in zip(procs, expected, strict=True):
        parent = parent_run(store, proc)
        sweep_dir = Path(parent.data.tags["sweep_dir"])
        assert sorted(p.name for p in sweep_dir.glob("optuna_*.png")) == names
        assert all((sweep_dir / name).stat().st_size > 5000 for name in names)
        logged = {a.path for a in store.client().list_artifacts(parent.info.run_id)}
        assert set(names) <= logged, logged
        results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
        assert list(results.plots) == names
    assert "pgcli: no importance plot: fANOVA needs 5 complete trials, the study has 3" in procs[0].stderr
    assert "no importance plot" not in procs[1].stderr
    assert "pgcli: Optuna plots: " in procs[1].stderr and "optuna_importance.png" in procs[1].stderr


def check_compare_names_the_trials_parameters(store: Store, workdir: Path, parent: Any, study: Any) -> None:
    """`pgcli compare` on the second sweep: one row per trial, its sampled values in the config column."""
    proc = run_pgcli(["compare", "--parent", parent.info.run_id, f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| algo | env_id | trial | budget | config | n |" in proc.stdout
    trials = [t for t in study.trials if "duplicate_of" not in t.user_attrs][3:]
    for t in trials:
        gamma, gae_lambda = (f"{float(t.params[k]):.4g}" for k in ("algo.gamma", "algo.gae_lambda"))
        row = f"| ppo | Pendulum-v1 | {t.number} | 128 | algo.gae_lambda={gae_lambda}, algo.gamma={gamma} | 1 |"
        assert row in proc.stdout, proc.stdout


def check_rerun_of_the_best_trial(store: Store, workdir: Path, proc: Any, study: Any) -> None:
    """The summary names the best trial and prints one `pgcli train` command (also in optimization_results.yaml)
    that trains it again: the same parameters, the same seed, so the same return."""
    best = study.best_trial
    shown = " ".join(f"{k}={v}" for k, v in best.params.items())
    assert f"pgcli: best trial {best.number} of study 'resume': value {best.value:.2f} with {shown}" in proc.stderr
    found = re.search(r"^pgcli: re-run the best trial: (pgcli train .*)$", proc.stderr, re.MULTILINE)
    assert found, proc.stderr[-3000:]
    command = found.group(1)
    sweep_dir = Path(parent_run(store, proc).data.tags["sweep_dir"])
    assert OmegaConf.load(sweep_dir / "optimization_results.yaml").rerun == command
    args = shlex.split(command)
    assert args[:2] == ["pgcli", "train"] and "-m" not in args and not any(a.startswith("hydra") for a in args)
    before = {r.info.run_id for r in runs(store)}
    rerun = run_pgcli(args[1:], cwd=workdir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (new,) = [r for r in runs(store) if r.info.run_id not in before]
    assert "trial" not in new.data.tags and "mlflow.parentRunId" not in new.data.tags
    for key, value in best.params.items():
        assert float(new.data.params[key]) == float(value)
    assert new.data.metrics["eval/return_mean"] == pytest.approx(best.value)


def test_a_trial_whose_evaluation_is_bad_is_pruned(store: Store, workdir: Path) -> None:
    # Deterministic: two enqueued trials. Trial 0 caps Pendulum's episodes at 50 steps (return >= 50 * -16.3);
    # trial 1 at 1000 steps, so an untrained policy's return is far below trial 0's at the first evaluation, and
    # the median pruner (active after 1 completed trial) stops it there. The joblib launcher runs each job in a
    # worker process: the evaluations reach the study through its storage.
    (workdir / "outputs").mkdir()
    study = optuna.create_study(
        study_name="prune", storage=f"sqlite:///{workdir / 'outputs' / 'optuna.db'}", direction="maximize"
    )
    study.enqueue_trial({"env.max_episode_steps": 50})
    study.enqueue_trial({"env.max_episode_steps": 1000})
    pruning = ["hydra.sweeper.pruner=median", "hydra.sweeper.pruner_startup_trials=1"]
    joblib = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=1"]
    proc = search(
        store,
        workdir,
        "prune",
        "total_steps=384",
        "eval.every=128",
        "hydra.sweeper.n_trials=2",
        *pruning,
        *joblib,
        "env.max_episode_steps=choice(50,1000)",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    good, bad = load(workdir, "prune").trials
    assert good.state == optuna.trial.TrialState.COMPLETE and sorted(good.intermediate_values) == [128, 256, 384]
    assert bad.state == optuna.trial.TrialState.PRUNED and list(bad.intermediate_values) == [128]
    assert bad.intermediate_values[128] < good.intermediate_values[128]

    by_trial = {r.data.tags["trial"]: r for r in runs(store)}
    assert by_trial["0"].info.status == "FINISHED" and "pruned" not in by_trial["0"].data.tags
    pruned = by_trial["1"]
    assert pruned.info.status == "KILLED" and pruned.data.tags["pruned"] == "true"
    assert pruned.data.tags["pruned_at_step"] == "128" and "error" not in pruned.data.tags
    assert pruned.info.run_name == "ppo-pendulum-t1-s0"

    # the summary: a pruned trial is neither a failure nor a finished run
    assert re.search(r"\| 1 \| 1 \| ppo-pendulum-t1-s0 \| PRUNED \|", proc.stderr)
    assert "pgcli: sweep finished: 2 jobs, 1 pruned, the others finished" in proc.stderr
    assert "Error executing job" not in proc.stderr

    # what the search leaves: the history (the pruned trial marked), no importance from one complete trial (said
    # why), and the command that re-runs the best trial
    sweep_dir = Path(parent_run(store, proc).data.tags["sweep_dir"])
    assert [p.name for p in sweep_dir.glob("optuna_*.png")] == ["optuna_history.png"]
    assert "pgcli: no importance plot: fANOVA needs 5 complete trials, the study has 1" in proc.stderr
    assert re.search(r"^pgcli: re-run the best trial: pgcli train .* env.max_episode_steps=50$", proc.stderr, re.M)


def test_a_failed_trial_ends_the_search_on_one_line(store: Store, workdir: Path) -> None:
    # Deterministic: the enqueued first trial sets Pendulum's g="bad", so its first step raises a TypeError. With the
    # sweeper's default max_failure_rate=0 the search stops there: the second trial never runs.
    (workdir / "outputs").mkdir()
    study = optuna.create_study(
        study_name="fail", storage=f"sqlite:///{workdir / 'outputs' / 'optuna.db'}", direction="maximize"
    )
    study.enqueue_trial({"++env.kwargs.g": "bad"})
    proc = search(
        store,
        workdir,
        "fail",
        "total_steps=128",
        "eval.every=0",
        "hydra.sweeper.n_trials=2",
        "++env.kwargs.g=choice(bad,10.0)",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]

    # the job's one line names it by the value the search gave it; the sweeper's warning adds the reason only
    reason = "TypeError: unsupported operand type(s) for /: 'str' and 'float'"
    job_lines = [line for line in proc.stderr.splitlines() if line.startswith("pgcli: job #0 ")]
    assert len(job_lines) == 1 and job_lines[0].startswith(f"pgcli: job #0 ++env.kwargs.g=bad failed: {reason} ")
    assert f"Trial 0 failed: {reason} " in proc.stderr and "JobFailed" not in proc.stderr

    # one closing line (a one-job summary keeps the job's whole command line), then what the search leaves as on a
    # normal end
    lines = proc.stderr.strip().splitlines()
    (closing,) = [i for i, line in enumerate(lines) if line.startswith("pgcli: sweep failed:")]
    assert lines[closing].startswith("pgcli: sweep failed: 1 job, 1 failed: #0 ")
    assert lines[closing].endswith(f" ++env.kwargs.g=bad: FAILED ({reason})")
    assert lines[closing + 1 :] == [
        "pgcli: no trial of study 'fail' completed: no best trial to re-run",
        "pgcli: no importance plot: fANOVA needs 5 complete trials, the study has 0",
    ]

    assert [t.state.name for t in load(workdir, "fail").trials] == ["FAIL"]
    parent = parent_run(store, proc)
    assert parent.info.status == "FAILED"
    results = OmegaConf.load(Path(parent.data.tags["sweep_dir"]) / "optimization_results.yaml")
    assert (results.n_trials, results.n_failed) == (1, 1)
    assert "optimization_results.yaml" in {a.path for a in store.client().list_artifacts(parent.info.run_id)}


def test_a_search_over_an_appended_key_logs_its_best_value_under_the_plain_key(store: Store, workdir: Path) -> None:
    # "best.++env.kwargs.g" is no MLflow param name: the search used to end with an MlflowException after its trials
    proc = search(
        store,
        workdir,
        "appended",
        "total_steps=128",
        "eval.every=0",
        "hydra.sweeper.n_trials=2",
        "++env.kwargs.g=choice(9.81,10.0)",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = parent_run(store, proc)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["best.env.kwargs.g"] in ("9.81", "10.0")
