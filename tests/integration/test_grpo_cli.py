"""A real `pgcli train algo=grpo` subprocess lands a FINISHED MLflow run with the GRPO metrics."""

import re
from pathlib import Path

from tests.conftest import Store, run_pgcli

GRPO_METRICS = {
    "train/group_return_mean",
    "train/group_return_std",
    "train/degenerate_frac",
    "train/clip_frac_low",
    "train/clip_frac_high",
    "train/kl_ref",
    "train/approx_kl",
    "train/entropy",
    "train/policy_loss",
    "rollout/ep_return_mean",
    "rollout/ep_len_mean",
    "time/sps",
    "eval/return_mean",
}


def test_grpo_train_lands_a_finished_run_with_its_metrics(store: Store, workdir: Path):
    args = [
        "train",
        "algo=grpo",
        "env=cartpole",
        f"tracking.uri={store.uri}",
        "total_steps=1500",
        "eval.episodes=2",
        "eval.every=0",
        "progress=false",
        "env.n_envs=4",
        "algo.group_size=4",
        "algo.n_groups=2",
        "algo.batch_size=4",
        "algo.beta=0.05",
        "algo.epsilon_high=0.28",
        "seed=3",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("cartpole")
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) >= GRPO_METRICS
    assert run.data.params["algo.group_size"] == "4" and run.data.params["algo.epsilon_high"] == "0.28"
    steps = [m.step for m in store.client().get_metric_history(run.info.run_id, "train/group_return_mean")]
    assert steps == sorted(steps) and steps[-1] >= 1500 and all(s % 4 == 0 for s in steps)  # env steps, N = 4
    (log,) = workdir.glob("outputs/runs/*/*/train.log")  # the curve is titled with algo, env id and seed
    assert "learning_curve.png title: grpo on CartPole-v1, seed 3\n" in log.read_text()


def test_grpo_rejects_a_group_of_one_before_anything_runs(store: Store, workdir: Path):
    proc = run_pgcli(["train", "algo=grpo", "algo.group_size=1", f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 2
    assert "algo.group_size must be >= 2 (got 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (store.root / "mlflow.db").exists()


def test_grpo_says_up_front_that_it_trains_past_total_steps_and_the_bar_ends_where_it_stopped(workdir: Path):
    """A GRPO update plays whole episodes, so training ends past total_steps: one note names the options that bound
    the overshoot, and the progress bar ends at the env steps trained (not at total_steps)."""
    args = [
        "train",
        "algo=grpo",
        "env=cartpole",
        "tracking=off",
        "total_steps=300",
        "eval.episodes=2",
        "eval.every=0",
        "env.n_envs=4",
        "algo.group_size=2",
        "algo.n_groups=2",
        "algo.batch_size=4",
        "checkpoint_every=0",
        "progress=true",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = int(re.search(r"\(seed 0\): ([\d,]+) env steps", proc.stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert trained > 300
    notes = [line for line in proc.stderr.splitlines() if line.startswith("pgcli: note:") and "total_steps" in line]
    assert len(notes) == 1, proc.stderr
    assert "total_steps=300" in notes[0] and "algo.n_groups" in notes[0] and "algo.group_size" in notes[0]
    bars = [line for line in re.split(r"[\r\n]", proc.stderr) if "step/s" in line or "step]" in line]
    assert f"{trained}/{trained}" in bars[-1], bars[-3:]
