"""Text tasks (docs/algorithms/lm.md): a real `pgcli train` per language-model RL algorithm, started from a real SFT
run (init=<run id>), lands a FINISHED MLflow run with the held-out accuracy and the language-RL metrics."""

from __future__ import annotations

import pytest

from tests.conftest import run_pgcli
from tests.integration.conftest import LM_SMALL, SFTRun

LM_RL_METRICS = {
    "eval/accuracy",
    "eval/pass_at_2",
    "train/kl_ref",
    "train/entropy",
    "train/clip_fraction",
    "train/approx_kl",
    "train/dropped_frac",
    "train/zero_variance_frac",
    "rollout/reward_mean",
    "rollout/completion_len",
    "time/tokens_per_s",
}


@pytest.mark.parametrize(
    "algo",
    [["algo=grpo"], ["algo=grpo", "preset=grpo_addition_dr"], ["algo=rloo"], ["algo=reinforce"], ["algo=ppo_lm"]],
    ids=["grpo", "dr_grpo", "rloo", "reinforce", "ppo_lm"],
)
def test_each_algorithm_lands_a_finished_run_with_accuracy(lm_sft_run: SFTRun, algo: list[str]):
    store, workdir, sft_id = lm_sft_run
    args = ["train", *algo, "env=addition", f"init={sft_id}", f"tracking.uri={store.uri}", "total_steps=64",
            "eval.every=32", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8", "algo.beta=0.04",
            "run_name=" + "-".join(a.split("=")[1] for a in algo), *LM_SMALL]  # fmt: skip
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in store.runs("addition") if r.info.run_name == args[-len(LM_SMALL) - 1].split("=")[1]]
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == sft_id
    assert set(run.data.metrics) >= LM_RL_METRICS
    assert 0.0 <= run.data.metrics["eval/accuracy"] <= 1.0 and run.data.metrics["train/kl_ref"] >= 0.0
    if algo == ["algo=ppo_lm"]:
        assert "train/value_loss" in run.data.metrics
    client = store.client()
    # a step is one sampled completion: 16 per update, evaluations at 32 and 64
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == [16, 32, 48, 64]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [32, 64]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert "model/policy.pt" in artifacts


def test_control_only_grpo_options_are_one_line_errors_on_a_text_env(lm_sft_run: SFTRun):
    store, workdir, _ = lm_sft_run
    before = len(store.runs("addition"))
    proc = run_pgcli(["train", "algo=grpo", "env=addition", "algo.advantage=process", f"tracking.uri={store.uri}",
                      *LM_SMALL], cwd=workdir, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pgcli: error: algo.advantage=process needs per-step rewards of a control task; a text task scores a whole "
        "completion once: use algo.advantage=outcome"
    )
    assert len(store.runs("addition")) == before
