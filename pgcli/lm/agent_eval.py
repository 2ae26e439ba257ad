"""Held-out evaluation on a multi-turn task (docs/lm.md, "Multi-turn agents"): what ``eval/*`` means there.

On the task's fixed held-out questions, each played to the end (:func:`pgcli.lm.play.play`):

- ``eval/accuracy`` (and ``eval/return_mean``, the reward): share of questions the greedy policy solves;
- ``eval/pass_at_<k>``: share solved by at least one of k sampled trajectories (the policy's sampling settings);
- ``eval/reward_mean``: mean reward (solved) of those sampled trajectories;
- ``eval/turns_mean``: turns the greedy trajectories take; ``eval/tool_error_rate``: share of their turns that were
  tool errors (any kind, :data:`pgcli.lm.agent.TOOL_ERRORS`);
- ``eval/completion_len``: generated tokens per greedy trajectory (EOS included, all turns);
- with a reference policy (``init=``): ``eval/kl_ref``, the mean over the sampled trajectories of the sum over their
  turns of log pi(a|s) - log pi_ref(a|s): KL(pi || pi_ref) per trajectory in nats.

The samples table shows the first questions: the reference transcript, the greedy one (``3*5=15; 15+7=22``), whether
it solved, and the sampled ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pgcli.contracts import EvalResult
from pgcli.lm.agent import AgentTask
from pgcli.lm.model import CausalLM, completion_logprobs
from pgcli.lm.play import Episodes, play
from pgcli.lm.tasks import Problem


@torch.no_grad()
def evaluate_agent(
    task: AgentTask,
    policy: CausalLM,
    problems: list[Problem],
    *,
    pass_k: int,
    temperature: float,
    top_p: float,
    n_table_rows: int,
    batch_size: int,
    sample_seed: int,
    device: torch.device,
    reference: CausalLM | None = None,
) -> EvalResult:
    """Score ``policy`` on ``problems`` by playing them (module docstring): greedily once, then ``pass_k`` sampled
    trajectories each with a generator seeded by ``sample_seed``; ``batch_size`` trajectories per play."""

    def play_all(todo: list[Problem], temperature: float, generator: torch.Generator | None) -> list[Episodes]:
        """``todo`` played ``batch_size`` at a time."""
        batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
        return [
            play(task, policy, b, temperature=temperature, top_p=top_p, generator=generator, device=device)
            for b in batches
        ]

    greedy = play_all(problems, 0.0, None)
    generator = torch.Generator(device=device).manual_seed(sample_seed)
    repeated = [p for p in problems for _ in range(pass_k)]
    sampled = play_all(repeated, temperature, generator)
    solved = np.array([s for e in greedy for s in e.solved], dtype=float)
    sampled_solved = np.array([s for e in sampled for s in e.solved], dtype=float)
    turns = [t for e in greedy for t in e.turns]
    n_turns = np.array([len(t) for t in turns])
    extra = {
        "eval/accuracy": float(solved.mean()),
        f"eval/pass_at_{pass_k}": float(sampled_solved.reshape(len(problems), pass_k).max(axis=1).mean()),
        "eval/reward_mean": float(sampled_solved.mean()),
        "eval/turns_mean": float(n_turns.mean()),
        "eval/tool_error_rate": sum(bool(turn.error) for t in turns for turn in t) / max(int(n_turns.sum()), 1),
        "eval/completion_len": float(sum(int(e.rows.mask.sum()) for e in greedy) / len(problems)),
    }
    if reference is not None:
        extra["eval/kl_ref"] = float(
            np.mean(np.concatenate([_log_ratios(e, policy, reference, temperature) for e in sampled]))
        )
    table = _table(task, problems[:n_table_rows], turns, solved, sampled, pass_k) if n_table_rows else None
    return EvalResult(solved, n_turns, extra=extra, samples=table)


def _log_ratios(episodes: Episodes, policy: CausalLM, reference: CausalLM, temperature: float) -> np.ndarray:
    """Per trajectory of ``episodes``: the sum over its turns of log pi(a|s) - log pi_ref(a|s)."""
    rows = episodes.rows
    logp, _ = completion_logprobs(
        policy, rows.prompt_tokens, rows.prompt_mask, rows.tokens, rows.mask, temperature=temperature
    )
    ref_logp, _ = completion_logprobs(
        reference, rows.prompt_tokens, rows.prompt_mask, rows.tokens, rows.mask, temperature=temperature
    )
    per_turn = ((logp - ref_logp).float() * rows.mask).sum(1)  # [N]
    per_trajectory = torch.zeros(len(episodes.problems), device=per_turn.device)
    per_trajectory.index_add_(0, rows.trajectory, per_turn)
    return per_trajectory.cpu().numpy()


def transcript(turns: list[Any]) -> str:
    """A trajectory's turns as the samples table shows them: ``3*5=15; 15+7=22``."""
    return "; ".join(turn.transcript for turn in turns)


def _table(
    task: AgentTask,
    problems: list[Problem],
    turns: list[list[Any]],
    solved: np.ndarray,
    sampled: list[Episodes],
    k: int,
) -> list[dict[str, Any]]:
    """The samples table's rows for the first ``problems``."""
    sampled_turns = [t for e in sampled for t in e.turns]
    sampled_solved = [s for e in sampled for s in e.solved]
    rows = []
    for i, problem in enumerate(problems):
        _, reference = task.play(problem, task.reference_actions(problem))
        rows.append(
            {
                "prompt": problem.prompt,
                "reference": transcript(reference),
                "greedy": transcript(turns[i]),
                "correct": bool(solved[i]),
                "turns": len(turns[i]),
                "tool_errors": sum(bool(turn.error) for turn in turns[i]),
                "sampled": [transcript(t) for t in sampled_turns[i * k : (i + 1) * k]],
                "sampled_correct": int(sum(sampled_solved[i * k : (i + 1) * k])),
            }
        )
    return rows
