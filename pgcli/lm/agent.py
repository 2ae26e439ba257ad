"""Multi-turn text tasks (docs/lm.md, "Multi-turn agents"): the policy acts over turns, the environment answers each
turn, and one verifiable reward comes at the end.

An :class:`AgentTask` is a :class:`~pgcli.lm.tasks.Task` (the same questions, vocabulary and held-out set) that is
played: ``start(problem)`` gives the first state, whose ``prompt`` the policy completes with one action;
``step(state, action)`` applies it and gives the next state, until ``done(state)``. The state's prompt is the whole
observation (what the environment answered is folded into it), so each turn's prompt stays short.

``env=countdown_tool`` (:class:`CountdownCalculator`): the question is a countdown problem (``3,5,7>22=``); each
turn the policy writes one operation on two of the numbers left (``3*5``), the calculator replaces the two by the
result and the next prompt shows the numbers left (``7,15>22=``). Solved when a result equals the target; over after
``max_turns`` turns, or when one number is left. A turn is a **tool error** (counted by kind, :data:`TOOL_ERRORS`)
when it does not parse as ``<number><op><number>``, names a number that is not left, gives a negative result, or
stops at the token limit without EOS; the numbers stay as they were, the turn is spent, and the next prompt shows the
failed action before ``!`` (``3*9!3,5,7>22=``).

As a :class:`~pgcli.lm.tasks.Task`, a whole trajectory reads as its actions joined by ``;``: ``correct`` replays
them (1.0 reward when solved, else 0.0) and ``demonstration`` is the reference's (``3*5;15+7``). Supervised warm
starts train on single turns: :meth:`AgentTask.turn_task`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from pgcli.lm.tasks import CountdownTool, Problem, Task

if TYPE_CHECKING:
    from pgcli.config import CountdownToolEnvConfig
    from pgcli.lm.tasks import Vocab

TOOL_ERRORS = ("malformed", "missing_number", "negative", "truncated")
"""Kinds of tool error: the action does not parse, names a number that is not left, gives a negative result, or was
cut at the token limit."""

ACTION_SEPARATOR = ";"
"""Joins a trajectory's actions into one string (``demonstration``, ``correct``)."""

RECOVERY_SHARE = 0.25
"""Share of the turn demonstrations (:meth:`AgentTask.turn_task`) that follow a failed action."""

_OPERATION = re.compile(r"(0|[1-9]\d*)([+\-*])(0|[1-9]\d*)")


@dataclass(frozen=True)
class State:
    """Where a countdown trajectory stands: the numbers left, the target, turns spent, and whether it is solved."""

    numbers: tuple[int, ...]
    target: int
    turns: int = 0
    solved: bool = False
    failed: str | None = None
    """The previous turn's action when it was a tool error (cut to an answer's length), else None."""

    @property
    def prompt(self) -> str:
        """The observation the policy completes: ``7,15>22=``; after a tool error, the failed action and ``!`` first
        (``3*9!3,5,7>22=``), so the same state does not ask for the same action again."""
        state = f"{','.join(map(str, self.numbers))}>{self.target}="
        return state if self.failed is None else f"{self.failed}!{state}"


@dataclass(frozen=True)
class Turn:
    """One turn: the prompt it answered, the action, and the calculator's answer (``error`` empty when it ran)."""

    prompt: str
    action: str
    result: int | None
    error: str = ""

    @property
    def transcript(self) -> str:
        """``3*5=15``, or ``3*8=!missing_number`` on a tool error."""
        return f"{self.action}={self.result}" if not self.error else f"{self.action}=!{self.error}"


def operate(numbers: tuple[int, ...], action: str) -> tuple[int | None, str]:
    """The calculator: the value of ``action`` (``a op b``, a and b among ``numbers``) and ``""``, or None and the kind
    of tool error."""
    result, error, _ = _calculate(numbers, action)
    return result, error


def _calculate(numbers: tuple[int, ...], action: str) -> tuple[int | None, str, tuple[int, ...]]:
    """:func:`operate`, with the numbers left once a valid ``action``'s operands are replaced by its result (appended);
    ``numbers`` unchanged on a tool error."""
    match = _OPERATION.fullmatch(action.strip())
    if match is None:
        return None, "malformed", numbers
    a, op, b = int(match[1]), match[2], int(match[3])
    left = list(numbers)
    for x in (a, b):
        if x not in left:
            return None, "missing_number", numbers
        left.remove(x)
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return (None, "negative", numbers) if value < 0 else (value, "", (*left, value))


def reference_actions(expression: str) -> list[str]:
    """The operations that compute a countdown reference ``expression`` (``+ - *``, no brackets, non-negative value)
    one at a time: the products first, left to right, then the sum of the added terms, then each subtraction, so no
    intermediate value is negative. ``"3+5*7-2"`` -> ``["5*7", "3+35", "38-2"]``."""
    terms: list[tuple[str, list[int]]] = []  # (sign, factors)
    for sign, term in re.findall(r"([+-]?)([\d*]+)", expression):
        terms.append((sign or "+", [int(x) for x in term.split("*")]))
    actions: list[str] = []
    values: list[tuple[str, int]] = []
    for sign, factors in terms:
        value = factors[0]
        for factor in factors[1:]:
            actions.append(f"{value}*{factor}")
            value *= factor
        values.append((sign, value))
    added = [v for s, v in values if s == "+"]
    total = added[0]
    for value in added[1:]:
        actions.append(f"{total}+{value}")
        total += value
    for value in (v for s, v in values if s == "-"):
        actions.append(f"{total}-{value}")
        total -= value
    return actions


class AgentTask(Task):
    """A task played over turns (module docstring). Subclasses give ``start`` and ``step`` and the reference."""

    max_turns: int

    def start(self, problem: Problem) -> State:
        raise NotImplementedError

    def step(self, state: State, action: str, *, truncated: bool = False) -> tuple[State, Turn]:
        raise NotImplementedError

    def reference_actions(self, problem: Problem) -> list[str]:
        raise NotImplementedError

    def done(self, state: State) -> bool:
        """Solved or out of turns."""
        return state.solved or state.turns >= self.max_turns

    def play(self, problem: Problem, actions: list[str]) -> tuple[State, list[Turn]]:
        """``actions`` taken one per turn from the start of ``problem`` until done (the rest ignored)."""
        state, turns = self.start(problem), []
        for action in actions:
            if self.done(state):
                break
            state, turn = self.step(state, action)
            turns.append(turn)
        return state, turns

    def correct(self, problem: Problem, completion: str) -> bool:
        """Whether the trajectory whose actions ``completion`` joins with ``;`` solves ``problem``."""
        return self.play(problem, completion.split(ACTION_SEPARATOR))[0].solved

    def well_formed(self, problem: Problem, completion: str) -> bool:
        """Whether every action of the trajectory ran without a tool error."""
        return not any(turn.error for turn in self.play(problem, completion.split(ACTION_SEPARATOR))[1])

    def demonstration(self, problem: Problem) -> str:
        """The reference trajectory: its actions joined by ``;``."""
        _, turns = self.play(problem, self.reference_actions(problem))
        return ACTION_SEPARATOR.join(turn.action for turn in turns)

    def turn_task(self) -> Task:
        """A single-turn task of this one's turns for a supervised warm start (``algo=sft``): a prompt is a state on
        the reference path of a training question, its demonstration the reference's next action."""
        return Task(
            f"{self.name}_turns",
            _TurnPuzzle(self),
            n_eval=1,
            eval_seed=0,
            vocab=self.vocab,
            max_new_tokens=self.max_completion_len,
        )


class CountdownCalculator(AgentTask):
    """``env=countdown_tool``: countdown played one operation per turn (module docstring)."""

    def __init__(self, cfg: CountdownToolEnvConfig, vocab: Vocab | None = None, max_new_tokens: int | None = None):
        puzzle = CountdownTool(cfg.n_numbers, cfg.max_number, cfg.max_target)
        super().__init__(
            cfg.id, puzzle, n_eval=cfg.n_eval, eval_seed=cfg.eval_seed, vocab=vocab, max_new_tokens=max_new_tokens
        )
        self.max_turns = cfg.max_turns

    def done(self, state: State) -> bool:
        """Solved, out of turns, or one number left (no operation to make)."""
        return super().done(state) or len(state.numbers) < 2

    def start(self, problem: Problem) -> State:
        """The state a prompt shows (a question, or a turn's prompt with its failed action)."""
        failed, mark, rest = problem.prompt.rpartition("!")
        numbers, target = CountdownTool.parse_prompt(rest)
        return State(tuple(numbers), target, failed=failed if mark else None)

    def step(self, state: State, action: str, *, truncated: bool = False) -> tuple[State, Turn]:
        """The state after ``action`` (a tool error spends the turn and changes nothing else) and the turn's record;
        ``truncated``: the action was cut at the token limit."""
        result, error, numbers = (None, "truncated", state.numbers) if truncated else _calculate(state.numbers, action)
        turn = Turn(state.prompt, action, result, error)
        if result is None:
            shown = action[: self.puzzle.max_answer_chars]
            return replace(state, turns=state.turns + 1, failed=shown), turn
        return State(numbers, state.target, state.turns + 1, solved=result == state.target), turn

    def reference_actions(self, problem: Problem) -> list[str]:
        return reference_actions(problem.answer)


class _TurnPuzzle:
    """The turns of an :class:`AgentTask`'s reference trajectories as single-turn problems (:meth:`turn_task`): the
    question drawn as the agent task draws it for training (never a held-out one), then a state on its reference
    path; correct means the reference's action."""

    def __init__(self, agent: AgentTask) -> None:
        self.agent = agent
        self.chars = agent.puzzle.chars
        self.max_prompt_chars = agent.puzzle.max_prompt_chars
        self.max_answer_chars = agent.puzzle.max_answer_chars
        self.n_distinct = agent.puzzle.n_distinct

    def draw(self, rng: np.random.Generator) -> Problem:
        """A state on a training question's reference path, with its reference action; one in four comes after a
        failed action (a recovery: the same action is still right)."""
        question = self.agent.sample(rng, 1)[0]
        _, turns = self.agent.play(question, self.agent.reference_actions(question))
        k = int(rng.integers(len(turns)))
        prompt = turns[k].prompt
        if rng.random() < RECOVERY_SHARE:
            state = self.agent.start(Problem(prompt, ""))
            missing = max(state.numbers) + 1 + int(rng.integers(9))  # never among the numbers left
            prompt = f"{state.numbers[0]}*{missing}"[: self.max_answer_chars] + "!" + prompt
        return Problem(prompt, turns[k].action)

    def correct(self, problem: Problem, completion: str) -> bool:
        return completion == problem.answer

    def well_formed(self, problem: Problem, completion: str) -> bool:
        return operate(self.agent.start(Problem(problem.prompt, "")).numbers, completion)[1] == ""
