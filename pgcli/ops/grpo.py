"""Group Relative Policy Optimization math for episodic control (Shao et al., 2024, "DeepSeekMath", section 4.1).

A batch holds E episodes padded to length L: per-step tensors are [E, L] with a float prefix `mask` (1.0 on the real
steps, which come first), and `group_ids` [E] (long) says which of the M groups an episode belongs to; members of a
group start from the same initial state. Implemented here:

- `group_normalized_advantages`: critic-free advantages, three modes, each a centred signal divided by a scale:
    outcome        A_{i,t} = R_i - mean_g(R),  R_i = sum_t gamma^t r_{i,t}                  (GRPO outcome supervision)
    process        A_{i,t} = sum_{t' >= t} gamma^(t'-t) (r_{i,t'} - mean_g(r))             (GRPO process supervision)
    step_baseline  A_{i,t} = G_{i,t} - mean_{j in g alive at t}(G_{j,t}),  G_{i,t} = sum_{t' >= t} gamma^(t'-t) r_{i,t'}
  and `scale`: "group" divides by std_g + eps (GRPO), "batch" by the same std over the whole batch + eps (TRL
  `scale_rewards="batch"`), "none" does not divide (Dr. GRPO, Liu et al., 2025, arXiv:2503.20783).
- `k3_kl`: the k3 estimator of KL(pi || pi_ref), exp(ref - logp) - (ref - logp) - 1 (DeepSeekMath eq. 4); `k1_kl`
  (logp - ref) and `k2_kl` ((logp - ref)^2 / 2), the three by name in `KL_ESTIMATORS` (Schulman, 2020).
- `clip_bounds`, `grpo_clipped_objective`, `clip_fractions`: the PPO-clip surrogate with decoupled bounds
  [1 - eps, 1 + eps_high] (DAPO "Clip-Higher", Yu et al., 2025, arXiv:2503.14476).
- The loss aggregations (per-episode mean, token mean, constant; `LOSS_AGGREGATIONS`) are in `pgcli.ops.aggregate`;
  given a whole batch's `BatchTotals`, `clip_fractions` returns a row chunk's share as they do.

Standard deviations are population stds (divide by n, not n - 1), unlike TRL's `torch.std` (unbiased): a group of
one then has std 0 (and is degenerate) instead of NaN, the ragged per-step sets of `process` and `step_baseline` are
plain z-scores, and with eps = 0 and a two-member group the advantages are exactly +-1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from pgcli.ops.aggregate import (
    BatchTotals,
    _check_totals,
)


class GroupAdvantages(NamedTuple):
    """Output of `group_normalized_advantages`."""

    advantages: Tensor
    """[E, L] advantage per step; 0.0 on padding and for every step of a degenerate group."""
    degenerate: Tensor
    """[M] bool: the group carries no signal (see the mode), so its advantages are exactly 0.0."""
    group_return_mean: Tensor
    """[M] mean of the episode returns R_i = sum_t gamma^t r_{i,t} in the group (every mode; for logging)."""
    group_return_std: Tensor
    """[M] population std of the same returns."""


class _Centred(NamedTuple):
    """A mode's advantage before scaling, and the two stds `scale` can divide it by."""

    centred: Tensor  # [E, L], arbitrary on padding
    group_std: Tensor  # [M]
    batch_std: Tensor  # []
    degenerate: Tensor  # [M] bool


def _group_sums(values: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Per-(group, column) sum of the real entries of `values` [E, L] and their count: two [M, L] tensors."""
    real = mask.bool()
    sums = values.new_zeros(n_groups, values.shape[1]).index_add_(0, group_ids, values.masked_fill(~real, 0.0))
    counts = values.new_zeros(n_groups, values.shape[1]).index_add_(0, group_ids, real.to(values.dtype))
    return sums, counts


def _group_mean_std(values: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Mean and population std over each group's real entries of `values` [E, L] (all columns pooled): two [M]."""
    sums, counts = _group_sums(values, mask, group_ids, n_groups)
    mean = sums.sum(1) / counts.sum(1)  # [M]
    # two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels badly
    sq_sums, _ = _group_sums((values - mean[group_ids, None]) ** 2, mask, group_ids, n_groups)
    return mean, (sq_sums.sum(1) / counts.sum(1)).sqrt()


def _batch_std(values: Tensor, mask: Tensor) -> Tensor:
    """Population std over all real entries of `values` [E, L]: a 0-dim tensor."""
    one_group = torch.zeros(values.shape[0], dtype=torch.long, device=values.device)
    return _group_mean_std(values, mask, one_group, 1)[1][0]


def _group_max_min(values: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Per-(group, column) max and min of the real entries of `values` [E, L]: two [M, L]; -inf / +inf if none."""
    real = mask.bool()
    index = group_ids[:, None].expand_as(values)
    high = values.new_full((n_groups, values.shape[1]), -torch.inf)
    low = values.new_full((n_groups, values.shape[1]), torch.inf)
    high = high.scatter_reduce(0, index, values.masked_fill(~real, -torch.inf), reduce="amax")
    low = low.scatter_reduce(0, index, values.masked_fill(~real, torch.inf), reduce="amin")
    return high, low


def _reward_to_go(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} within each episode (padding contributes 0): [E, L], 0.0 on padding."""
    real = mask.bool()
    rewards = rewards.masked_fill(~real, 0.0)  # padding may hold garbage, even NaN
    to_go = torch.zeros_like(rewards)  # [E, L]
    running = torch.zeros_like(rewards[:, 0])  # [E]
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        to_go[:, t] = running
    return to_go.masked_fill(~real, 0.0)


def _outcome(rewards: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int, *, gamma: float) -> _Centred:
    """A_i = R_i - mean_g(R) on every step of episode i; degenerate when the group's returns are all equal."""
    returns = _reward_to_go(rewards, mask, gamma)[:, :1]  # [E, 1]: discounted return from the shared start
    every = torch.ones_like(returns)
    mean, std = _group_mean_std(returns, every, group_ids, n_groups)
    high, low = _group_max_min(returns, every, group_ids, n_groups)  # [M, 1]
    return _Centred(
        centred=(returns - mean[group_ids, None]).expand_as(rewards),
        group_std=std,
        batch_std=_batch_std(returns, every),
        degenerate=high[:, 0] == low[:, 0],
    )


def _process(rewards: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int, *, gamma: float) -> _Centred:
    """A_t = discounted sum_{t' >= t} (r_t' - mean_g(r)); degenerate when all the group's step rewards are equal.

    DeepSeekMath normalises the rewards first, (r - mean) / std, then sums; the sum is linear and std_g is constant
    within an episode, so centring here and dividing afterwards gives the same advantages.
    """
    mean, std = _group_mean_std(rewards, mask, group_ids, n_groups)
    high, low = _group_max_min(rewards, mask, group_ids, n_groups)  # [M, L]
    return _Centred(
        centred=_reward_to_go(rewards - mean[group_ids, None], mask, gamma),
        group_std=std,
        batch_std=_batch_std(rewards, mask),
        degenerate=high.amax(1) == low.amin(1),
    )


def _step_baseline(rewards: Tensor, mask: Tensor, group_ids: Tensor, n_groups: int, *, gamma: float) -> _Centred:
    """A_t = G_t - b_t, b_t = mean of G_t over the group's members still alive at t; the stds are those of A_t.

    Degenerate when, at every t, the alive members share one return-to-go (so every A_t is 0). A member alone at
    step t (the others already ended) gets A_t = 0 there: it is its own baseline.
    """
    to_go = _reward_to_go(rewards, mask, gamma)  # [E, L]
    sums, counts = _group_sums(to_go, mask, group_ids, n_groups)  # [M, L]
    baseline = sums / counts.clamp_min(1.0)  # [M, L]; 0 where no member is alive
    deviation = to_go - baseline[group_ids]  # [E, L]
    _, std = _group_mean_std(deviation, mask, group_ids, n_groups)
    high, low = _group_max_min(to_go, mask, group_ids, n_groups)  # [M, L]
    return _Centred(
        centred=deviation,
        group_std=std,
        batch_std=_batch_std(deviation, mask),
        # high == low: alive members agree; high < low (-inf < inf): nobody alive at t
        degenerate=(high <= low).all(1),
    )


_MODES: dict[str, Callable[..., _Centred]] = {"outcome": _outcome, "process": _process, "step_baseline": _step_baseline}
ADVANTAGE_MODES: tuple[str, ...] = tuple(_MODES)
"""Values of `mode` accepted by `group_normalized_advantages`."""
# what each `scale` divides the centred signal by (signal, group_ids [E], eps): [E, 1] or 0-dim
_SCALES: dict[str, Callable[[_Centred, Tensor, float], Tensor]] = {
    "group": lambda signal, group_ids, eps: signal.group_std[group_ids, None] + eps,  # [E, 1]
    "batch": lambda signal, group_ids, eps: signal.batch_std + eps,
    "none": lambda signal, group_ids, eps: signal.centred.new_ones(()),
}
REWARD_SCALES: tuple[str, ...] = tuple(_SCALES)
"""Values of `scale` accepted by `group_normalized_advantages`."""


def _check_episode_batch(rewards: Tensor, mask: Tensor, group_ids: Tensor) -> int:
    """Validate the [E, L] + [E] layout and return the number of groups M."""
    if rewards.ndim != 2 or not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float [E, L] tensor (got {rewards.dtype} {tuple(rewards.shape)})")
    if mask.shape != rewards.shape:
        raise ValueError(f"mask must have the shape of rewards {tuple(rewards.shape)} (got {tuple(mask.shape)})")
    if group_ids.shape != rewards.shape[:1] or group_ids.dtype != torch.long:
        raise ValueError(
            f"group_ids must be a torch.long tensor of shape [E] = {tuple(rewards.shape[:1])} "
            f"(got {group_ids.dtype} {tuple(group_ids.shape)})"
        )
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"need at least one episode and one step (got rewards {tuple(rewards.shape)})")
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError("mask must hold only 0.0 and 1.0")
    if (mask[:, 1:] > mask[:, :-1]).any() or (mask[:, 0] == 0).any():
        raise ValueError("mask must be a prefix mask: each episode's real steps first (at least one), then padding")
    if group_ids.min() < 0:
        raise ValueError(f"group_ids must be >= 0 (got min {int(group_ids.min())})")
    n_groups = int(group_ids.max()) + 1
    missing = (torch.bincount(group_ids, minlength=n_groups) == 0).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"group_ids must cover 0..{n_groups - 1} without gaps (no episode in groups {missing})")
    return n_groups


def _check_options(*, mode: str, scale: str, gamma: float, eps: float) -> None:
    """Validate `group_normalized_advantages`' keyword options."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {ADVANTAGE_MODES} (got {mode!r})")
    if scale not in REWARD_SCALES:
        raise ValueError(f"scale must be one of {REWARD_SCALES} (got {scale!r})")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] (got {gamma})")
    if eps < 0.0:
        raise ValueError(f"eps must be >= 0 (got {eps}); typical: 1e-4")


def group_normalized_advantages(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    mode: str,
    scale: str,
    gamma: float = 1.0,
    eps: float = 1e-4,
) -> GroupAdvantages:
    """Critic-free GRPO advantages: a group-relative signal, optionally divided by a std.

    Modes (g is episode i's group, G_{i,t} the discounted return-to-go, R_i = G_{i,0}):
        outcome: c_{i,t} = R_i - mean_{j in g} R_j, the same on every step of episode i. With gamma < 1, R_i is the
            discounted return from the shared initial state. Std: of {R_j : j in g}.
        process: c_{i,t} = sum_{t' >= t} gamma^(t'-t) (r_{i,t'} - mu_g), mu_g the mean of all real step rewards of
            the group's episodes (DeepSeekMath process supervision; gamma < 1 discounts the normalised rewards).
            Std: of those step rewards. With a constant per-step reward (CartPole's +1) every group is degenerate.
        step_baseline: c_{i,t} = G_{i,t} - b_{g,t}, b_{g,t} the mean of G_{j,t} over the members j of g still alive
            at step t (a per-time-step Monte Carlo baseline). Std: of {c_{j,t} : j in g, t real} (mean ~0, so the
            RMS deviation).
    Scales: "group": A = c / (std_g + eps); "batch": A = c / (std_batch + eps), where std_batch is the std of the
    same quantity over the whole batch (TRL "batch": group mean, batch std); "none": A = c (Dr. GRPO).
    All stds are population stds. A degenerate group gets A = 0.0 exactly whatever the scale and eps, never NaN.
    Group sizes may differ, though the trainer uses G members per group.

    Args:
        rewards: [E, L] reward after each step; padding may hold anything (it is ignored).
        mask: [E, L] float prefix mask, 1.0 on real steps (at least one per episode).
        group_ids: [E] long, values 0..M-1, every group non-empty.
        mode: one of `ADVANTAGE_MODES`.
        scale: one of `REWARD_SCALES`.
        gamma: discount in [0, 1]; 1.0 gives undiscounted sums.
        eps: >= 0, added to the std before dividing (TRL uses 1e-4).

    Returns:
        `GroupAdvantages`: advantages [E, L] (0.0 on padding), degenerate [M], group_return_mean [M],
        group_return_std [M].

    Raises:
        ValueError: on a bad mode, scale, gamma or eps, or tensors that break the layout above.
    """
    _check_options(mode=mode, scale=scale, gamma=gamma, eps=eps)
    n_groups = _check_episode_batch(rewards, mask, group_ids)

    signal = _MODES[mode](rewards, mask, group_ids, n_groups, gamma=gamma)
    keep = mask.bool() & ~signal.degenerate[group_ids, None]  # [E, L]
    # where, not multiply: a degenerate group's 0 / (0 + eps) may be NaN when eps = 0
    advantages = torch.where(keep, signal.centred / _SCALES[scale](signal, group_ids, eps), 0.0)
    returns = _reward_to_go(rewards, mask, gamma)[:, :1]  # [E, 1]
    return_mean, return_std = _group_mean_std(returns, torch.ones_like(returns), group_ids, n_groups)
    return GroupAdvantages(advantages, signal.degenerate, return_mean, return_std)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Elementwise k3 estimate of KL(pi || pi_ref) on actions sampled from pi (DeepSeekMath eq. 4; TRL's `beta` term).

    With x = ref_logp - logp: exp(x) - x - 1, computed as expm1(x) - x, which stays >= 0 in floating point (plain
    exp(x) - x - 1 can round below 0 for |x| ~ 1e-7) and is exactly 0 where logp == ref_logp.

    Args:
        logp: log pi(a|s) under the current policy, any shape ([E, L] in the trainer).
        ref_logp: log pi_ref(a|s), same shape.

    Returns:
        Non-negative tensor of the shape of `logp`.

    Raises:
        ValueError: on shape mismatch.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have the same shape")
    log_ratio = ref_logp - logp
    return torch.expm1(log_ratio) - log_ratio


def k1_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Elementwise k1 estimate of KL(pi || pi_ref) on actions sampled from pi: log pi - log pi_ref (unbiased, can be
    negative). Same arguments and errors as `k3_kl`."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have the same shape")
    return logp - ref_logp


def k2_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Elementwise k2 estimate of KL(pi || pi_ref) on actions sampled from pi: (log pi - log pi_ref)^2 / 2 (biased,
    non-negative). Same arguments and errors as `k3_kl`."""
    return 0.5 * k1_kl(logp, ref_logp) ** 2


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": k1_kl, "k2": k2_kl, "k3": k3_kl}
"""Schulman's ("Approximating KL divergence", 2020) per-sample estimators of KL(pi || pi_ref), by name: each maps
(logp, ref_logp) of the sampled actions to a tensor of their shape. As a loss term (the samples held fixed) the
expected gradient of k1 is 0, of k2 the gradient of KL(pi || pi_ref), of k3 the gradient of KL(pi_ref || pi)."""


def clip_bounds(epsilon: float, epsilon_high: float | None = None) -> tuple[float, float]:
    """Ratio clip interval (1 - epsilon, 1 + epsilon_high); decoupled bounds are DAPO's Clip-Higher (0.2 / 0.28).

    Args:
        epsilon: lower clip, in [0, 1).
        epsilon_high: upper clip, >= 0; None means `epsilon` (symmetric PPO clip).

    Returns:
        (low, high).

    Raises:
        ValueError: if a bound is out of range.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1) (got {epsilon}); typical: 0.2")
    high = epsilon if epsilon_high is None else epsilon_high
    if high < 0.0:
        raise ValueError(f"epsilon_high must be >= 0 or None (got {epsilon_high}); DAPO uses 0.28")
    return 1.0 - epsilon, 1.0 + high


def _check_clip(ratio: Tensor, advantages: Tensor, low: float, high: float) -> None:
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)} must have one shape")
    if not low <= 1.0 <= high:
        raise ValueError(f"clip bounds must satisfy low <= 1 <= high (got low={low}, high={high}); see clip_bounds")


def grpo_clipped_objective(ratio: Tensor, advantages: Tensor, low: float, high: float) -> Tensor:
    """Elementwise min(r * A, clamp(r, low, high) * A): the PPO-clip surrogate with possibly asymmetric bounds.

    Args:
        ratio: [E, L] (any shape) pi_theta(a|s) / pi_old(a|s).
        advantages: advantages, same shape.
        low: lower ratio bound, e.g. `clip_bounds(...)[0]`.
        high: upper ratio bound.

    Returns:
        Objective per step (to maximise), shape of `ratio`; aggregate its negation with `LOSS_AGGREGATIONS`.

    Raises:
        ValueError: on shape mismatch or bounds with not low <= 1 <= high.
    """
    _check_clip(ratio, advantages, low, high)
    return torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)


def clip_fractions(
    ratio: Tensor, advantages: Tensor, low: float, high: float, mask: Tensor, *, totals: BatchTotals | None = None
) -> tuple[float, float]:
    """Fractions of real steps where the clip is active (its gradient is zero) at the low and at the high bound.

    Low: r < low and A < 0. High: r > high and A > 0. Elsewhere the min picks the unclipped term.

    Args:
        ratio: [E, L] probability ratios.
        advantages: [E, L] advantages.
        low: lower ratio bound.
        high: upper ratio bound.
        mask: [E, L] 1.0 on real steps; at least one.
        totals: the whole batch these rows are a chunk of: fractions of its real steps (None: of these).

    Returns:
        (low_fraction, high_fraction), each in [0, 1].

    Raises:
        ValueError: on shape mismatch, bad bounds, or a mask with no real step.
    """
    _check_clip(ratio, advantages, low, high)
    if mask.shape != ratio.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must have the shape of ratio {tuple(ratio.shape)}")
    n_real = float(mask.sum())
    if totals is not None:
        _check_totals(totals, mask)
        n_real = float(totals.n_real)
    if n_real == 0:
        raise ValueError("mask has no real step")
    with torch.no_grad():
        at_low = ((ratio < low) & (advantages < 0)).to(mask.dtype)
        at_high = ((ratio > high) & (advantages > 0)).to(mask.dtype)
        return float((at_low * mask).sum()) / n_real, float((at_high * mask).sum()) / n_real
