"""pgcli.lm.dataset_task: prompts rendered as the policy reads them, rows in a seeded resumable order, the held-out
rows never trained on, TinyGPT's characters from the rows, and each bad row as one line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("datasets")

from pgcli.algo.lm_rollout import load_task_state, task_state, task_stats
from pgcli.config import DatasetEnvConfig, HFModelConfig, LMModelConfig
from pgcli.errors import ConfigError, PgcliError
from pgcli.lm.dataset_task import DatasetTask, Recorded, recorded_fields, recorded_vocab, render_prompt
from pgcli.lm.load import make_text_task
from pgcli.lm.tasks import Problem

RNG = np.random.default_rng(0)  # the trainers' generator: a dataset task's order does not depend on it


def word_rows(n: int) -> list[dict[str, Any]]:
    """Word problems with unique prompts, their answers and two extra columns."""
    names = ("Tom", "Ann", "Bob", "Eve")
    return [
        {
            "prompt": f"{names[i % 4]} has {i} apples and buys {i % 7 + 1} more. How many?",
            "answer": str(i + i % 7 + 1),
            "id": i,
            "level": i % 3,
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dataset_task(path: Path, *, model: Any = None, seed: int = 0, **env: Any) -> DatasetTask:
    cfg = DatasetEnvConfig(path=str(path), **({"eval_size": 10, "n_eval": 10, "reward": "math"} | env))
    task = make_text_task(cfg, model or LMModelConfig(max_len=96), seed=seed)
    assert isinstance(task, DatasetTask)
    return task


# --------------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------------


def test_a_string_prompt_is_itself_and_messages_get_the_plain_rendering() -> None:
    assert render_prompt("12+34=") == "12+34="
    assert render_prompt("12+34=", system_prompt="Add.") == "system: Add.\nuser: 12+34=\nassistant: "
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "2+2="},
    ]
    assert render_prompt(messages) == "user: hi\nassistant: yo\nuser: 2+2=\nassistant: "


def test_the_chat_template_renders_messages_with_one_bos() -> None:
    pytest.importorskip("transformers")
    from pgcli.lm.hf import HFTokenizer
    from pgcli.lm.random_hf import build_tokenizer

    tokenizer: Any = build_tokenizer()
    vocab = HFTokenizer(tokenizer)
    text = render_prompt([{"role": "user", "content": "12+34="}], tokenizer=tokenizer)
    assert text == "user: 12+34=\n<s>assistant: "  # the template's leading <s> dropped: encode_prompt puts BOS first
    ids = vocab.encode_prompt(text)
    assert ids[0] == vocab.bos_id and ids[1] != vocab.bos_id
    # exactly what the tokenizer's own templating makes (model.chat_template=true on a built-in task)
    assert ids == HFTokenizer(tokenizer, chat_template=True).encode_prompt("12+34=")
    # a string prompt goes through the template only with model.chat_template=true
    assert render_prompt("12+34=", tokenizer=tokenizer) == "12+34="
    assert render_prompt("12+34=", tokenizer=tokenizer, chat_template=True) == text


@pytest.mark.parametrize("prompt", [7, [], [{"role": "user"}], [{"role": "user", "content": 3}], {"content": "x"}])
def test_a_prompt_that_is_neither_a_string_nor_messages_is_refused(prompt: Any) -> None:
    with pytest.raises(ValueError):
        render_prompt(prompt)


def test_a_bad_prompt_in_the_rows_is_one_line_naming_the_row(tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(40)]
    rows[23]["prompt"] = [{"role": "user"}]  # Arrow fills the missing content with None
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    held = write_jsonl(tmp_path / "held.jsonl", rows[:5])
    with pytest.raises(ConfigError) as err:
        dataset_task(path, eval_path=str(held), reward="exact")
    message = str(err.value)
    assert "\n" not in message and "train row 23" in message and "env.prompt_key=prompt" in message


# --------------------------------------------------------------------------------------------------------------------
# Rows: order, held-out set, resume
# --------------------------------------------------------------------------------------------------------------------


def test_training_never_draws_a_held_out_row_and_visits_each_row_once_an_epoch(tmp_path: Path) -> None:
    task = dataset_task(write_jsonl(tmp_path / "rows.jsonl", word_rows(50)))
    held_out = {p.columns["id"] for p in task.eval_problems()}
    assert len(held_out) == 10
    drawn = [p.columns["id"] for _ in range(40) for p in task.sample(RNG, 7)]  # 280 rows: 7 epochs of 40
    assert not held_out & set(drawn)
    assert Counter(drawn) == Counter({i: 7 for i in set(range(50)) - held_out})
    assert drawn[:40] != drawn[40:80]  # reshuffled each epoch
    assert task.data_stats() == {"data/epoch": 7.0, "data/rows_seen": 280.0}


def test_the_order_is_the_seeds_not_the_trainers_generator(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(50))
    first = [p.prompt for p in dataset_task(path, seed=3).sample(np.random.default_rng(1), 20)]
    again = [p.prompt for p in dataset_task(path, seed=3).sample(np.random.default_rng(2), 20)]
    other = [p.prompt for p in dataset_task(path, seed=4).sample(np.random.default_rng(1), 20)]
    assert first == again != other
    unshuffled = dataset_task(path, shuffle=False).sample(RNG, 5)
    train = dataset_task(path).splits
    assert train is not None and [p.prompt for p in unshuffled] == train.train["prompt"][:5]


def test_a_restored_task_continues_at_the_same_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(50))
    straight = dataset_task(path, seed=5)
    rows = [[p.columns["id"] for p in straight.sample(RNG, 6)] for _ in range(12)]  # past an epoch end
    first = dataset_task(path, seed=5)
    for _ in range(4):
        first.sample(RNG, 6)
    saved = json.loads(json.dumps(task_state(first)))  # as state.json holds it
    resumed = dataset_task(path, seed=5)
    load_task_state(resumed, saved)
    assert [[p.columns["id"] for p in resumed.sample(RNG, 6)] for _ in range(8)] == rows[4:]
    assert task_stats(resumed, {"rollout/accuracy": 0.5})["data/rows_seen"] == 72.0


def test_a_checkpoint_of_other_characters_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(50))
    state = task_state(dataset_task(path)) | {}
    state["task"] = {**state["task"], "vocab": "0123456789"}
    with pytest.raises(PgcliError, match="characters changed"):
        load_task_state(dataset_task(path), state)


def test_eval_problems_are_the_first_n_eval_held_out_rows(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(30))
    held = write_jsonl(tmp_path / "held.jsonl", word_rows(40)[30:])
    task = dataset_task(path, eval_path=str(held), n_eval=4)
    assert [p.columns["id"] for p in task.eval_problems()] == [30, 31, 32, 33]
    assert len(dataset_task(path, eval_path=str(held), n_eval=100).eval_problems()) == 10  # all there are


# --------------------------------------------------------------------------------------------------------------------
# Rewards and the verifier
# --------------------------------------------------------------------------------------------------------------------

SEEN: list[dict[str, Any]] = []


def level_reward(prompt: str, completion: str, **columns: Any) -> float:
    """A user reward: the row's level when the completion is its id (records what it was given)."""
    SEEN.append({"prompt": prompt, "completion": completion, **columns})
    return float(columns["level"]) if completion == str(columns["id"]) else 0.0


def test_a_user_reward_receives_the_rows_columns_and_the_verifier_judges_the_answer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(50))
    task = dataset_task(path, reward=["math", {"_target_": f"{__name__}.level_reward", "weight": 0.5}])
    problems = task.sample(RNG, 3)
    SEEN.clear()
    completions = [f"#### {problems[0].answer}", str(problems[1].columns["id"]), "no idea"]
    totals, parts = task.score(problems, completions)
    assert [row["id"] for row in SEEN] == [p.columns["id"] for p in problems]
    assert SEEN[0]["prompt"] == problems[0].prompt and set(SEEN[0]) == {"prompt", "completion", "answer", "id", "level"}
    expected_math = [1.0, float(problems[1].answer == str(problems[1].columns["id"])), 0.0]
    assert parts["math"] == expected_math
    assert parts["level_reward"] == [0.0, float(problems[1].columns["level"]), 0.0]
    assert totals == [m + 0.5 * lv for m, lv in zip(parts["math"], parts["level_reward"], strict=True)]
    assert task.has_checker and task.correct(problems[0], completions[0]) and not task.correct(problems[2], "no idea")


def test_without_an_answer_column_a_function_reward_has_no_accuracy(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "answer"} for r in word_rows(50)]
    task = dataset_task(write_jsonl(tmp_path / "rows.jsonl", rows), reward={"_target_": f"{__name__}.level_reward"})
    assert not task.has_checker
    problem = task.sample(RNG, 1)[0]
    assert not task.correct(problem, str(problem.columns["id"]))
    assert "rollout/accuracy" not in task_stats(task, {"rollout/accuracy": 0.0, "rollout/reward_mean": 1.0})


def test_math_without_the_answer_column_is_one_line(tmp_path: Path) -> None:
    rows = [{"question": r["prompt"], "id": r["id"]} for r in word_rows(50)]
    with pytest.raises(ConfigError, match="answer") as err:
        dataset_task(write_jsonl(tmp_path / "rows.jsonl", rows), prompt_key="question")
    assert "\n" not in str(err.value)


def test_a_learned_reward_adds_to_the_format_term_and_leaves_the_verifier(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", word_rows(50))
    task = dataset_task(path, reward="rm:some-run", format_pattern=r"\d+", format_reward=0.5)
    scored = task.with_learned_reward(lambda prompts, completions: [float(len(c)) for c in completions])
    problems = task.sample(RNG, 2)
    totals, parts = scored.score(problems, ["12", "abc"])
    assert parts == {"learned": [2.0, 3.0], "format": [1.0, 0.0]} and totals == [2.5, 3.0]
    assert task.learned_reward is None  # the task itself is unchanged
    assert scored.correct(problems[0], problems[0].answer)  # rm: keeps exact on the answer column as the checker


# --------------------------------------------------------------------------------------------------------------------
# TinyGPT's characters and the model's context
# --------------------------------------------------------------------------------------------------------------------


def test_tinygpts_characters_come_from_the_rows_and_are_recorded(tmp_path: Path) -> None:
    rows = word_rows(40)
    rows[3]["answer"] = "€"  # an answer's character belongs to the vocabulary too
    task = dataset_task(write_jsonl(tmp_path / "rows.jsonl", rows), reward="exact")
    text = "".join(r["prompt"] + r["answer"] for r in rows)
    assert task.chars == "".join(sorted(set(text)))
    assert task.vocab.size == len(task.chars) + 3
    assert recorded_vocab(task) == task.chars
    fields = recorded_fields(task)["dataset_task"]
    assert fields == {"max_prompt_len": task.max_prompt_len, "max_completion_len": task.max_completion_len}
    assert task.max_prompt_len == max(len(r["prompt"]) for r in rows) + 1  # BOS
    assert task.max_completion_len == max(len(r["answer"]) for r in rows) + 1  # EOS


def test_a_recorded_vocabulary_is_kept_and_a_character_outside_it_is_one_line(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(40)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    addition = "0123456789+="  # an addition run's characters, in its order
    task = dataset_task(path, model=LMModelConfig(), reward="exact")
    assert task.chars == "+0123456789="
    env = DatasetEnvConfig(path=str(path), eval_size=10)
    kept = make_text_task(env, LMModelConfig(), saved={"vocab": addition})
    assert isinstance(kept, DatasetTask) and kept.chars == addition
    assert kept.vocab.encode("12+") == [4, 5, 13]
    with pytest.raises(ConfigError) as err:
        make_text_task(env, LMModelConfig(), saved={"vocab": "0123456789"})
    assert "'+'" in str(err.value) and "model=hf" in str(err.value) and "\n" not in str(err.value)


def test_a_task_without_rows_renders_prompts_from_what_was_recorded(tmp_path: Path) -> None:
    env = DatasetEnvConfig(path=str(tmp_path / "gone.jsonl"), system_prompt="Add.")
    saved = {"vocab": "+0123456789=:\n adeimnrstuy.A", "dataset_task": {"max_prompt_len": 40, "max_completion_len": 5}}
    task = make_text_task(env, LMModelConfig(max_len=45), saved=saved, rows=False)
    assert isinstance(task, DatasetTask) and Recorded.of(saved).max_completion_len == 5
    assert task.render("1+2=") == "system: Add.\nuser: 1+2=\nassistant: " and task.max_completion_len == 5
    with pytest.raises(PgcliError):
        task.sample(RNG, 1)


def test_prompts_longer_than_the_context_are_counted_in_one_line(tmp_path: Path) -> None:
    rows = word_rows(40)
    for i in (5, 6, 30):
        rows[i]["prompt"] += " Think carefully about it, please, and then answer."
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ConfigError) as err:
        dataset_task(path, model=LMModelConfig(max_len=64), eval_size=5)
    message = str(err.value)
    longest = max(len(r["prompt"]) for r in rows) + 1
    assert "\n" not in message and "3 of 40 rows" in message and f"the longest is {longest} tokens" in message
    assert f"model.max_len={longest + 3} or more" in message  # + the longest answer (2 characters) and EOS
    dataset_task(path, model=LMModelConfig(max_len=longest + 3), eval_size=5)  # that fixes it


def test_a_hf_model_measures_prompts_in_its_tokens(tmp_path: Path, tiny_hf_model: Path) -> None:
    pytest.importorskip("transformers")
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(40)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    task = dataset_task(path, model=HFModelConfig(path=str(tiny_hf_model)), reward="exact")
    problem = task.eval_problems()[0]
    assert problem.prompt.startswith("user: ") and problem.prompt.endswith("<s>assistant: ")
    assert task.chars is None and recorded_vocab(task) == ""
    assert task.max_prompt_len == max(len(task.vocab.encode_prompt(task.render(r["prompt"]))) for r in rows)
    assert isinstance(problem, Problem) and task.demonstration(problem) == problem.answer
