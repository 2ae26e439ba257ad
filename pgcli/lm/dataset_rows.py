"""Your rows as demonstrations and preference pairs: the data of ``pgcli sft env=dataset`` and ``pgcli rm env=dataset``
(docs/lm.md, "Supervised fine-tuning on your rows", "A reward model on your preference pairs").

The column conventions are TRL's:

- demonstrations (:class:`DemoRows`): ``prompt`` + ``completion`` (``env.prompt_key``, ``env.completion_key``; each a
  string, or a list of messages: conversational prompt-completion), the loss on the completion only; or a
  ``messages`` conversation (``env.messages_key``), the loss on its assistant turns only
  (:mod:`pgcli.lm.conversations`). A row with a completion column is read as prompt + completion.
- preference pairs (:class:`PreferenceRows`): ``chosen`` and ``rejected`` (``env.chosen_key``,
  ``env.rejected_key``), strings or conversations, with a shared ``prompt`` column when there is one (explicit
  prompt) or without (implicit prompt: each side is the whole text). A row whose chosen equals its rejected carries
  no preference: it is counted and skipped (all of them: refused).

A string prompt with a string completion is encoded as the built-in tasks' demonstrations are (the prompt through
``vocab.encode_prompt``: BOS, or the chat template's user turn with ``model.chat_template=true``; the completion's
ids and EOS), so a built-in task exported as rows trains exactly as the task does. Anything with messages, or any
row under ``env.system_prompt`` (a system message, then the prompt as the user turn: the prompt RL on the same rows
reads, :func:`pgcli.lm.dataset_task.render_prompt`), is a conversation.

TinyGPT on rows reads a character vocabulary built from the data (:func:`rows_vocab`:
:func:`pgcli.lm.datasets.text_chars`, the rule RL on the same rows follows), or an ``init=`` model's. The rows are
read once per process (:func:`pgcli.lm.datasets.rows_of`: the checks before a run and the run share them), then
lazily from the Arrow table, a batch at a time; :func:`check_rows` (the checks before a run) encodes every row once
and refuses, in one line, what would fail later.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from pgcli.config import DatasetEnvConfig, HFModelConfig, LMModelConfig, RMConfig, SFTConfig
from pgcli.errors import ConfigError
from pgcli.lm.conversations import ASSISTANT, USER, Rendered, as_messages, render_conversation, with_system
from pgcli.lm.datasets import Splits, once, require_columns, rows_of, text_chars

if TYPE_CHECKING:
    from datasets import Dataset

    from pgcli.lm.tasks import Vocab

TextModel = LMModelConfig | HFModelConfig


@dataclass(frozen=True)
class Example:
    """One encoded row: ``ids`` with the tokens the loss is on marked (``trained``)."""

    ids: list[int]
    trained: list[bool]
    start: int
    """The first trained token: ``ids[:start]`` is the prompt of the SFT layout, the rest its completion."""
    last_start: int
    """The first token of the last trained turn: ``ids[:last_start]`` is the prompt a held-out row is asked."""
    last_end: int
    """One past the last trained token: ``ids[last_start:last_end]`` is the reference the greedy answer must match."""

    @staticmethod
    def of(rendered: Rendered) -> Example:
        """The example of a rendered conversation."""
        flags = rendered.trained
        start = flags.index(True)
        end = len(flags) - flags[::-1].index(True)
        return Example(rendered.ids, flags, start, rendered.last_start, end)

    @staticmethod
    def plain(prompt: list[int], completion: list[int]) -> Example:
        """A prompt's ids followed by its completion's (EOS included), the loss on the completion."""
        n = len(prompt)
        return Example(prompt + completion, [False] * n + [True] * len(completion), n, n, n + len(completion))

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class EncodedPair:
    """A preference row's two token sequences (prompt and response), ``chosen`` preferred."""

    chosen: list[int]
    rejected: list[int]


def rows_vocab(env: DatasetEnvConfig, splits: Splits, model: TextModel, recorded: str | None = None) -> Vocab:
    """The vocabulary a model reads the rows in: its tokenizer (``model=hf``), or TinyGPT's characters: ``recorded``
    (an ``init=`` model's: its token ids) when the rows need no other character, else the sorted characters of the
    rows' text (:func:`pgcli.lm.datasets.text_chars`, as RL on the rows reads them).

    Raises:
        ConfigError: a row holds a character outside ``recorded``.
    """
    if isinstance(model, HFModelConfig):
        from pgcli.lm.hf import load_tokenizer

        return load_tokenizer(model)
    from pgcli.lm.tasks import CharVocab

    found = text_chars(env, splits)
    if recorded is None:
        return CharVocab(found.chars)
    outside = [c for c in found.chars if c not in recorded]
    if outside:
        which, index = found.first_row[outside[0]]
        raise ConfigError(
            f"env.path={env.path}: {which} row {index} has the character {outside[0]!r}, outside the vocabulary of the "
            f"init model ({len(outside)} such character(s)); TinyGPT reads only those characters: use model=hf, or "
            "train without init="
        )
    return CharVocab(recorded)


def context_length(model: TextModel) -> int:
    """The tokens a row may have: ``model.max_len`` (TinyGPT) or the model's ``max_position_embeddings``."""
    if isinstance(model, LMModelConfig):
        return model.max_len
    import json

    from pgcli.lm.hf import resolve_model_dir

    config = json.loads((resolve_model_dir(model.path) / "config.json").read_text())
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 1 << 30  # no stated limit


# --------------------------------------------------------------------------------------------------------------------
# Demonstrations (pgcli sft)
# --------------------------------------------------------------------------------------------------------------------


class DemoRows:
    """The demonstrations of ``pgcli sft env=dataset`` (module docstring): training rows read in the order of a
    :class:`pgcli.lm.datasets.RowOrder`, held-out rows for the evaluation. The task-like attributes (``name``,
    ``vocab``) are what the policy is built from."""

    def __init__(self, env: DatasetEnvConfig, vocab: Vocab, splits: Splits) -> None:
        self.env, self.vocab, self.splits = env, vocab, splits
        self.name = env.id
        columns = splits.columns
        if env.completion_key in columns:
            require_columns(splits.train, [("env.prompt_key", env.prompt_key)], source=splits.source)
            self.mode = "completion"
        elif env.messages_key in columns:
            self.mode = "messages"
        else:
            raise ConfigError(
                f"pgcli sft env=dataset reads a completion column (env.completion_key={env.completion_key}, beside "
                f"env.prompt_key={env.prompt_key}) or a conversation column (env.messages_key={env.messages_key}); "
                f"{splits.source} has: {', '.join(columns)}"
            )

    @property
    def n_train(self) -> int:
        return len(self.splits.train)

    def train_examples(self, indices: Sequence[int]) -> list[Example]:
        """The training rows at ``indices`` (of the training split), encoded."""
        return self._examples(self.splits.train, indices, "training")

    def held_out_examples(self, n: int) -> list[Example]:
        """The first ``n`` held-out rows (all when fewer), encoded."""
        rows = self.splits.held_out
        return self._examples(rows, range(min(n, len(rows))), "held-out")

    def _examples(self, rows: Dataset, indices: Sequence[int], which: str) -> list[Example]:
        batch = rows[list(indices)]
        keys = (self.env.prompt_key, self.env.completion_key) if self.mode == "completion" else (self.env.messages_key,)
        columns = [batch[key] for key in keys]
        return [
            self.example(*values, where=f"{which} row {i}")
            for i, values in zip(indices, zip(*columns, strict=True), strict=True)
        ]

    def example(self, *values: Any, where: str) -> Example:
        """One row's example: ``(prompt, completion)`` or ``(messages,)`` as the mode reads it."""
        env = self.env
        if self.mode == "messages":
            messages = as_messages(values[0], where=f"env.messages_key={env.messages_key}, {where}")
            conversation = with_system(messages, env.system_prompt)
            return Example.of(render_conversation(self.vocab, conversation, where=f"{where} of {self.splits.source}"))
        return prompt_completion(self.vocab, env, values[0], values[1], where=where)

    def describe(self) -> str:
        """The start line's note: the rows and how they are read."""
        what = "prompt + completion" if self.mode == "completion" else "conversations (assistant turns trained)"
        return f"{self.n_train} training rows ({what}), {len(self.splits.held_out)} held out"


def as_text(value: Any) -> Any:
    """A number as its text (a csv column of numbers reads as ints or floats); anything else as it is."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def prompt_completion(vocab: Vocab, env: DatasetEnvConfig, prompt: Any, completion: Any, *, where: str) -> Example:
    """A prompt and its completion (strings: the built-in layout; messages: a conversation whose completion turns
    are trained)."""
    prompt, completion = as_text(prompt), as_text(completion)
    if isinstance(prompt, str) and isinstance(completion, str) and env.system_prompt is None:
        return Example.plain(vocab.encode_prompt(prompt), [*vocab.encode(completion), vocab.eos_id])
    asked = _turns(prompt, USER, f"env.prompt_key={env.prompt_key}, {where}")
    answer = _turns(completion, ASSISTANT, f"env.completion_key={env.completion_key}, {where}")
    conversation = with_system(asked, env.system_prompt)
    trained = [False] * len(conversation) + [m["role"] == ASSISTANT for m in answer]
    return Example.of(render_conversation(vocab, conversation + answer, trained, where=where))


def _turns(value: Any, role: str, where: str) -> list[dict[str, str]]:
    """A string as one turn of ``role``; a list as messages."""
    return [{"role": role, "content": value}] if isinstance(value, str) else as_messages(value, where=where)


# --------------------------------------------------------------------------------------------------------------------
# Preference pairs (pgcli rm)
# --------------------------------------------------------------------------------------------------------------------


class PreferenceRows:
    """The preference pairs of ``pgcli rm env=dataset`` (module docstring): rows whose chosen equals rejected are
    skipped (``n_equal`` training rows, ``n_equal_held_out`` held out)."""

    def __init__(self, env: DatasetEnvConfig, vocab: Vocab, splits: Splits) -> None:
        self.env, self.vocab, self.splits, self.name = env, vocab, splits, env.id
        keys = [("env.chosen_key", env.chosen_key), ("env.rejected_key", env.rejected_key)]
        require_columns(splits.train, keys, source=splits.source)
        self.explicit_prompt = env.prompt_key in splits.columns
        # one pass per process (the preflight's rows are the run's)
        self.train_rows, self.held_out_rows = once(
            env, splits, "distinct pairs", lambda: (self._distinct(splits.train), self._distinct(splits.held_out))
        )
        self.n_equal = len(splits.train) - len(self.train_rows)
        self.n_equal_held_out = len(splits.held_out) - len(self.held_out_rows)
        if len(self.train_rows) == 0:
            raise ConfigError(
                f"every one of the {len(splits.train)} training rows of {splits.source} has chosen equal to rejected "
                f"(env.chosen_key={env.chosen_key}, env.rejected_key={env.rejected_key}): no preference to learn"
            )
        if len(self.held_out_rows) == 0:
            raise ConfigError(
                f"every one of the {len(splits.held_out)} held-out rows has chosen equal to rejected: no held-out "
                "preference to evaluate on"
            )

    def _distinct(self, rows: Dataset) -> np.ndarray:
        """Indices of the rows whose chosen differs from rejected."""
        keep: list[int] = []
        start = 0
        for batch in rows.iter(batch_size=4096):
            chosen, rejected = batch[self.env.chosen_key], batch[self.env.rejected_key]
            keep += [start + i for i, (c, r) in enumerate(zip(chosen, rejected, strict=True)) if c != r]
            start += len(chosen)
        return np.asarray(keep, dtype=np.int64)

    @property
    def n_train(self) -> int:
        return len(self.train_rows)

    def train_pairs(self, order_indices: Sequence[int]) -> list[EncodedPair]:
        """The training pairs at positions ``order_indices`` of the distinct rows, encoded."""
        return self._pairs(self.splits.train, self.train_rows[list(order_indices)].tolist(), "training")

    def held_out_pairs(self, n: int) -> tuple[list[EncodedPair], list[dict[str, Any]]]:
        """The first ``n`` distinct held-out pairs, encoded, with their rows as they are (for the samples table)."""
        indices = self.held_out_rows[:n].tolist()
        rows = self.splits.held_out
        batch = rows[indices]
        table = [{key: batch[key][i] for key in batch} for i in range(len(indices))]
        return self._pairs(rows, indices, "held-out"), table

    def _pairs(self, rows: Dataset, indices: list[int], which: str) -> list[EncodedPair]:
        env = self.env
        batch = rows[indices]
        prompts = batch[env.prompt_key] if self.explicit_prompt else [None] * len(indices)
        return [
            self.pair(prompt, chosen, rejected, where=f"{which} row {i}")
            for i, prompt, chosen, rejected in zip(
                indices, prompts, batch[env.chosen_key], batch[env.rejected_key], strict=True
            )
        ]

    def pair(self, prompt: Any, chosen: Any, rejected: Any, *, where: str) -> EncodedPair:
        """One row's pair: each side encoded after the prompt (explicit) or alone (implicit)."""
        return EncodedPair(self.side(prompt, chosen, "chosen", where), self.side(prompt, rejected, "rejected", where))

    def side(self, prompt: Any, response: Any, which: str, where: str) -> list[int]:
        """The token ids of one side of a pair."""
        env = self.env
        key = f"env.{which}_key={getattr(env, f'{which}_key')}, {where}"
        if prompt is not None:
            return prompt_completion(self.vocab, env, prompt, response, where=key).ids
        response = as_text(response)
        if isinstance(response, str):
            text = response if env.system_prompt is None else f"{env.system_prompt}\n{response}"
            return [*self.vocab.encode_prompt(text), self.vocab.eos_id]
        messages = with_system(as_messages(response, where=key), env.system_prompt)
        return render_conversation(self.vocab, messages, where=key).ids

    def describe(self) -> str:
        """The start line's note: the pairs, and the rows skipped for chosen equal to rejected."""
        prompt = "a shared prompt" if self.explicit_prompt else "implicit prompts"
        skipped = f"; {self.n_equal} with chosen equal to rejected skipped" if self.n_equal else ""
        return f"{self.n_train} preference pairs ({prompt}){skipped}, {len(self.held_out_rows)} held out"


# --------------------------------------------------------------------------------------------------------------------
# Building them, and the checks before a run
# --------------------------------------------------------------------------------------------------------------------


def on_rows(env: object, algo: object) -> TypeGuard[DatasetEnvConfig]:
    """A ``pgcli sft`` or ``pgcli rm`` run on ``env=dataset``: it reads rows (this module), not an RL task."""
    return isinstance(env, DatasetEnvConfig) and isinstance(algo, SFTConfig | RMConfig)


def supervised_rows(
    env: DatasetEnvConfig, model: TextModel, algo: object, splits: Splits | None = None, *, recorded: str | None = None
) -> DemoRows | PreferenceRows:
    """The rows of a ``pgcli sft`` (demonstrations) or ``pgcli rm`` (preference pairs) run on ``env=dataset``
    (``recorded``: an ``init=`` TinyGPT's characters, :func:`rows_vocab`)."""
    splits = rows_of(env) if splits is None else splits
    vocab = rows_vocab(env, splits, model, recorded)
    if isinstance(algo, RMConfig):
        return PreferenceRows(env, vocab, splits)
    return DemoRows(env, vocab, splits)


def check_rows(env: DatasetEnvConfig, model: TextModel, algo: object) -> DemoRows | PreferenceRows:
    """Every row of a ``pgcli sft|rm env=dataset`` run reads as its command needs and fits the model's context
    (one line naming the first bad row, or counting the rows that are too long)."""
    if isinstance(algo, RMConfig) and algo.pairs != "checker":
        raise ConfigError(
            f"algo.pairs={algo.pairs} makes pairs from a generated task; env=dataset reads its pairs from the rows' "
            f"{env.chosen_key} and {env.rejected_key} columns: drop algo.pairs"
        )
    if isinstance(model, HFModelConfig):
        from pgcli.lm.model_files import check_hf_files

        check_hf_files(model)  # what needs no torch, first: a missing file or LoRA target
        from pgcli.lm.hf import check_hf_model

        check_hf_model(model)
    rows = supervised_rows(env, model, algo)
    limit = context_length(model)
    for split, data in (("training", rows.splits.train), ("held-out", rows.splits.held_out)):
        lengths = list(_lengths(rows, data, split))
        over = [n for n in lengths if n > limit]
        if over:
            key = "model.max_len" if isinstance(model, LMModelConfig) else "the model's max_position_embeddings"
            raise ConfigError(
                f"{len(over)} of the {len(lengths)} {split} rows of {rows.splits.source} are longer than the model's "
                f"context ({key}={limit} tokens; the longest has {max(over)}): "
                + ("raise model.max_len" if isinstance(model, LMModelConfig) else "shorten them")
                + " or drop those rows"
            )
    return rows


def _lengths(rows: DemoRows | PreferenceRows, data: Dataset, split: str) -> Iterable[int]:
    """Tokens of each row of ``data`` (a pair: its longer side), a batch at a time."""
    n = len(data)
    for start in range(0, n, 1024):
        indices = list(range(start, min(n, start + 1024)))
        if isinstance(rows, DemoRows):
            yield from (len(e) for e in rows._examples(data, indices, split))
        else:
            yield from (max(len(p.chosen), len(p.rejected)) for p in rows._pairs(data, indices, split))
