"""The Bradley-Terry preference loss of a reward model and its accuracy (InstructGPT, Ouyang et al., 2022, eq. 1).

Given rewards r_c = r(x, y_c) of the preferred completions and r_r = r(x, y_r) of the rejected ones, the
Bradley-Terry model says P(y_c > y_r) = sigmoid(r_c - r_r), so the negative log-likelihood of the labels is

    L = - mean_pairs log sigmoid(r_c - r_r)

(log 2 when every reward is equal). The pairwise accuracy is the share of pairs with r_c > r_r, a tie counting as
wrong.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def _check_pair_shapes(r_chosen: Tensor, r_rejected: Tensor) -> None:
    if r_chosen.ndim != 1 or r_chosen.shape != r_rejected.shape:
        raise ValueError(f"rewards must be two [N] tensors (got {tuple(r_chosen.shape)} and {tuple(r_rejected.shape)})")


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """``-mean log sigmoid(r_chosen - r_rejected)`` over N pairs: the negative log-likelihood of the labels under the
    Bradley-Terry model P(y_c > y_r) = sigmoid(r_c - r_r). Inputs [N]; returns a scalar."""
    _check_pair_shapes(r_chosen, r_rejected)
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def pairwise_accuracy(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Share of the N pairs whose chosen completion gets the strictly higher reward (a tie counts as wrong)."""
    _check_pair_shapes(r_chosen, r_rejected)
    return (r_chosen > r_rejected).float().mean()
