"""Conjugate gradient for the TRPO natural-gradient direction: solve F x = g given only Fisher-vector products.

Hestenes & Stiefel (1952); as in TRPO (Schulman et al., 2015, appendix C) and its reference implementations
(OpenAI baselines `cg`, Spinning Up `cg`): x0 = 0, stop early once the squared residual drops below `residual_tol`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def conjugate_gradient(
    matvec: Callable[[Tensor], Tensor],
    b: Tensor,
    *,
    n_iters: int,
    residual_tol: float = 1e-10,
) -> tuple[Tensor, float]:
    """Approximately solve A x = b for symmetric positive-definite A, starting from x0 = 0.

    Args:
        matvec: v -> A v, mapping a [P] tensor to a [P] tensor.
        b: [P] right-hand side.
        n_iters: maximum number of iterations (each costs one `matvec`); exact in P iterations in exact arithmetic.
        residual_tol: stop once the squared residual norm ||b - A x||^2 falls below this (baselines: 1e-10).

    Returns:
        (x, residual) where x is [P] and residual is the final SQUARED residual norm ||b - A x||^2 as tracked by the
        recursion r_{k+1} = r_k - alpha_k A p_k.

    Raises:
        ValueError: if `b` is not 1-D, `n_iters` < 0, or `matvec` changes the shape.
    """
    if b.dim() != 1:
        raise ValueError(f"b must be a 1-D [P] tensor, got shape {tuple(b.shape)}")
    if n_iters < 0:
        raise ValueError(f"n_iters must be >= 0, got {n_iters}")
    x = torch.zeros_like(b)
    r = b.clone()  # residual b - A x, with x0 = 0
    p = b.clone()  # search direction
    r_dot_r = torch.dot(r, r)
    for _ in range(n_iters):
        if r_dot_r < residual_tol:
            break
        a_p = matvec(p)
        if a_p.shape != p.shape:
            raise ValueError(f"matvec must map shape {tuple(p.shape)} to itself, got {tuple(a_p.shape)}")
        alpha = r_dot_r / torch.dot(p, a_p)
        x = x + alpha * p
        r = r - alpha * a_p
        new_r_dot_r = torch.dot(r, r)
        p = r + (new_r_dot_r / r_dot_r) * p
        r_dot_r = new_r_dot_r
    return x, float(r_dot_r)
