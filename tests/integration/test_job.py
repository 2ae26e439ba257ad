"""``pgcli.training.run_job``: one tiny CartPole job from Python, composed, checked and labelled as ``pgcli train``
would, giving the same metrics as the build path it wraps."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.training import TrainSummary, run_job
from pgcli.training.build import RunContext, train
from tests.conftest import Store

TINY = ["algo=trpo", "env=cartpole", "env.n_envs=2", "total_steps=256", "algo.n_steps=64", "algo.batch_size=32",
        "algo.n_critic_updates=2", "eval.every=128", "eval.episodes=2", "progress=false", "hardware=cpu"]  # fmt: skip


def metric_rows(run_dir: Path) -> list[tuple[str, str, str]]:
    """``metrics.csv`` without the wall-clock ``time/*`` keys."""
    with (run_dir / "metrics.csv").open() as f:
        return [(r["key"], r["step"], r["value"]) for r in csv.DictReader(f) if not r["key"].startswith("time/")]


def test_run_job_trains_a_tiny_cartpole_job_without_tracking(tmp_path: Path):
    summary = run_job(TINY, output_dir=tmp_path / "job", tracking=False)

    assert isinstance(summary, TrainSummary)
    assert summary.run_id is None and summary.tracking_uri is None  # tracking=off
    assert summary.output_dir == tmp_path / "job" and summary.steps == 256
    assert summary.final_return == summary.final_return  # an evaluation ran (not nan)
    agent = json.loads((tmp_path / "job" / "model" / "agent.json").read_text())
    assert (agent["algo"], agent["env"]) == ("trpo", "cartpole")  # labelled from Hydra's group choices
    rows = metric_rows(tmp_path / "job")
    assert [step for key, step, _ in rows if key == "eval/return_mean"] == ["128", "256"]

    # the same numbers as the build path with the same config (tracking=off, which run_job appended)
    cfg = compose_train_config([*TINY, "tracking=off"])
    train(cfg, RunContext(algo_name="trpo", env_name="cartpole", output_dir=tmp_path / "direct"))
    assert rows == metric_rows(tmp_path / "direct")


def test_run_job_names_its_mlflow_run_as_pgcli_train_does(tmp_path: Path):
    store = Store(tmp_path / "store")
    summary = run_job(
        [*TINY, "total_steps=64", "eval.every=0", f"tracking.uri={store.uri}"], output_dir=tmp_path / "job"
    )
    (run,) = store.runs("cartpole")
    assert run.info.run_id == summary.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "trpo-cartpole-s0"
    assert run.data.tags["preset"] == run.data.params["preset"] == "trpo_cartpole"  # conf/preset/trpo_cartpole.yaml
    assert run.data.tags["output_dir"] == str(tmp_path / "job")


def test_a_bad_override_is_a_one_line_error_before_anything_exists(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        run_job([*TINY, "algo.n_steps=-1"], output_dir=tmp_path / "job", tracking=False)
    assert "algo.n_steps" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "job").exists()
