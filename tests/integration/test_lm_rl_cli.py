"""Text tasks (docs/algorithms/lm.md): a real `pgcli train` per language-model RL algorithm, started from a real SFT
run (init=<run id>), lands a FINISHED MLflow run with the held-out accuracy and the language-RL metrics."""

from __future__ import annotations

from pathlib import Path

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
    [
        ["algo=grpo"],
        ["algo=grpo", "preset=grpo_addition_dr"],
        ["algo=rloo"],
        ["algo=reinforce"],
        ["algo=gspo"],
        ["algo=reinforce_pp", "algo.baseline=group"],
        ["algo=ppo_lm"],
    ],
    ids=["grpo", "dr_grpo", "rloo", "reinforce", "gspo", "reinforce_pp_baseline", "ppo_lm"],
)
def test_each_algorithm_lands_a_finished_run_with_accuracy(lm_sft_run: SFTRun, algo: list[str]):
    store, workdir, sft_id = lm_sft_run
    args = [
        "train",
        *algo,
        "env=addition",
        f"init={sft_id}",
        f"tracking.uri={store.uri}",
        "total_steps=64",
        "eval.every=32",
        "algo.group_size=4",
        "algo.n_groups=4",
        "algo.batch_size=8",
        "algo.beta=0.04",
        "run_name=" + "-".join(a.split("=")[1] for a in algo),
        *LM_SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in store.runs("addition") if r.info.run_name == args[-len(LM_SMALL) - 1].split("=")[1]]
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == sft_id
    assert set(run.data.metrics) >= LM_RL_METRICS
    assert 0.0 <= run.data.metrics["eval/accuracy"] <= 1.0 and run.data.metrics["train/kl_ref"] >= 0.0
    if algo == ["algo=ppo_lm"]:
        assert "train/value_loss" in run.data.metrics
    client = store.client()
    # a step is one sampled completion: 16 per update, evaluations at 32 and 64, and at 0 (the SFT model it starts from)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == [16, 32, 48, 64]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [0, 32, 64]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert "model/policy.pt" in artifacts


def test_control_only_grpo_options_are_one_line_errors_on_a_text_env(lm_sft_run: SFTRun):
    store, workdir, _ = lm_sft_run
    before = len(store.runs("addition"))
    proc = run_pgcli(
        ["train", "algo=grpo", "env=addition", "algo.advantage=process", f"tracking.uri={store.uri}", *LM_SMALL],
        cwd=workdir,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pgcli: error: algo.advantage=process needs per-step rewards of a control task; a text task scores a whole "
        "completion once: use algo.advantage=outcome"
    )
    assert len(store.runs("addition")) == before


RL_SMALL = ["algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8", "progress=false"]
"""A tiny GRPO update (16 completions); the task settings and model sizes come from the SFT run (init=)."""


def test_a_run_from_init_takes_its_task_settings_and_starts_with_its_evaluation(lm_sft_run: SFTRun):
    # the SFT run is 2-digit addition on a 1-layer d_model=32 model (LM_SMALL): none of that is typed here
    store, workdir, sft_id = lm_sft_run
    args = [
        "train",
        "algo=grpo",
        "env=addition",
        f"init={sft_id}",
        f"tracking.uri={store.uri}",
        "total_steps=32",
        "eval.every=0",
        "run_name=carried",
        *RL_SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (note,) = [line for line in proc.stderr.splitlines() if line.startswith("pgcli: note: init=")]
    for setting in (
        "env.n_digits=2",
        "env.n_eval=32",
        "env.eval_pass_k=2",
        "model.n_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
    ):
        assert setting in note, note
    (run,) = [r for r in store.runs("addition") if r.info.run_name == "carried"]
    assert run.info.status == "FINISHED"
    assert (run.data.params["env.n_digits"], run.data.params["model.d_model"]) == ("2", "32")
    # step 0: the SFT model as the run starts, scored on the same held-out set as the SFT run's last evaluation
    client = store.client()
    accuracy = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert [m.step for m in accuracy] == [0, 32]
    assert accuracy[0].value == client.get_run(sft_id).data.metrics["eval/accuracy"]
    assert "samples/step_0.json" in {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    # the learning curve shows what a text run has, against sampled completions
    run_dir = Path(run.data.tags["output_dir"])
    assert (run_dir / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    (curve,) = [line for line in (run_dir / "train.log").read_text().splitlines() if "learning_curve.png:" in line]
    assert curve.endswith(
        "learning_curve.png: x sampled completions; held-out accuracy [0, 1]: eval/accuracy, eval/pass_at_2; "
        "reward of sampled completions: rollout/reward_mean; KL to the reference: train/kl_ref"
    ), curve


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["env=addition", "env.n_digits=12"],
            "env=addition with env.n_digits=12 needs model.max_len >= 41; the "
            "weights of the init run have model.max_len=32",
        ),
        (
            ["env=addition", "model.d_model=64"],
            "the source has model.d_model=32, this run model.d_model=64; set model.d_model=32",
        ),
        (
            ["env=sort"],
            "the source was trained on env=addition, whose characters differ from env=sort's; SFT on env=sort first",
        ),
    ],
)
def test_a_setting_the_init_weights_cannot_take_is_one_line(lm_sft_run: SFTRun, overrides: list[str], message: str):
    store, workdir, sft_id = lm_sft_run
    before = len(store.runs("addition"))
    proc = run_pgcli(
        ["train", "algo=grpo", *overrides, f"init={sft_id}", f"tracking.uri={store.uri}", *RL_SMALL],
        cwd=workdir,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == f"pgcli: error: init={sft_id}: {message}"
    assert len(store.runs("addition")) == before and store.client().get_experiment_by_name("sort") is None
