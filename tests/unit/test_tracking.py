"""pgcli.tracking: flatten, where runs go, RunLogger reports, and MLflowBackend batching against a real SQLite store."""

from __future__ import annotations

import csv
import logging
import shutil
from pathlib import Path

import pytest

from pgcli.config import TrackingConfig
from pgcli.tracking.backend import MLflowBackend
from pgcli.tracking.client import MLFLOW_BATCH_LIMIT
from pgcli.tracking.logger import RunLogger, flatten
from pgcli.tracking.reports import Panel, learning_curve_figure, plot_learning_curve, step_unit, text_panels
from pgcli.tracking.spool import SPOOL_FILE, Spool
from pgcli.tracking.store import ensure_store
from pgcli.tracking.uri import MLFLOW_TABLES, TrackingTarget, resolve_tracking_target, sqlite_tables
from pgcli.training.checkpoints import prune_checkpoints


def test_flatten_nests_with_dots_and_keeps_lists():
    tree = {"algo": {"clip_range": 0.2, "net": {"pi": [64, 64]}}, "seed": 3, "env": {"kwargs": {}}}
    assert flatten(tree) == {"algo.clip_range": 0.2, "algo.net.pi": [64, 64], "seed": 3}
    assert flatten({"a": 1}, "top.") == {"top.a": 1}


# --------------------------------------------------------------------------------------------------------------------
# resolve_tracking_target
# --------------------------------------------------------------------------------------------------------------------


def test_explicit_uri_wins_over_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/env.db")
    assert resolve_tracking_target(TrackingConfig(uri="http://host:5000")) == TrackingTarget("http://host:5000", None)


def test_environment_wins_over_default_store(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/env.db")
    assert resolve_tracking_target(TrackingConfig(), cwd=tmp_path).uri == "sqlite:////elsewhere/env.db"


def test_explicit_sqlite_store_keeps_artifacts_beside_the_database(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    target = resolve_tracking_target(TrackingConfig(uri=f"sqlite:///{tmp_path}/team/runs.db"))
    assert target.artifact_root == (tmp_path.resolve() / "team" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env/mlflow.db")
    assert (
        resolve_tracking_target(TrackingConfig()).artifact_root == (tmp_path.resolve() / "env" / "mlartifacts").as_uri()
    )


def test_default_store_is_absolute_under_the_start_directory(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    target = resolve_tracking_target(TrackingConfig(store_dir="outputs"))
    assert target.uri == f"sqlite:///{tmp_path.resolve()}/outputs/mlflow.db"
    assert target.artifact_root == (tmp_path.resolve() / "outputs" / "mlartifacts").as_uri()
    elsewhere = resolve_tracking_target(TrackingConfig(store_dir="../shared_store"), cwd=tmp_path / "sub")
    assert elsewhere.uri == f"sqlite:///{tmp_path.resolve()}/shared_store/mlflow.db"


# --------------------------------------------------------------------------------------------------------------------
# RunLogger reports
# --------------------------------------------------------------------------------------------------------------------


def test_run_logger_writes_csv_and_learning_curve(tmp_path: Path):
    logger = RunLogger(tmp_path / "run")
    for step in (100, 200, 300):
        logger.log_metrics({"rollout/ep_return_mean": step / 10, "train/value_loss": 1.0 / step}, step)
    logger.log_metrics({"eval/return_mean": 25.0, "eval/return_std": 2.0}, 300)
    assert logger.last("rollout/ep_return_mean") == 30.0 and logger.last("missing") is None

    paths = logger.write_reports()
    assert [p.name for p in paths] == ["metrics.csv", "learning_curve.png"]
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["key", "step", "value"]
    returns = [(int(s), float(v)) for k, s, v in rows[1:] if k == "rollout/ep_return_mean"]
    assert returns == [(100, 10.0), (200, 20.0), (300, 30.0)]
    assert len(rows) == 1 + 3 + 3 + 2
    png = (tmp_path / "run" / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_a_control_curve_logs_its_series(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    history = {
        "rollout/ep_return_mean": [(100, 1.0), (200, 2.0)],
        "eval/return_mean": [(200, 3.0)],
        "eval/return_std": [(200, 0.5)],
    }
    with caplog.at_level(logging.INFO, logger="pgcli"):
        assert plot_learning_curve(history, tmp_path / "c.png") == tmp_path / "c.png"
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    assert caplog.messages == [
        "learning_curve.png: x environment steps; episode return: rollout/ep_return_mean, eval/return_mean"
    ]


def test_a_sft_curve_shows_accuracy_on_0_1_and_the_loss_against_demonstrations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    # one evaluation, returns whose std band would pass 1.0: the curve is still accuracy and loss, not a dot
    history = {
        "train/loss": [(32, 2.0), (64, 1.5)],
        "train/teacher_forced_exact": [(32, 0.0), (64, 0.1)],
        "eval/accuracy": [(64, 0.5)],
        "eval/pass_at_10": [(64, 0.9)],
        "eval/pass_at_2": [(64, 0.7)],
        "eval/return_mean": [(64, 0.5)],
        "eval/return_std": [(64, 0.5)],
    }
    assert step_unit(history) == "demonstrations"
    assert text_panels(history) == [
        Panel("held-out accuracy", ("eval/accuracy", "eval/pass_at_2", "eval/pass_at_10"), unit_interval=True),
        Panel("training loss", ("train/loss",)),
    ]
    with caplog.at_level(logging.INFO, logger="pgcli"):
        assert plot_learning_curve(history, tmp_path / "sft.png") == tmp_path / "sft.png"
    assert (tmp_path / "sft.png").read_bytes().startswith(b"\x89PNG")
    assert caplog.messages == [
        "learning_curve.png: x demonstrations; held-out accuracy [0, 1]: eval/accuracy, eval/pass_at_2, "
        "eval/pass_at_10; training loss: train/loss"
    ]


def test_an_rl_text_curve_shows_reward_and_kl_against_sampled_completions(tmp_path: Path):
    history = {
        "rollout/reward_mean": [(16, 0.2), (32, 0.4)],
        "train/loss": [(16, 0.1), (32, 0.0)],
        "train/kl_ref": [(16, 0.0), (32, 0.01)],
        "eval/accuracy": [(0, 0.3), (32, 0.4)],
    }
    assert step_unit(history) == "sampled completions"
    assert [p.keys for p in text_panels(history)] == [("eval/accuracy",), ("rollout/reward_mean",), ("train/kl_ref",)]
    assert plot_learning_curve(history, tmp_path / "rl.png") == tmp_path / "rl.png"
    assert plot_learning_curve({"train/teacher_forced_exact": []}, tmp_path / "none.png") is None


def test_a_multi_turn_curve_counts_sampled_turns_and_says_trajectories_are_solved():
    from pgcli.tracking.reports import _label

    history = {
        "rollout/reward_mean": [(40, 0.2)],
        "rollout/turns_mean": [(40, 2.5)],
        "eval/turns_mean": [(0, 2.9)],
        "eval/accuracy": [(0, 0.2)],
        "eval/pass_at_4": [(0, 0.4)],
    }
    assert step_unit(history) == "sampled turns"
    assert _label("eval/accuracy", history) == "greedy trajectory solved (eval/accuracy)"
    assert _label("eval/pass_at_4", history) == "pass@4: one of 4 trajectories solved (eval/pass_at_4)"
    single = {k: v for k, v in history.items() if "turns" not in k}
    assert (step_unit(single), _label("eval/accuracy", single)) == (
        "sampled completions",
        "greedy completion correct (eval/accuracy)",
    )


def test_a_reward_model_curve_shows_pairwise_accuracy_and_its_losses_against_pairs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    history = {
        "train/loss": [(32, 0.69), (64, 0.5)],
        "train/pairwise_accuracy": [(32, 0.5), (64, 0.7)],
        "eval/pairwise_accuracy": [(64, 0.8)],
        "eval/loss": [(64, 0.45)],
        "eval/return_mean": [(64, 0.8)],
        "eval/reward_margin": [(64, 1.2)],
    }
    assert step_unit(history) == "preference pairs"
    assert text_panels(history) == [
        Panel("held-out accuracy", ("eval/pairwise_accuracy",), unit_interval=True),
        Panel("training loss", ("train/loss", "eval/loss")),
    ]
    with caplog.at_level(logging.INFO, logger="pgcli"):
        assert plot_learning_curve(history, tmp_path / "rm.png") == tmp_path / "rm.png"
    assert caplog.messages == [  # the text run's panels, not the control plot of returns against env steps
        "learning_curve.png: x preference pairs; held-out accuracy [0, 1]: eval/pairwise_accuracy; training loss: "
        "train/loss, eval/loss"
    ]


def test_no_png_without_return_metrics(tmp_path: Path):
    logger = RunLogger(tmp_path)
    logger.log_metrics({"train/value_loss": 1.0}, 10)
    assert [p.name for p in logger.write_reports()] == ["metrics.csv"]


def test_run_logger_close_rejects_unknown_status_and_is_idempotent(tmp_path: Path):
    with pytest.raises(ValueError, match="status must be one of"):
        RunLogger(tmp_path).close("RUNNING")
    logger = RunLogger(tmp_path)
    logger.close("FINISHED")
    logger.close("FAILED")  # second call: no-op
    assert logger.closed


# --------------------------------------------------------------------------------------------------------------------
# MLflowBackend on a real SQLite store (one for the module, copied from the session's migrated schema)
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory, mlflow_schema_db: Path) -> TrackingTarget:
    root = tmp_path_factory.mktemp("store")
    shutil.copyfile(mlflow_schema_db, root / "mlflow.db")  # schema already migrated (conftest)
    return TrackingTarget(f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri())


def history(backend: MLflowBackend, key: str) -> list[tuple[int, float]]:
    points = backend.client.get_metric_history(backend.run_id, key)
    return sorted((m.step, m.value) for m in points)


def test_metrics_are_buffered_then_written_in_batches_with_their_steps(target: TrackingTarget):
    backend = MLflowBackend(target, experiment="batching", run_name="r", tags={"algo": "ppo"}, flush_every_s=3600)
    n = MLFLOW_BATCH_LIMIT // 2 - 1  # two metrics per call: just under one batch
    for i in range(n):
        backend.log_metrics({"a": float(i), "b": -float(i)}, step=10 * i)
    assert history(backend, "a") == []  # nothing written yet: buffered
    backend.log_metrics({"a": float(n), "b": -float(n)}, step=10 * n)  # the buffer reaches the batch limit: flushed
    assert len(history(backend, "a")) == n + 1
    backend.log_metrics({"a": 1e6}, step=123_456)
    backend.end("FINISHED")
    a = history(backend, "a")
    assert a[:3] == [(0, 0.0), (10, 1.0), (20, 2.0)] and a[-1] == (123_456, 1e6)
    assert history(backend, "b")[-1] == (10 * n, -float(n))
    run = backend.client.get_run(backend.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["algo"] == "ppo" and run.info.run_name == "r"


def test_flush_on_time(target: TrackingTarget):
    backend = MLflowBackend(target, experiment="batching", run_name="timed", tags={}, flush_every_s=1e-9)
    backend.log_metrics({"x": 1.0}, step=1)
    assert history(backend, "x") == [(1, 1.0)]
    backend.end("KILLED")
    assert backend.client.get_run(backend.run_id).info.status == "KILLED"


def test_params_tags_artifacts_and_parent(target: TrackingTarget, tmp_path: Path):
    parent = MLflowBackend(target, experiment="params", run_name="parent", tags={})
    backend = MLflowBackend(target, experiment="params", run_name="child", tags={}, parent_run_id=parent.run_id)
    params = {f"group.key_{i}": i for i in range(250)}  # more than one params batch (100)
    backend.log_params(params)
    backend.set_tags({"git_commit": "abc", "seed": "3"})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.zip").write_bytes(b"zip")
    (tmp_path / "metrics.csv").write_text("key,step,value\n")
    backend.log_artifact(tmp_path / "model", "model")
    backend.log_artifact(tmp_path / "metrics.csv")
    backend.end("FAILED")
    parent.end("FINISHED")

    run = backend.client.get_run(backend.run_id)
    assert run.data.params == {k: str(v) for k, v in params.items()}
    assert run.data.tags["git_commit"] == "abc" and run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert run.info.status == "FAILED"
    names = {a.path for a in backend.client.list_artifacts(backend.run_id)}
    assert names == {"model", "metrics.csv"}
    assert [a.path for a in backend.client.list_artifacts(backend.run_id, "model")] == ["model/model.zip"]
    exp = backend.client.get_experiment(backend.experiment_id)
    assert exp.artifact_location == f"{target.artifact_root}/params"  # new experiments store under the root


def test_same_experiment_is_reused(target: TrackingTarget):
    a = MLflowBackend(target, experiment="reuse", run_name="a", tags={})
    b = MLflowBackend(target, experiment="reuse", run_name="b", tags={})
    assert a.experiment_id == b.experiment_id and a.run_id != b.run_id
    a.end("FINISHED")
    b.end("FINISHED")


def test_run_logger_close_logs_reports_and_ends_the_run(target: TrackingTarget, tmp_path: Path):
    backend = MLflowBackend(target, experiment="logger", run_name="r", tags={}, flush_every_s=3600)
    logger = RunLogger(tmp_path, backend)
    for step in range(1, 6):
        logger.log_metrics({"rollout/ep_return_mean": float(step)}, step * 100)
    logger.close("FINISHED")
    run = backend.client.get_run(backend.run_id)
    assert run.info.status == "FINISHED"
    assert history(backend, "rollout/ep_return_mean") == [(s * 100, float(s)) for s in range(1, 6)]
    assert {a.path for a in backend.client.list_artifacts(backend.run_id)} == {"metrics.csv", "learning_curve.png"}


def test_identical_points_at_one_step_are_all_kept(target: TrackingTarget):
    # Two CartPole episodes that end in the same vector step with the same length: MLflow drops exact duplicate
    # (key, step, timestamp, value) points, so both must still be stored (one metric point per episode).
    backend = MLflowBackend(target, experiment="duplicates", run_name="r", tags={}, flush_every_s=3600)
    for _ in range(3):
        backend.log_metrics({"rollout/ep_len": 200.0}, step=1600)
    backend.log_metrics({"rollout/ep_len": 200.0}, step=1608)
    backend.end("FINISHED")
    assert history(backend, "rollout/ep_len") == [(1600, 200.0)] * 3 + [(1608, 200.0)]


def interrupt_once(backend: MLflowBackend, *, after_write: bool) -> None:
    """Make the next log_batch raise KeyboardInterrupt (Ctrl-C), before or after it writes."""
    real = backend.client.log_batch
    calls = {"n": 0}

    def log_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            if after_write:
                real(*args, **kwargs)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    backend.client.log_batch = log_batch


@pytest.mark.parametrize("after_write", [False, True], ids=["before-write", "after-write"])
def test_ctrl_c_during_a_flush_loses_no_metrics(target: TrackingTarget, after_write: bool):
    backend = MLflowBackend(target, experiment="interrupted", run_name="r", tags={}, flush_every_s=3600)
    for step in range(10):
        backend.log_metrics({"time/sps": 100.0 + step}, step=step)
    interrupt_once(backend, after_write=after_write)
    with pytest.raises(KeyboardInterrupt):
        backend.flush()
    backend.end("KILLED")  # flushes what is left
    assert history(backend, "time/sps") == [(s, 100.0 + s) for s in range(10)]  # every point, once
    assert backend.client.get_run(backend.run_id).info.status == "KILLED"


def test_the_curve_is_titled_with_algo_env_and_seed(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    control = {"rollout/ep_return_mean": [(100, 1.0), (200, 2.0)], "eval/return_mean": [(200, 3.0)]}
    text = {"rollout/reward_mean": [(16, 0.2)], "eval/accuracy": [(16, 0.3)]}
    for history, title in ((control, "trpo on Hopper-v5, seed 1"), (text, "grpo on addition, seed 0")):
        fig = learning_curve_figure(history, title)
        assert fig is not None and fig.get_suptitle() == title
    assert learning_curve_figure({}, "x") is None
    with caplog.at_level(logging.INFO, logger="pgcli"):
        plot_learning_curve(control, tmp_path / "c.png", title="trpo on Hopper-v5, seed 1")
    assert caplog.messages[:2] == [
        "learning_curve.png title: trpo on Hopper-v5, seed 1",
        "learning_curve.png: x environment steps; episode return: rollout/ep_return_mean, eval/return_mean",
    ]


# --------------------------------------------------------------------------------------------------------------------
# a new SQLite store (ensure_store) and checkpoints waiting in an outage spool
# --------------------------------------------------------------------------------------------------------------------


def test_ensure_store_makes_a_whole_store_once_and_leaves_other_files_alone(tmp_path: Path):
    db = tmp_path / "new" / "mlflow.db"
    ensure_store(f"sqlite:///{db}")
    assert sqlite_tables(db) >= MLFLOW_TABLES
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db", "mlflow.db.lock"]  # no temporary store left
    before = db.stat().st_mtime_ns
    ensure_store(f"sqlite:///{db}")
    assert db.stat().st_mtime_ns == before
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    ensure_store(f"sqlite:///{text}")  # MLflow (and pgcli train's preflight) answer for it
    assert text.read_text() == "not a database" and not (tmp_path / "notes.txt.lock").exists()
    ensure_store("http://127.0.0.1:1")  # a server creates its own schema: nothing is contacted


def test_checkpoints_waiting_in_the_spool_are_not_pruned(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    for step in (100, 200, 300):
        (checkpoints / f"step_{step}").mkdir(parents=True)
    spool = Spool(tmp_path / SPOOL_FILE)
    spool.start("r1", "http://127.0.0.1:5000")
    spool.append({"op": "artifact", "path": str(checkpoints / "step_100"), "artifact_path": "checkpoints/step_100"})
    prune_checkpoints(checkpoints, 1)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_100", "step_300"]
    spool.clear()  # delivered: the next checkpoint prunes it
    prune_checkpoints(checkpoints, 1)
    assert [p.name for p in checkpoints.iterdir()] == ["step_300"]


def test_restored_history_keeps_the_logged_order_of_points_at_one_step(tmp_path: Path):
    # two episodes that ended at the same vector step: a resumed run's metrics.csv lists them as the straight run did
    # (sorting on (step, value) put 96 first: the resumed Atari run's report differed from the straight run's)
    logger = RunLogger(tmp_path)
    logger.restore_history({"rollout/ep_len": [(176, 99.0), (176, 96.0), (128, 50.0)]})
    assert logger.history["rollout/ep_len"] == [(128, 50.0), (176, 99.0), (176, 96.0)]


def test_an_rlhf_curve_draws_gold_and_proxy_together_and_names_the_reward_the_proxy(tmp_path: Path, caplog):
    history = {
        "rollout/reward_mean": [(16, 0.2), (32, 0.4)],
        "train/kl_ref": [(16, 0.0), (32, 0.01)],
        "eval/accuracy": [(0, 0.055), (32, 0.043)],
        "eval/proxy_reward_mean": [(0, 0.41), (32, 0.653)],
    }
    gold, reward, kl = text_panels(history)
    assert kl.keys == ("train/kl_ref",)
    assert gold.keys == ("eval/accuracy",) and gold.right == ("eval/proxy_reward_mean",) and gold.unit_interval
    assert gold.ylabel.startswith("gold") and gold.right_label.startswith("proxy")
    assert reward.keys == ("rollout/reward_mean",) and reward.ylabel.startswith("proxy reward (reward model)")
    fig = learning_curve_figure(history)
    labels = [text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()]
    assert any(label.startswith("gold: task checker") for label in labels)
    assert any(label.startswith("proxy: reward model's score, greedy") for label in labels)  # in the gold's legend
    assert "proxy: reward-model score" in [ax.get_ylabel() for ax in fig.axes]  # the right axis
    assert plot_learning_curve(history, tmp_path / "rlhf.png") == tmp_path / "rlhf.png"
