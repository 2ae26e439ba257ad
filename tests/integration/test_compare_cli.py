"""`pgcli compare` on runs made by the real commands in the README's order (docs/sweeps.md, "Comparing runs"):
`pgcli train`, `pgcli train resume=<run> total_steps=<more>`, `pgcli eval`, then `pgcli compare`, all as real
subprocesses on one store. Compare leaves the eval runs out, groups a resumed run by the budget it was resumed to,
and refuses a --group-by key no run has with one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest

from tests.conftest import Store, run_pgcli

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

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
    assert "?" not in (tmp_path / "report" / "compare-eval_return_mean.md").read_text()
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
    report = (out / "compare-eval_accuracy-vs-eval_kl_ref.md").read_text()
    assert "![eval/accuracy against eval/kl_ref](compare-eval_accuracy-vs-eval_kl_ref.png)" in report
    assert (out / "compare-eval_accuracy-vs-eval_kl_ref.png").stat().st_size > 1000


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


# --------------------------------------------------------------------------------------------------------------------
# Unlike rewards, many groups, several reports of one selection (docs/sweeps.md, "Comparing runs")
# --------------------------------------------------------------------------------------------------------------------


def log_text_run(
    client: MlflowClient, exp: str, start: int, params: dict[str, str], curve: list[float], **tags: str
) -> str:
    """One FINISHED text run as `pgcli train` logs it: its config as params, algo/env/seed tags, eval/return_mean at
    steps 0, 100, 200, and eval/accuracy (the checker's) unless it is a reward model."""
    from mlflow.entities import Metric, Param, RunTag

    params = {"env.id": "addition", "total_steps": "200", **params}
    tags = {"algo": params["algo"], "env_id": "addition", "seed": params["seed"], **tags}
    run_id = client.create_run(exp, start_time=1_700_000_000_000 + start, tags=tags).info.run_id
    metrics = [Metric("eval/return_mean", v, 0, 100 * i) for i, v in enumerate(curve)]
    if params["algo"] != "rm":
        metrics += [Metric("eval/accuracy", 0.1 * (i + 1), 0, 100 * i) for i in range(len(curve))]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.fixture(scope="module")
def rewards_store(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> tuple[Store, str]:
    """An 'addition' experiment as a user fills it: 2 reward-model runs (`pgcli rm`: eval/return_mean is pairwise
    accuracy), 2 PPO runs on the task's reward (accuracy) and 2 on the first reward model's score
    (`env.reward=rm:<run>`, its id recorded as the run does); returns the store and that reward model's id."""
    store = Store(tmp_path_factory.mktemp("rewards") / "store")
    store.root.mkdir()
    shutil.copyfile(mlflow_schema_db, store.root / "mlflow.db")
    client = store.client()
    exp = client.create_experiment("addition", artifact_location=(store.root / "artifacts").as_uri())
    rm_ids = [log_text_run(client, exp, s, {"algo": "rm", "seed": str(s)}, [0.5, 0.8, 0.9]) for s in range(2)]
    for seed in range(2):
        log_text_run(client, exp, 10 + seed, {"algo": "ppo_lm", "seed": str(seed)}, [0.1, 0.3, 0.5])
        rm_params = {"algo": "ppo_lm", "seed": str(seed), "env.reward": f"rm:{rm_ids[0][:8]}"}
        log_text_run(client, exp, 20 + seed, rm_params, [0.5, 2.0, 3.5], reward_model_run_id=rm_ids[0])
    return store, rm_ids[0]


def test_unlike_rewards_get_rows_and_panels_of_their_own_with_a_note(
    rewards_store: tuple[Store, str], tmp_path: Path
) -> None:
    store, rm_id = rewards_store
    out = tmp_path / "report"
    args = ["compare", "--experiment", "addition", "--out", str(out), f"tracking.uri={store.uri}"]
    proc = run_pgcli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| algo | env_id | reward | budget | n | final eval/return_mean"), rows[0]
    # the reward model's score, the task's accuracy and the pairwise accuracy: three rows, never one average
    assert rows[1].startswith(f"| ppo_lm | addition | rm:{rm_id[:8]} | 200 | 2 | 3.500 ± 0.000 |"), rows
    assert rows[2].startswith("| ppo_lm | addition | task | 200 | 2 | 0.500 ± 0.000 |"), rows
    assert rows[3].startswith("| rm | addition | pairwise accuracy | 200 | 2 | 0.900 ± 0.000 |"), rows
    (note,) = [line for line in proc.stdout.splitlines() if "different score per reward" in line]
    assert note.startswith("- eval/return_mean is a different score per reward, so each reward has its own rows"), note
    assert "pairwise accuracy (held-out pairs ranked right, pgcli rm): 2 run(s)" in note
    assert f"rm:{rm_id[:8]} (that reward model's score): 2 run(s)" in note and "task (the task's reward)" in note
    assert "--filter" in note and "split" not in proc.stdout  # no "runs differ in env.reward" note: it is a key
    # the checker's accuracy means one thing for every policy: no reward key (the config tells the two apart), and
    # the reward models, which log no accuracy, are left out
    proc = run_pgcli([*args[:-1], "--metric", "eval/accuracy", args[-1]], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"| ppo_lm | addition | 200 | env.reward=rm:{rm_id[:8]} | 2 | 0.300 ± 0.000 |" in proc.stdout
    assert "| reward |" not in proc.stdout and "different score per reward" not in proc.stdout
    assert "2 run(s) without 'eval/accuracy' left out" in proc.stderr
    # each comparison its own files, named by what they draw: the first is still there
    assert sorted(p.name for p in out.iterdir()) == [
        f"compare-{name}.{suffix}" for name in ("eval_accuracy", "eval_return_mean") for suffix in ("html", "md", "png")
    ]
    assert "![learning curves](compare-eval_return_mean.png)" in (out / "compare-eval_return_mean.md").read_text()


def test_a_plot_of_sixteen_groups_grows_to_hold_its_legend(
    tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path, tmp_path: Path
) -> None:
    """16 settings of algo.beta, one seed each, as a 16-point grid sweep logs them: the png is one panel's height (4.2
    in, 420 px before) plus 16 legend lines of 0.2 in below the axes (unit test: the legend inside the figure)."""
    store = Store(tmp_path_factory.mktemp("many") / "store")
    store.root.mkdir()
    shutil.copyfile(mlflow_schema_db, store.root / "mlflow.db")
    client = store.client()
    exp = client.create_experiment("addition", artifact_location=(store.root / "artifacts").as_uri())
    for i in range(16):
        params = {"algo": "ppo_lm", "seed": "0", "algo.beta": f"{0.001 * (i + 1):.3f}"}
        log_text_run(client, exp, i, params, [0.1, 0.2 + 0.01 * i, 0.3 + 0.02 * i])
    out = tmp_path / "report"
    args = ["compare", "--experiment", "addition", "--group-by", "algo.beta", "--out", str(out)]
    proc = run_pgcli([*args, f"tracking.uri={store.uri}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("| ppo_lm | addition | ") == 16
    width, height = png_size(out / "compare-eval_return_mean.png")
    assert height >= (4.2 + 16 * 0.2) * 100 and width >= 700, (width, height)  # 100 dpi


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    header = path.read_bytes()[16:24]
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
