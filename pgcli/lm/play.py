"""Play a multi-turn task (:mod:`pgcli.lm.agent`) with a policy, many trajectories at once (docs/lm.md, "Multi-turn
agents"): each round, one batched key/value-cache generation answers the prompt of every trajectory still going, the
task steps each, until all are done. The held-out evaluation and the multi-turn trainers play the same way.

Every generated turn is kept as a row of :class:`TurnRows` (its prompt, its tokens), rows ordered by round, then by
trajectory, so the trainers score and train on turns exactly as the single-turn trainers do on completions.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
from torch import Tensor

from pgcli.lm.agent import AgentTask, State, Turn
from pgcli.lm.model import CausalLM
from pgcli.lm.tasks import Problem, decode_completions, generate_for_task
from pgcli.ops.lm import truncated_completions


class TurnRows(NamedTuple):
    """The N turns generated while playing, one row each, in the layout of :func:`pgcli.lm.model.generate`."""

    prompt_tokens: Tensor
    """[N, P] long, left-padded prompts (each its trajectory's state at that turn)."""
    prompt_mask: Tensor
    """[N, P] bool, True on real prompt tokens."""
    tokens: Tensor
    """[N, C] long, the action's tokens, PAD after EOS."""
    mask: Tensor
    """[N, C] bool, True on generated tokens up to and including EOS."""
    trajectory: Tensor
    """[N] long: the trajectory (index into the played problems) each turn belongs to."""


class Episodes(NamedTuple):
    """Trajectories played from ``problems``: trajectory i started from ``problems[i]``."""

    problems: list[Problem]
    states: list[State]
    """Where each trajectory ended."""
    turns: list[list[Turn]]
    """Each trajectory's turns, in order."""
    rows: TurnRows
    seconds: float
    """Wall time of the play: encoding, generation, decoding and the environment's steps."""

    @property
    def solved(self) -> list[bool]:
        return [state.solved for state in self.states]


@torch.no_grad()
def play(
    task: AgentTask,
    policy: CausalLM,
    problems: list[Problem],
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    device: torch.device,
) -> Episodes:
    """One trajectory per problem, turn by turn (module docstring); temperature 0 plays greedily. The policy is put in
    eval mode for the play and its mode restored after."""
    start = time.perf_counter()
    states = [task.start(p) for p in problems]
    turns: list[list[Turn]] = [[] for _ in problems]
    rounds: list[TurnRows] = []
    training = policy.training
    policy.eval()
    try:
        while active := [i for i, state in enumerate(states) if not task.done(state)]:
            prompts = [Problem(states[i].prompt, "") for i in active]
            prompt_tokens, prompt_mask, out = generate_for_task(
                task, policy, prompts, device, temperature=temperature, top_p=top_p, generator=generator
            )
            actions = decode_completions(task.vocab, out.tokens)
            cut = truncated_completions(out.tokens, out.mask.float(), eos_id=task.vocab.stop_ids).tolist()
            for j, i in enumerate(active):
                states[i], turn = task.step(states[i], actions[j], truncated=bool(cut[j]))
                turns[i].append(turn)
            index = torch.tensor(active, dtype=torch.long, device=device)
            rounds.append(TurnRows(prompt_tokens, prompt_mask, out.tokens, out.mask, index))
    finally:
        policy.train(training)
    rows = _concatenate(rounds, pad_id=task.vocab.pad_id, device=device)
    return Episodes(problems, states, turns, rows, time.perf_counter() - start)


def _concatenate(rounds: list[TurnRows], *, pad_id: int, device: torch.device) -> TurnRows:
    """The rounds' rows stacked: prompts left-padded and actions right-padded to the widest of any round."""
    if not rounds:
        empty = torch.zeros((0, 1), dtype=torch.long, device=device)
        return TurnRows(empty, empty.bool(), empty, empty.bool(), torch.zeros(0, dtype=torch.long, device=device))
    p = max(r.prompt_tokens.shape[1] for r in rounds)
    c = max(r.tokens.shape[1] for r in rounds)

    def left(x: Tensor, value: int | bool) -> Tensor:
        return torch.nn.functional.pad(x, (p - x.shape[1], 0), value=value)

    def right(x: Tensor, value: int | bool) -> Tensor:
        return torch.nn.functional.pad(x, (0, c - x.shape[1]), value=value)

    return TurnRows(
        prompt_tokens=torch.cat([left(r.prompt_tokens, pad_id) for r in rounds]),
        prompt_mask=torch.cat([left(r.prompt_mask, False) for r in rounds]),
        tokens=torch.cat([right(r.tokens, pad_id) for r in rounds]),
        mask=torch.cat([right(r.mask, False) for r in rounds]),
        trajectory=torch.cat([r.trajectory for r in rounds]),
    )
