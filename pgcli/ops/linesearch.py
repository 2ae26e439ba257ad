"""Backtracking line search enforcing TRPO's trust region (Schulman et al., 2015, appendix C).

Starting from the natural-gradient step scaled to the KL boundary, shrink it geometrically until the mean
KL(old || new) is within `max_kl` and the surrogate objective improved; if no fraction passes, restore the old
parameters (SB3-contrib TRPO and Spinning Up TRPO behave the same way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from torch import Tensor

from pgcli.ops.autodiff import flat_params, set_flat_params


class LineSearchResult(NamedTuple):
    """Outcome of `backtracking_line_search`."""

    success: bool
    """Whether a step was accepted (False: parameters restored)."""
    step_fraction: float
    """Fraction of the full step applied (0.0 on failure)."""
    n_backtracks: int
    """Index of the last fraction tried: 0 when the full step was accepted, max_backtracks - 1 on failure."""
    objective: float
    """Surrogate objective at the final parameters (old_objective on failure)."""
    kl: float
    """Mean KL(old || new) at the final parameters (0.0 on failure)."""


def backtracking_line_search(
    params: Sequence[Tensor],
    full_step: Tensor,
    evaluate: Callable[[], tuple[float, float]],
    *,
    expected_improve: float | None = None,
    accept_ratio: float = 0.1,
    backtrack_coeff: float,
    max_backtracks: int,
    max_kl: float,
    old_objective: float,
) -> LineSearchResult:
    """Try params + coeff^j * full_step for j = 0, ..., max_backtracks - 1; keep the first acceptable one.

    A fraction is accepted when the objective and KL are finite, KL <= max_kl, and the objective improved on
    `old_objective`. With `expected_improve` (the first-order improvement g . full_step of the full step), it must
    also improve by more than accept_ratio * expected_improve * fraction (Armijo condition; modular_rl's TRPO
    `linesearch`, accept_ratio 0.1). Each candidate is computed from the saved parameters, so a failed search
    restores them bit for bit.

    Args:
        params: parameters to update in place (P elements).
        full_step: [P] step for fraction 1.
        evaluate: returns (surrogate objective to maximise, mean KL(old || new)) at the current `params`.
        expected_improve: predicted improvement of the full step; None checks plain improvement only.
        accept_ratio: minimum actual / expected improvement, used only with `expected_improve`.
        backtrack_coeff: shrink factor in (0, 1) (SB3, Spinning Up: 0.8; baselines: 0.5).
        max_backtracks: number of fractions tried, full step included (SB3, Spinning Up, baselines: 10).
        max_kl: trust-region radius on the mean KL.
        old_objective: objective at the current parameters.

    Returns:
        A `LineSearchResult`.

    Raises:
        ValueError: if `full_step` does not match `params`, `backtrack_coeff` is outside (0, 1), or
            `max_backtracks` < 1.
    """
    n_total = sum(p.numel() for p in params)
    if full_step.shape != (n_total,):
        raise ValueError(f"full_step must be [{n_total}] for these params, got shape {tuple(full_step.shape)}")
    if not 0.0 < backtrack_coeff < 1.0:
        raise ValueError(f"backtrack_coeff must be in (0, 1), got {backtrack_coeff}")
    if max_backtracks < 1:
        raise ValueError(f"max_backtracks must be >= 1, got {max_backtracks}")
    old_params = flat_params(params)  # [P]
    full_step = full_step.detach()
    for j in range(max_backtracks):
        fraction = backtrack_coeff**j
        set_flat_params(params, old_params + fraction * full_step)
        objective, kl = (float(v) for v in evaluate())
        improve = objective - old_objective
        min_improve = 0.0 if expected_improve is None else max(0.0, accept_ratio * expected_improve * fraction)
        if math.isfinite(objective) and math.isfinite(kl) and kl <= max_kl and improve > min_improve:
            return LineSearchResult(True, fraction, j, objective, kl)
    set_flat_params(params, old_params)
    return LineSearchResult(False, 0.0, max_backtracks - 1, old_objective, 0.0)
