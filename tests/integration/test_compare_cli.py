"""`pgcli compare` on runs made by the real commands in the README's order (docs/sweeps.md, "Comparing runs"):
`pgcli train`, `pgcli train resume=<run> total_steps=<more>`, `pgcli eval`, then `pgcli compare`, all as real
subprocesses on one store. Compare leaves the eval runs out, groups a resumed run by the budget it was resumed to,
and refuses a --group-by key no run has with one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, run_pgcli

TINY = ["algo=ppo", "algo.n_steps=64", "algo.n_epochs=1", "algo.batch_size=64", "env.n_envs=2", "eval.every=128",
        "eval.episodes=2", "checkpoint_every=128", "progress=false"]  # fmt: skip
"""128 env steps per update, an evaluation and a checkpoint after each."""


class Experiment(NamedTuple):
    store: Store
    workdir: Path
    resumed: str
    """seed 0: trained to 256 steps, then resumed to 512."""
    evaluated: str
    """seed 1: trained to 512 steps, then scored by `pgcli eval`."""


def pgcli_ok(args: list[str], workdir: Path) -> str:
    proc = run_pgcli(args, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Experiment:
    root = tmp_path_factory.mktemp("compare")
    store, workdir = Store(root / "store"), root / "work"
    store.root.mkdir()
    workdir.mkdir()
    shutil.copyfile(mlflow_schema_db, store.root / "mlflow.db")
    uri = f"tracking.uri={store.uri}"
    pgcli_ok(["train", *TINY, "seed=0", "total_steps=256", uri], workdir)
    (first,) = store.runs("cartpole")
    pgcli_ok(["train", f"resume={first.info.run_id}", "total_steps=512", uri], workdir)
    pgcli_ok(["train", *TINY, "seed=1", "total_steps=512", uri], workdir)
    second = next(r for r in store.runs("cartpole") if r.info.run_id != first.info.run_id)
    pgcli_ok(["eval", second.info.run_id, "--episodes", "2", uri], workdir)
    return Experiment(store, workdir, first.info.run_id, second.info.run_id)


def compare(experiment: Experiment, out: Path, *args: str) -> tuple[list[str], str]:
    """The table rows `pgcli compare --experiment cartpole` prints (header left out), and all it prints."""
    proc = run_pgcli(
        ["compare", "--experiment", "cartpole", "--out", str(out), *args, f"tracking.uri={experiment.store.uri}"],
        cwd=experiment.workdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:], proc.stdout


def test_eval_runs_are_not_compared_and_a_resumed_run_counts_at_its_new_budget(
    experiment: Experiment, tmp_path: Path
) -> None:
    runs = {r.info.run_id: r for r in experiment.store.runs("cartpole")}
    assert len(runs) == 3  # the two training runs and the eval run nested under the second
    resumed = runs[experiment.resumed]
    assert resumed.data.params["total_steps"] == "256"  # MLflow params cannot change ...
    assert resumed.data.tags["total_steps"] == "512"  # ... the budget it was resumed to is its tag

    rows, printed = compare(experiment, tmp_path / "report")
    # one group: both seeds at 512 steps; no "?" group of the eval run, no split by the resumed run's old budget
    assert len(rows) == 1, rows
    assert rows[0].startswith("| ppo | CartPole-v1 | 512 | 2 | "), rows
    assert "?" not in (tmp_path / "report" / "compare.md").read_text()
    assert "split" not in printed  # no note of runs of different budgets


def test_an_unknown_group_by_key_is_one_line_naming_the_keys(experiment: Experiment, tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = run_pgcli(
        [
            "compare",
            "--experiment",
            "cartpole",
            "--group-by",
            "algo.learning_rat",
            "--out",
            str(out),
            f"tracking.uri={experiment.store.uri}",
        ],
        cwd=experiment.workdir,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("pgcli: error: --group-by: no compared run has 'algo.learning_rat'"), line
    assert "did you mean algo.learning_rate" in line and "algo.n_steps" in line and "seed" in line
    assert not out.exists()


# --------------------------------------------------------------------------------------------------------------------
# --x: one metric against another (docs/sweeps.md, "Against another metric: --x")
# --------------------------------------------------------------------------------------------------------------------

BETA_RUNS = {  # algo.beta -> per seed: [(step, eval/kl_ref, eval/accuracy)]
    "0.01": [[(0, 0.0, 0.5), (100, 1.0, 0.7), (200, 3.0, 0.4)], [(0, 0.0, 0.4), (100, 2.0, 0.6), (200, 4.0, 0.2)]],
    "0.1": [[(0, 0.0, 0.5), (100, 0.5, 0.6), (200, 1.0, 0.7)], [(0, 0.0, 0.4), (100, 0.5, 0.5), (200, 1.5, 0.6)]],
}
"""A beta sweep as ``env.reward=rm:<run>`` logs it: the small beta goes further from the reference and its gold
accuracy turns down; the large one stays close."""


@pytest.fixture(scope="module")
def beta_store(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Store:
    """Runs of a beta sweep logged as `pgcli train` logs them (params, tags, eval metrics), plus one FINISHED run of
    the same experiment that never logged eval/kl_ref (a run without a reference)."""
    from mlflow.entities import Metric, Param, RunTag

    store = Store(tmp_path_factory.mktemp("beta") / "store")
    store.root.mkdir()
    shutil.copyfile(mlflow_schema_db, store.root / "mlflow.db")
    client = store.client()
    exp = client.create_experiment("addition", artifact_location=(store.root / "artifacts").as_uri())
    runs = [(beta, seed, points) for beta, seeds in BETA_RUNS.items() for seed, points in enumerate(seeds)]
    runs.append(("0.1", 2, [(0, None, 0.3), (200, None, 0.3)]))
    for start, (beta, seed, points) in enumerate(runs):
        tags = {"algo": "ppo_lm", "env_id": "addition", "seed": str(seed)}
        run_id = client.create_run(exp, start_time=1_700_000_000_000 + start, tags=tags).info.run_id
        metrics = [Metric("eval/accuracy", acc, 0, step) for step, _, acc in points]
        metrics += [Metric("eval/kl_ref", kl, 0, step) for step, kl, _ in points if kl is not None]
        params = {"algo": "ppo_lm", "env.id": "addition", "seed": str(seed), "total_steps": "200", "algo.beta": beta}
        client.log_batch(
            run_id,
            metrics=metrics,
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        client.set_terminated(run_id, "FINISHED")
    return store


def test_x_draws_the_metric_against_another_logged_metric(beta_store: Store, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["--group-by", "algo.beta", "--metric", "eval/accuracy", "--x", "eval/kl_ref", "--out", str(out)]
    proc = run_pgcli(["compare", "--experiment", "addition", *args, f"tracking.uri={beta_store.uri}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    # the x metric's final value per group beside the curve metric's (mean ± std over the seeds)
    assert "final eval/accuracy (mean ± std)" in rows[0] and "final eval/kl_ref (mean ± std)" in rows[0], rows[0]
    assert rows[1].startswith("| ppo_lm | addition | 0.01 | 200 | 2 | 0.300 ± 0.141 | 3.500 ± 0.707 |"), rows
    assert rows[2].startswith("| ppo_lm | addition | 0.1 | 200 | 2 | 0.650 ± 0.071 | 1.250 ± 0.354 |"), rows
    assert "1 run(s) without a step logging both 'eval/accuracy' and 'eval/kl_ref' left out" in proc.stderr
    report = (out / "compare.md").read_text()
    assert "![eval/accuracy against eval/kl_ref](compare.png)" in report
    assert (out / "compare.png").stat().st_size > 1000


def test_an_x_metric_no_run_logged_is_one_line(beta_store: Store, tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = run_pgcli(
        [
            "compare",
            "--experiment",
            "addition",
            "--metric",
            "eval/accuracy",
            "--x",
            "eval/kl",
            "--out",
            str(out),
            f"tracking.uri={beta_store.uri}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.strip() == (
        "pgcli: error: none of the 5 selected runs logged both 'eval/accuracy' and 'eval/kl'"
    ), proc.stderr
    assert not out.exists()
