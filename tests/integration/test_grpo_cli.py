"""A real `pgcli train algo=grpo` subprocess lands a FINISHED MLflow run with the GRPO metrics."""

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
    args = ["train", "algo=grpo", "env=cartpole", f"tracking.uri={store.uri}", "total_steps=1500", "eval.episodes=2",
            "eval.every=0", "progress=false", "env.n_envs=4", "algo.group_size=4", "algo.n_groups=2",
            "algo.batch_size=4", "algo.beta=0.05", "algo.epsilon_high=0.28", "seed=3"]  # fmt: skip
    proc = run_pgcli(args, cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("cartpole")
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) >= GRPO_METRICS
    assert run.data.params["algo.group_size"] == "4" and run.data.params["algo.epsilon_high"] == "0.28"
    steps = [m.step for m in store.client().get_metric_history(run.info.run_id, "train/group_return_mean")]
    assert steps == sorted(steps) and steps[-1] >= 1500 and all(s % 4 == 0 for s in steps)  # env steps, N = 4


def test_grpo_rejects_a_group_of_one_before_anything_runs(store: Store, workdir: Path):
    proc = run_pgcli(["train", "algo=grpo", "algo.group_size=1", f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 2
    assert "algo.group_size must be >= 2 (got 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (store.root / "mlflow.db").exists()
