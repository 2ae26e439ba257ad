"""How a per-step loss [E, L] becomes a scalar: the aggregations of the policy-gradient losses of GRPO and its relatives
(`LOSS_AGGREGATIONS`, TRL's `loss_type`).

- `seq_mean_loss`: per-episode (completion) mean, then the mean over episodes (GRPO);
- `token_mean_loss`: the mean over all real steps of the batch (DAPO, Yu et al., 2025);
- `constant_loss`: the sum over E * max_len (Dr. GRPO, Liu et al., 2025).

A batch is E rows padded to L with a float prefix `mask` (1.0 on the real steps). Given the `BatchTotals` of a whole
batch (`batch_totals`), each returns a row chunk's share of the batch's value instead, so the shares of a batch's
chunks sum to it: gradient accumulation over micro-batches.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class BatchTotals(NamedTuple):
    """The sizes of a whole batch a row chunk's aggregates divide by: their shares of the batch's then sum to it."""

    n_rows: int
    """Episodes (completions) in the whole batch."""
    n_real: int
    """Real steps (tokens) in the whole batch: where its mask is 1.0."""


def batch_totals(mask: Tensor) -> BatchTotals:
    """The `BatchTotals` of the batch whose [E, L] prefix mask is `mask`."""
    return BatchTotals(n_rows=int(mask.shape[0]), n_real=int(mask.sum()))


def _check_totals(totals: BatchTotals, mask: Tensor) -> None:
    """A chunk holds at most its batch's rows and real steps, and the batch at least one real step."""
    if totals.n_real <= 0 or totals.n_rows < mask.shape[0] or totals.n_real < float(mask.sum()):
        raise ValueError(
            f"totals {tuple(totals)} must cover the chunk's {mask.shape[0]} rows and its real steps (>= 1)"
        )


def _check_loss(loss: Tensor, mask: Tensor, max_len: int, totals: BatchTotals | None) -> None:
    if loss.ndim != 2 or mask.shape != loss.shape:
        raise ValueError(f"loss and mask must be [E, L] of one shape (got {tuple(loss.shape)}, {tuple(mask.shape)})")
    if max_len < loss.shape[1]:
        raise ValueError(f"max_len must be >= the padded length L={loss.shape[1]} (got {max_len})")
    if totals is not None:
        _check_totals(totals, mask)


def seq_mean_loss(loss: Tensor, mask: Tensor, *, max_len: int, totals: BatchTotals | None = None) -> Tensor:
    """Mean over each episode's real steps, then mean over episodes (GRPO; short episodes weigh more per step).

    (1/E) sum_i (1/|o_i|) sum_t loss_{i,t}; with `totals`, E is the whole batch's `n_rows`.

    Args:
        loss: [E, L] per-step loss; padding is ignored.
        mask: [E, L] 1.0 on real steps; every episode needs at least one.
        max_len: unused here; accepted so the three aggregations are interchangeable (checked >= L).
        totals: the whole batch these rows are a chunk of (None: they are the batch): the chunk's share of its loss.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: on shape mismatch, max_len < L, or an episode without real steps.
    """
    _check_loss(loss, mask, max_len, totals)
    lengths = mask.sum(1)  # [E]
    if (lengths == 0).any():
        raise ValueError("seq_mean_loss: every episode needs at least one real step in mask")
    per_episode = torch.where(mask.bool(), loss, 0.0).sum(1) / lengths  # [E]
    return per_episode.mean() if totals is None else per_episode.sum() / totals.n_rows


def token_mean_loss(loss: Tensor, mask: Tensor, *, max_len: int, totals: BatchTotals | None = None) -> Tensor:
    """Sum over all real steps / number of real steps (DAPO token-level loss; every step weighs the same); with
    `totals`, the number of real steps is the whole batch's `n_real`.

    Args:
        loss: [E, L] per-step loss; padding is ignored.
        mask: [E, L] 1.0 on real steps; at least one in total (with `totals`: in the whole batch).
        max_len: unused here; accepted so the three aggregations are interchangeable (checked >= L).
        totals: the whole batch these rows are a chunk of (None: they are the batch): the chunk's share of its loss.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: on shape mismatch, max_len < L, or no real step.
    """
    _check_loss(loss, mask, max_len, totals)
    n_real = mask.sum() if totals is None else totals.n_real
    if n_real == 0:
        raise ValueError("token_mean_loss: mask has no real step")
    return torch.where(mask.bool(), loss, 0.0).sum() / n_real


def constant_loss(loss: Tensor, mask: Tensor, *, max_len: int, totals: BatchTotals | None = None) -> Tensor:
    """Sum over all real steps / (E * max_len) (Dr. GRPO: a constant normaliser, no length bias); with `totals`, E
    is the whole batch's `n_rows`.

    Args:
        loss: [E, L] per-step loss; padding is ignored.
        mask: [E, L] 1.0 on real steps.
        max_len: the longest possible episode (e.g. the env's time limit), >= L.
        totals: the whole batch these rows are a chunk of (None: they are the batch): the chunk's share of its loss.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: on shape mismatch or max_len < L.
    """
    _check_loss(loss, mask, max_len, totals)
    n_rows = loss.shape[0] if totals is None else totals.n_rows
    return torch.where(mask.bool(), loss, 0.0).sum() / (n_rows * max_len)


class LossAggregation(Protocol):
    """Signature shared by the entries of `LOSS_AGGREGATIONS`."""

    def __call__(self, loss: Tensor, mask: Tensor, *, max_len: int, totals: BatchTotals | None = None) -> Tensor: ...


LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    "seq_mean": seq_mean_loss,
    "token_mean": token_mean_loss,
    "constant": constant_loss,
}
"""Per-step [E, L] loss -> scalar, by name (TRL `loss_type` grpo / dapo / dr_grpo)."""
