"""Advantage estimation for on-policy rollouts stored as [T, N] tensors (T steps, N envs).

Implements GAE(gamma, lambda) (Schulman et al., 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation", eq. 16: A_t = sum_l (gamma * lam)^l delta_{t+l}), computed with the backward recursion
A_t = delta_t + gamma * lam * A_{t+1}, plus reward-to-go and advantage normalisation.

Termination and truncation are kept apart (Pardo et al., 2018, "Time Limits in Reinforcement Learning"; SB3 PR #633):
`terminated` stops bootstrapping, `dones` (terminated or truncated) stops the lambda-recursion, and a truncated step
bootstraps from the value of its true final observation, which the caller supplies in `next_values`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected [T, N] tensors of one shape, got {shapes}")


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    dones: Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """GAE(lambda) advantages and lambda-returns.

    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
    A_t     = delta_t + gamma * lam * (1 - dones_t) * A_{t+1},  with A_T = 0 after the last row.

    Args:
        rewards: [T, N] reward r_t received after acting at step t.
        values: [T, N] V(s_t).
        next_values: [T, N] V(s_{t+1}); for a step that ended an episode, the value of the true final observation
            (not of the auto-reset observation). For the last row it is the rollout's bootstrap value.
        terminated: [T, N] 1.0 where the episode terminated at t (zeroes the bootstrap).
        dones: [T, N] 1.0 where the episode ended at t, terminated or truncated (cuts the recursion).
        gamma: discount factor.
        lam: GAE lambda (0: one-step TD error, 1: Monte Carlo return minus baseline).

    Returns:
        (advantages, returns), both [T, N], with returns = advantages + values (the TD(lambda) value targets).

    Raises:
        ValueError: if the inputs are not all [T, N] of the same shape.
    """
    _check_same_shape(rewards=rewards, values=values, next_values=next_values, terminated=terminated, dones=dones)
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values  # [T, N]
    adv = reverse_scan(deltas, gamma * lam * (1.0 - dones))  # [T, N]
    return adv, adv + values


def discounted_cumsum(x: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """Discounted reward-to-go along dim 0, restarting at episode ends: G_t = x_t + gamma * (1 - dones_t) * G_{t+1}.

    There is no bootstrap past the last row (G_T = 0); use `gae` with lam=1 for a bootstrapped return.

    Args:
        x: [T, N] per-step values (typically rewards).
        dones: [T, N] 1.0 where step t is the last step of its episode.
        gamma: discount factor.

    Returns:
        [T, N] discounted sums.

    Raises:
        ValueError: if `x` and `dones` are not [T, N] of the same shape.
    """
    _check_same_shape(x=x, dones=dones)
    return reverse_scan(x, gamma * (1.0 - dones))


def reverse_scan(x: Tensor, decay: Tensor) -> Tensor:
    """y_t = x_t + decay_t * y_{t+1} along dim 0, with y_T = 0 after the last row: the recursion of GAE and of the
    discounted return.

    The T sequential steps run on numpy views of the CPU tensors, in place: a numpy op on N = 8 numbers costs about
    a microsecond against several for a torch op, and an update's T = 2048 steps made the torch loop ~40 ms. The
    arithmetic is the same float32 operations in the same order.

    Args:
        x: [T, N] terms.
        decay: [T, N] factors (gamma * lam * (1 - done) for GAE).

    Returns:
        [T, N] tensor y on the device of ``x``.
    """
    x_np = x.detach().cpu().numpy()
    decay_np = decay.detach().to(x.dtype).cpu().numpy()
    out = np.empty_like(x_np)
    running = np.zeros_like(x_np[0])  # [N]
    for t in range(x_np.shape[0] - 1, -1, -1):
        np.multiply(decay_np[t], running, out=running)
        running += x_np[t]
        out[t] = running
    return torch.from_numpy(out).to(x.device)


def normalize(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Standardise over all elements: (x - mean) / (std + eps), with the unbiased (n - 1) std as SB3 does.

    A single element returns x - mean (zeros) instead of NaN, since the unbiased std of one sample is undefined
    (SB3 skips normalisation for a batch of one, DLR-RM/stable-baselines3#325).

    Args:
        x: tensor of any shape.
        eps: added to the std to avoid division by zero.

    Returns:
        Tensor of the shape of `x`.
    """
    centred = x - x.mean()
    if x.numel() < 2:
        return centred
    return centred / (x.std() + eps)
