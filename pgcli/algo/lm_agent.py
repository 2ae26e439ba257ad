"""Flow-GRPO and whole-trajectory GRPO on a multi-turn text task (docs/algorithms/lm.md, "Multi-turn agents").

One update: M training questions, G trajectories each played to the end by the old policy (:func:`pgcli.lm.play.play`:
one batched generation per round of turns), one verifiable reward R_j per trajectory (1.0 when solved). Every turn
is a sample: its prompt is the state the trajectory was in, its completion the action. The two algorithms differ in
the advantage each turn gets:

    algo=flow_grpo   every turn of trajectory j carries R_j; A = (R_j - mean) / (std + eps), mean and std over all
                     the turns of the question's G trajectories (AgentFlow, Li et al., 2025: verl's GRPO grouped by
                     question id), so trajectories with more turns weigh more in the statistics
    algo=grpo        A_j = (R_j - mean_g R) / (std_g R + eps) over the question's G trajectories, each counted once,
                     then given to every turn of j: a trajectory is one sample whose tokens are its actions' tokens

and then the same as GRPO on single completions (`pgcli.algo.lm_grpo`): mu epochs of minibatch steps (minibatches of
turns) on the clipped token objective with the KL term to the reference. A "step" is one sampled turn, so both
compare at the same number of generated completions.

On several processes (docs/distributed.md) each rank plays M / N questions, whole groups, so the advantages, taken
within a question's trajectories, are the one-process ones. The ranks' numbers of turns differ, so every rank splits
its turns into the same number of minibatches, ceil(turns of the global batch / `batch_size`) (at most the fewest turns
a rank holds), each minibatch's loss its share of the global minibatch's; the steps count every rank's turns and a
per-turn metric is weighted by each rank's turns.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from torch import Tensor

from pgcli.algo.lm_base import CriticFreeConfig
from pgcli.algo.lm_grpo import LMGRPO, STD_EPS
from pgcli.algo.lm_rollout import CompletionBatch, rollout_stats
from pgcli.config import GRPOConfig
from pgcli.hardware import distributed
from pgcli.lm.agent import TOOL_ERRORS, AgentTask
from pgcli.lm.play import Episodes, play
from pgcli.lm.tasks import TextTask
from pgcli.ops.lm import group_advantages, token_advantages

TURN_METRICS = (
    "rollout/completion_len",
    "rollout/tool_error_rate",
    *(f"rollout/errors_{kind}" for kind in TOOL_ERRORS),
    "rollout/truncated_frac",
)
"""The metrics that are means over a batch's turns (the others are per trajectory, question or update)."""


def trajectory_advantages(cfg: GRPOConfig, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
    """Whole-trajectory GRPO's advantage on every token of every turn: [N, C]. Each trajectory (``batch.trajectory``)
    counts once in its question's statistics, with the reward and group its turns carry."""
    if batch.trajectory is None:
        raise ValueError("whole-trajectory advantages need the batch's trajectory ids (a multi-turn batch)")
    n_trajectories = int(batch.trajectory.max()) + 1
    rewards = batch.rewards.new_zeros(n_trajectories).scatter_(0, batch.trajectory, batch.rewards)  # [T]
    groups = batch.group_ids.new_zeros(n_trajectories).scatter_(0, batch.trajectory, batch.group_ids)  # [T]
    per_trajectory = group_advantages(rewards, groups, scale=cfg.scale_rewards, eps=STD_EPS).advantages  # [T]
    return token_advantages(per_trajectory[batch.trajectory], batch.mask)


def episode_stats(episodes: Episodes, batch: CompletionBatch) -> dict[str, float]:
    """The ``rollout/*`` metrics of a multi-turn batch: per trajectory (reward, solved share, turns) and per turn (tool
    errors by kind, generated tokens)."""
    turns = [turn for trajectory in episodes.turns for turn in trajectory]
    errors = Counter(turn.error for turn in turns if turn.error)
    solved = sum(episodes.solved) / len(episodes.solved)
    stats = rollout_stats(batch) | {
        "rollout/reward_mean": solved,
        "rollout/accuracy": solved,
        "rollout/turns_mean": len(turns) / len(episodes.turns),
        "rollout/tool_error_rate": sum(errors.values()) / len(turns),
    }
    return stats | {f"rollout/errors_{kind}": errors[kind] / len(turns) for kind in TOOL_ERRORS}


class LMAgentGRPO(LMGRPO):
    """Flow-GRPO (``algo=flow_grpo``) or whole-trajectory GRPO (``algo=grpo``) on a multi-turn task (module
    docstring); sampling is play and whole-trajectory GRPO has its advantages, the rest is :class:`LMGRPO`'s."""

    def __init__(self, cfg: CriticFreeConfig, *, task: TextTask, **kwargs: Any) -> None:
        if not isinstance(task, AgentTask):
            raise TypeError(f"{type(self).__name__} plays multi-turn tasks (got {type(task).__name__})")
        super().__init__(cfg, task=task, **kwargs)
        self.agent_task = task

    def _sample(self) -> tuple[CompletionBatch, dict[str, float]]:
        """1. G trajectories of each of M questions played by the old policy; the batch of their turns, each with
        its trajectory's reward, grouped by question."""
        size = self.cfg.group_size
        questions = self.task.sample(self.prompt_rng, distributed.local_size(self.cfg.n_groups, "algo.n_groups"))
        episodes = play(
            self.agent_task,
            self.policy,
            [q for q in questions for _ in range(size)],
            temperature=self.temperature,
            top_p=self.top_p,
            generator=self.generator,
            device=self.device,
        )
        rows = episodes.rows
        solved = torch.tensor(episodes.solved, dtype=torch.bool, device=self.device)  # [T]
        rewards = solved.float()  # the final verdict: 1.0 when solved
        batch = CompletionBatch(
            prompt_tokens=rows.prompt_tokens,
            prompt_mask=rows.prompt_mask,
            tokens=rows.tokens,
            mask=rows.mask.float(),
            rewards=rewards[rows.trajectory],
            correct=solved[rows.trajectory],
            group_ids=rows.trajectory // size,
            sample_seconds=episodes.seconds,
            trajectory=rows.trajectory,
        )
        return batch, episode_stats(episodes, batch)

    def _advantages(self, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
        """Whole-trajectory GRPO: one advantage per trajectory, given to its turns; Flow-GRPO: :class:`LMGRPO`'s."""
        if isinstance(self.cfg, GRPOConfig):
            return trajectory_advantages(self.cfg, batch, old_logp, ref_logp)
        return super()._advantages(batch, old_logp, ref_logp)

    def _sampled_steps(self, batch: CompletionBatch) -> int:
        """The turns of every rank's trajectories (their numbers differ)."""
        return sum(distributed.all_counts(len(batch.rewards)))

    def _stat_weights(self, batch: CompletionBatch) -> dict[str, float]:
        """A per-turn metric weighs by this rank's turns."""
        return dict.fromkeys(TURN_METRICS, float(len(batch.rewards)))

    def _minibatches(self, rows: Tensor) -> tuple[Tensor, ...]:
        """On several processes, as many minibatches on every rank (each step's collectives line up): ceil(turns of
        the global batch / ``batch_size``), at most the fewest turns a rank holds, each rank's turns (shuffled)
        split evenly among them; in one process, :class:`LMGRPO`'s."""
        if not distributed.active():
            return super()._minibatches(rows)
        counts = distributed.all_counts(len(rows))
        n = min(math.ceil(sum(counts) / self.cfg.batch_size), min(counts))
        return rows[torch.randperm(len(rows), device=self.device)].tensor_split(n)
