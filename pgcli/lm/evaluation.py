"""Held-out evaluation of a text policy (docs/lm.md, "Evaluation"): what ``eval/*`` means on a text task.

On the task's fixed held-out problems (never sampled for training):

- ``eval/accuracy``: share of problems whose greedy completion (temperature 0) is correct (exact match; countdown:
  verified; your rows, ``env=dataset``: the verifier's judgement on the answer column, not reported without one);
- ``eval/pass_at_<k>``: share of problems with at least one correct completion among k sampled ones (the policy's
  sampling settings, ``model.temperature`` and ``model.top_p``); with n = k samples per problem this is the unbiased
  pass@k estimator of Chen et al. (2021). MLflow metric names cannot hold ``@``, hence ``pass_at``;
- ``eval/reward_mean``: mean reward of those sampled completions (format reward included);
- ``eval/completion_len``: mean length in tokens (EOS included) of the greedy completions;
- ``eval/return_mean`` (every run's key): mean reward of the greedy completions, what the best model is chosen by;
- with a learned reward (``env.reward=rm:<run>``, docs/lm.md, "RL on a learned reward"): ``eval/proxy_reward_mean``,
  the reward model's mean score of the greedy completions, and ``eval/proxy_reward_sampled_mean``, of the sampled
  ones (``eval/accuracy`` stays the checker's: the gold beside the proxy);
- with a reference policy (``init=``, or LoRA's base): ``eval/kl_ref``, the mean over the sampled completions of
  log pi(y|x) - log pi_ref(y|x) at the sampling temperature, an unbiased estimate of KL(pi || pi_ref) per completion
  in nats; gold accuracy against it is the over-optimisation curve.

On a multi-turn task (``env=countdown_tool``) the held-out questions are played (:mod:`pgcli.lm.agent_eval`).

The sampled completions use a generator seeded the same way at every evaluation, so curves compare like with like.
The first ``env.eval_samples`` problems go into a samples table (prompt, reference, greedy and sampled completions,
whether each is correct).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pgcli.config import EvalConfig
from pgcli.contracts import Agent, EvalResult
from pgcli.lm.agent import AgentTask
from pgcli.lm.agent_eval import evaluate_agent
from pgcli.lm.model import CausalLM, completion_logprobs
from pgcli.lm.tasks import LearnedReward, Problem, TextTask, decode_completions, generate_for_task

EVAL_SEED_OFFSET = 10_000
"""The evaluation's sampling seed is the run's seed plus this (as for gymnasium evaluation envs)."""


@dataclass
class TextEvalSettings:
    """How a held-out evaluation samples (from ``env`` and ``model`` of a text run)."""

    pass_k: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    n_table_rows: int = 16
    batch_size: int = 1024
    """Completions generated per forward batch."""


@torch.no_grad()
def evaluate_text(
    task: TextTask,
    policy: CausalLM,
    problems: list[Problem],
    settings: TextEvalSettings,
    *,
    seed: int,
    device: torch.device,
    reference: CausalLM | None = None,
    learned_reward: LearnedReward | None = None,
) -> EvalResult:
    """Score ``policy`` on ``problems`` (module docstring; ``eval/kl_ref`` with a ``reference``, the proxy metrics
    with a ``learned_reward``); the policy's train/eval mode is restored afterwards. A multi-turn task is played:
    :func:`pgcli.lm.agent_eval.evaluate_agent`."""
    if isinstance(task, AgentTask):
        return evaluate_agent(
            task,
            policy,
            problems,
            pass_k=settings.pass_k,
            temperature=settings.temperature,
            top_p=settings.top_p,
            n_table_rows=settings.n_table_rows,
            batch_size=settings.batch_size,
            sample_seed=seed + EVAL_SEED_OFFSET,
            device=device,
            reference=reference,
        )
    was_training = policy.training
    policy.eval()
    try:
        greedy = _complete(task, policy, problems, settings, temperature=0.0, generator=None, device=device)
        generator = torch.Generator(device=device).manual_seed(seed + EVAL_SEED_OFFSET)
        k = settings.pass_k
        repeated = [p for p in problems for _ in range(k)]
        sampled = _complete(
            task,
            policy,
            repeated,
            settings,
            temperature=settings.temperature,
            generator=generator,
            device=device,
            reference=reference,
        )
    finally:
        policy.train(was_training)
    result = score_completions(
        task, problems, greedy[0], greedy[1], sampled[0], k=settings.pass_k, n_table_rows=settings.n_table_rows
    )
    if reference is not None:
        result.extra["eval/kl_ref"] = float(np.mean(sampled[2]))
    if learned_reward is not None:
        result.extra |= proxy_metrics(learned_reward, problems, greedy[0], sampled[0], k=k)
    return result


def proxy_metrics(
    learned_reward: LearnedReward, problems: list[Problem], greedy: list[str], sampled: list[str], *, k: int
) -> dict[str, float]:
    """``eval/proxy_reward_mean`` and ``eval/proxy_reward_sampled_mean``: the learned reward's mean score of the greedy
    completions and of the k sampled ones per problem (module docstring)."""
    repeated = [p.prompt for p in problems for _ in range(k)]
    return {
        "eval/proxy_reward_mean": float(np.mean(list(learned_reward([p.prompt for p in problems], greedy)))),
        "eval/proxy_reward_sampled_mean": float(np.mean(list(learned_reward(repeated, sampled)))),
    }


def score_completions(
    task: TextTask,
    problems: list[Problem],
    greedy: list[str],
    greedy_lens: list[int],
    sampled: list[str],
    *,
    k: int,
    n_table_rows: int,
) -> EvalResult:
    """The evaluation of given completions: ``greedy[i]`` (``greedy_lens[i]`` tokens) answers ``problems[i]``, and
    ``sampled[i * k : (i + 1) * k]`` are its k samples (module docstring for the metrics)."""
    correct = np.array([task.correct(p, c) for p, c in zip(problems, greedy, strict=True)])
    rewards = np.array(task.rewards(problems, greedy))
    repeated = [p for p in problems for _ in range(k)]
    sampled_correct = np.array([task.correct(p, c) for p, c in zip(repeated, sampled, strict=True)])
    sampled_rewards = np.array(task.rewards(repeated, sampled))
    passed = sampled_correct.reshape(len(problems), k).any(axis=1)
    rows: list[dict[str, Any]] = [
        {
            "prompt": p.prompt,
            "reference": p.answer,
            "greedy": greedy[i],
            "correct": bool(correct[i]),
            "reward": float(rewards[i]),
            "sampled": sampled[i * k : (i + 1) * k],
            "sampled_correct": int(sampled_correct[i * k : (i + 1) * k].sum()),
        }
        for i, p in enumerate(problems[:n_table_rows])
    ]
    extra = {
        "eval/accuracy": float(correct.mean()),
        f"eval/pass_at_{k}": float(passed.mean()),
        "eval/reward_mean": float(sampled_rewards.mean()),
        "eval/completion_len": float(np.mean(greedy_lens)),
    }
    if not getattr(task, "has_checker", True):  # no verifier (a dataset scored by a function or a reward model only)
        del extra["eval/accuracy"], extra[f"eval/pass_at_{k}"]
        for row in rows:
            row["correct"] = row["sampled_correct"] = None
    return EvalResult(rewards, np.asarray(greedy_lens), extra=extra, samples=rows if n_table_rows else None)


def _complete(
    task: TextTask,
    policy: CausalLM,
    problems: list[Problem],
    settings: TextEvalSettings,
    *,
    temperature: float,
    generator: torch.Generator | None,
    device: torch.device,
    reference: CausalLM | None = None,
) -> tuple[list[str], list[int], list[float]]:
    """Completions of ``problems`` in batches: their texts, lengths in tokens (EOS included) and, with a
    ``reference``, log pi(y|x) - log pi_ref(y|x) of each (else no values)."""
    texts: list[str] = []
    lengths: list[int] = []
    log_ratios: list[float] = []
    for start in range(0, len(problems), settings.batch_size):
        chunk = problems[start : start + settings.batch_size]
        tokens, mask, gen = generate_for_task(
            task, policy, chunk, device, temperature=temperature, top_p=settings.top_p, generator=generator
        )
        texts += decode_completions(task.vocab, gen.tokens)
        lengths += gen.mask.sum(1).tolist()
        if reference is not None:
            logp, _ = completion_logprobs(policy, tokens, mask, gen.tokens, gen.mask, temperature=temperature)
            ref_logp, _ = completion_logprobs(reference, tokens, mask, gen.tokens, gen.mask, temperature=temperature)
            log_ratios += ((logp - ref_logp).float() * gen.mask).sum(1).tolist()  # [B]
    return texts, lengths, log_ratios


class TextEvaluator:
    """The monitor's evaluator on a text task: :func:`evaluate_text` on the held-out set (with the KL to
    ``reference`` and the ``learned_reward``'s proxy metrics where given).

    It scores the policy module it was built with, which the run's trainer trains in place (the ``agent`` the
    monitor passes is the trainer, used by the monitor for saving only).
    """

    concurrent = None
    """Evaluated in this process only (``pgcli.training.evaluation.EvaluatorLike``)."""

    def __init__(
        self,
        task: TextTask,
        policy: CausalLM,
        settings: TextEvalSettings,
        cfg: EvalConfig,
        *,
        seed: int,
        device: torch.device,
        reference: CausalLM | None = None,
        learned_reward: LearnedReward | None = None,
    ) -> None:
        self.task, self.policy, self.settings, self.cfg = task, policy, settings, cfg
        self.seed, self.device = seed, device
        self.reference, self.learned_reward = reference, learned_reward
        self.problems = task.eval_problems()

    def __call__(self, agent: Agent) -> EvalResult:
        return evaluate_text(
            self.task,
            self.policy,
            self.problems,
            self.settings,
            seed=self.seed,
            device=self.device,
            reference=self.reference,
            learned_reward=self.learned_reward,
        )

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]:
        """Text tasks have no video (``eval.video_every`` is refused for them): an evaluation, no files."""
        return self(agent), []

    def close(self) -> None:
        """Nothing to release."""
