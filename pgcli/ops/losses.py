"""Policy-gradient loss terms and diagnostics for PPO / TRPO (Schulman et al., 2017, "Proximal Policy Optimization").

- `clipped_surrogate`: L^CLIP, PPO eq. 7, elementwise (an objective to maximise).
- `ppo_penalty_beta_update`: the adaptive KL coefficient of PPO section 4.
- `approx_kl`: the k3 estimator of KL(old || new) (Schulman, 2020, "Approximating KL Divergence"), as in SB3 and
  CleanRL.
- `clip_fraction`, `explained_variance`: SB3's training diagnostics.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_range: float) -> Tensor:
    """Elementwise min(r * A, clip(r, 1 - eps, 1 + eps) * A) (PPO eq. 7, before the mean).

    Args:
        ratio: [B] (or any shape) probability ratio pi_new(a|s) / pi_old(a|s).
        advantages: advantages, same shape as `ratio`.
        clip_range: epsilon.

    Returns:
        Objective per sample, shape of `ratio`; the loss is its negated mean.

    Raises:
        ValueError: on shape mismatch.
    """
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)} must match")
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.min(ratio * advantages, clipped * advantages)


def clip_fraction(ratio: Tensor, clip_range: float) -> Tensor:
    """Fraction of samples with |r - 1| > eps (SB3 `train/clip_fraction`). Returns a 0-dim tensor."""
    return ((ratio - 1.0).abs() > clip_range).float().mean()


def approx_kl(log_ratio: Tensor) -> Tensor:
    """k3 estimate of KL(old || new): mean((exp(lr) - 1) - lr), lr = log pi_new(a|s) - log pi_old(a|s), a ~ pi_old.

    Unbiased and nonnegative per sample (exp(x) >= 1 + x), unlike mean(-lr) (Schulman, 2020; SB3 PPO, CleanRL).

    Args:
        log_ratio: [B] log-ratios on samples from the old policy.

    Returns:
        0-dim tensor.
    """
    return torch.mean(torch.expm1(log_ratio) - log_ratio)


def explained_variance(y_pred: Tensor, y_true: Tensor) -> float:
    """1 - Var[y_true - y_pred] / Var[y_true] (SB3 `explained_variance`, population variances).

    1 is a perfect fit, 0 is no better than predicting the mean, negative is worse.

    Args:
        y_pred: [B] predictions (e.g. values).
        y_true: [B] targets (e.g. returns).

    Returns:
        The ratio as a float; NaN when Var[y_true] = 0, as in SB3.

    Raises:
        ValueError: on shape mismatch.
    """
    if y_pred.shape != y_true.shape:
        raise ValueError(f"y_pred {tuple(y_pred.shape)} and y_true {tuple(y_true.shape)} must match")
    var_y = torch.var(y_true, correction=0)
    if var_y == 0:
        return float("nan")
    return float(1.0 - torch.var(y_true - y_pred, correction=0) / var_y)


def ppo_penalty_beta_update(beta: float, kl: float, kl_target: float) -> float:
    """Adaptive KL-penalty coefficient (PPO section 4): halve if kl < target / 1.5, double if kl > 1.5 * target.

    Args:
        beta: current penalty coefficient.
        kl: mean KL(old || new) measured after the update.
        kl_target: d_targ.

    Returns:
        The new beta (unchanged on the boundaries, which are strict inequalities in the paper).

    Raises:
        ValueError: if `kl_target` <= 0.
    """
    if kl_target <= 0:
        raise ValueError(f"kl_target must be > 0, got {kl_target}")
    if kl < kl_target / 1.5:
        return beta / 2.0
    if kl > kl_target * 1.5:
        return beta * 2.0
    return beta
