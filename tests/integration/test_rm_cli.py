"""``pgcli rm`` end to end (docs/lm.md, "Reward models: `pgcli rm`"): a real subprocess trains a reward model on
addition, with TinyGPT and with a Hugging Face model (``tiny_hf_model``), lands FINISHED with its held-out pairwise
accuracy and its model, resumes, and its MLflow Model scores (prompt, completion) pairs; bad options are one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, run_pgcli
from tests.integration.conftest import LM_SMALL, SFTRun, assert_rm_eval_repeats_the_run

TINY = ["total_steps=256", "eval.every=128", "checkpoint_every=128", "algo.batch_size=32", *LM_SMALL]
HF = ["model=hf", "model.lora.r=4", "total_steps=32", "eval.every=16", "checkpoint_every=16", "algo.batch_size=8",
      "env.n_digits=2", "env.n_eval=16", "env.eval_samples=4", "progress=false"]  # fmt: skip


class RMRun(NamedTuple):
    store: Store
    workdir: Path
    run_id: str


def _rm_run(root: Path, args: list[str]) -> RMRun:
    store, workdir = Store(root / "store"), root / "work"
    workdir.mkdir()
    proc = run_pgcli(["rm", "env=addition", f"tracking.uri={store.uri}", *args], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    return RMRun(store, workdir, run.info.run_id)


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> RMRun:
    """One `pgcli rm` run of a tiny TinyGPT reward model."""
    return _rm_run(tmp_path_factory.mktemp("rm"), TINY)


@pytest.fixture(scope="module")
def hf_rm(tmp_path_factory: pytest.TempPathFactory, tiny_hf_model: Path) -> RMRun:
    """One `pgcli rm` run of the random Llama with LoRA adapters and the scalar head."""
    return _rm_run(tmp_path_factory.mktemp("rm-hf"), [*HF, f"model.path={tiny_hf_model}"])


def _check_finished(rm: RMRun, eval_steps: list[int]) -> None:
    client = rm.store.client()
    run = client.get_run(rm.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "rm-addition-s0"
    assert run.data.params["algo"] == "rm" and run.data.tags["env"] == "addition"
    assert {"eval/pairwise_accuracy", "eval/reward_margin", "eval/loss", "train/loss"} <= set(run.data.metrics)
    assert 0.0 <= run.data.metrics["eval/pairwise_accuracy"] <= 1.0
    assert [m.step for m in client.get_metric_history(rm.run_id, "eval/pairwise_accuracy")] == eval_steps
    model_dir = Path(run.data.tags["output_dir"]) / "model"
    assert {"policy.pt", "reward_head.pt", "agent.json"} <= {p.name for p in model_dir.iterdir()}
    assert json.loads((model_dir / "agent.json").read_text())["algo"] == "rm"
    artifacts = {a.path for a in client.list_artifacts(rm.run_id, "model")}
    assert {"model/MLmodel", "model/reward_head.pt", "model/agent.json"} <= artifacts


def _check_scores(rm: RMRun) -> None:
    """The logged MLflow Model gives the rewards the run's last evaluation wrote in its samples table."""
    import mlflow.pyfunc
    import numpy as np
    import pandas as pd

    client = rm.store.client()
    last = max(m.step for m in client.get_metric_history(rm.run_id, "eval/pairwise_accuracy"))
    table = json.loads(
        Path(client.download_artifacts(rm.run_id, f"samples/step_{last}.json", str(rm.workdir))).read_text()
    )
    assert table and set(table[0]) >= {"prompt", "chosen", "rejected", "reward_chosen", "reward_rejected"}
    mlflow.set_tracking_uri(rm.store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{rm.run_id}/model")
    frame = pd.DataFrame({"prompt": [r["prompt"] for r in table], "completion": [r["chosen"] for r in table]})
    rewards = np.asarray(model.predict(frame))
    assert rewards.shape == (len(table),)
    assert np.allclose(rewards, [r["reward_chosen"] for r in table], atol=1e-4)
    pairs = [(r["prompt"], r["rejected"]) for r in table[:2]]
    assert np.allclose(model.predict(pairs), [r["reward_rejected"] for r in table[:2]], atol=1e-4)


def _check_resume(rm: RMRun, total: int, eval_steps: list[int]) -> None:
    args = ["train", f"resume={rm.run_id}", f"tracking.uri={rm.store.uri}", f"total_steps={total}"]
    proc = run_pgcli(args, cwd=rm.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = rm.store.client()
    trained = [r for r in rm.store.runs("addition") if "source_run_id" not in r.data.tags]  # not its evaluations
    assert client.get_run(rm.run_id).info.status == "FINISHED" and len(trained) == 1
    assert [m.step for m in client.get_metric_history(rm.run_id, "eval/pairwise_accuracy")] == eval_steps
    losses = [m.step for m in client.get_metric_history(rm.run_id, "train/loss")]
    batch = total // len(losses)
    assert losses == list(range(batch, total + 1, batch))  # every update once: none repeated, none missing


def test_rm_lands_a_finished_run_with_pairwise_accuracy_and_a_model(tiny_rm: RMRun):
    _check_finished(tiny_rm, [128, 256])


def test_the_rm_model_scores_prompt_completion_pairs(tiny_rm: RMRun):
    _check_scores(tiny_rm)


def test_pgcli_eval_of_the_rm_run_repeats_its_pairwise_evaluation(tiny_rm: RMRun):
    """A reward model is evaluated as its run evaluated it: held-out pairwise accuracy and margin, not as a policy."""
    proc = run_pgcli(["eval", tiny_rm.run_id, f"tracking.uri={tiny_rm.store.uri}"], cwd=tiny_rm.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pgcli: evaluating 32 held-out preference pairs of addition, final model..." in proc.stderr
    assert_rm_eval_repeats_the_run(proc.stdout, tiny_rm.store, "addition", tiny_rm.run_id)


def test_resume_continues_the_rm_run(tiny_rm: RMRun):
    """Last of the TinyGPT tests: it extends the shared run."""
    _check_resume(tiny_rm, 384, [128, 256, 384])
    _check_scores(tiny_rm)


def test_rm_with_a_hugging_face_model(hf_rm: RMRun):
    _check_finished(hf_rm, [16, 32])
    _check_scores(hf_rm)
    _check_resume(hf_rm, 48, [16, 32, 48])


def test_rm_on_the_init_policys_own_mistakes(tmp_path: Path, lm_sft_run: SFTRun):
    """algo.pairs=policy: the rejected completions are wrong samples of the SFT model (docs/lm.md, "Reward models")."""
    sft = lm_sft_run.store.client().get_run(lm_sft_run.run_id)
    args = [
        "algo.pairs=policy",
        f"init={sft.data.tags['output_dir']}",
        "total_steps=64",
        "eval.every=64",
        "algo.batch_size=32",
        *LM_SMALL,
    ]
    rm = _rm_run(tmp_path, args)
    run = rm.store.client().get_run(rm.run_id)
    assert run.info.status == "FINISHED" and run.data.params["algo.pairs"] == "policy"
    assert {"eval/pairwise_accuracy", "eval/policy_pair_fallback_frac", "train/policy_pair_fallback_frac"} <= set(
        run.data.metrics
    )
    assert 0.0 <= run.data.metrics["train/policy_pair_fallback_frac"] <= 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["env=cartpole", "algo.label_noise=0.1"], "algo=rm trains on text tasks only"),
        (["env=addition", "algo.label_noise=0.5"], "algo.label_noise must be in [0, 0.5) (got 0.5)"),
        (["algo=grpo"], "pgcli rm trains algo=rm; drop algo=grpo"),
        (["env=addition", "algo.pairs=policy"], "init must be an SFT run with algo.pairs=policy (got None)"),
    ],
)
def test_bad_rm_options_are_one_line_before_anything_is_created(workdir: Path, args: list[str], message: str):
    proc = run_pgcli(["rm", *args, "progress=false"], cwd=workdir, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"pgcli: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (workdir / "outputs").exists()
