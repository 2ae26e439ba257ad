"""The verifiers and reward sets of pgcli.lm.verifiers against hand-written cases, the numeric fallback with
math-verify switched off, and the per-term reward metrics of a sampled batch."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.lm_rollout import rollout_stats, sample_completions
from pgcli.errors import ConfigError, PgcliError
from pgcli.lm import verifiers
from pgcli.lm.model import TinyGPT, TinyGPTSizes
from pgcli.lm.tasks import Addition, Problem, Task
from pgcli.lm.verifiers import (
    VERIFIERS,
    build_rewards,
    extract_answer,
    format_ok,
    to_number,
    verify_choice,
    verify_exact,
    verify_math,
)

# --------------------------------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 1,234", "1,234"),
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{{nested}}", "{nested}"),
        (r"\boxed{a{b}c} and \boxed{3}", "3"),  # the last box
        (r"\boxed{7} then \boxed{unclosed", "7"),  # a box that never closes is skipped
        (r"\boxed{5}, but #### 6", "5"),  # \boxed first
        ("#### 6\n<answer>7</answer>", "6"),  # then #### (to the end of its line)
        ("<answer> 7 </answer> the answer is 8", "7"),  # then <answer>
        ("The answer is 42. Next, 9", "42"),  # then "answer is", to the end of its sentence
        ("Answer: B", "B"),
        ("the answer is (b)", "(b)"),
        ("The answer isn't clear: 5 or 3.5", "3.5"),  # "isn't" is no marker: the last number
        ("x = -3.5 and 1/2 of it", "1/2"),
        ("from 3-5", "5"),  # a hyphen after a digit is no minus sign
        ("it is -12", "-12"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# --------------------------------------------------------------------------------------------------------------------
# exact
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("  Paris  ", "paris", True),
        ('"Paris".', "Paris", True),
        ("New   York\n", "new york", True),
        ("I think the answer is Paris.", "Paris", True),  # the extracted answer
        ("#### 42", "42", True),
        ("Lyon", "Paris", False),
        ("Parisian", "Paris", False),
        ("#### 1,234", "1234", False),  # exact is a string match: math compares numbers
    ],
)
def test_verify_exact(completion, answer, expected):
    assert verify_exact(completion, answer) is expected


# --------------------------------------------------------------------------------------------------------------------
# math, with math-verify and with the numeric fallback
# --------------------------------------------------------------------------------------------------------------------

MATH_CASES = [
    ("#### 1,234", "1234", True),
    ("The total is 1234.\n#### 1,234", "#### 1234", True),
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"\frac{1}{2}", "1/2", True),
    ("It costs 42 dollars", "42", True),
    ("The answer is 42 dollars.", "42", True),
    ("The answer is $42", "42", True),
    ("42", "$42", True),
    ("42%", "42", True),
    ("Step 1: 3 + 4 = 7\n#### 7", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 7", True),
    ("-3.0", "-3", True),
    ("The answer is 41", "42", False),
    (r"\boxed{\frac{1}{3}}", "0.5", False),
    ("#### 1,235", "1234", False),
    ("no idea", "42", False),
]


@pytest.mark.parametrize(("completion", "answer", "expected"), MATH_CASES)
def test_verify_math_with_math_verify(completion, answer, expected):
    pytest.importorskip("math_verify")
    assert verify_math(completion, answer) is expected


@pytest.mark.parametrize(("completion", "answer", "expected"), MATH_CASES)
def test_numeric_fallback_gives_the_same_verdicts(monkeypatch, completion, answer, expected):
    monkeypatch.setattr(verifiers, "USE_MATH_VERIFY", False)
    assert verify_math(completion, answer) is expected


def test_fallback_when_math_verify_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` raises ImportError
    assert verifiers._math_verify() is None
    assert verify_math("#### 1,234", "1234") and not verify_math("#### 1,235", "1234")


def test_math_verify_catches_what_numbers_cannot():
    pytest.importorskip("math_verify")
    assert verify_math(r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}")
    assert not verify_math(r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{1}{\sqrt{2}}")


def test_math_verify_works_off_the_main_thread():
    pytest.importorskip("math_verify")
    verdicts: list[bool] = []
    thread = threading.Thread(
        target=lambda: verdicts.extend(
            [verify_math(r"\boxed{\frac{1}{2}}", "0.5"), verify_math(r"\boxed{\frac{1}{3}}", "0.5")]
        )
    )
    thread.start()
    thread.join()
    assert verdicts == [True, False]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", 1234.0),
        ("$1,234.50", 1234.5),
        ("-3.5", -3.5),
        ("1/2", 0.5),
        (r"\frac{3}{4}", 0.75),
        ("42 dollars", 42.0),
        ("42%", 42.0),
        (r"\$7", 7.0),
        ("seven", None),
        ("1/0", None),
        ("", None),
    ],
)
def test_to_number(text, value):
    assert to_number(text) == value


# --------------------------------------------------------------------------------------------------------------------
# choice
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion",
    ["B", "(B)", "B.", "b", "B) Paris", "Answer: B", "the answer is (b)", r"\boxed{B}", "<answer>B</answer>", "**B**"],
)
@pytest.mark.parametrize("answer", ["B", "(B)", " b "])
def test_verify_choice_accepts_the_letter_in_its_usual_forms(completion, answer):
    assert verify_choice(completion, answer)


@pytest.mark.parametrize(
    "completion", ["A", "(c)", "Answer: C", "I think so", "Because B is wrong, A", "the answer is (a)", ""]
)
def test_verify_choice_rejects_other_letters_and_prose(completion):
    assert not verify_choice(completion, "B")


def test_verify_choice_needs_a_letter_as_answer():
    assert not verify_choice("B", "Paris")


def test_format_ok_matches_the_whole_stripped_completion_across_lines():
    pattern = r"<think>.*?</think>\s*<answer>.*?</answer>"
    assert format_ok(pattern, "  <think>a\nb</think>\n<answer>4</answer>\n")
    assert not format_ok(pattern, "<think>a</think><answer>4</answer> trailing")
    assert not format_ok(pattern, "<answer>4</answer>")


# --------------------------------------------------------------------------------------------------------------------
# build_rewards and RewardSet
# --------------------------------------------------------------------------------------------------------------------

COLUMNS = ("prompt", "answer", "difficulty")


def test_a_builtin_name_is_one_term_and_the_checker():
    rewards = build_rewards("math", answer_key="answer", columns=COLUMNS)
    assert rewards.names == ["math"] and rewards.checker is VERIFIERS["math"]
    totals, parts = rewards.score(["q1", "q2"], ["#### 1,234", "#### 7"], [{"answer": "1234"}, {"answer": 8}])
    assert totals == [1.0, 0.0] and parts == {"math": [1.0, 0.0]}
    assert rewards.correct("#### 1,234", {"answer": "1234"}) and not rewards.correct("#### 7", {"answer": 8})


def test_a_verifier_reads_its_answer_column_even_when_it_is_named_completion():
    rewards = build_rewards("exact", answer_key="completion", columns=("prompt", "completion"))
    assert rewards.score(["q", "q"], ["Paris", "Lyon"], [{"completion": "paris"}] * 2) == (
        [1.0, 0.0],
        {"exact": [1.0, 0.0]},
    )
    assert rewards.correct("Paris.", {"completion": "paris"})


def test_an_empty_reward_is_exact_on_the_answer_column():
    rewards = build_rewards({}, answer_key="answer", columns=COLUMNS)
    assert rewards.names == ["exact"] and rewards.checker is verify_exact
    with pytest.raises(ConfigError, match=r"no answer column 'answer' \(it has: prompt, question\)"):
        build_rewards(None, answer_key="answer", columns=("prompt", "question"))


def test_a_learned_reward_leaves_no_terms_and_the_exact_checker():
    rewards = build_rewards("rm:abc123", answer_key="answer", columns=COLUMNS)
    assert rewards.names == [] and rewards.checker is verify_exact
    assert rewards.score(["q"], ["c"], [{"answer": "c"}]) == ([0.0], {})
    no_answers = build_rewards("rm:abc123", answer_key="answer", columns=("prompt",))
    assert no_answers.checker is None and not no_answers.correct("c", {})


def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)


USER_REWARDS = """
    SEEN = []

    def length_penalty(prompt, completion, *, per_char=0.1, **columns):
        SEEN.append((prompt, completion, columns))
        return -per_char * len(completion)

    def by_difficulty(prompt, completion, difficulty, answer, **columns):
        return float(difficulty) * float(completion.strip() == str(answer))

    def broken(prompt, completion, **columns):
        raise KeyError("no such column")

    def not_a_number(prompt, completion, **columns):
        return "high"

    NOT_CALLABLE = 3
"""


def test_a_target_reward_receives_the_rows_columns_by_name(tmp_path, monkeypatch):
    write_module(tmp_path, monkeypatch, USER_REWARDS)
    rewards = build_rewards(
        {"_target_": "my_rewards.length_penalty", "per_char": 0.5}, answer_key="answer", columns=COLUMNS
    )
    assert rewards.names == ["length_penalty"] and rewards.checker is verify_exact  # answers exist: exact judges
    rows = [{"answer": "4", "difficulty": 2, "completion": "a reference"}]
    totals, parts = rewards.score(["2+2="], ["four"], rows)
    assert totals == [-2.0] and parts == {"length_penalty": [-2.0]}
    import my_rewards  # type: ignore[import-not-found]

    # every column but the prompt reaches it by name; a "completion" column would clash with the argument (TRL: same)
    assert my_rewards.SEEN == [("2+2=", "four", {"answer": "4", "difficulty": 2})]


def test_several_weighted_rewards_and_a_format_term_total_their_weighted_sum(tmp_path, monkeypatch):
    write_module(tmp_path, monkeypatch, USER_REWARDS)
    spec = [
        "exact",
        {"verifier": "math", "weight": 0.5, "name": "numeric"},
        {"_target_": "my_rewards.by_difficulty", "weight": -2},
    ]
    rewards = build_rewards(
        spec, answer_key="answer", columns=COLUMNS, format_pattern=r"<answer>.*</answer>", format_weight=0.25
    )
    assert rewards.names == ["exact", "numeric", "by_difficulty", "format"]
    assert rewards.checker is verify_exact  # the first built-in verifier
    rows = [{"answer": "12", "difficulty": 3}, {"answer": "12", "difficulty": 1}]
    totals, parts = rewards.score(["p", "p"], ["<answer>12</answer>", "12.0"], rows)
    assert parts == {
        "exact": [1.0, 0.0],
        "numeric": [1.0, 1.0],
        "by_difficulty": [0.0, 0.0],
        "format": [1.0, 0.0],
    }
    assert totals == pytest.approx([1.0 + 0.5 * 1.0 - 2.0 * 0.0 + 0.25 * 1.0, 0.0 + 0.5 * 1.0 - 2.0 * 0.0 + 0.0])
    totals, parts = rewards.score(["p"], ["12"], [{"answer": "12", "difficulty": 3}])
    assert parts["by_difficulty"] == [3.0] and totals == pytest.approx([1.0 + 0.5 - 6.0])


def test_a_zero_format_weight_adds_no_term_but_the_pattern_must_compile():
    assert build_rewards("exact", answer_key="answer", columns=COLUMNS, format_pattern="x+").names == ["exact"]
    with pytest.raises(ConfigError, match=r"env.format_pattern '\(unclosed' is not a valid regular expression"):
        build_rewards("exact", answer_key="answer", columns=COLUMNS, format_pattern="(unclosed", format_weight=1.0)


def one_line_error(spec, columns=COLUMNS, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        build_rewards(spec, answer_key="answer", columns=columns, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_each_bad_reward_is_one_line(tmp_path, monkeypatch):
    write_module(tmp_path, monkeypatch, USER_REWARDS)
    assert "unknown verifier 'maths'; the built-in ones are exact, math, choice" in one_line_error("maths")
    assert "env.reward[1]: unknown verifier 'regex'" in one_line_error(["exact", {"verifier": "regex"}])
    assert one_line_error("math", columns=["prompt", "question"]) == (
        "env.reward=math needs the answer column 'answer'; the data has: prompt, question "
        "(set env.answer_key to the column that holds the answers)"
    )
    assert "does not import (ModuleNotFoundError" in one_line_error({"_target_": "no_such_module.fn"})
    assert "has no attribute 'lenght_penalty'; did you mean" in one_line_error(
        {"_target_": "my_rewards.lenght_penalty"}
    )
    assert "is not callable (got int)" in one_line_error({"_target_": "my_rewards.NOT_CALLABLE"})
    assert "env.reward.weight must be a finite number (got 'high')" in one_line_error(
        {"_target_": "my_rewards.broken", "weight": "high"}
    )
    assert "env.reward[0].weight must be a finite number (got True)" in one_line_error(
        [{"verifier": "exact", "weight": True}]
    )
    assert "env.format_reward must be a finite number" in one_line_error(
        "exact", format_pattern="x", format_weight=float("nan")
    )
    assert "two reward terms are named 'exact'" in one_line_error(["exact", {"verifier": "exact", "weight": 2}])
    assert "named 'format'" in one_line_error(
        ["exact", {"verifier": "math", "name": "format"}], format_pattern="x", format_weight=1.0
    )
    assert "a verifier takes only weight and name (got also per_char)" in one_line_error(
        {"verifier": "exact", "per_char": 1}
    )
    assert "needs a verifier" in one_line_error({"weight": 1.0})
    assert "empty list" in one_line_error([])


def test_a_user_rewards_exception_propagates_with_its_name(tmp_path, monkeypatch):
    write_module(tmp_path, monkeypatch, USER_REWARDS)
    rewards = build_rewards(["exact", {"_target_": "my_rewards.broken"}], answer_key="answer", columns=COLUMNS)
    with pytest.raises(PgcliError, match=r"reward function 'broken' raised KeyError: 'no such column'") as info:
        rewards.score(["p"], ["c"], [{"answer": "c"}])
    assert isinstance(info.value.__cause__, KeyError)
    rewards = build_rewards({"_target_": "my_rewards.not_a_number"}, answer_key="answer", columns=COLUMNS)
    with pytest.raises(PgcliError, match=r"reward function 'not_a_number' returned 'high', not a number"):
        rewards.score(["p"], ["c"], [{}])


# --------------------------------------------------------------------------------------------------------------------
# Each term logged apart
# --------------------------------------------------------------------------------------------------------------------


def test_task_score_splits_a_format_reward_into_its_terms_and_rewards_stay_the_totals():
    task = Task("addition", Addition(3), n_eval=10, eval_seed=0, format_reward=0.1)
    problems = [Problem("123+45=", "168")] * 3
    totals, parts = task.score(problems, ["168", "167", "1+"])
    assert parts == {"task": [1.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert totals == [1.0 + 0.1, 0.0 + 0.1, 0.0] and task.rewards(problems, ["168", "167", "1+"]) == totals
    plain = Task("addition", Addition(3), n_eval=10, eval_seed=0)
    assert plain.score(problems, ["168", "167", "1+"]) == ([1.0, 0.0, 0.0], {})


def test_rollout_stats_log_each_reward_term():
    task = Task("addition", Addition(2), n_eval=20, eval_seed=0, format_reward=0.5)
    torch.manual_seed(0)
    sizes = TinyGPTSizes(
        vocab_size=task.vocab.size,
        max_len=task.max_prompt_len + task.max_completion_len,
        n_layers=1,
        n_heads=2,
        d_model=32,
        d_ff=64,
    )
    problems = task.sample(np.random.default_rng(0), 4)
    batch = sample_completions(
        task,
        TinyGPT(sizes),
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    texts = [task.vocab.decode(row) for row in batch.tokens.tolist()]
    repeated = [p for p in problems for _ in range(4)]
    formed = [float(task.well_formed(p, t)) for p, t in zip(repeated, texts, strict=True)]
    checked = [float(task.correct(p, t)) for p, t in zip(repeated, texts, strict=True)]
    stats = rollout_stats(batch)
    assert stats["rollout/reward/format"] == pytest.approx(np.mean(formed))
    assert stats["rollout/reward/task"] == pytest.approx(np.mean(checked))
    assert stats["rollout/reward_mean"] == pytest.approx(np.mean(checked) + 0.5 * np.mean(formed))
    assert 0 < np.mean(formed) < 1  # both terms vary, so the check can tell them apart
    plain = batch._replace(reward_parts={})
    assert not any(key.startswith("rollout/reward/") for key in rollout_stats(plain))
