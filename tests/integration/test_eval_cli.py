"""`pgcli eval` through the console script, on runs that a real `pgcli train` logged to a temporary MLflow store.

What a user relies on: the default evaluation repeats the run's own (same episodes, env seed and deterministic
actions), so it scores exactly the return the run logged; results land in an `eval-<run>` run nested under the
evaluated one; `--video` gives a playable, non-empty video artifact; bad input is one line with exit status 2.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import pytest

from tests.conftest import Store, run_pgcli


def trained_run(root: Path, schema_db: Path, *overrides: str) -> tuple[Store, Path, Any]:
    """A finished `pgcli train` run in a fresh store under ``root``: (store, the dir pgcli ran in, the run)."""
    store, workdir = Store(root / "store"), root / "work"
    store.root.mkdir(parents=True)
    workdir.mkdir()
    shutil.copyfile(schema_db, store.root / "mlflow.db")
    proc = run_pgcli(["train", f"tracking.uri={store.uri}", "progress=false", *overrides], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.client().search_runs([e.experiment_id for e in store.client().search_experiments()])
    return store, workdir, run


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> tuple[Store, Path, Any]:
    # PPO (SB3) on CartPole: evaluations at 1024 and 2048 steps, 3 episodes each
    return trained_run(
        tmp_path_factory.mktemp("cartpole"), mlflow_schema_db, "total_steps=2048", "eval.every=1024", "eval.episodes=3"
    )


def last(store: Store, run_id: str, key: str) -> float:
    return sorted(store.client().get_metric_history(run_id, key), key=lambda m: m.step)[-1].value


def eval_runs(store: Store, source: Any) -> list[Any]:
    return store.client().search_runs(
        [source.info.experiment_id], f"tags.source_run_id = '{source.info.run_id}'", order_by=["start_time DESC"]
    )


def check_video(path: Path, shape: tuple[int, int, int]) -> int:
    """A readable video of RGB frames of ``shape``; returns its frame count."""
    assert path.stat().st_size > 1000
    frames = [frame for frame in imageio.get_reader(path)]
    assert frames and frames[0].shape == shape
    assert len({frame.tobytes() for frame in frames}) > 1  # the scene moves
    return len(frames)


def test_eval_by_run_id_scores_the_logged_return_and_logs_a_video(cartpole, tmp_path: Path):
    store, workdir, run = cartpole
    proc = run_pgcli(["eval", run.info.run_id, f"tracking.uri={store.uri}", "--video"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = last(store, run.info.run_id, "eval/return_mean")
    assert f"return        {logged:.1f} ± " in proc.stdout
    assert "pgcli: evaluating 3 episodes of cartpole, final model...\n" in proc.stderr  # said before it plays
    assert "0/3 [" in proc.stderr and "episode/s" in proc.stderr  # the bar of the episodes
    assert f"logged        {logged:.1f} (eval/return_mean" in proc.stdout

    (ev,) = eval_runs(store, run)
    assert ev.info.status == "FINISHED" and ev.info.run_name == f"eval-{run.info.run_name}"
    assert ev.data.tags["mlflow.parentRunId"] == run.info.run_id and ev.data.tags["pgcli.eval.model"] == "final"
    assert ev.data.metrics["eval/return_mean"] == pytest.approx(logged, abs=1e-9)  # the run's last evaluation
    assert ev.data.params["episodes"] == "3" and ev.data.params["deterministic"] == "True"
    assert len(store.client().get_metric_history(ev.info.run_id, "eval/episode_return")) == 3

    (video,) = [a.path for a in store.client().list_artifacts(ev.info.run_id, "videos")]
    assert video == "videos/episode.mp4"
    local = Path(store.client().download_artifacts(ev.info.run_id, video, str(tmp_path)))
    n_frames = check_video(local, (400, 600, 3))
    first_return = store.client().get_metric_history(ev.info.run_id, "eval/episode_return")
    # one frame per step of the first episode but its last (CartPole: +1 per step, so return = steps)
    assert n_frames in {int(m.value) for m in first_return}
    assert (Path(run.data.tags["output_dir"]) / "eval").is_dir()  # the local copy, in the run directory


def test_eval_best_of_a_run_dir_without_logging(cartpole):
    store, workdir, run = cartpole
    n_runs = len(store.client().search_runs([run.info.experiment_id]))
    proc = run_pgcli(
        ["eval", run.data.tags["output_dir"], "--best", "--no-log", f"tracking.uri={store.uri}"], cwd=workdir
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best model" in proc.stdout
    assert f"return        {last(store, run.info.run_id, 'eval/best_return_mean'):.1f} ± " in proc.stdout
    assert len(store.client().search_runs([run.info.experiment_id])) == n_runs  # --no-log: no eval run


def test_eval_by_run_id_downloads_the_model_when_the_run_dir_is_gone(cartpole):
    store, workdir, run = cartpole
    run_dir = Path(run.data.tags["output_dir"])
    moved = run_dir.with_name(run_dir.name + "_moved")
    run_dir.rename(moved)
    try:
        proc = run_pgcli(
            [
                "eval",
                run.info.run_id,
                "--episodes",
                "2",
                "--stochastic",
                "--seed",
                "7",
                "--no-log",
                f"tracking.uri={store.uri}",
            ],
            cwd=workdir,
        )
    finally:
        moved.rename(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 episodes, stochastic, env seed 7" in proc.stdout


@pytest.mark.slow  # MuJoCo through software EGL: ~2 min on a loaded 2-core machine
def test_eval_hopper_with_video(tmp_path: Path, mlflow_schema_db: Path):
    # our TRPO on Hopper-v5 (MuJoCo, offscreen rendering): 2048 steps, one final evaluation of a 50-step episode cap
    store, workdir, run = trained_run(
        tmp_path,
        mlflow_schema_db,
        "algo=trpo",
        "env=hopper",
        "total_steps=2048",
        "algo.n_steps=256",
        "env.max_episode_steps=50",
        "eval.episodes=1",
    )
    proc = run_pgcli(["eval", run.info.run_id, f"tracking.uri={store.uri}", "video=true"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (ev,) = eval_runs(store, run)
    assert ev.data.metrics["eval/return_mean"] == pytest.approx(last(store, run.info.run_id, "eval/return_mean"))
    (video,) = [a.path for a in store.client().list_artifacts(ev.info.run_id, "videos")]
    n_frames = check_video(Path(store.client().download_artifacts(ev.info.run_id, video, str(tmp_path))), (480, 480, 3))
    assert n_frames == ev.data.metrics["eval/ep_len_mean"]  # first observation .. the state before the last step


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["0123456789abcdef0123456789abcdef"], "no run 0123456789abcdef0123456789abcdef in sqlite:///"),
        (["not-a-run"], "'not-a-run' is not a directory, nor an MLflow run id"),
        (["{empty}"], "is neither a run directory (.hydra/, model/) nor a model directory"),
        (["{model}", "--best"], "is a model directory; --best picks best_model/"),
        (["{run}", "algo=trpo"], "pgcli eval takes tracking overrides only (got 'algo=trpo')"),
        (["{run}", "--episodes", "0"], "--episodes must be >= 1 (got 0)"),
    ],
)
def test_bad_input_is_one_line_and_status_2(cartpole, argv: list[str], fragment: str, tmp_path: Path):
    store, _, run = cartpole
    (tmp_path / "empty").mkdir()
    run_dir = run.data.tags["output_dir"]
    argv = [a.format(empty=tmp_path / "empty", run=run_dir, model=f"{run_dir}/model") for a in argv]
    n_runs = len(store.client().search_runs([run.info.experiment_id]))
    proc = run_pgcli(["eval", *argv, f"tracking.uri={store.uri}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("pgcli: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr
    assert len(store.client().search_runs([run.info.experiment_id])) == n_runs
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "FINISHED"), (RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_the_eval_run_ends_as_a_training_run_ends_never_running(raised, status, tmp_path: Path):
    # pgcli.training.run.final_status decides, as for a training run: an error FAILED, Ctrl-C/SIGTERM KILLED
    from types import SimpleNamespace

    from pgcli.commands.eval import EvalTarget, eval_run

    ended: list[tuple[str, str]] = []

    class RecordingStore:
        uri = "sqlite:///unused.db"

        def create_run(self, experiment: str, *, run_name: str, tags: dict, artifact_root: str | None) -> Any:
            return SimpleNamespace(run_id="eval1")

        def end(self, run_id: str, status: str) -> None:
            ended.append((run_id, status))

    target = EvalTarget(tmp_path, SimpleNamespace(seed=0, experiment=None), "ppo", "cartpole", "final", None, None)
    if raised is None:
        with eval_run(RecordingStore(), target, None, None) as run:
            assert run.run_id == "eval1" and ended == []
    else:
        with pytest.raises(type(raised)), eval_run(RecordingStore(), target, None, None):
            raise raised
    assert ended == [("eval1", status)]
