"""TRPO's old key names (``algo.cg_iters`` ...) after the rename to sb3-contrib's (``algo.cg_max_steps`` ...), through
the real `pgcli` CLI: typed on the command line they train as the new ones with one note; a run logged before the
rename (its params, .hydra config, overrides and agent.json under the old names, as the old code wrote them) is
re-run by ``--from-run``, resumed by ``resume=``, scored by ``pgcli eval`` and grouped by ``pgcli compare`` with the
runs logged since."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

import pytest
import yaml

from pgcli.config import TRPOConfig
from tests.conftest import Store, run_pgcli
from tests.integration.test_from_run import histories, rerun

NEW_TO_OLD = {new: old for old, new in TRPOConfig.renamed.items()}
TINY = ["algo=trpo", "algo.n_steps=64", "env.n_envs=2", "algo.batch_size=64", "algo.n_critic_updates=1",
        "eval.episodes=2", "progress=false"]  # fmt: skip
"""128 env steps per update on CartPole."""
OLD_NAMES = ["algo.cg_iters=5", "algo.vf_learning_rate=2e-3", "algo.backtrack_iters=4"]


class OldRun(NamedTuple):
    store: Store
    workdir: Path
    run: Any
    stderr: str
    """What `pgcli train` printed when the run was started with :data:`OLD_NAMES`."""
    logged: dict[str, str]
    """Its params as the run logged them (before :func:`to_old_names`)."""


def train(root: Path, schema_db: Path, *overrides: str) -> OldRun:
    """A finished `pgcli train` run in a fresh store under ``root``, made old-style (:func:`to_old_names`)."""
    store, workdir = Store(root / "store"), root / "work"
    store.root.mkdir(parents=True)
    workdir.mkdir()
    shutil.copyfile(schema_db, store.root / "mlflow.db")
    proc = run_pgcli(["train", f"tracking.uri={store.uri}", *TINY, *OLD_NAMES, *overrides], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    to_old_names(store, workdir, run)
    return OldRun(store, workdir, store.client().get_run(run.info.run_id), proc.stderr, run.data.params)


def old_key(key: str) -> str:
    return f"algo.{NEW_TO_OLD[key[5:]]}" if key.startswith("algo.") and key[5:] in NEW_TO_OLD else key


def old_line(line: str) -> str:
    key, eq, value = line.partition("=")
    return f"{old_key(key)}{eq}{value}"


def to_old_names(store: Store, workdir: Path, run: Any) -> None:
    """Rewrite ``run`` as pgcli wrote it before the rename: its MLflow params and ``hydra_overrides`` tag, its
    ``.hydra`` files and every ``agent.json``, in the run directory and among its artifacts."""
    run_id = run.info.run_id
    with sqlite3.connect(store.root / "mlflow.db") as db:
        for new, old in NEW_TO_OLD.items():
            db.execute(
                "update params set key = ? where key = ? and run_uuid = ?", (f"algo.{old}", f"algo.{new}", run_id)
            )
        tag = " ".join(old_line(o) for o in run.data.tags["hydra_overrides"].split())
        db.execute("update tags set value = ? where key = 'hydra_overrides' and run_uuid = ?", (tag, run_id))
    homes = [workdir / run.data.tags["output_dir"], Path(urlparse(run.info.artifact_uri).path)]
    for home in homes:
        for hydra in (home / ".hydra", home / "hydra"):
            if hydra.is_dir():
                _rewrite_yaml(hydra / "config.yaml", lambda c: {**c, "algo": _old_section(c["algo"])})
                _rewrite_yaml(hydra / "overrides.yaml", lambda lines: [old_line(o) for o in lines])
                text = (hydra / "hydra.yaml").read_text()  # the task overrides, and their override_dirname
                for new, old in NEW_TO_OLD.items():
                    text = text.replace(f"algo.{new}=", f"algo.{old}=")
                (hydra / "hydra.yaml").write_text(text)
        for agent in home.rglob("agent.json"):
            spec = json.loads(agent.read_text())
            spec["config"]["algo"] = _old_section(spec["config"]["algo"])
            agent.write_text(json.dumps(spec))
    written = json.dumps([store.client().get_run(run_id).data.params]) + "".join(
        p.read_text() for home in homes for p in home.rglob("*") if p.suffix in (".yaml", ".json")
    )
    assert "cg_iters" in written and "cg_max_steps" not in written and "line_search" not in written


def _old_section(algo: dict[str, Any]) -> dict[str, Any]:
    return {NEW_TO_OLD.get(k, k): v for k, v in algo.items()}


def _rewrite_yaml(path: Path, change: Any) -> None:
    path.write_text(yaml.safe_dump(change(yaml.safe_load(path.read_text())), sort_keys=False))


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "is now algo." in line]


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> OldRun:
    return train(tmp_path_factory.mktemp("old"), mlflow_schema_db, "seed=3", "total_steps=512", "eval.every=256")


def test_old_names_on_the_command_line_train_as_the_new_ones(old: OldRun):
    (note,) = notes(old.stderr)  # one line for the three keys
    assert note.startswith("pgcli: note: algo.cg_iters is now algo.cg_max_steps, algo.vf_learning_rate is now ")
    logged = old.logged  # the new names, with the values typed under the old ones
    assert (logged["algo.cg_max_steps"], logged["algo.learning_rate"], logged["algo.line_search_max_iter"]) == (
        "5",
        "0.002",
        "4",
    )
    assert all(f"algo.{old}" not in logged for old in TRPOConfig.renamed)


def test_from_run_of_a_run_logged_under_the_old_names_trains_it_again_exactly(old: OldRun):
    new = rerun(old.store, old.workdir, "--from-run", old.run.info.run_id)
    assert {old_key(k): v for k, v in new.data.params.items()} == old.run.data.params  # the same values, new names
    assert new.data.params["algo.cg_max_steps"] == "5" and "algo.cg_iters" not in new.data.params
    assert histories(old.store, new.info.run_id) == histories(old.store, old.run.info.run_id)


def test_from_run_says_once_that_it_read_old_names(old: OldRun):
    proc = run_pgcli(
        ["train", f"tracking.uri={old.store.uri}", "--from-run", old.run.info.run_id, "--cfg", "job"], cwd=old.workdir
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (note,) = notes(proc.stderr)
    assert "algo.cg_iters is now algo.cg_max_steps" in note and "algo.vf_lr_schedule is now algo.lr_schedule" in note
    assert "cg_max_steps: 5" in proc.stdout and "learning_rate: 0.002" in proc.stdout


def test_eval_of_an_old_run(old: OldRun):
    proc = run_pgcli(
        ["eval", old.run.info.run_id, "--episodes", "2", "--no-log", f"tracking.uri={old.store.uri}"], cwd=old.workdir
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(notes(proc.stderr)) == 1


def test_compare_groups_an_old_run_with_a_new_run_of_the_same_setting(old: OldRun, tmp_path: Path):
    rerun(old.store, old.workdir, "--from-run", old.run.info.run_id, "seed=4")
    rows, printed = compare(old, tmp_path / "all")
    assert rows == [rows[0]] and rows[0].startswith("| trpo | CartPole-v1 | 512 | 2 | "), rows  # both seeds
    assert "split" not in printed  # not split by the names of its config
    rows, _ = compare(old, tmp_path / "by", "--group-by", "algo.cg_iters")  # an old name typed
    assert rows == [rows[0]] and rows[0].startswith("| trpo | CartPole-v1 | 5 | 512 | 2 | "), rows


def compare(old: OldRun, out: Path, *args: str) -> tuple[list[str], str]:
    """The table rows `pgcli compare --experiment cartpole` prints (header left out), and all it prints."""
    proc = run_pgcli(
        ["compare", "--experiment", "cartpole", "--out", str(out), *args, f"tracking.uri={old.store.uri}"],
        cwd=old.workdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    noted = re.findall(r"algo\.(\w+) is now", proc.stderr)  # the old run's params (and an old --group-by key)
    assert sorted(noted) == sorted(TRPOConfig.renamed), proc.stderr  # each key once
    return [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:], proc.stdout


def test_resume_of_an_old_run(tmp_path: Path, mlflow_schema_db: Path):
    short = train(tmp_path, mlflow_schema_db, "seed=1", "total_steps=256", "eval.every=128", "checkpoint_every=128")
    run_dir = short.workdir / short.run.data.tags["output_dir"]
    # the command that started it, with resume= and more steps: its old names are its own overrides, no change
    again = [*TINY, *OLD_NAMES, "seed=1", "total_steps=384", "eval.every=128", "checkpoint_every=128"]
    proc = run_pgcli(["train", f"resume={run_dir}", *again, f"tracking.uri={short.store.uri}"], cwd=short.workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(notes(proc.stderr)) == 1
    resumed = short.store.client().get_run(short.run.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["total_steps"] == "384"
    assert resumed.data.params["algo.cg_iters"] == "5"  # MLflow params never change


def test_run_job_takes_an_old_name_with_a_note_and_trains_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from pgcli.config import renames
    from pgcli.training import run_job
    from tests.integration.test_job import TINY as JOB
    from tests.integration.test_job import metric_rows

    renames._NOTED.clear()  # this process may have announced it already
    run_job([*JOB, "total_steps=128", "algo.backtrack_coeff=0.5"], output_dir=tmp_path / "old", tracking=False)
    assert notes(capsys.readouterr().err) == [
        "pgcli: note: algo.backtrack_coeff is now algo.line_search_shrinking_factor (SB3's vocabulary); "
        "the old name still works"
    ]
    run_job(
        [*JOB, "total_steps=128", "algo.line_search_shrinking_factor=0.5"], output_dir=tmp_path / "new", tracking=False
    )
    assert metric_rows(tmp_path / "old") == metric_rows(tmp_path / "new")
    agent = json.loads((tmp_path / "old" / "model" / "agent.json").read_text())
    assert agent["config"]["algo"]["line_search_shrinking_factor"] == 0.5


def test_a_sweep_over_an_old_name(tmp_path: Path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "algo.cg_iters=3,7", "total_steps=128", "eval.every=0", "tracking=off"]
    proc = run_pgcli(["train", *args, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(notes(proc.stderr)) == 1, proc.stderr
    configs = [yaml.safe_load(p.read_text()) for p in sorted(sweep.glob("*/.hydra/config.yaml"))]
    assert [c["algo"]["cg_max_steps"] for c in configs] == [3, 7] and all("cg_iters" not in c["algo"] for c in configs)
