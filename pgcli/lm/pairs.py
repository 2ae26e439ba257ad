"""Preference pairs generated from a text task, the data of a reward model (``pgcli rm``; docs/lm.md, "Reward models:
`pgcli rm`").

A pair is a prompt with two completions, the preferred one first: (x, y_chosen, y_rejected). The task's checker is
the annotator, so every label is known to be right before noise is added:

- ``checker`` pairs: chosen is correct (the reference answer; on countdown the reference or any other verified
  expression over the given numbers), rejected is a wrong one close to it: the answer with one digit changed,
  dropped or added (addition, sort), or a wrong but well-formed expression (countdown: one operator changed, or the
  numbers in another order with other operators);
- ``partial`` pairs: both completions wrong, the one with more partial credit chosen (addition: the smaller distance
  |value - answer|; sort: more digits in the right place; countdown: the smaller distance |value - target|);
- ``policy`` pairs (the comparisons of InstructGPT's reward model, Ouyang et al., 2022: outputs of the SFT model):
  rejected is the first wrong one among k samples of the init policy (``init=``) at its temperature, so the reward
  model learns to rank the mistakes RL will make; chosen is, half the time, the first correct one among those samples
  when there is one, else the checker's correct completion (the reference; countdown: the reference or another
  verified expression). On addition and sort a correct sample is the reference itself; on countdown the policy's
  own correct expressions are ranked too. A prompt with no wrong sample among the k falls back to the checker's wrong
  completion (``Pair.from_policy`` False; its share is logged as ``*/policy_pair_fallback_frac``).

Label noise p flips each training pair (chosen and rejected swapped, ``Pair.flipped``) with probability p. Held-out
pairs come from the task's held-out problems only (never sampled for training), one clean pair per problem, drawn
with the same seed (``env.eval_seed``) by every run, so their pairwise accuracy compares runs like with like.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from pgcli.errors import ConfigError
from pgcli.lm.arithmetic import evaluate_expression
from pgcli.lm.tasks import DIGITS, Addition, Countdown, Problem, Sort, Task

PAIR_KINDS = ("checker", "partial", "policy")
"""How a pair is made (``algo.pairs``; module docstring)."""
MAX_TRIES = 64
"""Draws of a candidate completion before a problem is declared to have none of the kind asked for."""


@dataclass(frozen=True)
class Pair:
    """A prompt and two completions, ``chosen`` labelled better than ``rejected``."""

    problem: Problem
    chosen: str
    rejected: str
    flipped: bool = False
    """Label noise swapped the two: ``chosen`` is the worse completion."""
    from_policy: bool = False
    """The wrong completion is a sample of the init policy (``policy`` pairs; False where the checker's stood in)."""


class PolicySamples(Protocol):
    """k completions of each problem sampled from the init policy, their randomness drawn from ``rng`` (so pairs are
    reproducible from the pair RNG and resume exactly): ``[len(problems)][k]`` texts."""

    def __call__(self, problems: Sequence[Problem], rng: np.random.Generator) -> list[list[str]]: ...


class Completions(Protocol):
    """How a puzzle family's correct and wrong completions are drawn, and how close a wrong one is."""

    def correct(self, problem: Problem, rng: np.random.Generator) -> str: ...

    def wrong(self, problem: Problem, rng: np.random.Generator) -> str: ...

    def credit(self, problem: Problem, completion: str) -> float:
        """Partial credit of a wrong completion: higher is closer to correct."""
        ...


class DigitAnswers:
    """Addition and sort: the answer is a digit string; a wrong one is the answer with one digit changed, dropped or
    added (never longer than the longest answer, so it fits the model as the answer does)."""

    def __init__(self, task: Task, max_chars: int, credit: Callable[[Problem, str], float]) -> None:
        self.task, self.max_chars, self._credit = task, max_chars, credit

    def correct(self, problem: Problem, rng: np.random.Generator) -> str:
        return problem.answer

    def wrong(self, problem: Problem, rng: np.random.Generator) -> str:
        return _draw(
            lambda: perturb_digits(problem.answer, rng, self.max_chars),
            lambda c: not self.task.correct(problem, c),
            problem,
        )

    def credit(self, problem: Problem, completion: str) -> float:
        return self._credit(problem, completion)


def perturb_digits(answer: str, rng: np.random.Generator, max_chars: int) -> str:
    """``answer`` with one digit changed, dropped (when it has two or more) or added (when shorter than
    ``max_chars``), each edit equally likely among those allowed."""
    edits = ["change"] + (["drop"] if len(answer) > 1 else []) + (["add"] if len(answer) < max_chars else [])
    edit = edits[int(rng.integers(len(edits)))]
    if edit == "drop":
        i = int(rng.integers(len(answer)))
        return answer[:i] + answer[i + 1 :]
    if edit == "add":
        i = int(rng.integers(len(answer) + 1))
        return answer[:i] + DIGITS[int(rng.integers(10))] + answer[i:]
    i = int(rng.integers(len(answer)))
    others = DIGITS.replace(answer[i], "")
    return answer[:i] + others[int(rng.integers(len(others)))] + answer[i + 1 :]


def addition_credit(problem: Problem, completion: str) -> float:
    """Minus the distance between the completion's value and the answer (0 for the answer itself)."""
    return -abs(int(completion) - int(problem.answer)) if completion.isdigit() else -float("inf")


def sort_credit(problem: Problem, completion: str) -> float:
    """Digits in the right place, minus the difference in length."""
    same = sum(a == b for a, b in zip(problem.answer, completion, strict=False))
    return float(same - abs(len(problem.answer) - len(completion)))


class Expressions:
    """Countdown: correct completions are verified expressions over the given numbers; a wrong one is well formed (it
    parses and uses only given numbers) and misses the target."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def correct(self, problem: Problem, rng: np.random.Generator) -> str:
        """The reference or, half the time, another verified expression over the same numbers when one is found."""
        if rng.random() < 0.5:
            numbers, _ = Countdown.parse_prompt(problem.prompt)
            for _ in range(MAX_TRIES // 4):
                candidate = random_expression(numbers, rng)
                if self.task.correct(problem, candidate):
                    return candidate
        return problem.answer

    def wrong(self, problem: Problem, rng: np.random.Generator) -> str:
        """The reference with one operator changed (half the time) or a random expression over the numbers."""
        numbers, _ = Countdown.parse_prompt(problem.prompt)

        def candidate() -> str:
            return change_operator(problem.answer, rng) if rng.random() < 0.5 else random_expression(numbers, rng)

        def ok(c: str) -> bool:
            return self.task.well_formed(problem, c) and not self.task.correct(problem, c)

        return _draw(candidate, ok, problem)

    def credit(self, problem: Problem, completion: str) -> float:
        _, target = Countdown.parse_prompt(problem.prompt)
        value = evaluate_expression(completion)
        return -float("inf") if value is None else -abs(value - target)


def random_expression(numbers: list[int], rng: np.random.Generator) -> str:
    """Every number once, in a random order, joined by random operators (usual precedence, no brackets)."""
    order = [numbers[i] for i in rng.permutation(len(numbers))]
    ops = [Countdown.OPS[int(i)] for i in rng.integers(0, len(Countdown.OPS), size=len(numbers) - 1)]
    return str(order[0]) + "".join(op + str(x) for op, x in zip(ops, order[1:], strict=True))


def change_operator(expr: str, rng: np.random.Generator) -> str:
    """``expr`` with one of its ``+ - *`` replaced by another (``expr`` itself when it has none)."""
    at = [i for i, c in enumerate(expr) if c in Countdown.OPS]
    if not at:
        return expr
    i = at[int(rng.integers(len(at)))]
    others = Countdown.OPS.replace(expr[i], "")
    return expr[:i] + others[int(rng.integers(len(others)))] + expr[i + 1 :]


def _draw(candidate: Callable[[], str], ok: Callable[[str], bool], problem: Problem) -> str:
    for _ in range(MAX_TRIES):
        text = candidate()
        if ok(text):
            return text
    raise ConfigError(
        f"no wrong completion found for prompt {problem.prompt!r} in {MAX_TRIES} draws; the task is "
        "too small for preference pairs (raise env.n_digits or env.n_numbers)"
    )


def completions_of(task: Task) -> Completions:
    """The completion drawer of ``task``'s puzzle family."""
    puzzle = task.puzzle
    if isinstance(puzzle, Addition):
        return DigitAnswers(task, puzzle.max_answer_chars, addition_credit)
    if isinstance(puzzle, Sort):
        return DigitAnswers(task, puzzle.max_answer_chars, sort_credit)
    if isinstance(puzzle, Countdown):
        return Expressions(task)
    raise ConfigError(f"no preference pairs for env={task.name}")


class PairGenerator:
    """Preference pairs of ``task`` (module docstring): ``sample`` for training, ``eval_pairs`` held out.
    ``policy_samples`` draws the init policy's completions of ``policy`` pairs."""

    def __init__(
        self,
        task: Task,
        kind: str = "checker",
        label_noise: float = 0.0,
        policy_samples: PolicySamples | None = None,
    ) -> None:
        if kind not in PAIR_KINDS:
            raise ConfigError(f"algo.pairs must be one of {', '.join(PAIR_KINDS)} (got {kind!r})")
        if kind == "policy" and policy_samples is None:
            raise ValueError("policy pairs are made of the init policy's samples: pass policy_samples")
        self.task, self.kind, self.label_noise, self.policy_samples = task, kind, label_noise, policy_samples
        self.completions = completions_of(task)

    def pair(self, problem: Problem, rng: np.random.Generator) -> Pair:
        """One clean ``checker`` or ``partial`` pair for ``problem`` (chosen is the better completion)."""
        draw = self.completions
        if self.kind != "partial":
            return Pair(problem, draw.correct(problem, rng), draw.wrong(problem, rng))
        first = draw.wrong(problem, rng)
        for _ in range(MAX_TRIES):
            second = draw.wrong(problem, rng)
            a, b = draw.credit(problem, first), draw.credit(problem, second)
            if a != b:
                return Pair(problem, first, second) if a > b else Pair(problem, second, first)
        raise ConfigError(
            f"algo.pairs=partial: no two wrong completions of {problem.prompt!r} with different "
            f"partial credit in {MAX_TRIES} draws; use algo.pairs=checker"
        )

    def pairs(self, problems: Sequence[Problem], rng: np.random.Generator) -> list[Pair]:
        """One clean pair per problem; ``policy`` pairs sample the init policy for all of them at once."""
        if self.kind != "policy":
            return [self.pair(problem, rng) for problem in problems]
        assert self.policy_samples is not None  # __init__
        out = []
        for problem, samples in zip(problems, self.policy_samples(problems, rng), strict=True):
            right = [s for s in samples if self.task.correct(problem, s)]
            wrong = [s for s in samples if not self.task.correct(problem, s)]
            chosen = right[0] if right and rng.random() < 0.5 else self.completions.correct(problem, rng)
            rejected = wrong[0] if wrong else self.completions.wrong(problem, rng)
            out.append(Pair(problem, chosen, rejected, from_policy=bool(wrong)))
        return out

    def sample(self, rng: np.random.Generator, n: int) -> list[Pair]:
        """``n`` training pairs (training problems only), each label flipped with probability ``label_noise``."""
        pairs = self.pairs(self.task.sample(rng, n), rng)
        flips = rng.random(n) < self.label_noise
        return [
            replace(p, chosen=p.rejected, rejected=p.chosen, flipped=True) if flip else p
            for p, flip in zip(pairs, flips, strict=True)
        ]

    def eval_pairs(self, seed: int) -> list[Pair]:
        """One clean pair per held-out problem, the completions drawn from ``seed`` (the same pairs for every run)."""
        return self.pairs(self.task.eval_problems(), np.random.default_rng(seed))


def fallback_frac(pairs: Sequence[Pair]) -> float:
    """Share of ``pairs`` whose wrong completion is the checker's, not the init policy's (``policy`` pairs)."""
    return float(np.mean([not p.from_policy for p in pairs])) if pairs else 0.0
