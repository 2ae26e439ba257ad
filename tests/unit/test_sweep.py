"""pgcli.sweeps.tree and the Ray launcher: the pure helpers behind a sweep's summary, exit line and worker
environment."""

from __future__ import annotations

import pytest

from hydra_plugins.pgcli_ray_launcher.ray_launcher import is_loopback, loopback_only, worker_env
from pgcli.sweeps.tree import (
    SweepOutcome,
    child_row,
    drop_common_overrides,
    format_table,
    round_overrides,
    summary_line,
)


def row(job: str, overrides: str, status: str = "FINISHED", error: str = "") -> dict[str, str]:
    return {
        "job": job,
        "run_name": f"ppo-s{job}",
        "status": status,
        "seed": job,
        "overrides": overrides,
        "final_return": "1.00" if status == "FINISHED" else "",
        "error": error,
    }


def test_summary_keeps_only_the_overrides_that_vary() -> None:
    rows = drop_common_overrides([row("0", "algo=ppo total_steps=9 seed=0"), row("1", "algo=ppo total_steps=9 seed=1")])
    assert [r["overrides"] for r in rows] == ["seed=0", "seed=1"]
    assert drop_common_overrides([row("0", "a=1")])[0]["overrides"] == "a=1"  # one job: nothing to compare


def test_table_shows_errors_only_when_a_job_failed() -> None:
    ok = format_table([row("0", "seed=0")])
    assert ok.splitlines()[0] == "| job | run | status | seed | overrides | final return |"
    failed = format_table([row("0", "seed=0"), row("1", "seed=1", "FAILED", "TypeError: bad | kwarg")])
    assert failed.splitlines()[0].endswith("| error |") and "TypeError: bad \\| kwarg" in failed


def test_summary_line_names_the_failed_jobs() -> None:
    ok = SweepOutcome("p1", "FINISHED", 4)
    assert (
        ok.ok
        and summary_line(ok) == "pgcli: sweep finished: 4 jobs, all finished; compare them: pgcli compare --parent p1"
    )
    bad = SweepOutcome("p1", "FAILED", 4, ["#3 seed=3: FAILED (ValueError: nan)"])
    assert not bad.ok
    assert summary_line(bad) == "pgcli: sweep failed: 4 jobs, 1 failed: #3 seed=3: FAILED (ValueError: nan)"
    assert "ended KILLED" in summary_line(SweepOutcome("p1", "KILLED", 2))


def test_optuna_trials_show_their_number_pruned_status_and_rounded_values() -> None:
    from types import SimpleNamespace

    def child(job: str, trial: str, lr: str, pruned: bool) -> SimpleNamespace:
        tags = {
            "sweep_job": job,
            "trial": trial,
            "seed": "0",
            "hydra_overrides": f"env=pendulum algo.learning_rate={lr}",
        }
        if pruned:
            tags["pruned"] = "true"
        status = "KILLED" if pruned else "FINISHED"
        return SimpleNamespace(
            tags=tags, name=f"ppo-pendulum-t{trial}-s0", status=status, metrics={"eval/return_mean": -170.123456}
        )

    children = [child("0", "4", "0.000312345678", False), child("1", "6", "1.234567e-05", True)]
    rows = drop_common_overrides([child_row(c) for c in children])
    assert [r["status"] for r in rows] == ["FINISHED", "PRUNED"] and [r["trial"] for r in rows] == ["4", "6"]
    assert rows[0]["overrides"] == "algo.learning_rate=0.000312345678"  # children.csv keeps the exact value
    table = format_table(rows).splitlines()
    assert table[0] == "| job | trial | run | status | seed | overrides | final return |"
    assert table[2] == "| 0 | 4 | ppo-pendulum-t4-s0 | FINISHED | 0 | algo.learning_rate=0.0003123 | -170.12 |"
    assert "| PRUNED |" in table[3] and "algo.learning_rate=1.235e-05" in table[3]
    assert child_row(child("2", "", "0.1", False))["trial"] == ""  # a grid sweep has no trial column
    assert "| trial |" not in format_table([child_row(child("2", "", "0.1", False))])


def test_round_overrides_rounds_floats_only() -> None:
    assert round_overrides("a=0.123456789 b=3 c=1e-07 env=Pendulum-v1 d=true e=x.y") == (
        "a=0.1235 b=3 c=1e-07 env=Pendulum-v1 d=true e=x.y"
    )


def test_summary_line_counts_pruned_runs_apart_from_failures() -> None:
    outcome = SweepOutcome("p1", "FINISHED", 5, [], n_pruned=2)
    assert outcome.ok
    assert summary_line(outcome) == (
        "pgcli: sweep finished: 5 jobs, 2 pruned, the others finished; compare them: pgcli compare --parent p1"
    )


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("10.0.0.5:6379", False),
        (None, False),
    ],
)
def test_is_loopback(address: str | None, expected: bool) -> None:
    assert is_loopback(address) is expected


def test_loopback_mode_follows_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert loopback_only(None) and loopback_only("local") and loopback_only("127.0.0.1:6379")
    assert not loopback_only("head.cluster:6379")
    monkeypatch.setenv("RAY_ADDRESS", "head.cluster:6379")
    assert not loopback_only(None)


def test_worker_env_forwards_pgcli_mlflow_and_thread_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCLI_PARENT_RUN_ID", "abc")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("UNRELATED_SECRET", "no")
    env = worker_env({"EXTRA": "1"})
    assert env["PGCLI_PARENT_RUN_ID"] == "abc" and env["MLFLOW_TRACKING_URI"] == "sqlite:///x.db"
    assert env["OMP_NUM_THREADS"] == "1" and env["EXTRA"] == "1" and "UNRELATED_SECRET" not in env


def test_sqlite_lock_errors_are_retried_and_others_are_not() -> None:
    from pgcli.tracking.client import with_retry

    calls = []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return x * 2

    assert with_retry(flaky, 21) == 42 and len(calls) == 3

    def broken() -> None:
        calls.append(0)
        raise ValueError("no such table")

    calls.clear()
    with pytest.raises(ValueError, match="no such table"):
        with_retry(broken)
    assert calls == [0]  # not retried
    with pytest.raises(RuntimeError, match="locked"):
        with_retry(lambda: (_ for _ in ()).throw(RuntimeError("database is locked")), timeout_s=0.2)


@pytest.mark.parametrize("reopen", [False, True])
def test_an_optuna_storage_opens_and_reopens_with_the_garbage_collector_off(tmp_path, reopen: bool) -> None:
    # Regression of an earlier CI failure (docs/sweeps.md, "Hyperparameter search with Optuna"): Optuna 2.10 stamped its
    # alembic version on a connection it never committed, which held SQLite's write lock until the garbage collector
    # freed it; with the collector off the next open failed with "database is locked". The storage pgcli opens (a
    # directory that does not exist yet, as for outputs/optuna.db on a fresh checkout) must open, run trials and reopen
    # (a resumed study) with it off.
    import gc

    optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")
    from pgcli.sweeps.study import open_storage

    url = f"sqlite:///{tmp_path}/not/yet/there/optuna.db"
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(2 if reopen else 1):
            storage = open_storage(url)
            study = optuna.create_study(storage=storage, study_name="s", load_if_exists=True)
            study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=2)
            storage.engine.dispose()
    finally:
        if enabled:
            gc.enable()
    assert len(optuna.load_study(study_name="s", storage=url).trials) == (4 if reopen else 2)
