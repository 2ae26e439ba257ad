"""pgcli.lm.datasets: every source format, the held-out split, the row order and each bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from pgcli.config import DatasetEnvConfig
from pgcli.errors import ConfigError
from pgcli.lm.datasets import RowOrder, load_splits, require_columns

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(40)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """The same 40 rows as jsonl, json, csv, parquet and a save_to_disk directory."""
    import datasets
    import pandas as pd

    frame = pd.DataFrame(ROWS)
    out = {"jsonl": _jsonl(tmp_path / "rows.jsonl", ROWS)}
    out["json"] = tmp_path / "rows.json"
    out["json"].write_text(json.dumps(ROWS))
    out["csv"] = tmp_path / "rows.csv"
    frame.to_csv(out["csv"], index=False)
    out["parquet"] = tmp_path / "rows.parquet"
    frame.to_parquet(out["parquet"])
    out["saved"] = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(out["saved"]))
    return out


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "saved"])
def test_every_format_gives_the_same_rows_and_a_disjoint_held_out_set(sources: dict[str, Path], kind: str) -> None:
    splits = load_splits(DatasetEnvConfig(path=str(sources[kind]), eval_size=8, eval_seed=3))
    assert len(splits.train) == 32 and len(splits.held_out) == 8
    assert set(splits.columns) == {"prompt", "answer", "level"}
    train, held = set(splits.train["prompt"]), set(splits.held_out["prompt"])
    assert not train & held and len(train | held) == 40
    again = load_splits(DatasetEnvConfig(path=str(sources["jsonl"]), eval_size=8, eval_seed=3))
    assert set(again.held_out["prompt"]) == held  # the same held-out rows whatever the format


def test_held_out_rows_from_a_second_file_or_a_split(tmp_path: Path) -> None:
    import datasets

    train = _jsonl(tmp_path / "train.jsonl", ROWS[:30])
    test = _jsonl(tmp_path / "test.jsonl", ROWS[30:])
    splits = load_splits(DatasetEnvConfig(path=str(train), eval_path=str(test)))
    assert (len(splits.train), len(splits.held_out)) == (30, 10)
    whole = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": whole.select(range(30)), "test": whole.select(range(30, 40))}).save_to_disk(
        str(tmp_path / "dict")
    )
    splits = load_splits(DatasetEnvConfig(path=str(tmp_path / "dict"), eval_split="test"))
    assert splits.held_out["prompt"] == [r["prompt"] for r in ROWS[30:]]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: DatasetEnvConfig(path=str(d / "missing.jsonl")), "no such file or directory"),
        (lambda d: DatasetEnvConfig(path=str(_write(d / "rows.txt", "x"))), "unknown format '.txt'"),
        (lambda d: DatasetEnvConfig(path=str(_write(d / "empty.jsonl", ""))), "the file is empty"),
        (lambda d: DatasetEnvConfig(path=str(_write(d / "broken.jsonl", "{not json\n"))), "cannot read it as json"),
        (lambda d: DatasetEnvConfig(path=str(_jsonl(d / "r.jsonl", ROWS)), eval_size=30), "env.eval_size must be <="),
        (lambda d: DatasetEnvConfig(path=str(_jsonl(d / "r.jsonl", ROWS)), split="test"), "one split, 'train'"),
        (lambda d: DatasetEnvConfig(path=str(d)), "save_to_disk"),
        (lambda d: DatasetEnvConfig(path="nobody/no-such-dataset"), "not a hub dataset in the local cache"),
    ],
)
def test_bad_sources_are_one_line(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_splits(make(tmp_path))
    assert message in str(err.value) and "\n" not in str(err.value)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_missing_column_names_the_columns_there_are(sources: dict[str, Path]) -> None:
    splits = load_splits(DatasetEnvConfig(path=str(sources["jsonl"]), eval_size=4))
    with pytest.raises(ConfigError, match=r"no column 'question' \(it has: prompt, answer, level\)"):
        require_columns(splits.train, [("env.prompt_key", "question")], source="rows.jsonl")


def test_row_order_visits_each_row_once_per_epoch_and_resumes_exactly() -> None:
    order = RowOrder(10, seed=7)
    first = order.take(6) + order.take(4)
    assert sorted(first) == list(range(10)) and order.epoch == 0
    second = order.take(10)
    assert sorted(second) == list(range(10)) and second != first  # reshuffled
    straight = RowOrder(10, seed=7)
    expected = straight.take(27)
    resumed = RowOrder(10, seed=7)
    head = resumed.take(13)
    restored = RowOrder(10, seed=7)
    restored.load_state_dict(resumed.state_dict())
    assert head + restored.take(14) == expected and restored.rows_seen == 27
    assert RowOrder(5, seed=1, shuffle=False).take(7) == [0, 1, 2, 3, 4, 0, 1]
