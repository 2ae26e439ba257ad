"""PPO loss terms and diagnostics against hand-computed numbers."""

import math

import pytest
import torch

from pgcli.ops.losses import approx_kl, clip_fraction, clipped_surrogate, explained_variance, ppo_penalty_beta_update


def test_clipped_surrogate_worked_examples():
    ratio = torch.tensor([1.5, 1.4, 0.5, 0.5, 1.1])
    adv = torch.tensor([1.0, -2.0, -1.0, 1.0, 3.0])
    # min(1.5, 1.2) = 1.2 | min(-2.8, -2.4) = -2.8 | min(-0.5, -0.8) = -0.8 | min(0.5, 0.8) = 0.5 | 3.3 (inside)
    expected = torch.tensor([1.2, -2.8, -0.8, 0.5, 3.3])
    assert torch.allclose(clipped_surrogate(ratio, adv, clip_range=0.2), expected)


def test_clipped_surrogate_shape_mismatch_raises():
    with pytest.raises(ValueError, match="must match"):
        clipped_surrogate(torch.ones(3), torch.ones(2), clip_range=0.2)


def test_clip_fraction():
    # |r - 1| > 0.2 for 1.5, 1.4, 0.5 but not 1.0, 1.1 -> 3 / 5
    assert clip_fraction(torch.tensor([1.5, 1.4, 0.5, 1.0, 1.1]), clip_range=0.2).item() == pytest.approx(0.6)


def test_approx_kl_k3_values():
    assert approx_kl(torch.zeros(4)).item() == 0.0
    # lr = ln 2: (2 - 1) - ln 2; lr = -ln 2: (0.5 - 1) + ln 2; mean = (1 - 0.5) / 2 = 0.25
    assert approx_kl(torch.tensor([math.log(2.0), -math.log(2.0)])).item() == pytest.approx(0.25)
    assert approx_kl(torch.tensor([math.log(2.0)])).item() == pytest.approx(0.30685281944)


def test_approx_kl_nonnegative():
    log_ratio = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    assert (torch.expm1(log_ratio) - log_ratio).min() >= 0
    assert approx_kl(log_ratio).item() >= 0


def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(y, y) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), y) == pytest.approx(0.0)
    # residual [-1, 0, 0, 0]: population var 0.1875; var(y) = 1.25 -> 1 - 0.15
    assert explained_variance(torch.tensor([2.0, 2.0, 3.0, 4.0]), y) == pytest.approx(0.85)
    assert math.isnan(explained_variance(torch.zeros(3), torch.full((3,), 7.0)))
    with pytest.raises(ValueError):
        explained_variance(torch.zeros(3), y)


@pytest.mark.parametrize(
    ("kl", "expected"),
    [(1.0, 0.5), (1.999, 0.5), (2.0, 1.0), (3.0, 1.0), (4.5, 1.0), (4.501, 2.0), (10.0, 2.0)],
)
def test_ppo_penalty_beta_update(kl: float, expected: float):
    # kl_target 3: halve below 3 / 1.5 = 2, double above 3 * 1.5 = 4.5, boundaries unchanged
    assert ppo_penalty_beta_update(1.0, kl, kl_target=3.0) == expected


def test_ppo_penalty_beta_update_rejects_bad_target():
    with pytest.raises(ValueError, match="kl_target"):
        ppo_penalty_beta_update(1.0, 0.01, kl_target=0.0)
