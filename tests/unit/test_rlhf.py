"""RL on a learned reward (docs/lm.md, "RL on a learned reward"): the reward the trainers sample with is the reward
model's score of the completions' strings (against ``score_texts`` directly), the checker stays the gold, and the
evaluation's proxy and KL metrics against hand-made cases. Tiny models, CPU."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from pgcli.algo.lm_rollout import sample_completions
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.lm.evaluation import TextEvalSettings, evaluate_text
from pgcli.lm.learned_reward import reward_model_ref
from pgcli.lm.model import TinyGPT, TinyGPTSizes
from pgcli.lm.reward_model import RewardModel, score_texts
from pgcli.lm.tasks import Addition, Problem, Task, resolve_reward

CPU = torch.device("cpu")


def tiny_gpt(task: Task, seed: int) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(
        TinyGPTSizes(vocab_size=task.vocab.size, max_len=16, n_layers=1, n_heads=2, d_model=16, d_ff=32, init_std=0.3)
    )


@pytest.fixture
def task() -> Task:
    return Task("addition", Addition(2), n_eval=10, eval_seed=0)


@pytest.fixture
def reward_model(task: Task) -> RewardModel:
    model = RewardModel(tiny_gpt(task, seed=1))
    torch.nn.init.normal_(model.head.weight, std=1.0)  # a trained head is not zero: scores that differ by string
    return model.eval()


def scorer(model: RewardModel, task: Task):
    return functools.partial(score_texts, model, task.vocab, device=CPU)


def test_sampled_rewards_are_the_reward_models_scores_of_those_strings(task, reward_model):
    scored = task.with_learned_reward(scorer(reward_model, task))
    problems = task.sample(np.random.default_rng(0), 3)
    batch = sample_completions(
        scored,
        tiny_gpt(task, seed=0),
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
        device=CPU,
    )
    texts = [task.vocab.decode(row) for row in batch.tokens.tolist()]
    prompts = [p.prompt for p in problems for _ in range(4)]
    expected = score_texts(reward_model, task.vocab, prompts, texts, CPU)
    assert len(set(np.round(expected, 6))) > 1  # the test can tell the rows apart
    np.testing.assert_allclose(batch.rewards.numpy(), expected, rtol=1e-6, atol=1e-6)
    answers = [str(sum(int(x) for x in p.rstrip("=").split("+"))) for p in prompts]
    assert batch.correct.tolist() == [t == a for t, a in zip(texts, answers, strict=True)]  # the checker's verdicts


def test_the_learned_reward_leaves_the_task_it_came_from_alone(task, reward_model):
    scored = task.with_learned_reward(scorer(reward_model, task))
    problem = Problem("12+30=", "42")
    assert task.reward(problem, "42") == 1.0 and task.learned_reward is None  # the checker
    assert scored.reward(problem, "42") == pytest.approx(
        float(score_texts(reward_model, task.vocab, ["12+30="], ["42"], CPU)[0]), abs=1e-6
    )
    assert scored.correct(problem, "42") and not scored.correct(problem, "41")


def test_format_reward_adds_to_the_learned_score(reward_model):
    task = Task("addition", Addition(2), n_eval=10, eval_seed=0, format_reward=0.5)
    scored = task.with_learned_reward(lambda prompts, completions: [1.0] * len(prompts))
    assert scored.rewards([Problem("1+2=", "3")] * 2, ["4", "x"]) == [1.5, 1.0]  # well formed, malformed


def test_checker_rewards_are_unchanged_in_a_batch(task):
    problems = [Problem("1+2=", "3"), Problem("10+5=", "15")]
    assert task.rewards(problems, ["3", "16"]) == [task.reward(problems[0], "3"), task.reward(problems[1], "16")]
    assert task.rewards(problems, ["3", "16"]) == [1.0, 0.0]


def test_evaluation_logs_the_proxy_reward_and_the_kl_to_the_reference(task, reward_model):
    policy = tiny_gpt(task, seed=0)
    settings = TextEvalSettings(pass_k=3, temperature=1.0, top_p=1.0, n_table_rows=2, batch_size=7)
    problems = task.eval_problems()
    learned = scorer(reward_model, task)
    plain = evaluate_text(task, policy, problems, settings, seed=1, device=CPU)
    same = evaluate_text(
        task, policy, problems, settings, seed=1, device=CPU, reference=tiny_gpt(task, seed=0), learned_reward=learned
    )
    assert "eval/kl_ref" not in plain.extra and "eval/proxy_reward_mean" not in plain.extra
    assert same.extra["eval/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the reference is the policy
    assert {k: v for k, v in same.extra.items() if k in plain.extra} == plain.extra  # the gold metrics do not move
    other = evaluate_text(task, policy, problems, settings, seed=1, device=CPU, reference=tiny_gpt(task, seed=3))
    assert other.extra["eval/kl_ref"] > 0.0  # KL(pi || pi_ref) estimated on pi's samples


def test_the_proxy_reward_mean_is_the_mean_score_of_the_greedy_completions(task, reward_model):
    policy = tiny_gpt(task, seed=0)
    settings = TextEvalSettings(pass_k=2, temperature=1.0, top_p=1.0, n_table_rows=10, batch_size=16)
    problems = task.eval_problems()
    learned = scorer(reward_model, task)
    result = evaluate_text(
        task.with_learned_reward(learned), policy, problems, settings, seed=1, device=CPU, learned_reward=learned
    )
    rows = result.samples or []
    scores = score_texts(reward_model, task.vocab, [p.prompt for p in problems], [r["greedy"] for r in rows], CPU)
    sampled = [c for r in rows for c in r["sampled"]]
    sampled_scores = score_texts(reward_model, task.vocab, [p.prompt for p in problems for _ in range(2)], sampled, CPU)
    assert result.extra["eval/proxy_reward_mean"] == pytest.approx(float(scores.mean()), abs=1e-6)
    assert result.extra["eval/proxy_reward_sampled_mean"] == pytest.approx(float(sampled_scores.mean()), abs=1e-6)
    np.testing.assert_allclose(result.returns, scores, atol=1e-6)  # eval/return_mean: the reward being optimised
    correct = [task.correct(p, r["greedy"]) for p, r in zip(problems, rows, strict=True)]
    assert result.extra["eval/accuracy"] == pytest.approx(float(np.mean(correct)))  # the gold


def test_reward_spec_forms():
    assert reward_model_ref("rm:abc12345") == "abc12345" and reward_model_ref({}) is None
    assert resolve_reward("rm:abc12345") is None  # loaded by the run, on its device
    cfg = compose_train_config(["env=addition", "env.reward=rm:/some/run"])
    assert cfg.env.reward == "rm:/some/run"
    with pytest.raises(ConfigError, match=r"env.reward must be rm:<run id \| run dir> or \{_target_"):
        compose_train_config(["env=addition", "env.reward=checker"])
