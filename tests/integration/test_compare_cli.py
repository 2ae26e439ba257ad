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
    proc = run_pgcli(["compare", "--experiment", "cartpole", "--out", str(out), *args,
                      f"tracking.uri={experiment.store.uri}"], cwd=experiment.workdir)  # fmt: skip
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
    proc = run_pgcli(["compare", "--experiment", "cartpole", "--group-by", "algo.learning_rat", "--out", str(out),
                      f"tracking.uri={experiment.store.uri}"], cwd=experiment.workdir)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("pgcli: error: --group-by: no compared run has 'algo.learning_rat'"), line
    assert "did you mean algo.learning_rate" in line and "algo.n_steps" in line and "seed" in line
    assert not out.exists()
