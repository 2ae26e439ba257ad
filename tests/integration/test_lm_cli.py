"""Text tasks end to end (docs/lm.md): a real `pgcli sft` subprocess, then text runs started from it with
`init=<run>`, all landing in a temporary MLflow store that is queried back."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli

SMALL = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.n_digits=2", "env.n_eval=32",
         "env.eval_pass_k=2", "env.eval_samples=4", "progress=false"]  # fmt: skip


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Path, str]:
    """One real `pgcli sft` run: (store, working directory, MLflow run id)."""
    root = tmp_path_factory.mktemp("lm")
    store, workdir = Store(root / "store"), root / "work"
    workdir.mkdir()
    args = [
        "sft",
        "env=addition",
        f"tracking.uri={store.uri}",
        "total_steps=1024",
        "eval.every=512",
        "algo.batch_size=32",
        "algo.warmup_steps=256",
        "checkpoint_every=512",
        *SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    return store, workdir, run.info.run_id


def test_sft_lands_a_finished_run_with_accuracy_weights_and_samples(sft):
    store, workdir, run_id = sft
    client = store.client()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algo"] == "sft" and run.data.params["env.n_digits"] == "2"
    assert run.data.tags["env"] == "addition" and run.info.run_name == "sft-addition-s0"
    assert {"eval/accuracy", "eval/pass_at_2", "eval/reward_mean", "eval/completion_len", "train/loss"} <= set(
        run.data.metrics
    )
    assert 0.0 <= run.data.metrics["eval/accuracy"] <= 1.0
    steps = [m.step for m in client.get_metric_history(run_id, "eval/accuracy")]
    assert steps == [512, 1024]  # one evaluation per eval.every demonstrations
    loss = [m.value for m in client.get_metric_history(run_id, "train/loss")]
    assert len(loss) == 1024 // 32 and loss[-1] < loss[0]
    artifacts = {a.path for a in client.list_artifacts(run_id, "model")}
    assert {"model/policy.pt", "model/agent.json"} <= artifacts
    samples = {a.path for a in client.list_artifacts(run_id, "samples")}
    assert samples == {"samples/step_512.json", "samples/step_1024.json"}
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_1024.json", str(workdir))).read_text())
    assert len(table) == 4 and set(table[0]) >= {"prompt", "reference", "greedy", "correct", "sampled"}
    assert all(row["prompt"].endswith("=") and len(row["sampled"]) == 2 for row in table)


def test_the_logged_model_completes_prompts_as_the_run_did(sft):
    # runs:/<id>/model is an MLflow Model (pgcli.pyfunc): prompts in, greedy completions out, the same ones the run's
    # final evaluation logged in its samples table
    import mlflow.pyfunc
    import pandas as pd

    store, workdir, run_id = sft
    client = store.client()
    assert "model/MLmodel" in {a.path for a in client.list_artifacts(run_id, "model")}
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_1024.json", str(workdir))).read_text())
    prompts, greedy = [row["prompt"] for row in table], [row["greedy"] for row in table]
    mlflow.set_tracking_uri(store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    assert model.predict(prompts) == greedy
    assert model.predict(pd.DataFrame({"prompt": prompts[:2]})) == greedy[:2]
    assert model.predict(prompts[0]) == greedy[:1]
    with pytest.raises(ValueError, match="character 'x' is not in the vocabulary"):
        model.predict(["1x+2="])
    longer = r"prompt '1234\+5678=' is longer than env=addition's \(6 characters at most\)"
    with pytest.warns(UserWarning, match=longer):
        model.predict(["1234+5678="])  # a 4-digit sum asked of the 2-digit model: answered, with a warning


def test_a_text_run_starts_from_the_sft_run_by_id(sft):
    store, workdir, run_id = sft
    args = [
        "train",
        "algo=sft",
        "env=addition",
        f"init={run_id}",
        f"tracking.uri={store.uri}",
        "total_steps=64",
        "eval.every=0",
        "algo.batch_size=32",
        "algo.learning_rate=1e-6",
        *SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [r for r in store.runs("addition") if r.info.run_id != run_id]
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == run_id
    source = store.client().get_run(run_id).data.metrics["eval/accuracy"]
    # two steps at a learning rate of 1e-6: the greedy answers are the SFT model's
    assert run.data.metrics["eval/accuracy"] == pytest.approx(source, abs=1 / 32)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("init=/no/such/run", "pgcli: error: init=/no/such/run: no such run directory (and not an MLflow run id)"),
        (f"init={'c' * 32}", f"pgcli: error: init={'c' * 32}: no run with this id in sqlite:///"),
    ],
)
def test_a_bad_init_is_one_line_before_anything_runs(sft, override: str, message: str):
    store, workdir, _ = sft
    before = len(store.runs("addition"))
    proc = run_pgcli(
        ["train", "algo=sft", "env=addition", override, f"tracking.uri={store.uri}", *SMALL], cwd=workdir, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message)
    assert len(store.runs("addition")) == before


def test_an_init_of_other_sizes_is_refused(sft):
    store, workdir, run_id = sft
    args = [
        "train",
        "algo=sft",
        "env=addition",
        f"init={run_id}",
        f"tracking.uri={store.uri}",
        *SMALL,
        "model.d_model=64",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=120)
    assert proc.returncode == 2
    assert f"init={run_id}: the source has model.d_model=32, this run model.d_model=64" in proc.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("pgcli.algo.lm_grpo") is None,
    reason="the GRPO text trainer (branch lmrl) is not merged here",
)
def test_grpo_from_the_sft_run_lands_a_finished_run_with_accuracy(sft):
    store, workdir, run_id = sft
    args = [
        "train",
        "algo=grpo",
        "env=addition",
        f"init={run_id}",
        f"tracking.uri={store.uri}",
        "total_steps=64",
        "eval.every=0",
        "algo.group_size=4",
        "algo.n_groups=4",
        "algo.batch_size=8",
        "algo.beta=0.04",
        *SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in store.runs("addition") if r.data.params.get("algo") == "grpo"]
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == run_id
    assert "eval/accuracy" in run.data.metrics and "eval/pass_at_2" in run.data.metrics


def test_pgcli_eval_of_the_sft_run_repeats_its_last_evaluation(sft):
    store, workdir, run_id = sft
    proc = run_pgcli(["eval", run_id, f"tracking.uri={store.uri}"], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = store.client().get_run(run_id)
    (evaluation,) = [r for r in store.runs("addition") if r.data.tags.get("source_run_id") == run_id]
    assert evaluation.info.status == "FINISHED" and evaluation.info.run_name == "eval-sft-addition-s0"
    for key in ("eval/accuracy", "eval/pass_at_2", "eval/reward_mean", "eval/completion_len"):
        assert evaluation.data.metrics[key] == source.data.metrics[key], key  # same problems, same sampling seed
    assert "pgcli: evaluating 32 held-out problems of addition, final model..." in proc.stderr
    lines = proc.stdout.splitlines()
    accuracy = f"{source.data.metrics['eval/accuracy']:.3f}"
    assert any(line.split() == ["accuracy", accuracy, "(logged", f"{accuracy})"] for line in lines), proc.stdout
    tables = {a.path for a in store.client().list_artifacts(evaluation.info.run_id, "samples")}
    assert tables == {"samples/eval.json"}
    # the first rows of the samples table, and where the whole table is
    start = lines.index("  samples (4 of 4 in the table):")
    assert lines[start + 1].split() == ["prompt", "reference", "greedy", "answer", "correct"]
    table = json.loads(Path(lines[-2].split()[2]).read_text())  # "  samples table  <path> (artifact ...)"
    assert lines[-2].split()[:2] == ["samples", "table"] and lines[-2].endswith("(artifact samples/eval.json)")
    for row, line in zip(table, lines[start + 2 : start + 6], strict=True):
        assert line.split() == [repr(row["prompt"]), repr(row["reference"]), repr(row["greedy"]), str(row["correct"])]
    artifact = store.client().download_artifacts(evaluation.info.run_id, "samples/eval.json", str(workdir))
    assert json.loads(Path(artifact).read_text()) == table


def test_pgcli_eval_video_of_a_text_run_says_where_the_table_went(sft, tmp_path: Path):
    store, workdir, run_id = sft
    out = tmp_path / "eval-out"
    proc = run_pgcli(
        ["eval", run_id, "--video", "--no-log", "--out", str(out), f"tracking.uri={store.uri}"],
        cwd=workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pgcli: note: --video: a text task has no frames; the samples table is written instead" in proc.stderr
    assert f"  samples table       {out / 'eval.json'}" in proc.stdout.splitlines()
    assert len(json.loads((out / "eval.json").read_text())) == 4


def test_the_sft_summary_names_accuracy_on_held_out_problems(sft):
    store, _, run_id = sft
    log = (Path(store.client().get_run(run_id).data.tags["output_dir"]) / "train.log").read_text()
    assert "eval at step 512 on 32 held-out problems: return " in log and "over 32 episodes" not in log
    assert "final eval return" not in log  # an accuracy, not an episode return
    assert "final evaluation   32 held-out problems" in log


def test_resume_continues_the_sft_run(sft):
    """Last in this module: it extends the shared SFT run."""
    store, workdir, run_id = sft
    args = ["train", f"resume={run_id}", f"tracking.uri={store.uri}", "total_steps=1536"]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = store.client()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "eval/accuracy")] == [512, 1024, 1536]
    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == list(range(32, 1537, 32))  # every update once: none repeated, none missing
