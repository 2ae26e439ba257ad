"""Conversations rendered turn by turn with their assistant tokens marked (pgcli.lm.conversations), and rows read as
demonstrations and preference pairs (pgcli.lm.dataset_rows), against hand-built cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgcli.config import DatasetEnvConfig, LMModelConfig, RMConfig, SFTConfig
from pgcli.errors import ConfigError
from pgcli.lm.conversations import as_messages, render_conversation, with_system
from pgcli.lm.dataset_rows import DemoRows, Example, PreferenceRows, check_rows, rows_vocab
from pgcli.lm.datasets import load_splits
from pgcli.lm.tasks import CharVocab

TWO_TURNS = [
    {"role": "user", "content": "1+2"},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "4+5"},
    {"role": "assistant", "content": "9"},
]
VOCAB = CharVocab("0123456789+: \nabceinorstu")


def test_the_loss_mask_covers_exactly_the_assistant_tokens_of_a_two_turn_conversation():
    rendered = render_conversation(VOCAB, TWO_TURNS)
    bos, eos = VOCAB.bos_id, VOCAB.eos_id
    enc = VOCAB.encode
    # BOS, "user: 1+2\n", "assistant: ", "3" EOS, "user: 4+5\n", "assistant: ", "9" EOS
    expected = [bos, *enc("user: 1+2\n"), *enc("assistant: "), *enc("3"), eos]
    expected += [*enc("user: 4+5\n"), *enc("assistant: "), *enc("9"), eos]
    assert rendered.ids == expected
    trained = [
        VOCAB.decode([i]) if i != eos else "<eos>" for i, t in zip(rendered.ids, rendered.trained, strict=True) if t
    ]
    assert trained == ["3", "<eos>", "9", "<eos>"]
    assert rendered.ids[: rendered.last_start] == expected[: len(expected) - 2]  # the prompt of the last answer
    example = Example.of(rendered)
    assert example.ids[example.start] == enc("3")[0] and not any(example.trained[: example.start])
    assert example.ids[example.last_start : example.last_end] == [*enc("9"), eos]


def test_a_chat_template_is_rendered_prefix_by_prefix_and_only_the_answers_are_trained():
    from pgcli.lm.hf import HFTokenizer
    from pgcli.lm.random_hf import build_tokenizer

    vocab = HFTokenizer(build_tokenizer())
    rendered = render_conversation(vocab, TWO_TURNS)
    tokenizer = vocab.tokenizer
    whole = tokenizer.apply_chat_template(TWO_TURNS, tokenize=False)
    assert tokenizer.decode(rendered.ids) == whole  # the segments end to end are the template's text
    answers = [tokenizer.decode([i for i, t in zip(rendered.ids, rendered.trained, strict=True) if t])]
    assert answers == ["3\n9\n"]  # each answer with the template's end of turn, nothing of the user turns
    prompt = tokenizer.decode(rendered.ids[: rendered.last_start])
    assert prompt == tokenizer.apply_chat_template(TWO_TURNS[:3], tokenize=False, add_generation_prompt=True)


def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line():
    from pgcli.lm.hf import HFTokenizer
    from pgcli.lm.random_hf import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = (  # type: ignore[attr-defined]  # the last message only, as templates that drop turns
        "{{ messages[-1]['role'] }}: {{ messages[-1]['content'] }}\n"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ConfigError, match="prefix by prefix"):
        render_conversation(HFTokenizer(tokenizer), TWO_TURNS, where="row 0")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("hello", "non-empty list"),
        ([], "non-empty list"),
        ([{"role": "user"}], "message 0 is not"),
        ([{"role": "user", "content": 3}], "message 0 is not"),
        (["hi"], "message 0 is not"),
    ],
)
def test_messages_that_are_not_a_list_of_role_and_content_are_one_line(value, message):
    with pytest.raises(ConfigError, match=message) as info:
        as_messages(value, where="env.messages_key=messages, training row 3")
    assert "\n" not in str(info.value) and "training row 3" in str(info.value)


def test_a_conversation_without_an_assistant_turn_is_refused():
    with pytest.raises(ConfigError, match="no assistant turn"):
        render_conversation(VOCAB, [{"role": "user", "content": "1+2"}], where="row 0")


def test_a_system_prompt_leads_unless_the_conversation_has_one():
    assert with_system(TWO_TURNS, "be brief")[0] == {"role": "system", "content": "be brief"}
    own = [{"role": "system", "content": "x"}, *TWO_TURNS]
    assert with_system(own, "be brief") == own and with_system(TWO_TURNS, None) == TWO_TURNS


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _env(path: Path, **kw) -> DatasetEnvConfig:
    return DatasetEnvConfig(path=str(path), eval_size=2, **kw)


def test_string_rows_encode_as_the_built_in_demonstrations(tmp_path: Path):
    rows = [{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(10)]
    env = _env(_write(tmp_path / "d.jsonl", rows))
    splits = load_splits(env)
    vocab = rows_vocab(env, splits, LMModelConfig())
    assert isinstance(vocab, CharVocab)
    demos = DemoRows(env, vocab, splits)
    (example,) = demos.train_examples([0])
    row = splits.train[0]
    assert example.ids == [*vocab.encode_prompt(row["prompt"]), *vocab.encode(row["completion"]), vocab.eos_id]
    assert example.start == len(row["prompt"]) + 1 and all(example.trained[example.start :])
    assert vocab.chars == "+0123456789="  # the columns' characters: a string row has no role text


def test_rows_with_neither_completion_nor_messages_name_the_columns_there_are(tmp_path: Path):
    env = _env(_write(tmp_path / "d.jsonl", [{"question": "a", "answer": "b"}] * 6))
    splits = load_splits(env)
    with pytest.raises(ConfigError, match="has: question, answer"):
        DemoRows(env, CharVocab("ab"), splits)


def test_preference_rows_with_chosen_equal_to_rejected_are_counted_and_skipped(tmp_path: Path):
    rows = [{"chosen": f"{i}+", "rejected": f"{i}-" if i % 3 else f"{i}+"} for i in range(12)]
    env = _env(_write(tmp_path / "p.jsonl", rows), shuffle=False, eval_path=str(_write(tmp_path / "e.jsonl", rows)))
    splits = load_splits(env)
    pairs = PreferenceRows(env, rows_vocab(env, splits, LMModelConfig()), splits)
    assert (pairs.n_equal, pairs.n_train) == (4, 8)
    assert "4 with chosen equal to rejected skipped" in pairs.describe()
    (first,) = pairs.train_pairs([0])  # row 1: the first distinct one
    assert pairs.vocab.decode(first.chosen) == "1+" and pairs.vocab.decode(first.rejected) == "1-"


def test_all_equal_preference_rows_are_refused(tmp_path: Path):
    env = _env(_write(tmp_path / "p.jsonl", [{"chosen": "a", "rejected": "a"}] * 6))
    with pytest.raises(ConfigError, match="every one of the 4 training rows"):
        PreferenceRows(env, CharVocab("a"), load_splits(env))


def test_rows_longer_than_the_context_are_counted(tmp_path: Path):
    rows = [{"prompt": "1+1=", "completion": "2" * (3 if i % 2 else 40)} for i in range(10)]
    env = _env(_write(tmp_path / "d.jsonl", rows), eval_path=str(_write(tmp_path / "e.jsonl", rows[:2])))
    with pytest.raises(
        ConfigError, match=r"5 of the 10 training rows .* \(model.max_len=32 tokens; the longest has 46\)"
    ):
        check_rows(env, LMModelConfig(max_len=32), SFTConfig())


def test_generated_pair_kinds_are_refused_on_rows(tmp_path: Path):
    env = _env(_write(tmp_path / "p.jsonl", [{"chosen": "a", "rejected": "b"}] * 6))
    with pytest.raises(ConfigError, match=r"algo\.pairs=partial"):
        check_rows(env, LMModelConfig(), RMConfig(pairs="partial"))


def test_a_system_prompt_makes_a_string_row_a_conversation_and_numbers_read_as_text(tmp_path: Path):
    rows = [{"prompt": f"{i}+1", "completion": i + 1} for i in range(10)]  # a csv column of numbers reads as ints
    env = _env(_write(tmp_path / "d.jsonl", rows), system_prompt="add")
    splits = load_splits(env)
    vocab = rows_vocab(env, splits, LMModelConfig())
    assert isinstance(vocab, CharVocab) and set(": \nassistantuserystem") <= set(vocab.chars)  # a conversation
    (example,) = DemoRows(env, vocab, splits).train_examples([0])
    row = splits.train[0]
    turns = [
        {"role": "system", "content": "add"},
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": str(row["completion"])},
    ]
    assert example.ids == render_conversation(vocab, turns).ids
    assert vocab.decode(example.ids[: example.start]) == f"system: add\nuser: {row['prompt']}\nassistant: "
