"""Text tasks (docs/lm.md, "Tasks (`env=...`)"): checkers on hand-made right and wrong answers, vocabulary, held-out
set, rewards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgcli.errors import ConfigError
from pgcli.lm.arithmetic import evaluate_expression
from pgcli.lm.tasks import (
    Addition,
    CharVocab,
    Countdown,
    Problem,
    Sort,
    Task,
    decode_completions,
    encode_completions,
    encode_prompts,
    resolve_reward,
)


def test_vocab_reserves_pad_bos_eos_and_round_trips():
    vocab = CharVocab("0123456789+=")
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.size) == (0, 1, 2, 15)
    assert vocab.encode("12+3=") == [4, 5, 13, 6, 14]
    assert vocab.decode([1, 4, 5, 2, 7, 7]) == "12"  # BOS skipped, stops at EOS
    assert vocab.decode([0, 0, 1, 6]) == "3"  # PAD skipped
    with pytest.raises(ValueError, match="'x'"):
        vocab.encode("1x")


def test_addition_checker():
    task = Task("addition", Addition(3), n_eval=10, eval_seed=0)
    p = Problem("123+45=", "168")
    assert task.correct(p, "168")
    assert not task.correct(p, "167")
    assert not task.correct(p, "0168")  # exact match: no leading zero
    assert not task.correct(p, "168 ")
    assert not task.correct(p, "")
    assert task.reward(p, "168") == 1.0 and task.reward(p, "16") == 0.0


def test_addition_problems_are_right():
    rng = np.random.default_rng(1)
    for problem in [Addition(4).draw(rng) for _ in range(50)]:
        a, b = problem.prompt.rstrip("=").split("+")
        assert int(problem.answer) == int(a) + int(b)
        assert int(a) < 10**4 and int(b) < 10**4


def test_sort_checker():
    task = Task("sort", Sort(4), n_eval=10, eval_seed=0)
    p = Problem("3912=", "1239")
    assert task.correct(p, "1239")
    assert not task.correct(p, "1293")
    assert not task.correct(p, "123")
    drawn = Sort(6).draw(np.random.default_rng(0))
    assert drawn.answer == "".join(sorted(drawn.prompt.rstrip("="))) and len(drawn.answer) == 6


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("3*5+7", 22),
        ("3+5*7", 38),
        ("(3+5)*7", 56),
        ("7-3-2", 2),
        ("2*(3-5)", -4),
        ("12", 12),
        ("((4))", 4),
        ("3+", None),
        ("3**5", None),
        ("(3+5", None),
        ("3+5)", None),
        ("", None),
        ("03+1", None),
        ("3/5", None),
    ],
)
def test_evaluate_expression(expr, value):
    assert evaluate_expression(expr) == value


def test_countdown_checker_accepts_any_correct_expression():
    task = Task("countdown", Countdown(3, 9, 100), n_eval=10, eval_seed=0)
    p = Problem("3,5,7>22=", "3*5+7")
    assert task.correct(p, "3*5+7")
    assert task.correct(p, "7+5*3")  # another order: verified, not matched
    assert task.correct(p, "(7+5)*3-5-7-2") is False  # 5 and 7 used twice, 2 not given
    assert not task.correct(p, "3*5+8")  # 8 not given
    assert not task.correct(p, "7+7+7+1")
    assert not task.correct(p, "3*5+7+")  # does not parse
    assert not task.correct(p, "22")  # the target itself is not a given number
    assert task.well_formed(p, "3+5") and not task.well_formed(p, "3+5+5") and not task.well_formed(p, "3+")


def test_countdown_reference_solutions_are_correct():
    puzzle = Countdown(4, 9, 200)
    task = Task("countdown", puzzle, n_eval=10, eval_seed=0)
    for problem in task.sample(np.random.default_rng(3), 100):
        numbers, target = Countdown.parse_prompt(problem.prompt)
        assert len(numbers) == 4 and 0 <= target <= 200
        assert task.correct(problem, task.demonstration(problem))
        assert len(problem.prompt) <= puzzle.max_prompt_chars and len(problem.answer) <= puzzle.max_answer_chars


def test_held_out_set_is_fixed_and_disjoint_from_training_samples():
    task = Task("addition", Addition(2), n_eval=200, eval_seed=7)  # 10,000 distinct prompts, 2% held out
    again = Task("addition", Addition(2), n_eval=200, eval_seed=7)
    held_out = {p.prompt for p in task.eval_problems()}
    assert len(held_out) == 200
    assert [p.prompt for p in again.eval_problems()] == [p.prompt for p in task.eval_problems()]
    train = task.sample(np.random.default_rng(0), 20_000)  # would hit ~400 held-out prompts if not rejected
    assert not held_out & {p.prompt for p in train}
    other_seed = {p.prompt for p in Task("addition", Addition(2), n_eval=200, eval_seed=8).eval_problems()}
    assert other_seed != held_out


def test_sampling_is_seeded():
    task = Task("sort", Sort(5), n_eval=50, eval_seed=0)
    a = task.sample(np.random.default_rng(5), 30)
    b = task.sample(np.random.default_rng(5), 30)
    c = task.sample(np.random.default_rng(6), 30)
    assert a == b and a != c


def test_held_out_set_cannot_take_most_of_a_small_task():
    with pytest.raises(ConfigError, match=r"env.n_eval must be <= half of the 100 distinct addition prompts"):
        Task("addition", Addition(1), n_eval=60, eval_seed=0)


def test_lengths_bound_every_prompt_and_answer():
    for puzzle in (Addition(3), Sort(6), Countdown(3, 12, 300)):
        task = Task("t", puzzle, n_eval=10, eval_seed=0)
        for p in task.sample(np.random.default_rng(0), 300):
            assert len(p.prompt) + 1 <= task.max_prompt_len
            assert len(task.demonstration(p)) + 1 <= task.max_completion_len


def test_format_reward_adds_to_the_checker():
    task = Task("addition", Addition(3), n_eval=10, eval_seed=0, format_reward=0.1)
    p = Problem("123+45=", "168")
    assert task.reward(p, "168") == pytest.approx(1.1)
    assert task.reward(p, "167") == pytest.approx(0.1)  # wrong but a number
    assert task.reward(p, "1+") == 0.0
    assert task.reward(p, "12345") == 0.0  # longer than any answer


def partial_credit(problem: Problem, completion: str, *, weight: float = 1.0) -> float:
    """A user's checker: the share of answer characters in the right place."""
    hits = sum(a == b for a, b in zip(problem.answer, completion, strict=False))
    return weight * hits / len(problem.answer)


def test_pluggable_reward_by_target():
    fn = resolve_reward({"_target_": "tests.unit.test_lm_tasks.partial_credit", "weight": 2.0})
    task = Task("addition", Addition(3), n_eval=10, eval_seed=0, reward_fn=fn)
    p = Problem("123+45=", "168")
    assert task.reward(p, "160") == pytest.approx(2.0 * 2 / 3)
    assert task.correct(p, "160") is False  # accuracy still uses the task's checker
    with pytest.raises(ConfigError, match="has no attribute 'partial_credt'; did you mean"):
        resolve_reward({"_target_": "tests.unit.test_lm_tasks.partial_credt"})
    with pytest.raises(ConfigError, match="_target_"):
        resolve_reward({"weight": 1.0})
    assert resolve_reward({}) is None and resolve_reward(None) is None


def test_encode_prompts_left_pads_and_completions_right_pad():
    vocab = CharVocab("0123456789+=")
    tokens, mask = encode_prompts(vocab, [Problem("1+2=", "3"), Problem("10+20=", "30")])
    assert tokens.tolist() == [[0, 0, 1, 4, 13, 5, 14], [1, 4, 3, 13, 5, 3, 14]]
    assert mask.tolist() == [[False, False, True, True, True, True, True], [True] * 7]
    comp, cmask = encode_completions(vocab, ["3", "30"], width=4)
    assert comp.tolist() == [[6, 2, 0, 0], [6, 3, 2, 0]]
    assert cmask.tolist() == [[True, True, False, False], [True, True, True, False]]
    assert decode_completions(vocab, comp) == ["3", "30"]
    assert comp.dtype == torch.long and cmask.dtype == torch.bool
