"""Held-out evaluation of text policies (docs/lm.md, "Evaluation"): metrics on hand-made completions, seeded
sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgcli.lm.evaluation import TextEvalSettings, evaluate_text, score_completions
from pgcli.lm.model import TinyGPT, TinyGPTSizes
from pgcli.lm.tasks import Addition, Problem, Task


@pytest.fixture
def task() -> Task:
    return Task("addition", Addition(2), n_eval=10, eval_seed=0, format_reward=0.5)


def test_score_completions_against_hand_computed_metrics(task):
    problems = [Problem("1+2=", "3"), Problem("10+5=", "15"), Problem("7+7=", "14")]
    greedy = ["3", "16", "x"]  # right, wrong number, malformed
    lens = [2, 3, 2]
    sampled = ["3", "4",  # problem 0: 1 of 2 right
               "1", "5",  # problem 1: none right
               "14", "14"]  # fmt: skip  # problem 2: both right
    result = score_completions(task, problems, greedy, lens, sampled, k=2, n_table_rows=2)
    assert result.extra["eval/accuracy"] == pytest.approx(1 / 3)
    assert result.extra["eval/pass_at_2"] == pytest.approx(2 / 3)
    # rewards: 1 + 0.5 format for a right number, 0.5 for a wrong number; sampled: 1.5, .5, .5, .5, 1.5, 1.5
    assert result.extra["eval/reward_mean"] == pytest.approx(6.0 / 6)
    assert result.extra["eval/completion_len"] == pytest.approx(7 / 3)
    np.testing.assert_allclose(result.returns, [1.5, 0.5, 0.0])  # greedy rewards: what eval/return_mean averages
    assert result.mean == pytest.approx(2.0 / 3)
    assert result.samples is not None and len(result.samples) == 2
    assert result.samples[1] == {
        "prompt": "10+5=",
        "reference": "15",
        "greedy": "16",
        "correct": False,
        "reward": 0.5,
        "sampled": ["1", "5"],
        "sampled_correct": 0,
    }


def test_no_table_when_no_rows_are_asked_for(task):
    result = score_completions(task, [Problem("1+2=", "3")], ["3"], [2], ["3"], k=1, n_table_rows=0)
    assert result.samples is None and result.extra["eval/pass_at_1"] == 1.0


def test_evaluate_text_is_seeded_and_restores_train_mode(task):
    torch.manual_seed(0)
    policy = TinyGPT(
        TinyGPTSizes(vocab_size=task.vocab.size, max_len=16, n_layers=1, n_heads=2, d_model=16, d_ff=32, init_std=0.3)
    ).train()
    settings = TextEvalSettings(pass_k=4, temperature=1.0, top_p=0.9, n_table_rows=3, batch_size=7)
    problems = task.eval_problems()
    a = evaluate_text(task, policy, problems, settings, seed=1, device=torch.device("cpu"))
    b = evaluate_text(task, policy, problems, settings, seed=1, device=torch.device("cpu"))
    assert policy.training
    assert a.samples == b.samples and a.extra == b.extra
    assert a.samples is not None and all(len(row["sampled"]) == 4 for row in a.samples)
    assert set(a.extra) == {"eval/accuracy", "eval/pass_at_4", "eval/reward_mean", "eval/completion_len"}
    assert len(a.returns) == len(problems) == 10
    assert 1 <= a.extra["eval/completion_len"] <= task.max_completion_len
