"""GAE, reward-to-go and normalisation against hand-computed numbers."""

import pytest
import torch

from pgcli.ops.advantages import discounted_cumsum, gae, normalize


def col(*xs: float) -> torch.Tensor:
    """One env: a [T, 1] column."""
    return torch.tensor(xs, dtype=torch.float64).unsqueeze(1)


def test_gae_one_env_truncation_and_termination():
    # t=0 ordinary step; t=1 truncated (bootstrap from the true final obs value 4.0, recursion cut);
    # t=2 terminated (no bootstrap: next_value 8.0 must be ignored); t=3 rollout end (bootstrap from 2.0).
    rewards = col(1.0, 2.0, 3.0, 1.0)
    values = col(0.5, 1.0, 2.0, 1.0)
    next_values = col(1.0, 4.0, 8.0, 2.0)
    terminated = col(0.0, 0.0, 1.0, 0.0)
    dones = col(0.0, 1.0, 1.0, 0.0)
    adv, ret = gae(rewards, values, next_values, terminated, dones, gamma=0.5, lam=0.5)
    # deltas: 1 + .5*1 - .5 = 1.0 | 2 + .5*4 - 1 = 3.0 | 3 - 2 = 1.0 | 1 + .5*2 - 1 = 1.0
    # A3 = 1.0; A2 = 1.0 (cut); A1 = 3.0 (cut); A0 = 1.0 + 0.25 * 3.0 = 1.75
    assert torch.allclose(adv, col(1.75, 3.0, 1.0, 1.0))
    assert torch.allclose(ret, col(2.25, 4.0, 3.0, 2.0))


def test_gae_two_envs_are_independent():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 1.0]])
    values = torch.tensor([[1.0, 2.0], [1.0, 0.5]])
    next_values = torch.tensor([[1.0, 0.5], [2.0, 3.0]])
    terminated = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    dones = terminated.clone()
    adv, ret = gae(rewards, values, next_values, terminated, dones, gamma=0.5, lam=1.0)
    # env 0: d = [1 + .5 - 1, 2 + 1 - 1] = [0.5, 2.0]; A1 = 2.0, A0 = 0.5 + 0.5 * 2.0 = 1.5
    # env 1: d = [0 + .25 - 2, 1 - 0.5] = [-1.75, 0.5] (terminated at t=1); A1 = 0.5, A0 = -1.75 + 0.25 = -1.5
    assert torch.allclose(adv, torch.tensor([[1.5, -1.5], [2.0, 0.5]]))
    assert torch.allclose(ret, torch.tensor([[2.5, 0.5], [3.0, 1.0]]))


def test_gae_lambda_zero_is_td_error():
    adv, _ = gae(col(1.0, 1.0), col(0.0, 2.0), col(2.0, 4.0), col(0.0, 0.0), col(0.0, 0.0), gamma=0.5, lam=0.0)
    assert torch.allclose(adv, col(2.0, 1.0))  # 1 + .5*2 - 0, 1 + .5*4 - 2


def test_gae_shape_mismatch_raises():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        gae(x, x, x, x, torch.zeros(4, 3), gamma=0.99, lam=0.95)
    with pytest.raises(ValueError):
        gae(*(torch.zeros(4) for _ in range(5)), gamma=0.99, lam=0.95)


def test_discounted_cumsum_resets_at_dones():
    # episode ends at t=1: G1 = 2, G0 = 1 + .5*2 = 2; G3 = 4, G2 = 3 + .5*4 = 5
    out = discounted_cumsum(col(1.0, 2.0, 3.0, 4.0), col(0.0, 1.0, 0.0, 0.0), gamma=0.5)
    assert torch.allclose(out, col(2.0, 2.0, 5.0, 4.0))
    with pytest.raises(ValueError):
        discounted_cumsum(torch.zeros(3, 1), torch.zeros(2, 1), gamma=0.5)


def test_normalize_uses_unbiased_std():
    # mean 2, unbiased std sqrt(((-1)^2 + 0 + 1^2) / 2) = 1
    assert torch.allclose(normalize(torch.tensor([1.0, 2.0, 3.0])), torch.tensor([-1.0, 0.0, 1.0]))


def test_normalize_single_element_and_constant_give_zeros():
    assert torch.equal(normalize(torch.tensor([5.0])), torch.tensor([0.0]))
    assert torch.equal(normalize(torch.tensor([2.0, 2.0])), torch.tensor([0.0, 0.0]))
