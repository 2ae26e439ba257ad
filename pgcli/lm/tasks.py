"""Text tasks with verifiable rewards, generated on the fly (docs/lm.md, "Tasks (`env=...`)"): nothing is downloaded.

Each task is a puzzle family with a character vocabulary, a seeded problem generator, a checker and a reference
solution (the supervised demonstration):

- ``addition``:  ``"123+45="`` -> ``"168"``; operands uniform in ``[0, 10**n_digits)``; exact match.
- ``sort``:      ``"3912="`` -> ``"1239"``; ``n_digits`` random digits, sorted ascending; exact match.
- ``countdown``: ``"3,5,7>22="`` -> ``"3*5+7"``; reach the target with the given numbers (each at most once) and
  ``+ - *`` (parentheses allowed); verified by evaluating the expression, so every correct expression counts, not
  only the reference one.

A prompt is ``BOS + prompt characters``; a completion is the answer's characters followed by ``EOS`` (with
``model=hf`` the same strings in the model's tokenizer: :class:`Vocab`). The held-out
evaluation set (``eval_problems``) is drawn once from ``eval_seed`` and never returned by ``sample``: training prompts
are rejection-sampled against it, so accuracy is measured on prompts the policy never trained on.

Reward = ``reward_fn(problem, completion)`` + ``format_reward`` * [the completion is well formed], where
``reward_fn`` is 1.0 for a correct completion and 0.0 otherwise unless ``env.reward`` names another function
``(problem, completion) -> float`` with ``_target_`` (extra keys are passed to it as keyword arguments), or a reward
model's score (``env.reward=rm:<run>``: a :class:`LearnedReward` scores a batch of strings, docs/lm.md, "RL on a
learned reward"). ``correct`` stays the task's checker: the gold beside any learned reward. With a format reward the
two terms are logged apart (``score``: ``rollout/reward/task`` and ``rollout/reward/format``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pgcli.config import AdditionEnvConfig, CountdownEnvConfig, CountdownToolEnvConfig, SortEnvConfig, TextEnvConfig
from pgcli.errors import ConfigError
from pgcli.lm.arithmetic import evaluate_expression, uses_given_numbers

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from pgcli.lm.model import CausalLM, Generation

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class CharVocab:
    """Character vocabulary: PAD=0, BOS=1, EOS=2, then the task's characters in the order given."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"duplicate characters in vocabulary {chars!r}")
        self.chars = chars
        self._ids = {c: i + 3 for i, c in enumerate(chars)}
        self.size = len(chars) + 3

    def encode(self, text: str) -> list[int]:
        """Character ids of ``text`` (no BOS/EOS added); a character outside the vocabulary is a ValueError."""
        try:
            return [self._ids[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary {self.chars!r}") from None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end a completion (included in it): EOS."""
        return (self.eos_id,)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids: BOS, then the characters."""
        return [self.bos_id, *self.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``: stops at the first EOS, skips PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i >= 3:
                out.append(self.chars[i - 3])
        return "".join(out)


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer (the text a correct completion matches or a reference solution)."""

    prompt: str
    answer: str
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """A dataset row's columns other than the prompt (``env=dataset``: what the rewards see); empty for a puzzle."""


class Vocab(Protocol):
    """How text becomes token ids and back: :class:`CharVocab` (TinyGPT) or a model's tokenizer
    (:class:`pgcli.lm.hf.HFTokenizer`)."""

    pad_id: int
    eos_id: int
    size: int

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end a completion (EOS first)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TextTask(Protocol):
    """What trainers, the evaluator and SFT need from a task (see the module docstring)."""

    name: str
    vocab: Vocab
    max_prompt_len: int
    """Prompt tokens, BOS included."""
    max_completion_len: int
    """Completion tokens the policy may generate, EOS included (``max_new_tokens`` of generation)."""

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]: ...

    def eval_problems(self) -> list[Problem]: ...

    def reward(self, problem: Problem, completion: str) -> float: ...

    def rewards(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]: ...

    def score(
        self, problems: Sequence[Problem], completions: Sequence[str]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """The rewards and, for a reward of several terms, each term's unweighted values by name (empty for one)."""
        ...

    def correct(self, problem: Problem, completion: str) -> bool: ...

    def demonstration(self, problem: Problem) -> str: ...


# --------------------------------------------------------------------------------------------------------------------
# Puzzle families: how a problem is drawn and checked
# --------------------------------------------------------------------------------------------------------------------


class Puzzle(Protocol):
    chars: str
    max_prompt_chars: int
    max_answer_chars: int
    n_distinct: int
    """How many distinct prompts exist (bounds the held-out set)."""

    def draw(self, rng: np.random.Generator) -> Problem: ...

    def correct(self, problem: Problem, completion: str) -> bool: ...

    def well_formed(self, problem: Problem, completion: str) -> bool: ...


DIGITS = "0123456789"


class Addition:
    """``a+b=`` -> ``a + b`` in decimal, a and b uniform in ``[0, 10**n_digits)``."""

    chars = DIGITS + "+="

    def __init__(self, n_digits: int) -> None:
        self.n_digits = n_digits
        self.max_prompt_chars = 2 * n_digits + 2
        self.max_answer_chars = n_digits + 1
        self.n_distinct = 10 ** (2 * n_digits)

    def draw(self, rng: np.random.Generator) -> Problem:
        a, b = (int(x) for x in rng.integers(0, 10**self.n_digits, size=2))
        return Problem(f"{a}+{b}=", str(a + b))

    def correct(self, problem: Problem, completion: str) -> bool:
        return completion == problem.answer

    def well_formed(self, problem: Problem, completion: str) -> bool:
        return 0 < len(completion) <= self.max_answer_chars and completion.isdigit()


class Sort:
    """``3912=`` -> ``1239``: ``n_digits`` random digits in ascending order."""

    chars = DIGITS + "="

    def __init__(self, n_digits: int) -> None:
        self.n_digits = n_digits
        self.max_prompt_chars = n_digits + 1
        self.max_answer_chars = n_digits
        self.n_distinct = 10**n_digits

    def draw(self, rng: np.random.Generator) -> Problem:
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, size=self.n_digits))
        return Problem(f"{digits}=", "".join(sorted(digits)))

    def correct(self, problem: Problem, completion: str) -> bool:
        return completion == problem.answer

    def well_formed(self, problem: Problem, completion: str) -> bool:
        return len(completion) == self.n_digits and completion.isdigit()


class Countdown:
    """``3,5,7>22=`` -> an expression over the given numbers (each at most once) with ``+ - *`` and parentheses whose
    value is the target. The problem is drawn from a random expression over all ``n_numbers`` numbers (in random
    order, with random operators, usual precedence) with a value in ``[0, max_target]``; that expression is the
    reference solution."""

    chars = DIGITS + ",>=+-*()"
    OPS = "+-*"

    def __init__(self, n_numbers: int, max_number: int, max_target: int) -> None:
        self.n_numbers, self.max_number, self.max_target = n_numbers, max_number, max_target
        width = len(str(max_number))
        self.max_prompt_chars = n_numbers * (width + 1) + len(str(max_target)) + 1
        self.max_answer_chars = n_numbers * (width + 1) - 1 + 2  # the reference, plus room for one pair of brackets
        self.n_distinct = max_number**n_numbers  # a lower bound: orders and targets vary too

    def draw(self, rng: np.random.Generator) -> Problem:
        while True:
            numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.n_numbers)]
            order = [numbers[i] for i in rng.permutation(self.n_numbers)]
            ops = [self.OPS[int(i)] for i in rng.integers(0, len(self.OPS), size=self.n_numbers - 1)]
            expr = str(order[0]) + "".join(op + str(x) for op, x in zip(ops, order[1:], strict=True))
            value = evaluate_expression(expr)
            if value is not None and 0 <= value <= self.max_target:
                return Problem(f"{','.join(map(str, numbers))}>{value}=", expr)

    @staticmethod
    def parse_prompt(prompt: str) -> tuple[list[int], int]:
        """The numbers and the target of a countdown prompt ``"3,5,7>22="``."""
        numbers, _, target = prompt.rstrip("=").partition(">")
        return [int(x) for x in numbers.split(",")], int(target)

    def correct(self, problem: Problem, completion: str) -> bool:
        numbers, target = self.parse_prompt(problem.prompt)
        return uses_given_numbers(completion, numbers) and evaluate_expression(completion) == target

    def well_formed(self, problem: Problem, completion: str) -> bool:
        numbers, _ = self.parse_prompt(problem.prompt)
        return uses_given_numbers(completion, numbers) and evaluate_expression(completion) is not None


class CountdownTool(Countdown):
    """The questions of the multi-turn ``countdown_tool`` (:mod:`pgcli.lm.agent` plays them): countdown's problems,
    with the sizes of a turn. A turn's prompt is a state (``7,15>22=``: the numbers left), after a tool error led by
    the failed action and ``!`` (``3*9!3,5,7>22=``); its completion is one operation (``3*5``). An operation's result
    has at most as many digits as its operands together, so the numbers of a state hold at most the question's digits
    and so does one operation."""

    chars = Countdown.chars + "!"

    def __init__(self, n_numbers: int, max_number: int, max_target: int) -> None:
        super().__init__(n_numbers, max_number, max_target)
        digits = n_numbers * len(str(max_number))
        self.max_answer_chars = digits + 1  # one operation: both operands' digits and the operator
        # the failed action (cut to an answer's length) and "!", the numbers, their commas, ">", the target, "="
        self.max_prompt_chars = self.max_answer_chars + 1 + digits + n_numbers + len(str(max_target)) + 1


# --------------------------------------------------------------------------------------------------------------------
# A task: a puzzle + its held-out set + the reward
# --------------------------------------------------------------------------------------------------------------------

RewardFn = Callable[[Problem, str], float]


class LearnedReward(Protocol):
    """A reward model's scores of completions given their prompts, one batch at a time (``env.reward=rm:<run>``)."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> Iterable[float]: ...


class Task:
    """A :class:`TextTask` over a :class:`Puzzle` (see the module docstring for sampling, held-out set and reward)."""

    def __init__(
        self,
        name: str,
        puzzle: Puzzle,
        *,
        n_eval: int,
        eval_seed: int,
        reward_fn: RewardFn | None = None,
        format_reward: float = 0.0,
        vocab: Vocab | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if n_eval > puzzle.n_distinct // 2:
            raise ConfigError(
                f"env.n_eval must be <= half of the {puzzle.n_distinct} distinct {name} prompts (got {n_eval}); "
                "lower env.n_eval or make the task larger"
            )
        self.name, self.puzzle = name, puzzle
        self.vocab: Vocab = vocab or CharVocab(puzzle.chars)
        self.max_prompt_len = puzzle.max_prompt_chars + 1  # BOS
        # a subword token holds at least one character: the longest answer + EOS bounds every tokenizer's count
        self.max_completion_len = max_new_tokens or puzzle.max_answer_chars + 1
        self.reward_fn, self.format_reward = reward_fn, format_reward
        self.learned_reward: LearnedReward | None = None
        self._eval = self._draw_unique(np.random.default_rng(eval_seed), n_eval)
        self._eval_prompts = frozenset(p.prompt for p in self._eval)

    def _draw_unique(self, rng: np.random.Generator, n: int) -> list[Problem]:
        seen: dict[str, Problem] = {}
        while len(seen) < n:
            problem = self.puzzle.draw(rng)
            seen.setdefault(problem.prompt, problem)
        return list(seen.values())

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems (repeats possible), none of whose prompts is in the held-out set."""
        out: list[Problem] = []
        while len(out) < n:
            problem = self.puzzle.draw(rng)
            if problem.prompt not in self._eval_prompts:
                out.append(problem)
        return out

    def eval_problems(self) -> list[Problem]:
        """The fixed held-out set (the same for every run with the same ``eval_seed``)."""
        return list(self._eval)

    def correct(self, problem: Problem, completion: str) -> bool:
        return self.puzzle.correct(problem, completion)

    def well_formed(self, problem: Problem, completion: str) -> bool:
        return self.puzzle.well_formed(problem, completion)

    def reward(self, problem: Problem, completion: str) -> float:
        return self.rewards([problem], [completion])[0]

    def rewards(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        """The reward of ``completions[i]`` given ``problems[i]`` (module docstring); a learned reward scores them all
        in one call (batched on its device)."""
        return self.score(problems, completions)[0]

    def score(
        self, problems: Sequence[Problem], completions: Sequence[str]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """:meth:`rewards` and its terms: with ``format_reward`` > 0, ``task`` (the checker, function or learned
        reward) and ``format`` (1.0 when well formed), unweighted; no terms otherwise."""
        pairs = list(zip(problems, completions, strict=True))
        if self.learned_reward is not None:
            base = [float(r) for r in self.learned_reward([p.prompt for p, _ in pairs], [c for _, c in pairs])]
        elif self.reward_fn is not None:
            base = [self.reward_fn(p, c) for p, c in pairs]
        else:
            base = [float(self.correct(p, c)) for p, c in pairs]
        if not self.format_reward:
            return [float(b) for b in base], {}
        formed = [float(self.well_formed(p, c)) for p, c in pairs]
        totals = [float(b + self.format_reward * f) for b, f in zip(base, formed, strict=True)]
        return totals, {"task": [float(b) for b in base], "format": formed}

    def with_learned_reward(self, learned_reward: LearnedReward) -> Task:
        """This task with ``learned_reward`` as its reward (the checker stays ``correct``); ``self`` is unchanged."""
        task = copy.copy(self)
        task.learned_reward = learned_reward
        return task

    def demonstration(self, problem: Problem) -> str:
        return problem.answer


def resolve_reward(spec: Mapping[str, Any] | str | None) -> RewardFn | None:
    """The function ``env.reward`` names (``{_target_: module.fn, **kwargs}``), or None for the checker (``{}``) or a
    reward model (``rm:<run>``: :mod:`pgcli.lm.learned_reward` loads it where the run has its device).

    Raises:
        ConfigError: no ``_target_``, or it does not import, or it is not callable.
    """
    if not spec or isinstance(spec, str):
        return None
    spec = dict(spec)
    target = spec.pop("_target_", None)
    if not isinstance(target, str):
        raise ConfigError("env.reward must be {_target_: module.function, ...} (got no _target_)")
    from pgcli.envs.spec import resolve_target  # gymnasium's: not for a task whose reward is built in

    try:
        fn = resolve_target(target)
    except ImportError as exc:
        raise ConfigError(f"env.reward._target_ {target!r}: {exc}") from None
    if not callable(fn):
        raise ConfigError(f"env.reward._target_ {target!r} is not callable (got {type(fn).__name__})")
    return functools.partial(fn, **spec) if spec else fn


def make_puzzle(cfg: TextEnvConfig) -> Puzzle:
    """The puzzle family of a text env config."""
    if isinstance(cfg, AdditionEnvConfig):
        return Addition(cfg.n_digits)
    if isinstance(cfg, SortEnvConfig):
        return Sort(cfg.n_digits)
    if isinstance(cfg, CountdownEnvConfig):
        return Countdown(cfg.n_numbers, cfg.max_number, cfg.max_target)
    if isinstance(cfg, CountdownToolEnvConfig):
        return CountdownTool(cfg.n_numbers, cfg.max_number, cfg.max_target)
    raise ConfigError(f"no text task for {type(cfg).__name__}")


def make_task(cfg: TextEnvConfig, vocab: Vocab | None = None, max_new_tokens: int | None = None) -> Task:
    """The :class:`TextTask` of a text env config (``env=addition|sort|countdown``), in the task's character
    vocabulary unless a model's tokenizer is given (``max_new_tokens``: the completion budget, None for the task's
    longest answer + EOS)."""
    return Task(
        cfg.id,
        make_puzzle(cfg),
        n_eval=cfg.n_eval,
        eval_seed=cfg.eval_seed,
        reward_fn=resolve_reward(cfg.reward),
        format_reward=cfg.format_reward,
        vocab=vocab,
        max_new_tokens=max_new_tokens,
    )


def encode_prompts(
    vocab: Vocab, problems: Sequence[Problem], device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Each problem's prompt ids (``vocab.encode_prompt``: BOS + prompt), left-padded with PAD to the longest:
    tokens [B, P] long, mask [B, P] bool (True on real tokens)."""
    import torch

    rows = [vocab.encode_prompt(p.prompt) for p in problems]
    width = max(len(r) for r in rows)
    # whole rows in one tensor call each (per-row slice writes cost milliseconds per RL batch on a CPU)
    tokens = torch.tensor([[*[vocab.pad_id] * (width - len(r)), *r] for r in rows], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows], dtype=torch.bool)
    return tokens.to(device), mask.to(device)


def encode_completions(
    vocab: Vocab, texts: Sequence[str], width: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """``text + EOS`` of each completion, right-padded with PAD to ``width`` (cut there): tokens [B, C] long, mask
    [B, C] bool (True up to and including EOS). The layout of :func:`pgcli.lm.model.generate`'s output."""
    import torch

    tokens = torch.full((len(texts), width), vocab.pad_id, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.bool)
    for i, text in enumerate(texts):
        row = [*vocab.encode(text), vocab.eos_id][:width]
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    return tokens.to(device), mask.to(device)


def decode_completions(vocab: Vocab, tokens: Tensor) -> list[str]:
    """Text of each row of a completion tensor [B, C] (up to EOS)."""
    return [vocab.decode(row) for row in tokens.tolist()]


def generate_for_task(
    task: TextTask,
    policy: CausalLM,
    problems: Sequence[Problem],
    device: torch.device | str = "cpu",
    *,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Generation]:
    """One completion of each problem's prompt within the task's length and stop tokens
    (:func:`pgcli.lm.model.generate`): the prompt tokens [B, P], their mask [B, P] and the :class:`Generation`."""
    from pgcli.lm.model import generate

    prompt_tokens, prompt_mask = encode_prompts(task.vocab, problems, device)
    out = generate(
        policy,
        prompt_tokens,
        prompt_mask,
        max_new_tokens=task.max_completion_len,
        eos_id=task.vocab.stop_ids,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        pad_id=task.vocab.pad_id,
    )
    return prompt_tokens, prompt_mask, out
