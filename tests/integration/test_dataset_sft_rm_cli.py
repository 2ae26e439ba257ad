"""`pgcli sft env=dataset` and `pgcli rm env=dataset` on rows the tests write (jsonl, csv, parquet, a save_to_disk
directory), with TinyGPT and the tiny random Hugging Face model: FINISHED with their held-out metrics, a reward model
above chance on a learnable preference, kill -9 then resume reading the rows a straight run reads, and each bad input
one line (exit 2) before any MLflow run exists."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli, start_pgcli
from tests.integration.test_exact_resume import csv_history
from tests.integration.test_resume import wait_for_checkpoint

TINY = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.eval_size=32", "env.n_eval=32",
        "env.eval_samples=4", "algo.batch_size=32", "algo.warmup_steps=64", "algo.learning_rate=3e-3",
        "progress=false"]  # fmt: skip
"""A tiny TinyGPT, 32 held-out rows."""
HF = ["model=hf", "model.lora.r=4", "env.eval_size=8", "env.n_eval=8", "env.eval_samples=2", "algo.batch_size=8",
      "total_steps=32", "eval.every=16", "progress=false"]  # fmt: skip
"""The tiny random Llama with LoRA adapters, a few rows."""


def sums(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(50), rng.randrange(50)
        out.append((f"{a}+{b}=", str(a + b)))
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def prompt_completion_rows(n: int = 300) -> list[dict]:
    return [{"prompt": p, "completion": c} for p, c in sums(n)]


def message_rows(n: int = 300) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": p[:-1]}, {"role": "assistant", "content": c}]} for p, c in sums(n)
    ]


def final_metrics(store: Store, experiment: str = "dataset") -> tuple[str, dict[str, float]]:
    (run,) = store.runs(experiment)
    assert run.info.status == "FINISHED"
    return run.info.run_id, run.data.metrics


def test_sft_on_prompt_completion_rows_learns_and_records_its_vocabulary(
    tmp_path: Path, migrated_store: Store, workdir: Path
):
    data = write_jsonl(tmp_path / "sums.jsonl", prompt_completion_rows())
    store = migrated_store
    args = ["sft", "env=dataset", f"env.path={data}", f"tracking.uri={store.uri}", "total_steps=1024"]
    proc = run_pgcli([*args, "eval.every=512", *TINY], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "268 training rows (prompt + completion), 32 held out" in proc.stderr
    _, metrics = final_metrics(store)
    # 12 characters + PAD/BOS/EOS: uniform guessing costs ln(15) = 2.71 nats a token; the digits are learned
    assert metrics["eval/loss"] < 2.3 and metrics["eval/perplexity"] == pytest.approx(
        2.718281828 ** metrics["eval/loss"]
    )
    assert 0.0 <= metrics["eval/exact_match"] == metrics["eval/accuracy"] <= 1.0
    assert metrics["train/epoch"] == pytest.approx(1024 / 268)
    spec = json.loads(next((workdir / "outputs").rglob("model/agent.json")).read_text())
    assert spec["vocab"] == "+0123456789="  # the columns' characters, sorted


@pytest.mark.parametrize("fmt", ["parquet", "save_to_disk"])
def test_sft_on_message_rows_trains_the_assistant_turns(fmt: str, tmp_path: Path, migrated_store: Store, workdir: Path):
    import datasets

    rows = datasets.Dataset.from_list(message_rows())
    if fmt == "parquet":
        data = tmp_path / "chat.parquet"
        rows.to_parquet(str(data))
    else:
        data = tmp_path / "chat"
        rows.save_to_disk(str(data))
    store = migrated_store
    args = ["sft", "env=dataset", f"env.path={data}", f"tracking.uri={store.uri}", "total_steps=512"]
    proc = run_pgcli([*args, *TINY], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "conversations (assistant turns trained)" in proc.stderr
    _, metrics = final_metrics(store)
    assert metrics["eval/loss"] < 2.5  # ln(25 tokens) = 3.2 for a guess; the prompt's tokens are not counted
    samples = json.loads(next((workdir / "outputs").rglob("samples/step_512.json")).read_text())
    first = samples[0] if isinstance(samples, list) else samples["rows"][0]
    assert first["prompt"].startswith("user: ") and first["prompt"].endswith("assistant: ")


def test_sft_with_the_hf_model_on_csv_rows_and_on_conversations(
    tiny_hf_model: Path, tmp_path: Path, migrated_store: Store, workdir: Path
):
    import datasets

    csv = tmp_path / "sums.csv"
    datasets.Dataset.from_list(prompt_completion_rows(60)).to_csv(str(csv))
    chat = write_jsonl(tmp_path / "chat.jsonl", message_rows(60))
    store = migrated_store
    for data in (csv, chat):
        args = ["sft", "env=dataset", f"env.path={data}", f"model.path={tiny_hf_model}", f"tracking.uri={store.uri}"]
        proc = run_pgcli([*args, *HF], cwd=workdir)
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = store.runs("dataset")
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    for run in runs:
        assert {"eval/loss", "eval/exact_match", "train/loss"} <= set(run.data.metrics)


def marker_pairs(n: int, seed: int, *, equal: int = 0) -> list[dict]:
    """A learnable toy preference: the chosen answer ends in '+', the rejected one in '-'; ``equal`` rows carry none."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 5)))
        chosen, rejected = digits + "+", digits + "-"
        rows.append({"prompt": f"{digits}=", "chosen": chosen, "rejected": chosen if i < equal else rejected})
    return rows


def test_rm_on_preference_rows_ranks_held_out_pairs_above_chance(tmp_path: Path, migrated_store: Store, workdir: Path):
    train = write_jsonl(tmp_path / "pairs.jsonl", marker_pairs(300, 0, equal=12))
    held_out = write_jsonl(tmp_path / "held.jsonl", marker_pairs(64, 1))
    store = migrated_store
    args = ["rm", "env=dataset", f"env.path={train}", f"env.eval_path={held_out}", f"tracking.uri={store.uri}"]
    proc = run_pgcli([*args, "total_steps=512", "eval.every=256", *TINY], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "288 preference pairs (a shared prompt); 12 with chosen equal to rejected skipped, 64 held out" in proc.stderr
    )
    _, metrics = final_metrics(store)
    assert metrics["eval/pairwise_accuracy"] > 0.6 and metrics["eval/reward_margin"] > 0


def test_rm_with_the_hf_model_on_implicit_prompt_conversations(
    tiny_hf_model: Path, tmp_path: Path, migrated_store: Store, workdir: Path
):
    rows = [
        {
            "chosen": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["chosen"]}],
            "rejected": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["rejected"]}],
        }
        for r in marker_pairs(60, 0)
    ]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    store = migrated_store
    args = ["rm", "env=dataset", f"env.path={data}", f"model.path={tiny_hf_model}", f"tracking.uri={store.uri}"]
    proc = run_pgcli([*args, *HF], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "52 preference pairs (implicit prompts), 8 held out" in proc.stderr
    _, metrics = final_metrics(store)
    assert 0.0 <= metrics["eval/pairwise_accuracy"] <= 1.0 and "eval/reward_margin" in metrics


def test_sigkill_then_resume_of_sft_on_rows_reads_the_rows_a_straight_run_reads(tmp_path: Path, workdir: Path):
    data = write_jsonl(tmp_path / "sums.jsonl", prompt_completion_rows(200))
    common = ["train", "algo=sft", "env=dataset", f"env.path={data}", "tracking=off", "total_steps=4096",
              "checkpoint_every=512", "eval.every=1024", *TINY]  # fmt: skip
    straight, killed = workdir / "straight", workdir / "killed"
    done = run_pgcli([*common, f"hydra.run.dir={straight}"], cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    proc = start_pgcli([*common, f"hydra.run.dir={killed}"], cwd=workdir, stderr=workdir / "first.txt")
    try:
        wait_for_checkpoint(killed, proc, workdir / "first.txt")
        proc.kill()
        assert proc.wait(timeout=60) == -9, "pgcli finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
    state = json.loads(next(killed.glob("checkpoints/step_*/state.json")).read_text())
    assert state["row_order"]["epoch"] * 168 + state["row_order"]["position"] == state["steps"]
    resumed = run_pgcli(["train", f"resume={killed}"], cwd=workdir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    history = csv_history(killed)
    assert [row for row in history if row[0] == "train/epoch"] == [
        row for row in csv_history(straight) if row[0] == "train/epoch"
    ]
    assert history == csv_history(straight)  # the same rows in the same order: the same losses


def _bad(tmp_path: Path, case: str) -> tuple[Path, list[str]]:
    if case == "missing column":
        return write_jsonl(tmp_path / "d.jsonl", [{"question": "1+1", "answer": "2"}] * 40), ["sft"]
    if case == "missing chosen":
        return write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "good": "2", "rejected": "3"}] * 40), ["rm"]
    if case == "messages not a list":
        return write_jsonl(tmp_path / "d.jsonl", [{"messages": "user: hi"}] * 40), ["sft"]
    if case == "no assistant turn":
        return write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "1"}]}] * 40), ["sft"]
    if case == "too long":
        rows = [{"prompt": "1+1=", "completion": "2" * (60 if i % 4 == 0 else 2)} for i in range(40)]
        return write_jsonl(tmp_path / "d.jsonl", rows), ["sft"]
    assert case == "all equal"
    return write_jsonl(tmp_path / "d.jsonl", [{"chosen": "12", "rejected": "12"}] * 40), ["rm"]


BAD = {
    "missing column": "\\(env.completion_key=completion, .* has: question, answer",
    "missing chosen": "env.chosen_key=chosen: .* has no column 'chosen' \\(it has: prompt, good, rejected\\)",
    "messages not a list": "messages must be a non-empty list of \\{role, content\\} \\(got 'user: hi'\\)",
    "no assistant turn": "the conversation has no assistant turn to train on \\(roles: user\\)",
    "too long": "\\d+ of the 32 training rows .* longer than the model's context \\(model.max_len=32 tokens",
    "all equal": "every one of the 32 training rows .* has chosen equal to rejected",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_rows_are_one_line_before_any_run_exists(case: str, tmp_path: Path, workdir: Path):
    import re

    data, command = _bad(tmp_path, case)
    store = Store(tmp_path / "store")
    proc = run_pgcli(
        [*command, "env=dataset", f"env.path={data}", "env.eval_size=8", f"tracking.uri={store.uri}"], cwd=workdir
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(BAD[case], lines[0]), lines
    assert not (tmp_path / "store" / "mlflow.db").exists() or not store.runs("dataset")


def test_rows_from_init_read_in_the_init_models_characters(
    lm_sft_run, tmp_path: Path, migrated_store: Store, workdir: Path
):
    """`pgcli rm env=dataset init=<TinyGPT SFT run>` reads its rows in the source's token ids (the built-in addition
    model's twelve characters), and `pgcli sft` on rows holding another character is one line, no run."""
    run_dir = lm_sft_run.run_dir
    pairs = [{"prompt": p, "chosen": c, "rejected": str(int(c) + 1)} for p, c in sums(120)]
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    store = migrated_store
    small = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.eval_size=16", "env.n_eval=16"]
    args = ["rm", "env=dataset", f"env.path={data}", f"init={run_dir}", f"tracking.uri={store.uri}", *small]
    proc = run_pgcli([*args, "total_steps=64", "eval.every=64", "algo.batch_size=32", "progress=false"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final_metrics(store)
    spec = json.loads(next((workdir / "outputs").rglob("model/agent.json")).read_text())
    assert spec["vocab"] == "0123456789+="  # the init model's ids, not the rows' own vocabulary
    chat = write_jsonl(tmp_path / "chat.jsonl", message_rows(60))
    proc = run_pgcli(
        [
            "sft",
            "env=dataset",
            f"env.path={chat}",
            f"init={run_dir}",
            f"tracking.uri={store.uri}",
            *small,
            "progress=false",
        ],
        cwd=workdir,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "outside the vocabulary of the init model" in lines[0]
    assert len(store.runs("dataset")) == 1  # the refused run made none
