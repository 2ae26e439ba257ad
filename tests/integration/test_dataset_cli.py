"""``env=dataset`` through the real CLI (docs/lm.md, "Your data"): GRPO with ``reward=math`` on word problems written
by the test, TinyGPT on their characters; the held-out rows never trained on; a user reward receiving the row's
columns; ``pgcli eval`` and the MLflow Model of a dataset run; the tiny random ``model=hf`` on message prompts; kill -9
then resume reading the same rows; a sweep and ``pgcli compare``; each bad input as one line and no MLflow run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pgcli.cli import main
from tests.conftest import Store, run_pgcli, start_pgcli, wait_until
from tests.integration.conftest import LM_SMALL, SFTRun

pytest.importorskip("datasets")

SMALL = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.eval_pass_k=2", "env.eval_samples=4",
         "progress=false", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8"]  # fmt: skip
"""A tiny TinyGPT and small GRPO batches (16 completions per update)."""
RECORDER = '''
import json, os

def record(prompt, completion, **columns):
    """Writes the row's id and the columns it was given, one line per completion scored."""
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps({"id": columns["id"], "columns": sorted(columns)}) + "\\n")
    return 0.0
'''
REWARD = "env.reward=[math,{_target_: rewardlog.record, weight: 0.0}]"
"""math, and the recorder beside it (weight 0: it observes the rows scored without changing the reward)."""


def word_problems(n: int) -> list[dict[str, Any]]:
    """Tiny one-step word problems in words TinyGPT can spell (its characters are the rows')."""
    names = ("Tom", "Ann", "Bob", "Eve", "Max")
    return [
        {
            "prompt": f"{names[i % 5]} has {i % 9 + 1} apples and buys {i // 9 + 1} more. How many?",
            "answer": str(i % 9 + 1 + i // 9 + 1),
            "id": i,
            "level": i % 3,
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class DatasetRun(NamedTuple):
    store: Store
    workdir: Path
    data: Path
    run_id: str
    log: Path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 word problems and the recording reward module (on PYTHONPATH for the runs)."""
    root = tmp_path_factory.mktemp("dataset-data")
    write_jsonl(root / "problems.jsonl", word_problems(150))
    (root / "rewardlog.py").write_text(RECORDER)
    return root


def pgcli_env(data: Path, log: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(data), "REWARD_LOG": str(log)}


def grpo_args(data: Path, store: Store, *extra: str, max_len: int = 64) -> list[str]:
    """GRPO with reward=math (and the recorder) on the word problems; ``max_len`` has room for them."""
    return [
        "train",
        "algo=grpo",
        "env=dataset",
        f"env.path={data / 'problems.jsonl'}",
        "env.eval_size=20",
        "env.n_eval=20",
        REWARD,
        f"tracking.uri={store.uri}",
        f"model.max_len={max_len}",
        *SMALL,
        *extra,
    ]


@pytest.fixture(scope="module")
def word_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> DatasetRun:
    """One GRPO run with reward=math on the word problems, its rewards recorded."""
    root = tmp_path_factory.mktemp("dataset-run")
    store, workdir, log = Store(root / "store"), root / "work", root / "rewards.jsonl"
    workdir.mkdir()
    args = grpo_args(data_dir, store, "total_steps=64", "eval.every=32", "run_name=words")
    proc = run_pgcli(args, cwd=workdir, timeout=300, **pgcli_env(data_dir, log))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("dataset")
    return DatasetRun(store, workdir, data_dir, run.info.run_id, log)


def test_grpo_with_math_lands_finished_with_accuracy_on_rows_it_never_trained_on(word_run: DatasetRun):
    from pgcli.config import DatasetEnvConfig
    from pgcli.lm.datasets import load_splits

    run = word_run.store.client().get_run(word_run.run_id)
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert {"eval/accuracy", "eval/pass_at_2", "rollout/reward/math", "rollout/reward/record"} <= set(metrics)
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0
    assert metrics["data/rows_seen"] == 16 and metrics["data/epoch"] == pytest.approx(16 / 130)  # 4 updates of 4 rows
    # every held-out row is scored (1 greedy + 2 sampled completions) at each evaluation and never in training
    env = DatasetEnvConfig(path=str(word_run.data / "problems.jsonl"), eval_size=20)
    held_out = set(load_splits(env).held_out["id"])
    n_evals = len(word_run.store.client().get_metric_history(word_run.run_id, "eval/accuracy"))
    counts = Counter(row["id"] for row in logged(word_run.log))
    assert n_evals >= 2 and {i: counts[i] for i in held_out} == {i: 3 * n_evals for i in held_out}
    trained = {i: n for i, n in counts.items() if i not in held_out}
    assert sum(trained.values()) == 64 and set(trained.values()) == {4}  # 16 rows, each with its 4 completions
    # the user's reward received every column of the row but the prompt
    assert {tuple(row["columns"]) for row in logged(word_run.log)} == {("answer", "id", "level")}


def test_pgcli_eval_and_the_mlflow_model_answer_a_dataset_run(word_run: DatasetRun):
    import mlflow.pyfunc

    store, run_id = word_run.store, word_run.run_id
    proc = run_pgcli(
        ["eval", run_id, f"tracking.uri={store.uri}"], cwd=word_run.workdir, **pgcli_env(word_run.data, word_run.log)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged_accuracy = store.client().get_run(run_id).data.metrics["eval/accuracy"]
    assert ["accuracy", f"{logged_accuracy:.3f}"] in [line.split()[:2] for line in proc.stdout.splitlines()]
    assert "20 held-out problems" in proc.stdout
    path = store.client().download_artifacts(run_id, "samples/step_64.json", str(word_run.workdir))
    table = json.loads(Path(path).read_text())
    assert {"prompt", "reference", "greedy", "correct"} <= set(table[0])
    mlflow.set_tracking_uri(store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    assert model.predict([row["prompt"] for row in table]) == [row["greedy"] for row in table]


def test_the_tiny_hf_model_trains_on_message_prompts(tiny_hf_model: Path, tmp_path: Path):
    import mlflow.pyfunc

    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
        for a in range(10)
        for b in range(0, 30, 3)
    ]
    data = write_jsonl(tmp_path / "sums.jsonl", rows)
    store, workdir = Store(tmp_path / "store"), tmp_path / "work"
    workdir.mkdir()
    args = ["train", "algo=grpo", "env=dataset", f"env.path={data}", "env.eval_size=10", "env.n_eval=10",
            "env.reward=exact", "model=hf", f"model.path={tiny_hf_model}", "total_steps=32", "eval.every=0",
            "env.eval_pass_k=2", "env.eval_samples=4", "progress=false", "algo.group_size=4", "algo.n_groups=4",
            "algo.batch_size=8", f"tracking.uri={store.uri}"]  # fmt: skip
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("dataset")
    assert run.info.status == "FINISHED" and "eval/accuracy" in run.data.metrics
    path = store.client().download_artifacts(run.info.run_id, "samples/step_32.json", str(workdir))
    table = json.loads(Path(path).read_text())
    # the prompt as the model read it: the chat template's turns (its leading BOS is the vocabulary's)
    assert all(row["prompt"].startswith("user: ") and row["prompt"].endswith("\n<s>assistant: ") for row in table)
    # the MLflow Model takes the prompts as the rows hold them, messages rendered as in training
    messages = [[{"role": "user", "content": row["prompt"].removeprefix("user: ").split("\n")[0]}] for row in table]
    mlflow.set_tracking_uri(store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    assert model.predict(messages) == [row["greedy"] for row in table]


def test_data_show_prints_the_rows_as_the_model_reads_them(data_dir: Path, workdir: Path):
    path = data_dir / "problems.jsonl"
    args = ["data", "show", "env=dataset", f"env.path={path}", "env.eval_size=20", "env.reward=math"]
    proc = run_pgcli([*args, "model.max_len=96", "env.system_prompt=Count."], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "rows: 130 to train on, 20 held out" in proc.stdout and "columns: prompt, answer, id, level" in proc.stdout
    assert proc.stdout.count("--- prompt ") == 2 and "system: Count.\nuser: " in proc.stdout
    assert "verifier on the reference answers of 20 held-out problems: 20 accepted (100.0%)" in proc.stdout


def test_from_an_sft_run_on_a_learned_reward(lm_sft_run: SFTRun, tmp_path: Path):
    """GRPO on addition rows from the session's addition SFT run (TinyGPT keeps its characters, in its order) with a
    reward model trained on addition as the reward; the verifier on the answer column stays the gold."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(0, 100, 7) for b in range(0, 100, 9)]
    data = write_jsonl(tmp_path / "sums.jsonl", rows)
    store, workdir = Store(tmp_path / "store"), tmp_path / "work"
    workdir.mkdir()
    rm = ["rm", "env=addition", f"tracking.uri={store.uri}", "total_steps=64", "eval.every=64", "algo.batch_size=32"]
    proc = run_pgcli([*rm, *LM_SMALL], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rm_run,) = store.runs("addition")
    sft = lm_sft_run.store.client().get_run(lm_sft_run.run_id)
    args = ["train", "algo=grpo", "env=dataset", f"env.path={data}", "env.eval_size=20", "env.n_eval=20",
            f"init={Path(sft.data.tags['output_dir'])}", f"env.reward=rm:{rm_run.info.run_id}", "total_steps=32",
            "eval.every=16", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8", "algo.beta=0.04",
            "env.eval_pass_k=2", "progress=false", f"tracking.uri={store.uri}"]  # fmt: skip
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("dataset")
    assert run.info.status == "FINISHED" and run.data.tags["reward_model_run_id"] == rm_run.info.run_id
    assert {"eval/accuracy", "eval/proxy_reward_mean", "rollout/reward/learned", "train/kl_ref"} <= set(
        run.data.metrics
    )
    history = store.client().get_metric_history(run.info.run_id, "eval/accuracy")
    assert [m.step for m in history] == [0, 16, 32]  # step 0: the SFT model it starts from
    agent = json.loads((Path(run.data.tags["output_dir"]) / "model" / "agent.json").read_text())
    assert agent["vocab"] == "0123456789+="  # the SFT model's characters in its order, not the rows' sorted ones


def test_kill_then_resume_reads_the_rows_a_straight_run_reads(data_dir: Path, tmp_path: Path, migrated_store: Store):
    store, workdir = migrated_store, tmp_path / "work"
    workdir.mkdir()
    common = ["total_steps=160", "checkpoint_every=32", "eval.every=0", "seed=3", "tracking.flush_every_s=0.1"]
    straight_log, killed_log, resumed_log = (tmp_path / f"{name}.jsonl" for name in ("straight", "killed", "resumed"))
    proc = run_pgcli(
        grpo_args(data_dir, store, *common, "run_name=straight"), cwd=workdir, **pgcli_env(data_dir, straight_log)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    run_dir = workdir / "killed"
    args = grpo_args(data_dir, store, *common, "run_name=killed", f"hydra.run.dir={run_dir}")
    proc_k = start_pgcli(args, cwd=workdir, stderr=workdir / "first.txt", **pgcli_env(data_dir, killed_log))
    try:
        found = lambda: list((run_dir / "checkpoints").glob("step_*/monitor.json"))  # noqa: E731
        wait_until(found, "a checkpoint", timeout=240, proc=proc_k, stderr=workdir / "first.txt", interval=0.05)
        proc_k.kill()
        assert proc_k.wait(timeout=60) == -9, "pgcli finished before it could be killed"
    finally:
        if proc_k.poll() is None:
            proc_k.kill()
    (killed,) = [r for r in store.runs("dataset") if r.info.run_name == "killed"]
    assert killed.info.status == "RUNNING"
    resumed = run_pgcli(
        ["train", f"resume={killed.info.run_id}", f"tracking.uri={store.uri}"],
        cwd=workdir,
        **pgcli_env(data_dir, resumed_log),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    runs = {r.info.run_name: r for r in store.runs("dataset")}
    assert runs["killed"].info.status == "FINISHED"
    at = int(runs["killed"].data.tags["resumed_from_step"])
    assert 0 < at < 160
    # the rows scored: the killed run's up to its checkpoint, then the resumed run's, are the straight run's
    ids = lambda path: [row["id"] for row in logged(path)]  # noqa: E731
    assert len(ids(killed_log)) >= at and ids(killed_log)[:at] + ids(resumed_log) == ids(straight_log)
    client = store.client()
    for key in ("data/rows_seen", "data/epoch"):
        histories = [[(m.step, m.value) for m in client.get_metric_history(runs[n].info.run_id, key)] for n in runs]
        assert histories[0] == histories[1] and len(histories[0]) == 10, key


def test_a_sweep_over_algorithms_and_seeds_then_compare(data_dir: Path, tmp_path: Path, migrated_store: Store):
    # RLOO (critic-free) and PPO with a value head on the rows, sharing the group settings that train.yaml's default
    # algorithm (PPO for control) lacks
    store, workdir = migrated_store, tmp_path / "work"
    workdir.mkdir()
    grpo = grpo_args(data_dir, store, "total_steps=32", "eval.every=0", "algo=rloo,ppo_lm", "seed=1,2")
    args = ["train", "-m", *(a for a in grpo[1:] if a != "algo=grpo")]
    proc = run_pgcli(args, cwd=workdir, timeout=400, **pgcli_env(data_dir, tmp_path / "log.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [r for r in store.runs("dataset") if "seed" in r.data.params]  # the jobs, not the sweep's parent run
    assert sorted((r.data.params["algo"], r.data.params["seed"]) for r in runs) == [
        ("ppo_lm", "1"),
        ("ppo_lm", "2"),
        ("rloo", "1"),
        ("rloo", "2"),
    ]
    assert all(r.info.status == "FINISHED" and "eval/accuracy" in r.data.metrics for r in runs)
    out = tmp_path / "report"
    compare = ["compare", "--experiment", "dataset", "--metric", "eval/accuracy", "--out", str(out)]
    proc = run_pgcli([*compare, f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for algo in ("rloo", "ppo_lm"):  # one group of the two seeds each
        rows = [line for line in proc.stdout.splitlines() if line.startswith(f"| {algo} | dataset |")]
        assert len(rows) == 1 and "| 2 |" in rows[0], proc.stdout


# --------------------------------------------------------------------------------------------------------------------
# bad input: one line, exit 2, nothing created
# --------------------------------------------------------------------------------------------------------------------


def bad_sources(root: Path) -> dict[str, list[str]]:
    """Each bad input of env=dataset as the overrides that make it (files written under ``root``)."""
    problems = write_jsonl(root / "problems.jsonl", word_problems(60))
    write_jsonl(root / "questions.jsonl", [{"question": r["prompt"], "id": r["id"]} for r in word_problems(60)])
    write_jsonl(root / "numbers.jsonl", [{"prompt": i, "answer": str(i)} for i in range(60)])
    (root / "empty.jsonl").write_text("")
    (root / "rows.txt").write_text("1+1=\n")
    (root / "header.csv").write_text("prompt,answer\n")
    long = [{**r, "prompt": r["prompt"] + " Count them all, one by one."} for r in word_problems(60)]
    write_jsonl(root / "long.jsonl", long[:50] + word_problems(60)[50:])
    return {
        "a missing file": [f"env.path={root / 'nowhere.jsonl'}"],
        "an unknown format": [f"env.path={root / 'rows.txt'}"],
        "an empty file": [f"env.path={root / 'empty.jsonl'}"],
        "an empty held-out set": [f"env.path={problems}", f"env.eval_path={root / 'header.csv'}"],
        "a missing prompt column": [f"env.path={root / 'questions.jsonl'}"],
        "a prompt that is not text": [f"env.path={root / 'numbers.jsonl'}"],
        "prompts longer than the context": [f"env.path={root / 'long.jsonl'}"],
        "math without an answer column": [f"env.path={root / 'questions.jsonl'}", "env.prompt_key=question"],
        "a multi-turn algorithm": [f"env.path={problems}", "algo=flow_grpo"],
    }


FRAGMENTS = {
    "a missing file": "nowhere.jsonl: no such file or directory",
    "an unknown format": "unknown format '.txt'",
    "an empty file": "the file is empty",
    "an empty held-out set": "header.csv: split 'train' has no rows",
    "a missing prompt column": "has no column 'prompt' (it has: question, id)",
    "a prompt that is not text": "train row",
    "prompts longer than the context": "50 of 60 rows have a prompt longer than model.max_len=64",
    "math without an answer column": "needs the answer column 'answer'",
    "a multi-turn algorithm": "algo=flow_grpo",
}


@pytest.mark.parametrize("case", list(FRAGMENTS))
def test_bad_input_is_one_line_exit_2_and_no_run(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    overrides = bad_sources(data)[case]
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code = main(
        ["train", "algo=grpo", "env=dataset", "env.eval_size=10", "env.reward=math", "model.max_len=64", *overrides]
    )
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.startswith("pgcli: error: ") and captured.err.count("\n") == 1, captured.err
    assert FRAGMENTS[case] in captured.err and "Traceback" not in captured.err + captured.out
    assert list(work.iterdir()) == []  # no outputs/, no store, no run directory


def test_a_bad_input_through_the_real_command_creates_no_mlflow_run(data_dir: Path, migrated_store: Store):
    proc = run_pgcli(
        grpo_args(data_dir, migrated_store, max_len=40),
        cwd=migrated_store.root,
        **pgcli_env(data_dir, migrated_store.root / "log.jsonl"),
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "150 of 150 rows have a prompt longer than model.max_len=40" in proc.stderr
    client = migrated_store.client()
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
