"""Your own rows as a text task (``env=dataset``; docs/lm.md, "Your data"): :class:`DatasetTask`.

The rows come from :func:`pgcli.lm.datasets.rows_of` (training and held-out rows, memory-mapped, read once). A row's
prompt (``env.prompt_key``) is a string or a list of ``{role, content}`` messages; :func:`render_prompt` turns it into
the text the policy reads:

- a string, without ``env.system_prompt`` (and without ``model.chat_template=true``): the string itself;
- otherwise a message list (``env.system_prompt`` first, a string prompt as the user turn), rendered with the model's
  chat template (``apply_chat_template(..., add_generation_prompt=True)``, its leading BOS dropped: the vocabulary
  puts BOS first) or, for TinyGPT and a tokenizer without a template, the plain rendering: one ``role: content``
  line per message, then ``assistant: ``.

Training visits the rows in a :class:`~pgcli.lm.datasets.RowOrder` seeded by the run's seed (its state travels in the
trainer's checkpoint, so a resumed run reads exactly the rows a straight run reads); ``data/epoch`` and
``data/rows_seen`` are logged. The held-out set is the first ``env.n_eval`` held-out rows (all of them when fewer).
A problem's ``columns`` are the row's columns other than the prompt: what the rewards see
(:mod:`pgcli.lm.verifiers`); ``correct`` is the verifier's judgement on ``env.answer_key``, the ``eval/accuracy``.

TinyGPT reads characters: its vocabulary is the sorted characters of the rows' text
(:func:`pgcli.lm.datasets.text_chars`: the same rule as ``pgcli sft`` and ``pgcli rm`` on the rows), recorded in the
model's ``agent.json`` (``vocab``) so that ``pgcli eval``, resume, ``init=`` and the MLflow Model use the same ids. A
completion may hold up to the longest reference (``env.answer_key`` or ``env.completion_key``, in characters) + EOS
tokens (``model.max_new_tokens`` with ``model=hf`` when set), and every prompt plus that budget must fit the model's
context.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pgcli.config import DatasetEnvConfig, HFModelConfig, LMModelConfig
from pgcli.errors import ConfigError, PgcliError
from pgcli.lm.datasets import RowOrder, Splits, is_messages, once, require_columns, rows_of, text_chars
from pgcli.lm.tasks import CharVocab, LearnedReward, Problem, Vocab

if TYPE_CHECKING:
    from datasets import Dataset

    from pgcli.lm.verifiers import RewardSet

GENERATION_PROMPT = "assistant: "
"""The plain rendering's last line: the assistant's turn begins."""
SERVING_COMPLETION = 256
"""Completion tokens of a ``model=hf`` model served from a directory that records no budget."""
PROFILE_BATCH = 1024
"""Rows read per batch while profiling (prompts rendered and measured)."""


# --------------------------------------------------------------------------------------------------------------------
# Prompts: what the policy reads
# --------------------------------------------------------------------------------------------------------------------


def as_messages(prompt: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """``prompt`` as chat messages: a string is one user turn; ``system_prompt`` goes first.

    Raises:
        ValueError: ``prompt`` is neither a string nor a list of ``{role, content}`` mappings with string values
            (the message names what it is).
    """
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif is_messages(prompt):
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise ValueError(_describe(prompt))
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def _describe(value: Any) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "an empty list" if not value else "a list whose items are not all {role, content} strings"
    return f"a {type(value).__name__} ({str(value)[:40]!r})"


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """The plain rendering of ``messages`` (TinyGPT, a tokenizer without a chat template): one ``role: content`` line
    per message, then ``assistant: ``."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + GENERATION_PROMPT


def render_prompt(
    prompt: Any, *, system_prompt: str | None = None, tokenizer: Any = None, chat_template: bool = False
) -> str:
    """The text the policy reads for a row's ``prompt`` (module docstring); encode it with the task's vocabulary
    (``encode_prompt`` puts BOS first, so a template's own leading BOS is dropped here: no double BOS).

    Args:
        prompt: a string or a list of ``{role, content}`` messages.
        system_prompt: a system message put first (``env.system_prompt``).
        tokenizer: the Hugging Face tokenizer (``model=hf``), or None (TinyGPT: the plain rendering).
        chat_template: wrap a string prompt in the chat template too (``model.chat_template=true``).

    Raises:
        ValueError: a prompt that is neither a string nor a message list.
    """
    if isinstance(prompt, str) and system_prompt is None and not chat_template:
        return prompt
    messages = as_messages(prompt, system_prompt)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return render_plain(messages)
    text: str = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    bos = getattr(tokenizer, "bos_token", None)
    return text[len(bos) :] if bos and text.startswith(bos) else text


@dataclass(frozen=True)
class Renderer:
    """:func:`render_prompt` with a task's settings: ``env.system_prompt``, the tokenizer (None: TinyGPT) and
    ``model.chat_template``."""

    system_prompt: str | None = None
    tokenizer: Any = None
    chat_template: bool = False

    def __call__(self, prompt: Any) -> str:
        return render_prompt(
            prompt, system_prompt=self.system_prompt, tokenizer=self.tokenizer, chat_template=self.chat_template
        )

    @classmethod
    def of(cls, env: DatasetEnvConfig, model: LMModelConfig | HFModelConfig, vocab: Vocab | None) -> Renderer:
        """The renderer of ``env`` for ``model`` (``vocab``: its tokenizer with ``model=hf``)."""
        chat = isinstance(model, HFModelConfig) and model.chat_template
        return cls(env.system_prompt, getattr(vocab, "tokenizer", None), chat)


def _text(value: Any) -> str:
    """A reference column's value as text (a number in a jsonl file is a number; a message list is rendered)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if is_messages(value):
        return "".join(f"{m['role']}: {m['content']}\n" for m in value)
    return str(value)


# --------------------------------------------------------------------------------------------------------------------
# The rows, profiled once per process: prompt lengths, bad prompts
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """What one pass over the rows finds (:func:`profile_rows`)."""

    prompt_tokens: dict[str, np.ndarray]
    """Prompt tokens (BOS included) of each row, by split (``train``, ``held-out``)."""
    longest_reference: int
    """The longest answer or completion, in characters (0 without such columns)."""


def rows_and_profile(env: DatasetEnvConfig, vocab: Vocab | None, render: Renderer) -> tuple[Splits, Profile]:
    """The rows of ``env`` and their :class:`Profile` in ``vocab`` (None: characters), read and profiled once per
    process (:func:`pgcli.lm.datasets.rows_of`: the preflight and the run ask for the same ones)."""
    splits = rows_of(env)
    require_columns(splits.train, [("env.prompt_key", env.prompt_key)], source=splits.source)
    what = f"profile {getattr(render.tokenizer, 'name_or_path', None)!r} {render.chat_template}"
    return splits, once(env, splits, what, lambda: profile_rows(env, splits, vocab, render))


def profile_rows(env: DatasetEnvConfig, splits: Splits, vocab: Vocab | None, render: Renderer) -> Profile:
    """Render every prompt (a bad one is a one-line ConfigError naming its row), measure each in ``vocab``'s tokens
    (None: characters + BOS), and the longest reference (answer or completion)."""
    lengths: dict[str, np.ndarray] = {}
    longest = 0
    references = [env.answer_key, env.completion_key]
    for name, rows in (("train", splits.train), ("held-out", splits.held_out)):
        counts: list[int] = []
        for start, batch in _batches(rows, [env.prompt_key, *references]):
            prompts = [
                _render_row(env, render, p, name, start + i, splits) for i, p in enumerate(batch[env.prompt_key])
            ]
            counts += _token_counts(vocab, prompts)
            for key in references:
                longest = max([longest, *(len(_text(value)) for value in batch.get(key, []))])
        lengths[name] = np.asarray(counts, dtype=np.int64)
    return Profile(lengths, longest)


def _batches(rows: Dataset, keys: list[str]) -> Iterator[tuple[int, dict[str, list[Any]]]]:
    present = [k for k in dict.fromkeys(keys) if k in rows.column_names]
    start = 0
    for batch in rows.select_columns(present).iter(batch_size=PROFILE_BATCH):
        yield start, batch
        start += len(batch[present[0]])


def _render_row(env: DatasetEnvConfig, render: Renderer, prompt: Any, name: str, index: int, splits: Splits) -> str:
    try:
        return render(prompt)
    except ValueError as exc:
        raise ConfigError(
            f"env.prompt_key={env.prompt_key}: {name} row {index} of {_where(name, env, splits)} is {exc}; a prompt "
            "is a string or a list of {role, content} messages"
        ) from None


def _where(name: str, env: DatasetEnvConfig, splits: Splits) -> str:
    return splits.source if name == "train" or env.eval_path is None else str(env.eval_path)


def _token_counts(vocab: Vocab | None, prompts: list[str]) -> list[int]:
    """Prompt tokens, BOS included, as ``vocab.encode_prompt`` makes them (batched for a Hugging Face tokenizer)."""
    tokenizer = getattr(vocab, "tokenizer", None)
    if tokenizer is None:
        return [len(p) + 1 for p in prompts]
    bos = 0 if getattr(vocab, "bos_id", None) is None else 1
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return [len(row) + bos for row in ids]


# --------------------------------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Lengths:
    """Token budgets of a dataset task."""

    max_prompt_len: int
    """The longest prompt, BOS included."""
    max_completion_len: int
    """Completion tokens the policy may generate, EOS included."""


class DatasetTask:
    """A :class:`~pgcli.lm.tasks.TextTask` over a user's rows (module docstring); ``splits`` None: a task that only
    renders and encodes prompts (the MLflow Model, ``pgcli export``, a reward model's scorer), no rows read."""

    name = "dataset"

    def __init__(
        self,
        env: DatasetEnvConfig,
        splits: Splits | None,
        *,
        vocab: Vocab,
        lengths: Lengths,
        reward_set: RewardSet | None,
        render: Renderer,
        seed: int = 0,
        chars: str | None = None,
    ) -> None:
        self.env, self.splits, self.vocab, self.reward_set = env, splits, vocab, reward_set
        self.render = render
        """A prompt (a string or a message list) as the policy reads it (:func:`render_prompt`)."""
        self.max_prompt_len, self.max_completion_len = lengths.max_prompt_len, lengths.max_completion_len
        self.chars = chars
        """TinyGPT's character vocabulary (None with a model's tokenizer)."""
        self.learned_reward: LearnedReward | None = None
        self.order = None if splits is None else RowOrder(len(splits.train), seed=seed, shuffle=env.shuffle)

    @property
    def checker(self) -> Callable[[str, str], bool] | None:
        """The verifier behind ``correct`` (``(completion, answer) -> bool``), or None: no verifier."""
        return None if self.reward_set is None else self.reward_set.checker

    @property
    def has_checker(self) -> bool:
        """Whether a verifier judges completions (no verifier: no ``eval/accuracy`` to report)."""
        return self.checker is not None

    def describe(self) -> list[str]:
        """What ``pgcli data show`` prints first: the rows, their columns, the budgets and the vocabulary."""
        splits = self._rows()
        vocabulary = f"{len(self.chars)} characters (TinyGPT)" if self.chars is not None else "the model's tokenizer"
        reward = ", ".join(self.reward_set.names) if self.reward_set is not None and self.reward_set.names else "none"
        return [
            f"rows: {len(splits.train)} to train on, {len(splits.held_out)} held out ({splits.source})",
            f"columns: {', '.join(splits.columns)} (prompt: {self.env.prompt_key}, answer: {self.env.answer_key})",
            f"tokens: prompts up to {self.max_prompt_len} (BOS included), completions up to "
            f"{self.max_completion_len} (EOS included); vocabulary: {vocabulary}",
            f"reward terms: {reward}",
        ]

    # -- rows -> problems ------------------------------------------------------------------------------------------
    def _problems(self, batch: Mapping[str, list[Any]]) -> list[Problem]:
        """The problems of a batch of rows (column -> values)."""
        key, answer = self.env.prompt_key, self.env.answer_key
        n = len(batch[key])
        rows = [{c: values[i] for c, values in batch.items()} for i in range(n)]
        return [
            Problem(
                prompt=self.render(row[key]),
                answer=_text(row.get(answer)),
                columns={c: v for c, v in row.items() if c != key},
            )
            for row in rows
        ]

    def _rows(self) -> Splits:
        if self.splits is None:
            raise PgcliError("this dataset task was built without its rows (it renders prompts only)")
        return self.splits

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """The next ``n`` training rows in the run's row order (``rng`` is unused: the order has its own seed)."""
        del rng
        splits = self._rows()
        assert self.order is not None  # built with the rows
        return self._problems(splits.train[self.order.take(n)])

    def eval_problems(self) -> list[Problem]:
        """The first ``env.n_eval`` held-out rows (all of them when there are fewer)."""
        held_out = self._rows().held_out
        return self._problems(held_out[: min(self.env.n_eval, len(held_out))])

    def data_stats(self) -> dict[str, float]:
        """``data/epoch`` (fractional: rows seen over training rows) and ``data/rows_seen``."""
        if self.order is None:
            return {}
        return {"data/epoch": self.order.rows_seen / self.order.n, "data/rows_seen": float(self.order.rows_seen)}

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the row order stands, and the vocabulary (a resumed run must read the same characters)."""
        return {"order": None if self.order is None else self.order.state_dict(), "vocab": self.chars}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the row order of :meth:`state_dict`.

        Raises:
            PgcliError: the rows' characters changed since the checkpoint (TinyGPT's ids would differ).
        """
        if state.get("vocab") != self.chars:
            raise PgcliError(
                f"env.path={self.env.path}: the rows' characters changed since the checkpoint was written "
                "(TinyGPT's vocabulary would differ); resume on the same rows"
            )
        if self.order is not None and state.get("order") is not None:
            self.order.load_state_dict(state["order"])

    # -- rewards ---------------------------------------------------------------------------------------------------
    def score(
        self, problems: Sequence[Problem], completions: Sequence[str]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """The reward of ``completions[i]`` given ``problems[i]`` and each term's values by name: a learned reward's
        scores (``env.reward=rm:<run>``), else ``env.reward``'s terms (:mod:`pgcli.lm.verifiers`)."""
        if self.reward_set is None:
            raise PgcliError("this dataset task has no reward (it renders prompts only)")
        prompts = [p.prompt for p in problems]
        totals, parts = self.reward_set.score(prompts, list(completions), [p.columns for p in problems])
        if self.learned_reward is not None:  # its terms (rm:<run>: the format term only) add to the learned score
            learned = [float(r) for r in self.learned_reward(prompts, list(completions))]
            totals = [t + r for t, r in zip(totals, learned, strict=True)]
            parts = {"learned": learned, **parts}
        return totals, parts

    def rewards(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        return self.score(problems, completions)[0]

    def reward(self, problem: Problem, completion: str) -> float:
        return self.rewards([problem], [completion])[0]

    def correct(self, problem: Problem, completion: str) -> bool:
        """The verifier's judgement on ``env.answer_key`` (False without a verifier: see :attr:`has_checker`)."""
        return self.has_checker and self.reward_set is not None and self.reward_set.correct(completion, problem.columns)

    def demonstration(self, problem: Problem) -> str:
        """The row's completion (``env.completion_key``) where it has one, else its answer."""
        completion = problem.columns.get(self.env.completion_key)
        return completion if isinstance(completion, str) else problem.answer

    def with_learned_reward(self, learned_reward: LearnedReward) -> DatasetTask:
        """This task with ``learned_reward`` as its reward (the verifier stays ``correct``); ``self`` is unchanged."""
        task = copy.copy(self)
        task.learned_reward = learned_reward
        return task


# --------------------------------------------------------------------------------------------------------------------
# Building it, and the checks before a run
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """What a model directory's ``agent.json`` records of a dataset task (:func:`recorded_fields`)."""

    vocab: str | None = None
    """TinyGPT's characters (every text run records its own: a puzzle's, or a dataset's)."""
    max_prompt_len: int | None = None
    max_completion_len: int | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> Recorded:
        """From an ``agent.json`` (None: nothing recorded)."""
        spec = spec or {}
        task = spec.get("dataset_task") or {}
        return cls(
            vocab=spec.get("vocab") or None,
            max_prompt_len=task.get("max_prompt_len"),
            max_completion_len=task.get("max_completion_len"),
        )


def recorded_vocab(task: object) -> str | None:
    """What ``agent.json`` records as ``vocab`` for ``task``: a dataset task's characters ("" with a tokenizer);
    None for a puzzle (its own characters)."""
    return (task.chars or "") if isinstance(task, DatasetTask) else None


def recorded_fields(task: object) -> dict[str, Any]:
    """The ``agent.json`` entries of ``task`` beside ``vocab``: a dataset task's token budgets (nothing for a
    puzzle), for the tasks that read no rows (:func:`make_dataset_task` with ``rows=False``)."""
    if not isinstance(task, DatasetTask):
        return {}
    return {"dataset_task": {"max_prompt_len": task.max_prompt_len, "max_completion_len": task.max_completion_len}}


def make_dataset_task(
    env: DatasetEnvConfig,
    model: LMModelConfig | HFModelConfig,
    vocab: Vocab | None,
    *,
    seed: int = 0,
    recorded: Recorded | None = None,
    rows: bool = True,
) -> DatasetTask:
    """The :class:`DatasetTask` of ``env`` for ``model`` (``vocab``: its tokenizer with ``model=hf``, None for
    TinyGPT, whose characters come from the rows or from ``recorded``, an earlier run's). ``rows=False``: read no rows
    (needs ``recorded``; the task renders and encodes prompts only).

    Raises:
        ConfigError: a bad source, column, prompt or reward, a prompt that does not fit the model's context, or a
            character outside the recorded vocabulary (one line each).
    """
    recorded = recorded or Recorded()
    render = Renderer.of(env, model, vocab)
    if not rows:
        chars = recorded.vocab
        task_vocab = vocab if vocab is not None else CharVocab(chars or "")
        lengths = _serving_lengths(model, recorded)
        return DatasetTask(env, None, vocab=task_vocab, lengths=lengths, reward_set=None, render=render, chars=chars)
    splits, profile = rows_and_profile(env, vocab, render)
    chars = None
    if vocab is None:
        chars = _char_vocabulary(env, splits, recorded.vocab)
        vocab = CharVocab(chars)
    lengths = check_lengths(env, model, splits, profile)
    reward_set = reward_set_of(env, splits.columns)
    return DatasetTask(
        env, splits, vocab=vocab, lengths=lengths, reward_set=reward_set, render=render, seed=seed, chars=chars
    )


def _serving_lengths(model: LMModelConfig | HFModelConfig, recorded: Recorded) -> Lengths:
    """The budgets a model directory records, or (a run that did not record them) half of TinyGPT's positions each;
    ``model.max_new_tokens`` (else :data:`SERVING_COMPLETION`) completion tokens with ``model=hf``."""
    if recorded.max_prompt_len is not None and recorded.max_completion_len is not None:
        return Lengths(recorded.max_prompt_len, recorded.max_completion_len)
    if isinstance(model, HFModelConfig):
        return Lengths(0, model.max_new_tokens or SERVING_COMPLETION)
    return Lengths(model.max_len - model.max_len // 2, model.max_len // 2)


def reward_set_of(env: DatasetEnvConfig, columns: Sequence[str]) -> RewardSet:
    """``env.reward`` as a :class:`~pgcli.lm.verifiers.RewardSet` over ``columns`` (a learned reward, ``rm:<run>``,
    is attached later: it needs the device; its checker is ``exact`` on ``env.answer_key`` when the rows have it)."""
    from pgcli.lm.verifiers import build_rewards

    return build_rewards(
        env.reward,
        answer_key=env.answer_key,
        columns=list(columns),
        format_pattern=env.format_pattern,
        format_weight=env.format_reward,
    )


def _char_vocabulary(env: DatasetEnvConfig, splits: Splits, recorded: str | None) -> str:
    """TinyGPT's characters: the rows' (:func:`pgcli.lm.datasets.text_chars`), or ``recorded`` (an earlier run's) when
    every row's character is in it."""
    found = text_chars(env, splits)
    if recorded is None:
        return found.chars
    outside = [c for c in found.chars if c not in recorded]
    if outside:
        which, index = found.first_row[outside[0]]
        raise ConfigError(
            f"env.path={env.path}: {which} row {index} has the character {outside[0]!r}, outside the vocabulary the "
            f"model was trained with ({len(outside)} such character(s)); TinyGPT reads only those characters: use "
            "the rows it was trained on, or model=hf"
        )
    return recorded


def check_lengths(
    env: DatasetEnvConfig, model: LMModelConfig | HFModelConfig, splits: Splits, profile: Profile
) -> Lengths:
    """The task's token budgets, once every prompt plus the completion budget fits the model's context: a completion
    holds up to the longest reference + EOS (``model.max_new_tokens`` with ``model=hf`` when set; TinyGPT without a
    reference column: the rest of ``model.max_len``).

    Raises:
        ConfigError: how many rows are too long, the longest, and the fix (one line).
    """
    longest_prompt = max(int(v.max()) for v in profile.prompt_tokens.values())
    reference = profile.longest_reference + 1 if profile.longest_reference else None
    if isinstance(model, HFModelConfig):
        budget = model.max_new_tokens or reference
        if budget is None:
            raise ConfigError(
                f"model.max_new_tokens: the rows of {splits.source} have no {env.answer_key!r} or "
                f"{env.completion_key!r} column to bound a completion; set model.max_new_tokens"
            )
        context, option, fix = (
            _hf_context(model),
            f"the context of model.path={model.path}",
            "lower model.max_new_tokens",
        )
    else:
        budget = reference or max(1, model.max_len - longest_prompt)
        context, option = model.max_len, f"model.max_len={model.max_len}"
        fix = f"set model.max_len={longest_prompt + budget} or more"
    if context is not None and longest_prompt + budget > context:
        too_long = {name: np.flatnonzero(v + budget > context) for name, v in profile.prompt_tokens.items()}
        n = sum(len(v) for v in too_long.values())
        name = "train" if len(too_long["train"]) else "held-out"
        row = int(too_long[name][np.argmax(profile.prompt_tokens[name][too_long[name]])])
        total = len(splits.train) + len(splits.held_out)
        raise ConfigError(
            f"env.path={env.path}: {n} of {total} rows have a prompt longer than {option} leaves after a completion "
            f"budget of {budget} tokens ({context - budget} prompt tokens); the longest is {longest_prompt} tokens "
            f"({name} row {row}); {fix}, or drop those rows"
        )
    return Lengths(longest_prompt, budget)


def _hf_context(model: HFModelConfig) -> int | None:
    """The positions of the Hugging Face model (``max_position_embeddings``; None when its config has none)."""
    from transformers import AutoConfig

    from pgcli.lm.hf import resolve_model_dir

    try:
        config = AutoConfig.from_pretrained(resolve_model_dir(model.path))
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None
