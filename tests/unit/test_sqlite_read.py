"""pgcli.tracking.sqlite_read: the standard library's listing of a SQLite store equals MLflow's own."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from pgcli.tracking.listing import experiment_names, last_steps
from pgcli.tracking.sqlite_read import SqliteReader
from pgcli.tracking.store import NEWEST_FIRST, RunStore


def through_mlflow(uri: str) -> RunStore:
    store = RunStore(uri)
    store.__dict__["reader"] = None  # the cached property, set: every read goes through MlflowClient
    return store


def test_the_listing_equals_mlflows_own(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    writer = RunStore(uri)
    first = writer.create_run("cartpole", run_name="a", tags={"algo": "ppo"})
    writer.log_params(first.run_id, {"total_steps": 256})
    writer.log_metrics(first.run_id, {"eval/return_mean": 9.5, "loss": math.nan}, step=128)
    writer.log_metrics(first.run_id, {"eval/return_mean": 12.0}, step=256)
    writer.end(first.run_id, "FINISHED")
    second = writer.create_run("countdown", run_name="b", tags={})  # RUNNING, no metric
    gone = writer.create_run("cartpole", run_name="deleted", tags={})
    writer.client.delete_run(gone.run_id)
    hidden = writer.create_run("hidden", run_name="in a deleted experiment", tags={})
    writer.client.delete_experiment(hidden.experiment_id)

    fast, slow = RunStore(uri), through_mlflow(uri)
    assert fast.reader is not None
    assert fast.experiment_names() == slow.experiment_names() and "hidden" not in fast.experiment_names()
    assert fast.experiment_ids(["countdown", "nope"]) == slow.experiment_ids(["countdown", "nope"])
    runs = fast.search(fast.experiment_ids(), order_by=[NEWEST_FIRST])
    assert [r.run_id for r in runs] == [second.run_id, first.run_id]
    expected = slow.search(slow.experiment_ids(), order_by=[NEWEST_FIRST])
    losses = [r.metrics.pop("loss") for r in (runs[1], expected[1])]  # NaN != NaN: compared apart
    assert all(math.isnan(v) for v in losses)
    assert runs == expected
    assert runs[1].metrics == {"eval/return_mean": 12.0} and runs[1].params == {"total_steps": "256"}
    assert experiment_names(fast) == experiment_names(slow)
    assert last_steps(fast, runs) == last_steps(slow, expected) == {first.run_id: 256}
    history = fast.metric_history(first.run_id, "eval/return_mean")
    assert history == slow.metric_history(first.run_id, "eval/return_mean") == [(128, 9.5), (256, 12.0)]
    assert math.isnan(fast.metric_history(first.run_id, "loss")[0][1]) and fast.metric_history(second.run_id, "x") == []


def test_no_reader_for_other_stores_or_an_unknown_schema(tmp_path: Path):
    assert SqliteReader.open("http://127.0.0.1:5000") is None
    assert SqliteReader.open(f"sqlite:///{tmp_path / 'missing.db'}") is None
    assert not (tmp_path / "missing.db").exists()  # nothing created
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
    assert SqliteReader.open(f"sqlite:///{other}") is None
