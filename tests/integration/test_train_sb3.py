"""Short real trainings of the SB3 baselines through the `pgcli` console script, read back from MLflow.

Each test runs one `pgcli train` subprocess against a temporary SQLite store (a few thousand env steps, CPU) and checks
what a user relies on: status, the flattened config as params, metric histories keyed by env steps, reproducibility
tags and artifacts. Learning quality is not asserted here (benchmarks/ measures it).
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Store, run_pgcli


@pytest.fixture
def store(migrated_store: Store) -> Store:
    """A temporary store whose schema already exists (saves each subprocess MLflow's migrations)."""
    return migrated_store


COMMON_METRICS = (
    "rollout/ep_return_mean",
    "rollout/ep_len_mean",
    "rollout/ep_return",
    "rollout/ep_len",
    "train/value_loss",
    "train/entropy",
    "train/policy_loss",
    "train/explained_variance",
    "time/sps",
    "eval/return_mean",
    "eval/return_std",
)


def metric_history(store: Store, run: Any, key: str) -> list[tuple[int, float]]:
    points = store.client().get_metric_history(run.info.run_id, key)
    return [(m.step, m.value) for m in sorted(points, key=lambda m: (m.step, m.timestamp))]


def artifact_paths(store: Store, run: Any, path: str | None = None) -> set[str]:
    client = store.client()
    out: set[str] = set()
    for entry in client.list_artifacts(run.info.run_id, path):
        out |= artifact_paths(store, run, entry.path) if entry.is_dir else {entry.path}
    return out


def read_artifact(store: Store, run: Any, path: str, tmp: Path) -> bytes:
    local = store.client().download_artifacts(run.info.run_id, path, str(tmp))
    return Path(local).read_bytes()


def train(store: Store, workdir: Path, *overrides: str) -> tuple[Any, str]:
    """Run `pgcli train` to completion; return the single run it created and its stdout."""
    proc = run_pgcli(["train", f"tracking.uri={store.uri}", "progress=false", *overrides], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    runs = store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0], proc.stdout


def check_common(store: Store, run: Any, stdout: str, *, algo: str, env: str, env_id: str, seed: int, tmp: Path):
    """What every SB3-backed run must have, whatever the algorithm."""
    info, data = run.info, run.data
    assert info.status == "FINISHED" and info.end_time is not None
    assert info.run_name == f"{algo}-{env}-s{seed}"
    assert store.client().get_experiment(info.experiment_id).name == env

    steps = int(re.search(r"([\d,]+) env steps", stdout).group(1).replace(",", ""))
    assert info.run_id in stdout and "final eval return" in stdout

    # params: the flattened resolved config and the group choices
    params = data.params
    assert params["algo"] == algo and params["env"] == env
    assert params["env.id"] == env_id and params["seed"] == str(seed)
    assert "algo.gamma" in params and "model.pi_hidden_sizes" in params and "tracking.uri" in params

    # metrics: every key present, steps are env steps, non-decreasing, within the run
    for key in COMMON_METRICS:
        history = metric_history(store, run, key)
        assert history, f"metric {key} was never logged"
        run_steps = [s for s, _ in history]
        assert run_steps == sorted(run_steps), f"{key} steps go backwards"
        assert run_steps[0] > 0 and run_steps[-1] <= steps, f"{key} steps {run_steps} outside (0, {steps}]"
    assert metric_history(store, run, "rollout/ep_return_mean")[-1][0] == steps  # logged at the end
    assert all(v > 0 for _, v in metric_history(store, run, "time/sps"))
    episodes = metric_history(store, run, "rollout/ep_len")
    assert len(metric_history(store, run, "rollout/ep_return")) == len(episodes)
    assert sum(v for _, v in episodes) <= steps  # one point per finished episode, never more steps than were taken
    assert metric_history(store, run, "eval/return_mean")[-1][0] == steps  # final evaluation
    assert all(v >= 0 for _, v in metric_history(store, run, "eval/return_std"))
    assert metric_history(store, run, "train/entropy")[-1][0] > 0

    # tags: findable and reproducible
    tags = data.tags
    assert tags["algo"] == algo and tags["env"] == env and tags["seed"] == str(seed) and tags["env_id"] == env_id
    assert re.fullmatch(r"[0-9a-f]{40}", tags["git_commit"]) and tags["git_dirty"] in ("true", "false")
    for key in (
        "pgcli_version",
        "torch_version",
        "gymnasium_version",
        "sb3_version",
        "python_version",
        "device",
        "cpu",
    ):
        assert tags[key], key
    assert f"seed={seed}" in tags["hydra_overrides"].split()
    output_dir = Path(tags["output_dir"])
    assert output_dir.is_absolute() and output_dir.is_dir()
    assert output_dir.is_relative_to(workdir_of(output_dir))

    # artifacts: resolved config and overrides, final model, learning curve, metrics CSV
    artifacts = artifact_paths(store, run)
    assert {"hydra/config.yaml", "hydra/overrides.yaml", "model/model.zip", "learning_curve.png", "metrics.csv"} <= (
        artifacts
    )
    config = yaml.safe_load(read_artifact(store, run, "hydra/config.yaml", tmp))
    assert config["seed"] == seed and config["env"]["id"] == env_id
    assert zipfile.is_zipfile(io.BytesIO(read_artifact(store, run, "model/model.zip", tmp)))
    assert read_artifact(store, run, "learning_curve.png", tmp).startswith(b"\x89PNG")
    rows = list(csv.DictReader(io.StringIO(read_artifact(store, run, "metrics.csv", tmp).decode())))
    assert {r["key"] for r in rows} >= set(COMMON_METRICS)
    csv_returns = [float(r["value"]) for r in rows if r["key"] == "rollout/ep_return"]
    assert csv_returns == [v for _, v in metric_history(store, run, "rollout/ep_return")]
    for name in ("metrics.csv", "learning_curve.png", "model/model.zip", ".hydra/config.yaml"):
        assert (output_dir / name).is_file(), name
    return steps, params, artifacts


def workdir_of(output_dir: Path) -> Path:
    """The directory pgcli started in: run directories live in <start>/outputs/runs/<date>/<name>."""
    return output_dir.parents[3]


def test_ppo_cartpole_through_the_cli(store: Store, workdir: Path, tmp_path: Path):
    run, stdout = train(
        store, workdir, "seed=1", "total_steps=3000", "eval.every=1000", "eval.episodes=2", "checkpoint_every=1500"
    )
    steps, params, artifacts = check_common(
        store, run, stdout, algo="ppo", env="cartpole", env_id="CartPole-v1", seed=1, tmp=tmp_path
    )
    assert workdir_of(Path(run.data.tags["output_dir"])) == workdir.resolve()
    assert steps == 3072  # rollouts of 32 steps x 8 envs (ppo_cartpole preset): the first boundary past 3000
    assert params["algo.n_steps"] == "32" and params["algo.clip_range"] == "0.2"  # preset value, then SB3's default
    assert params["total_steps"] == "3000" and params["checkpoint_every"] == "1500"

    eval_steps = [s for s, _ in metric_history(store, run, "eval/return_mean")]
    assert eval_steps == [1024, 2048, 3072]  # the first update at or past every 1000 env steps, and the end
    returns = [v for _, v in metric_history(store, run, "rollout/ep_return")]
    assert all(v >= 1 and v == int(v) for v in returns)  # CartPole: +1 per step
    for name in ("train/approx_kl", "train/clip_fraction", "train/policy_loss"):
        assert metric_history(store, run, name), name
    assert all(v > 0 for _, v in metric_history(store, run, "train/entropy"))  # entropy, not SB3's negated loss
    assert {"checkpoints/step_1536/model.zip", "checkpoints/step_3072/model.zip"} <= artifacts
    evals = [v for _, v in metric_history(store, run, "eval/return_mean")]
    assert [v for _, v in metric_history(store, run, "eval/best_return_mean")] == list(itertools.accumulate(evals, max))
    assert "best_model/model.zip" in artifacts  # the agent of the best evaluation (eval.save_best)
    # the run's log: the budget note (3000 is not a whole number of 256-step rollouts), evaluations, the summary
    log = (Path(run.data.tags["output_dir"]) / "train.log").read_text()
    assert "training stops at 3,072 env steps" in log and "eval at step 3072: return" in log, log
    assert "final eval return" in log and run.info.run_id in log
    assert params["planned_steps"] == "3072"


def test_a2c_pendulum_through_the_cli(store: Store, workdir: Path, tmp_path: Path):
    run, stdout = train(
        store, workdir, "algo=a2c", "env=pendulum", "total_steps=3000", "eval.every=1500", "eval.episodes=1", "seed=2"
    )
    steps, params, artifacts = check_common(
        store, run, stdout, algo="a2c", env="pendulum", env_id="Pendulum-v1", seed=2, tmp=tmp_path
    )
    assert steps == 3008  # updates of 8 steps x 8 envs (a2c_pendulum preset)
    assert params["algo.use_sde"] == "True" and params["env.normalize_obs"] == "True"  # the zoo preset
    assert params["model.log_std_init"] == "-2.0"
    assert [s for s, _ in metric_history(store, run, "eval/return_mean")] == [1536, 3008]
    assert all(v < 0 for _, v in metric_history(store, run, "rollout/ep_return"))  # Pendulum: raw, unnormalised
    assert len(metric_history(store, run, "rollout/ep_return")) == 8  # 8 envs x one 200-step episode in 376 steps
    assert "model/normalizer.npz" in artifacts  # normalisation statistics saved with the model
    assert not any(a.startswith("checkpoints/") for a in artifacts)  # 3000 steps < checkpoint_every: final model only


def test_mlflow_tracking_uri_env_var_wins_over_default_store(store: Store, workdir: Path):
    proc = run_pgcli(
        ["train", "total_steps=256", "eval.every=0", "eval.episodes=1", "progress=false"],
        cwd=workdir,
        MLFLOW_TRACKING_URI=store.uri,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("cartpole")
    assert run.info.status == "FINISHED"
    assert not (workdir / "outputs" / "mlflow.db").exists()  # the default store was not used
    assert store.uri in proc.stdout


def test_default_store_is_outputs_mlflow_db_with_absolute_paths(workdir: Path):
    proc = run_pgcli(["train", "total_steps=256", "eval.every=0", "eval.episodes=1", "progress=false"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    db = workdir.resolve() / "outputs" / "mlflow.db"
    assert db.is_file()
    default = Store(db.parent)
    (run,) = default.runs("cartpole")
    assert run.info.status == "FINISHED"
    assert f"sqlite:///{db}" in proc.stdout
    experiment = default.client().get_experiment(run.info.experiment_id)
    assert experiment.artifact_location == (db.parent / "mlartifacts" / "cartpole").as_uri()
    assert run.info.artifact_uri.startswith((db.parent / "mlartifacts").as_uri())
    assert "metrics.csv" in artifact_paths(default, run)
    assert not (workdir / "mlruns").exists() and not (workdir / "mlflow.db").exists()
