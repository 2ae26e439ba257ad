"""Batches of encoded rows, and the held-out evaluations of ``pgcli sft`` and ``pgcli rm`` on ``env=dataset``
(docs/lm.md, "Supervised fine-tuning on your rows", "A reward model on your preference pairs").

On the first ``env.n_eval`` held-out rows (never trained on):

- SFT (:class:`DemoEvaluator`): ``eval/loss``, the mean negative log-likelihood of the trained tokens (the assistant
  turns, or the completion) under teacher forcing, and ``eval/perplexity`` = exp(loss); ``eval/exact_match``, the
  share of rows whose greedy completion (temperature 0) of the prompt before the last trained turn is that turn's
  tokens exactly, up to its first stop token (EOS, or the tokenizer's newline tokens); ``eval/accuracy`` is the same
  share (on a built-in task exported as rows it is the task's exact-match accuracy) and ``eval/return_mean`` too
  (the best model is the one that answers the most held-out rows exactly). The samples table holds the prompt, the
  reference and the greedy completion of the first ``env.eval_samples`` rows.
- the reward model (:class:`PreferenceEvaluator`): ``eval/pairwise_accuracy``, ``eval/reward_margin`` and
  ``eval/loss`` of :func:`pgcli.lm.reward_model.pair_metrics`, on the held-out pairs whose chosen differs from
  rejected.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pgcli.config import LMModelConfig, TextEnvConfig
from pgcli.contracts import Agent, EvalResult
from pgcli.lm.dataset_rows import DemoRows, EncodedPair, Example, PreferenceRows, TextModel
from pgcli.lm.model import CausalLM, completion_logprobs, generate
from pgcli.lm.reward_model import RewardModel, pair_metrics


def left_padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``rows`` left-padded to the longest: tokens [B, T] long, mask [B, T] bool (True on real tokens)."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            tokens[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = True
    return tokens.to(device), mask.to(device)


def right_padded(rows: Sequence[Sequence[Any]], pad: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``rows`` right-padded with ``pad`` to the longest: [B, C] of ``dtype``."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out.to(device)


def sft_batch(examples: Sequence[Example], pad_id: int, device: torch.device) -> tuple[Tensor, ...]:
    """The SFT layout of ``examples``: prompts [B, P] and their mask (left-padded), completions [B, C], their mask
    and the trained-token mask [B, C] (right-padded); a completion starts at the first trained token."""
    prompts, prompt_mask = left_padded([e.ids[: e.start] for e in examples], pad_id, device)
    completion = right_padded([e.ids[e.start :] for e in examples], pad_id, torch.long, device)
    completion_mask = right_padded([[True] * (len(e) - e.start) for e in examples], False, torch.bool, device)
    trained = right_padded([e.trained[e.start :] for e in examples], False, torch.bool, device)
    return prompts, prompt_mask, completion, completion_mask, trained


def pair_batch(pairs: Sequence[EncodedPair], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The chosen sides, then the rejected sides, left-padded: tokens [2N, T] and mask [2N, T] (a reward model reads
    each row's last real token)."""
    return left_padded([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id, device)


# --------------------------------------------------------------------------------------------------------------------
# SFT on rows
# --------------------------------------------------------------------------------------------------------------------


class DemoEvaluator:
    """The monitor's evaluator of ``pgcli sft env=dataset`` (module docstring); it scores the policy it was built
    with, which the trainer trains in place."""

    concurrent = None
    """Evaluated in this process only (``pgcli.training.evaluation.EvaluatorLike``)."""

    def __init__(
        self,
        rows: DemoRows,
        policy: CausalLM,
        *,
        n_eval: int,
        n_table_rows: int,
        context: int | None,
        device: torch.device,
        batch_size: int = 256,
    ) -> None:
        self.rows, self.policy, self.device, self.batch_size = rows, policy, device, batch_size
        self.context, self.n_table_rows = context, n_table_rows
        self.examples = rows.held_out_examples(n_eval)

    def __call__(self, agent: Agent) -> EvalResult:
        was_training = self.policy.training
        self.policy.eval()
        try:
            with torch.no_grad():
                loss = self._loss()
                answers = self._greedy()
        finally:
            self.policy.train(was_training)
        vocab = self.rows.vocab
        stops = set(vocab.stop_ids)
        references = [_cut(e.ids[e.last_start : e.last_end], stops) for e in self.examples]
        exact = np.array([_cut(a, stops) == r for a, r in zip(answers, references, strict=True)], dtype=np.float64)
        table = [
            {
                "prompt": _decode_all(vocab, e.ids[: e.last_start]),
                "reference": vocab.decode(ref),
                "greedy": vocab.decode(answer),
                "exact_match": bool(x),
            }
            for e, ref, answer, x in zip(self.examples, references, answers, exact, strict=False)
        ][: self.n_table_rows]
        extra = {
            "eval/loss": loss,
            "eval/perplexity": float(np.exp(min(loss, 50.0))),
            "eval/exact_match": float(exact.mean()),
            "eval/accuracy": float(exact.mean()),
            "eval/completion_len": float(np.mean([len(a) for a in answers])),
        }
        lengths = np.array([len(a) for a in answers])
        return EvalResult(exact, lengths, extra=extra, samples=table if self.n_table_rows else None)

    def _loss(self) -> float:
        """Mean NLL per trained token of the held-out examples (teacher forcing)."""
        total, count = 0.0, 0
        pad = self.rows.vocab.pad_id
        for start in range(0, len(self.examples), self.batch_size):
            prompts, prompt_mask, completion, completion_mask, trained = sft_batch(
                self.examples[start : start + self.batch_size], pad, self.device
            )
            logprobs, _ = completion_logprobs(self.policy, prompts, prompt_mask, completion, completion_mask)
            total -= float((logprobs.float() * trained).sum())
            count += int(trained.sum())
        return total / max(count, 1)

    def _greedy(self) -> list[list[int]]:
        """The greedy completion's ids of each example's last prompt, rows of one prompt length batched together (the
        prompt and its reference fit the context, so each batch's budget does)."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(self.examples):
            by_length[e.last_start].append(i)
        vocab = self.rows.vocab
        out: list[list[int]] = [[] for _ in self.examples]
        for length, members in by_length.items():
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                budget = max(self.examples[i].last_end - self.examples[i].last_start for i in chunk)
                if self.context is not None:
                    budget = max(1, min(budget, self.context - length))
                tokens, mask = left_padded([self.examples[i].ids[:length] for i in chunk], vocab.pad_id, self.device)
                gen = generate(
                    self.policy,
                    tokens,
                    mask,
                    max_new_tokens=budget,
                    eos_id=vocab.stop_ids,
                    temperature=0.0,
                    pad_id=vocab.pad_id,
                )
                for i, row, row_mask in zip(chunk, gen.tokens.tolist(), gen.mask.tolist(), strict=True):
                    out[i] = [t for t, m in zip(row, row_mask, strict=True) if m]
        return out

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]:
        """Text tasks have no video: an evaluation, no files."""
        return self(agent), []

    def close(self) -> None:
        """Nothing to release."""


def _decode_all(vocab: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` across EOS tokens (a plain-rendered conversation has one after each assistant turn)."""
    tokenizer = getattr(vocab, "tokenizer", None)
    if tokenizer is not None:  # a chat template's text, its newlines and special tokens included
        text: str = tokenizer.decode(list(ids))
        return text
    pieces: list[str] = []
    current: list[int] = []
    for i in ids:
        if int(i) == vocab.eos_id:
            pieces.append(vocab.decode(current))
            current = []
        else:
            current.append(int(i))
    return "<eos>".join([*pieces, vocab.decode(current)])


def _cut(ids: Sequence[int], stops: set[int]) -> list[int]:
    """``ids`` up to and including the first stop token."""
    out: list[int] = []
    for i in ids:
        out.append(int(i))
        if int(i) in stops:
            break
    return out


# --------------------------------------------------------------------------------------------------------------------
# A reward model on preference rows
# --------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def score_pairs(
    model: RewardModel, pairs: Sequence[EncodedPair], pad_id: int, device: torch.device, *, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """Rewards of the chosen and of the rejected side of each pair (float64 [N] each); the model's mode is
    restored."""
    was_training = model.training
    model.eval()
    chosen: list[np.ndarray] = []
    rejected: list[np.ndarray] = []
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            rewards = model(*pair_batch(chunk, pad_id, device)).double().cpu().numpy()
            chosen.append(rewards[: len(chunk)])
            rejected.append(rewards[len(chunk) :])
    finally:
        model.train(was_training)
    return np.concatenate(chosen), np.concatenate(rejected)


class PreferenceEvaluator:
    """The monitor's evaluator of ``pgcli rm env=dataset``: pairwise accuracy and margin on the held-out pairs (the
    text evaluator's interface, as :class:`pgcli.lm.reward_model.PairEvaluator`)."""

    concurrent = None
    """Evaluated in this process only (``pgcli.training.evaluation.EvaluatorLike``)."""

    def __init__(self, rows: PreferenceRows, *, n_eval: int, n_table_rows: int, device: torch.device) -> None:
        self.rows, self.device, self.n_table_rows = rows, device, n_table_rows
        self.pairs, self.table = rows.held_out_pairs(n_eval)

    def __call__(self, agent: Agent) -> EvalResult:
        reward_model = getattr(agent, "reward_model", None)  # a RewardModelTrainer's (pgcli.algo.reward_model)
        if not isinstance(reward_model, RewardModel):
            raise TypeError(f"a reward-model evaluation scores a RewardModelTrainer (got {type(agent).__name__})")
        r_chosen, r_rejected = score_pairs(reward_model, self.pairs, self.rows.vocab.pad_id, self.device)
        env = self.rows.env
        table = [
            {
                "prompt": row.get(env.prompt_key, "") if self.rows.explicit_prompt else "",
                "chosen": row[env.chosen_key],
                "rejected": row[env.rejected_key],
            }
            for row in self.table[: self.n_table_rows]
        ]
        lengths = np.array([len(p.chosen) for p in self.pairs])
        return pair_metrics(r_chosen, r_rejected, lengths, table)

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]:
        """Text tasks have no video: an evaluation, no files."""
        return self(agent), []

    def close(self) -> None:
        """Nothing to release."""


def rows_evaluator(
    rows: DemoRows | PreferenceRows, policy: CausalLM, env: TextEnvConfig, model: TextModel, device: torch.device
) -> DemoEvaluator | PreferenceEvaluator:
    """The held-out evaluator of a ``pgcli sft|rm env=dataset`` run (module docstring)."""
    if isinstance(rows, PreferenceRows):
        return PreferenceEvaluator(rows, n_eval=env.n_eval, n_table_rows=env.eval_samples, device=device)
    context = model.max_len if isinstance(model, LMModelConfig) else None  # a TinyGPT's positions end there
    return DemoEvaluator(rows, policy, n_eval=env.n_eval, n_table_rows=env.eval_samples, context=context, device=device)
