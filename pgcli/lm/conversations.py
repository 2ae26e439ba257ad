"""Conversations as token ids with the trained tokens marked (``pgcli sft`` / ``pgcli rm`` on ``env=dataset``;
docs/lm.md, "Supervised fine-tuning on your rows").

A conversation is a list of ``{role, content}`` messages (TRL's conversational format). It is rendered turn by turn,
and each turn's tokens are marked as trained (by default: the assistant turns) or not, so the SFT loss is on the
assistant tokens only:

- ``model=hf`` with a chat template: the template renders every prefix of the conversation, each assistant turn
  after ``add_generation_prompt=True`` (what the model sees before it answers), and a turn's text is the difference
  between consecutive prefixes: the assistant segment is ``template(m[:k+1])`` minus ``template(m[:k], generation
  prompt)`` (its content and the template's end-of-turn text). This is TRL's assistant-only loss for templates
  without ``{% generation %}`` markers, done prefix by prefix; a template that rewrites earlier turns (one that drops
  past reasoning) is refused in one line.
- TinyGPT, or a tokenizer without a chat template: a plain rendering, BOS (where the vocabulary has one), then each
  turn as ``role: content`` and a newline; an assistant turn is ``assistant: `` (not trained) followed by its content
  and EOS (trained), so generation stops where the turn ends.

Each segment is tokenised on its own; the ids the model trains on are the segments' ids end to end, and the prompt
of a held-out conversation is the ids before its last assistant segment: the same ids, so training and evaluation
see one tokenisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pgcli.errors import ConfigError

ASSISTANT = "assistant"
"""The role whose turns are trained and generated."""
SYSTEM = "system"
"""The role of ``env.system_prompt``'s message."""
PLAIN_TURN = "{role}: {content}\n"
"""A turn of the plain rendering (TinyGPT; a tokenizer without a chat template)."""
PLAIN_GENERATION = "assistant: "
"""What the plain rendering puts before an assistant's content (the generation prompt)."""
USER = "user"
"""The role a string prompt takes in a conversation."""
PLAIN_CHARS = ": \n" + ASSISTANT + USER
"""Characters the plain rendering adds to a conversation's own (a string prompt's user role too): a TinyGPT vocabulary
built from data includes them."""


class TokenVocab(Protocol):
    """What rendering needs of a vocabulary: :class:`pgcli.lm.tasks.CharVocab` or :class:`pgcli.lm.hf.HFTokenizer`
    (whose ``tokenizer`` may bring a chat template)."""

    eos_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Rendered:
    """A conversation's token ids and, per token, whether the loss is on it."""

    ids: list[int]
    trained: list[bool]
    last_start: int
    """Index of the first token of the last trained turn: ``ids[:last_start]`` is the prompt it answers."""


def as_messages(value: Any, *, where: str) -> list[dict[str, str]]:
    """``value`` as a conversation: a non-empty list of mappings with string ``role`` and ``content`` (other keys
    dropped).

    Raises:
        ConfigError: anything else, naming ``where`` (the column and row) and what is there.
    """
    if not isinstance(value, Sequence) or isinstance(value, str | bytes) or not value:
        raise ConfigError(f"{where}: messages must be a non-empty list of {{role, content}} (got {_show(value)})")
    out = []
    for i, message in enumerate(value):
        ok = isinstance(message, Mapping) and isinstance(message.get("role"), str) and "content" in message
        if not ok or not isinstance(message["content"], str):
            raise ConfigError(f"{where}: message {i} is not a {{role, content}} of strings (got {_show(message)})")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def with_system(messages: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    """``messages`` led by a system message of ``system_prompt`` (unless None or it already starts with one)."""
    if system_prompt is None or (messages and messages[0]["role"] == SYSTEM):
        return messages
    return [{"role": SYSTEM, "content": system_prompt}, *messages]


def render_conversation(
    vocab: TokenVocab, messages: list[dict[str, str]], trained: Sequence[bool] | None = None, *, where: str = ""
) -> Rendered:
    """Token ids of ``messages`` with the tokens of turns ``trained[k]`` marked (default: the assistant turns); the
    chat template of ``vocab.tokenizer`` when it has one, else the plain rendering (module docstring).

    Raises:
        ConfigError: no turn is trained (a conversation with no assistant turn), or the chat template does not
            render the conversation prefix by prefix.
    """
    marks = [m["role"] == ASSISTANT for m in messages] if trained is None else list(trained)
    if not any(marks):
        raise ConfigError(f"{where}: the conversation has no assistant turn to train on (roles: {_roles(messages)})")
    template = getattr(getattr(vocab, "tokenizer", None), "chat_template", None)
    segments = _template_segments(vocab, messages, marks, where) if template else _plain_segments(messages, marks)
    ids: list[int] = list(_bos(vocab)) if not template else []
    flags: list[bool] = [False] * len(ids)
    last_start = 0
    for text, is_trained, end_token in segments:
        if is_trained:
            last_start = len(ids)
        piece = vocab.encode(text) + ([vocab.eos_id] if end_token else [])
        ids += piece
        flags += [is_trained] * len(piece)
    return Rendered(ids, flags, last_start)


def _plain_segments(messages: list[dict[str, str]], marks: list[bool]) -> list[tuple[str, bool, bool]]:
    """(text, trained, followed by EOS) of the plain rendering: a trained turn is its content and EOS."""
    out: list[tuple[str, bool, bool]] = []
    for message, mark in zip(messages, marks, strict=True):
        if message["role"] == ASSISTANT:
            out.append((PLAIN_GENERATION, False, False))
            out.append((message["content"], mark, True))
        else:
            out.append((PLAIN_TURN.format(role=message["role"], content=message["content"]), mark, False))
    return out


def _template_segments(
    vocab: TokenVocab, messages: list[dict[str, str]], marks: list[bool], where: str
) -> list[tuple[str, bool, bool]]:
    """(text, trained, False) of the chat template, turn by turn: each turn's text is what its prefix adds."""
    tokenizer = vocab.tokenizer  # type: ignore[attr-defined]  # render_conversation checked it is there

    def render(prefix: list[dict[str, str]], generation: bool) -> str:
        if not prefix:
            return ""
        text: str = tokenizer.apply_chat_template(prefix, tokenize=False, add_generation_prompt=generation)
        return text

    out: list[tuple[str, bool, bool]] = []
    done = ""
    for k, (message, mark) in enumerate(zip(messages, marks, strict=True)):
        if message["role"] == ASSISTANT:  # the generation prompt belongs to the turn before the answer
            asked = render(messages[:k], True)
            out.append((_added(done, asked, k, where), False, False))
            done = asked
        full = render(messages[: k + 1], False)
        out.append((_added(done, full, k, where), mark, False))
        done = full
    return [segment for segment in out if segment[0]]


def _added(before: str, after: str, turn: int, where: str) -> str:
    if not after.startswith(before):
        raise ConfigError(
            f"{where}: the chat template does not render the conversation prefix by prefix (turn {turn} changes the "
            "text before it), so the assistant tokens cannot be marked; use a template that keeps earlier turns as "
            "they are"
        )
    return after[len(before) :]


def _bos(vocab: TokenVocab) -> tuple[int, ...]:
    bos = getattr(vocab, "bos_id", None)
    return () if bos is None else (int(bos),)


def _roles(messages: list[dict[str, str]]) -> str:
    return ", ".join(m["role"] for m in messages)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
