"""pgcli.lm.datasets: one rule for the characters of a dataset's text (TinyGPT's vocabulary is the same whichever
command reads the rows), and the rows read and scanned once per process (the checks before a run and the run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("datasets")

from pgcli.config import DatasetEnvConfig, LMModelConfig, RMConfig, SFTConfig
from pgcli.errors import ConfigError
from pgcli.lm import datasets as lm_datasets
from pgcli.lm.conversations import PLAIN_CHARS
from pgcli.lm.dataset_rows import PreferenceRows, supervised_rows
from pgcli.lm.dataset_task import DatasetTask
from pgcli.lm.datasets import load_splits, rows_of, text_chars
from pgcli.lm.load import make_text_task

MODEL = LMModelConfig(max_len=128)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sums(n: int) -> list[tuple[str, str]]:
    return [(f"{i}+{i % 7}=", str(i + i % 7)) for i in range(n)]


def vocabularies(env: DatasetEnvConfig) -> dict[str, str]:
    """TinyGPT's characters as each command builds them from ``env``'s rows."""
    task = make_text_task(env, MODEL)
    assert isinstance(task, DatasetTask) and task.chars is not None
    out = {"rl": task.chars, "sft": supervised_rows(env, MODEL, SFTConfig()).vocab.chars}
    if env.chosen_key in load_splits(env).columns:
        out["rm"] = supervised_rows(env, MODEL, RMConfig()).vocab.chars
    return out


def test_sft_rm_and_rl_read_prompt_completion_answer_rows_in_one_vocabulary(tmp_path: Path) -> None:
    rows = [
        {"prompt": p, "completion": f"{a}!", "answer": f"A{a}", "chosen": a, "rejected": f"{a}~"} for p, a in sums(30)
    ]
    rows[7]["answer"] = "€"  # only the answer column holds it: SFT's vocabulary has it too
    env = DatasetEnvConfig(path=str(write_jsonl(tmp_path / "rows.jsonl", rows)), eval_size=5, reward="exact")
    found = vocabularies(env)
    text = "".join(r["prompt"] + r["completion"] + r["answer"] + r["chosen"] + r["rejected"] for r in rows)
    assert found == {"rl": "".join(sorted(set(text))), "sft": found["rl"], "rm": found["rl"]}
    assert "€" in found["sft"] and ":" not in found["sft"]  # string rows, no system prompt: nothing rendered


def test_conversation_rows_read_in_one_vocabulary(tmp_path: Path) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": p}], "completion": a, "answer": a, "level": i % 3}
        for i, (p, a) in enumerate(sums(30))
    ]
    env = DatasetEnvConfig(path=str(write_jsonl(tmp_path / "chat.jsonl", rows)), eval_size=5, reward="exact")
    found = vocabularies(env)
    text = "".join(r["prompt"][0]["content"] + r["answer"] for r in rows)
    assert found == {"rl": "".join(sorted(set(text + PLAIN_CHARS))), "sft": found["rl"]}  # not the level column


def test_a_system_prompt_is_in_every_commands_vocabulary(tmp_path: Path) -> None:
    rows = [{"prompt": p, "completion": a, "answer": a} for p, a in sums(30)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    env = DatasetEnvConfig(path=str(path), eval_size=5, reward="exact", system_prompt="Add, quickly.")
    found = vocabularies(env)
    text = "".join(r["prompt"] + r["answer"] for r in rows) + "system" + "Add, quickly." + PLAIN_CHARS
    assert found == {"rl": "".join(sorted(set(text))), "sft": found["rl"]}


def test_a_character_outside_an_init_models_vocabulary_names_its_row(tmp_path: Path) -> None:
    rows = [{"prompt": p, "completion": a} for p, a in sums(30)]
    rows[12]["completion"] = "é"
    env = DatasetEnvConfig(path=str(write_jsonl(tmp_path / "rows.jsonl", rows)), eval_size=5)
    splits = load_splits(env)
    row = next(i for i, c in enumerate(splits.train["completion"]) if c == "é")
    with pytest.raises(ConfigError) as err:
        supervised_rows(env, MODEL, SFTConfig(), splits, recorded="+0123456789=")
    message = str(err.value)
    assert f"train row {row} has the character 'é', outside the vocabulary of the init model" in message
    assert "\n" not in message
    kept = supervised_rows(env, MODEL, SFTConfig(), splits, recorded="=+0123456789é")  # its order: its ids
    assert kept.vocab.chars == "=+0123456789é"


def test_rows_of_reads_once_and_a_scan_is_kept_with_those_rows(tmp_path: Path, monkeypatch) -> None:
    reads, scans = counting(monkeypatch)
    rows = [{"prompt": "a", "answer": "b"}] * 8
    env = DatasetEnvConfig(path=str(write_jsonl(tmp_path / "rows.jsonl", rows)), eval_size=2)
    splits = rows_of(env)
    assert rows_of(env) is splits and reads == [str(tmp_path / "rows.jsonl")]
    assert text_chars(env, splits) is text_chars(env, splits) and len(scans) == 1
    other = load_splits(env)  # rows read some other way: scanned on each call
    assert text_chars(env, other) == text_chars(env, splits) and len(scans) == 2
    assert rows_of(DatasetEnvConfig(path=env.path, eval_size=3)) is not splits  # another config: its own read
    write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "z", "answer": "yy"}] * 9)  # rewritten in this process
    again = rows_of(env)
    assert again is not splits and len(again.train) == 7 and text_chars(env, again).chars == "yz"


def counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """Record each source read (``read_rows``) and each character scan of the rows."""
    reads: list[str] = []
    scans: list[str] = []
    read_rows, scan_chars = lm_datasets.read_rows, lm_datasets._scan_chars

    def read(path: str, split: str, *, key: str) -> Any:
        reads.append(path)
        return read_rows(path, split, key=key)

    def scan(cfg: DatasetEnvConfig, splits: Any) -> Any:
        scans.append(cfg.path)
        return scan_chars(cfg, splits)

    monkeypatch.setattr(lm_datasets, "read_rows", read)
    monkeypatch.setattr(lm_datasets, "_scan_chars", scan)
    return reads, scans


@pytest.mark.parametrize("command", ["sft", "rm", "grpo"])
def test_the_checks_and_the_run_read_and_scan_the_rows_once(command: str, tmp_path: Path, monkeypatch) -> None:
    """What ``pgcli sft|rm|train env=dataset`` does in one process before it trains: the config and its checks
    (:func:`~pgcli.training.checks.train_config`), then the run's task and policy
    (:func:`~pgcli.training.text_parts.text_parts`): the file is read once, its characters scanned once."""
    import torch

    from pgcli.training.checks import train_config
    from pgcli.training.text_parts import text_parts

    rows = [{"prompt": p, "completion": a, "answer": a, "chosen": a, "rejected": f"{a}0"} for p, a in sums(40)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    reads, scans = counting(monkeypatch)
    distinct: list[int] = []
    original = PreferenceRows._distinct
    monkeypatch.setattr(PreferenceRows, "_distinct", lambda self, r: distinct.append(len(r)) or original(self, r))
    algo = {"sft": ["algo=sft"], "rm": ["algo=rm"], "grpo": ["algo=grpo", "env.reward=exact"]}[command]
    tiny = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.max_len=32", "tracking=off"]
    cfg = train_config([*algo, "env=dataset", f"env.path={path}", "env.eval_size=8", *tiny])
    parts = text_parts(cfg, torch.device("cpu"))
    assert reads == [str(path)] and scans == [str(path)]
    assert distinct == ([32, 8] if command == "rm" else [])  # the preference pairs: one pass over each split
    assert parts.vocab == "".join(sorted(set("".join(r["prompt"] + r["rejected"] for r in rows))))
