"""`pgcli train --from-run`: a logged run trained again from its exact resolved config, through the console script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Store, run_pgcli
from tests.integration.test_eval_cli import trained_run

# Our TRPO on CartPole, CPU: the command-line overrides (n_steps, the eval cadence) are part of the logged config.
SOURCE = ("algo=trpo", "seed=3", "total_steps=1024", "algo.n_steps=64", "env.n_envs=4", "algo.batch_size=128",
          "eval.every=512", "eval.episodes=2")  # fmt: skip


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> tuple[Store, Path, Any]:
    return trained_run(tmp_path_factory.mktemp("source"), mlflow_schema_db, *SOURCE)


def histories(store: Store, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's full history except wall-clock ones (time/*), as sorted (step, value) points."""
    client = store.client()
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("time/")]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def rerun(store: Store, workdir: Path, *args: str) -> Any:
    """`pgcli train <args>` that must succeed; returns the new run."""
    before = {
        r.info.run_id
        for r in store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    }
    proc = run_pgcli(["train", f"tracking.uri={store.uri}", *args], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    (new,) = [r for r in runs if r.info.run_id not in before and not r.info.run_name.startswith("eval-")]
    return new


def test_from_run_reproduces_the_metric_history_exactly(source):
    store, workdir, run = source
    new = rerun(store, workdir, "--from-run", run.info.run_id)
    assert new.info.status == "FINISHED" and new.info.run_id != run.info.run_id
    assert new.data.tags["source_run_id"] == run.info.run_id
    assert new.data.params == run.data.params  # the same resolved config, key for key
    expected = histories(store, run.info.run_id)
    assert "train/kl" in expected and len(expected["rollout/ep_return"]) > 10
    assert histories(store, new.info.run_id) == expected


def test_from_run_dir_with_overrides_on_top(source):
    store, workdir, run = source
    run_dir = run.data.tags["output_dir"]
    new = rerun(store, workdir, f"--from-run={run_dir}", "seed=4", "algo.target_kl=0.02", "progress=false")
    params = new.data.params
    assert params["seed"] == "4" and params["algo.target_kl"] == "0.02"  # the overrides
    assert params["algo.n_steps"] == "64" and params["env.n_envs"] == "4"  # the source's own overrides, kept
    assert params["algo.cg_max_steps"] == run.data.params["algo.cg_max_steps"]  # its preset values, not the defaults
    assert new.data.tags["source_run_id"] == run.info.run_id  # found by its run directory
    assert new.data.tags["source_config"] == run_dir


def test_from_run_as_a_sweep_over_seeds(source):
    """``--from-run X -m seed=5,6``: the flag may follow --from-run; each job is the source's config with its seed,
    nested under one sweep parent, and learns what a direct run of that config and seed learns."""
    store, workdir, run = source
    client = store.client()
    before = {r.info.run_id for r in client.search_runs([run.info.experiment_id])}
    proc = run_pgcli(
        ["train", f"tracking.uri={store.uri}", "--from-run", run.info.run_id, "-m", "seed=5,6", "progress=false"],
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = [r for r in client.search_runs([run.info.experiment_id]) if r.info.run_id not in before]
    (parent,) = [r for r in new if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in new if "mlflow.parentRunId" in r.data.tags), key=lambda r: r.data.params["seed"])
    assert [r.data.params["seed"] for r in children] == ["5", "6"]
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["source_run_id"] == run.info.run_id
        assert {k: v for k, v in child.data.params.items() if k != "seed"} == {
            k: v for k, v in run.data.params.items() if k != "seed"
        }
    assert parent.info.status == "FINISHED"
    assert histories(store, children[0].info.run_id) != histories(store, children[1].info.run_id)  # seeds differ


def test_from_run_id_with_tracking_off_finds_the_run_and_logs_nothing(source, tmp_path: Path):
    """docs/evaluation.md: ``tracking=off`` replaces the logged tracking section; the run id is still looked up in the
    store it names (here tracking.uri), and the re-run writes its metrics.csv only."""
    store, _, run = source
    n_runs = len(store.client().search_runs([run.info.experiment_id]))
    proc = run_pgcli(
        [
            "train",
            f"tracking.uri={store.uri}",
            "--from-run",
            run.info.run_id,
            "tracking=off",
            "total_steps=256",
            "eval.every=0",
            "progress=false",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(store.client().search_runs([run.info.experiment_id])) == n_runs  # nothing logged
    (csv,) = (tmp_path / "outputs" / "runs").rglob("metrics.csv")
    assert "rollout/ep_return" in csv.read_text()
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_a_quoted_tracking_off_turns_off_the_logging_not_the_lookup(source, tmp_path: Path):
    """``tracking.backend='off'`` is ``tracking.backend=off`` (Hydra unquotes it): the run id is still looked up."""
    store, _, run = source
    n_runs = len(store.client().search_runs([run.info.experiment_id]))
    proc = run_pgcli(
        [
            "train",
            f"tracking.uri={store.uri}",
            "--from-run",
            run.info.run_id,
            "tracking.backend='off'",
            "total_steps=256",
            "eval.every=0",
            "progress=false",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(store.client().search_runs([run.info.experiment_id])) == n_runs  # nothing logged
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--from-run", "{id}", "algo.target_kl=-1"], "algo.target_kl must be > 0 (got -1.0)"),
        (["--from-run", "{id}", "algo=ppo"], "--from-run keeps the logged run's algo"),
        (["--from-run", "ffffffffffffffffffffffffffffffff"], "no run ffffffffffffffffffffffffffffffff in sqlite:///"),
        (["--from-run", "nonsense"], "'nonsense' is neither a directory nor an MLflow run id"),
        (["--from-run"], "--from-run needs a run id or a run directory"),
        (["--config-dir", "{dir}/.hydra", "--config-name", "config"], "use: pgcli train --from-run <run id | run dir>"),
    ],
)
def test_bad_input_is_one_line_and_status_2(source, args: list[str], fragment: str, tmp_path: Path):
    store, _, run = source
    args = [a.format(id=run.info.run_id, dir=run.data.tags["output_dir"]) for a in args]
    n_runs = len(store.client().search_runs([run.info.experiment_id]))
    proc = run_pgcli(["train", f"tracking.uri={store.uri}", *args], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("pgcli: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr
    assert len(store.client().search_runs([run.info.experiment_id])) == n_runs
    assert not (tmp_path / "outputs").exists()  # no run directory either
