"""The Bradley-Terry loss and pairwise accuracy of a reward model (``pgcli.ops.preference``) against hand-computed
values."""

from __future__ import annotations

import math

import pytest
import torch

from pgcli.ops.preference import bradley_terry_loss, pairwise_accuracy


def test_bradley_terry_loss_matches_hand_computed_values():
    # margins 1 and 0: (-log sigmoid(1) - log sigmoid(0)) / 2 = (0.313262 + 0.693147) / 2
    loss = bradley_terry_loss(torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.5]))
    assert loss.item() == pytest.approx((math.log(1 + math.exp(-1.0)) + math.log(2.0)) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.503204, abs=1e-6)
    # a wrong ranking by 2 costs log(1 + e^2) = 2.126928
    assert bradley_terry_loss(torch.tensor([-1.0]), torch.tensor([1.0])).item() == pytest.approx(2.126928, abs=1e-6)


def test_bradley_terry_loss_gradient_is_sigmoid_of_minus_the_margin():
    r_chosen, r_rejected = torch.tensor([2.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)
    bradley_terry_loss(r_chosen, r_rejected).backward()
    assert r_chosen.grad is not None and r_rejected.grad is not None
    assert r_chosen.grad.item() == pytest.approx(-1 / (1 + math.e), abs=1e-6)  # -sigmoid(-1)
    assert r_rejected.grad.item() == pytest.approx(1 / (1 + math.e), abs=1e-6)


def test_pairwise_accuracy_counts_strictly_higher_chosen_rewards():
    r_chosen = torch.tensor([2.0, 1.0, 0.0, -3.0])
    r_rejected = torch.tensor([1.0, 1.0, -1.0, -2.0])  # right, tie (wrong), right, wrong
    assert pairwise_accuracy(r_chosen, r_rejected).item() == pytest.approx(0.5)


def test_the_loss_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"two \[N\] tensors"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match=r"two \[N\] tensors"):
        pairwise_accuracy(torch.zeros(2, 1), torch.zeros(2, 1))
