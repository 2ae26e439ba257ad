"""pgcli.training.logged: a run from the past found from its run id or run directory, and its logged config typed
again, with each command's own words for a reference that names no run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.training.logged import LoggedConfig, LoggedRun, Wording

WORDING = Wording(not_a_run="bad {ref!r}", no_store="no store for {ref}", not_found="no {ref} in {uri}")
RUN_ID = "0123456789abcdef0123456789abcdef"


class FakeStore:
    """The reads the locator makes: find by id or id prefix, search by output_dir."""

    def __init__(self, *records: Any) -> None:
        self.uri = "postgresql://db.example/fake"  # a database: no file to check
        self.records = {r.run_id: r for r in records}

    def find(self, run_id: str) -> Any:
        return self.records.get(run_id)

    def runs_with_id_prefix(self, prefix: str) -> list[Any]:
        return sorted((r for r in self.records.values() if r.run_id.startswith(prefix)), key=lambda r: r.run_id)

    def experiment_ids(self) -> list[str]:
        return ["0"]

    def search(self, experiment_ids: list[str], filter_string: str) -> list[Any]:
        return [r for r in self.records.values() if f"'{r.tags.get('output_dir')}'" in filter_string]


def record(run_id: str, output_dir: Path | None = None) -> Any:
    return SimpleNamespace(run_id=run_id, tags={"output_dir": str(output_dir)} if output_dir else {}, status="FINISHED")


def logged_run_dir(root: Path, *overrides: str, seeds: int = 1) -> Path:
    """A run directory as Hydra leaves it: .hydra/config.yaml (the resolved config) and hydra.yaml (its choices)."""
    cfg = compose_train_config(["algo=trpo", *overrides])
    hydra = root / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(yaml.safe_dump({**asdict(cfg), "n_seeds": seeds}))
    record = {
        "runtime": {"choices": {"algo": "trpo", "env": "cartpole", "hydra/launcher": "basic"}},
        "overrides": {"task": ["algo=trpo", *overrides]},
    }
    (hydra / "hydra.yaml").write_text(yaml.safe_dump({"hydra": record}))
    return root


def test_a_reference_that_names_no_run_gets_the_commands_words(tmp_path: Path) -> None:
    calls = []

    def no_store() -> None:
        calls.append(1)

    with pytest.raises(ConfigError, match=r"^bad 'nonsense'$"):
        LoggedRun.locate("nonsense", store=no_store, wording=WORDING)
    assert calls == []  # a reference that is no run id opens no store
    with pytest.raises(ConfigError, match=f"^no store for {RUN_ID}$"):
        LoggedRun.locate(RUN_ID, store=no_store, wording=WORDING)
    with pytest.raises(ConfigError, match=f"^no {RUN_ID} in postgresql://db.example/fake$"):
        LoggedRun.locate(RUN_ID, store=FakeStore, wording=WORDING)


def test_a_run_id_is_looked_up_only_in_a_store_that_is_there_and_nothing_is_created(tmp_path: Path) -> None:
    from pgcli.tracking.store import RunStore

    db = tmp_path / "outputs" / "mlflow.db"
    words = Wording(not_a_run="bad {ref!r}", no_store="no store for {ref}", not_found="no {ref}", doing="evaluate")
    with pytest.raises(ConfigError, match=f"^no run store at {db}: nothing to evaluate; run `pgcli train` first"):
        LoggedRun.locate(RUN_ID, store=lambda: RunStore(f"sqlite:///{db}"), wording=words)
    run_dir = logged_run_dir(tmp_path / "run")
    (run_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    run = LoggedRun.locate(str(run_dir), store=lambda: None, wording=words)
    assert run.find_in(RunStore(f"sqlite:///{db}")) is None  # a run directory's run, in no store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no outputs/, no mlflow.db


def test_a_run_id_finds_its_run_dir_only_when_it_is_here(tmp_path: Path) -> None:
    here, gone = "a" * 32, "b" * 32
    store = FakeStore(record(here, tmp_path), record(gone, tmp_path / "moved"))
    run = LoggedRun.locate(here, store=lambda: store, wording=WORDING)
    assert run.run_dir == tmp_path and run.run_id == here and run.find_in(store) is run.record
    assert LoggedRun.locate(gone, store=lambda: store, wording=WORDING).run_dir is None


def test_a_prefix_of_8_or_more_hex_digits_names_the_one_run_it_starts(tmp_path: Path) -> None:
    twin_a, twin_b = "0123abcd0" + "a" * 23, "0123abcd1" + "b" * 23
    store = FakeStore(record(RUN_ID, tmp_path), record(twin_a), record(twin_b))
    run = LoggedRun.locate(RUN_ID[:8], store=lambda: store, wording=WORDING)
    assert (run.ref, run.run_id, run.run_dir) == (RUN_ID[:8], RUN_ID, tmp_path)  # the whole id from here on
    assert LoggedRun.locate(twin_b[:9], store=lambda: store, wording=WORDING).run_id == twin_b
    with pytest.raises(
        ConfigError,
        match=f"^run id prefix 0123abcd matches 2 runs in postgresql://db.example/fake "
        rf"\({twin_a}, {twin_b}\); type more of the id$",
    ):
        LoggedRun.locate("0123abcd", store=lambda: store, wording=WORDING)
    with pytest.raises(ConfigError, match=r"^no 89abcdef in postgresql://db\.example/fake$"):
        LoggedRun.locate("89abcdef", store=lambda: store, wording=WORDING)  # the prefix as typed
    with pytest.raises(
        ConfigError,
        match=r"^'0123abc' is not a directory, and too short to name a run: a run id "
        r"prefix needs at least 8 hex digits \(pgcli runs shows 8\)$",
    ):
        LoggedRun.locate("0123abc", store=lambda: store, wording=WORDING)
    with pytest.raises(ConfigError, match=r"^bad '0123ABCD'$"):  # run ids are lowercase, as pgcli runs shows them
        LoggedRun.locate("0123ABCD", store=lambda: store, wording=WORDING)


def test_the_store_finds_the_runs_whose_id_starts_with_a_prefix_in_every_experiment(
    tmp_path: Path, mlflow_schema_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    import uuid

    from pgcli.tracking.store import RunStore

    shutil.copyfile(mlflow_schema_db, tmp_path / "mlflow.db")
    ids = iter(["0123abcd0" + "a" * 23, "0123abcd1" + "b" * 23, "0123abce" + "c" * 24])
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(next(ids)))  # the ids MLflow gives the next runs
    store = RunStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    made = [store.create_run(experiment, run_name="r", tags={}).run_id for experiment in ("a", "b", "b")]
    assert [r.run_id for r in store.runs_with_id_prefix("0123abcd")] == made[:2]  # across experiments, by id
    assert [r.run_id for r in store.runs_with_id_prefix("0123abc")] == made
    assert [r.run_id for r in store.runs_with_id_prefix(made[2])] == made[2:]
    assert store.runs_with_id_prefix("0123abcf") == []


def test_a_run_dir_names_its_run_through_run_json_else_its_output_dir_tag(tmp_path: Path) -> None:
    store = FakeStore(record(RUN_ID, tmp_path.resolve()))
    run = LoggedRun.locate(str(tmp_path), store=lambda: None, wording=WORDING)
    assert run.record is None and run.run_id is None and run.find_in(store).run_id == RUN_ID  # no run.json: by tag
    (tmp_path / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    assert run.run_id == RUN_ID and run.find_in(store).run_id == RUN_ID
    (tmp_path / "run.json").write_text(json.dumps({"run_id": None}))  # tracking=off: in no store
    assert run.run_id is None and run.find_in(store) is None


def test_the_logged_config_comes_back_typed_with_changes_on_top(tmp_path: Path) -> None:
    run_dir = logged_run_dir(tmp_path / "run", "seed=3", "algo.target_kl=0.02")
    run = LoggedRun.locate(str(run_dir), store=lambda: None, wording=WORDING)
    logged = run.logged_config()
    assert (logged.algo, logged.env) == ("trpo", "cartpole") and "hydra/launcher" not in logged.choices
    assert logged.overrides == ["algo=trpo", "seed=3", "algo.target_kl=0.02"]
    cfg = logged.train_config(["total_steps=20000", "progress=false"])
    assert cfg == compose_train_config(
        ["algo=trpo", "seed=3", "algo.target_kl=0.02", "total_steps=20000", "progress=false"]
    )
    with pytest.raises(ConfigError, match=r"^resume: total_steps: Value 'many'"):
        logged.train_config(["total_steps=many"], context="resume: ")


def test_one_seed_of_an_n_seeds_job_reads_the_jobs_config_with_its_own_seed(tmp_path: Path) -> None:
    job = logged_run_dir(tmp_path / "job", "seed=3", seeds=2)
    (job / "seed4").mkdir()
    (job / "seed9").mkdir()
    seed4 = LoggedRun.locate(str(job / "seed4"), store=lambda: None, wording=WORDING)
    assert seed4.config_dir() == (job / ".hydra", 4)
    values = seed4.logged_config().values
    assert (values["seed"], values["n_seeds"]) == (4, 1)
    with pytest.raises(ConfigError, match=r"seed9 is seed 9, but its job trained seeds 3..4$"):
        LoggedRun.locate(str(job / "seed9"), store=lambda: None, wording=WORDING).logged_config()


def test_a_missing_or_broken_logged_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^resume: x has no logged config \(.*hydra.yaml is missing\)$"):
        LoggedConfig.read(tmp_path, ref="x", context="resume: ")
    (tmp_path / "hydra.yaml").write_text("[1, 2")
    with pytest.raises(ConfigError, match=r"^cannot read .*hydra.yaml: "):
        LoggedConfig.read(tmp_path, ref="x")
    (tmp_path / "hydra.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match=r"hydra.yaml is not a config mapping$"):
        LoggedConfig.read(tmp_path, ref="x")
