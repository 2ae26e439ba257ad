"""Flat-vector autodiff helpers for second-order policy updates (TRPO, natural policy gradient).

The Fisher-vector product uses double backpropagation (Pearlmutter, 1994): the Hessian of the mean KL(old || new)
at new = old is the Fisher information matrix (TRPO, Schulman et al., 2015, appendix C), so
F v = grad((grad KL) . v) without ever forming F.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def flat_grad(
    output: Tensor,
    params: Sequence[Tensor],
    *,
    retain_graph: bool | None = None,
    create_graph: bool = False,
) -> Tensor:
    """Gradient of a scalar w.r.t. `params`, concatenated into one vector.

    Args:
        output: scalar (one-element) tensor.
        params: tensors requiring grad, P elements in total.
        retain_graph: keep the graph for another backward pass; None follows `create_graph`, as in
            `torch.autograd.grad`.
        create_graph: build a graph of the gradient itself (for higher-order derivatives).

    Returns:
        [P] gradient; parameters that `output` does not depend on contribute zeros.

    Raises:
        ValueError: if `output` is not a scalar.
    """
    if output.numel() != 1:
        raise ValueError(f"output must be a scalar, got shape {tuple(output.shape)}")
    grads = torch.autograd.grad(
        output, list(params), retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
    )
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params, strict=True)]
    )


def flat_params(params: Sequence[Tensor]) -> Tensor:
    """Detached copy of `params` concatenated into one [P] vector (in the order given)."""
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def set_flat_params(params: Sequence[Tensor], flat: Tensor) -> None:
    """Copy a [P] vector into `params` in place (inverse of `flat_params`), outside autograd.

    Raises:
        ValueError: if `flat` is not 1-D with as many elements as `params` hold.
    """
    n_total = sum(p.numel() for p in params)
    if flat.dim() != 1 or flat.numel() != n_total:
        raise ValueError(f"flat must be a [{n_total}] vector for these params, got shape {tuple(flat.shape)}")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def fisher_vector_product(kl: Tensor, params: Sequence[Tensor], vector: Tensor, *, damping: float) -> Tensor:
    """Damped Fisher-vector product (F + damping * I) v via the Hessian of the mean KL.

    Args:
        kl: scalar mean KL(old || new) over states, with `old` detached, evaluated at new = old and differentiable
            twice w.r.t. `params`. The graph is retained, so the same `kl` can serve every CG iteration.
        params: policy parameters (P elements); pass only the actor's, as SB3 TRPO does.
        vector: [P] vector v.
        damping: Tikhonov damping added as damping * v (TRPO: 0.1 in SB3 and Spinning Up), which keeps CG stable
            when F is near singular.

    Returns:
        [P] tensor (F + damping * I) v, detached.

    Raises:
        ValueError: if `kl` is not a scalar or `vector` does not match the parameter count.
    """
    n_total = sum(p.numel() for p in params)
    if vector.shape != (n_total,):
        raise ValueError(f"vector must be [{n_total}] for these params, got shape {tuple(vector.shape)}")
    grad_kl = flat_grad(kl, params, retain_graph=True, create_graph=True)  # [P], differentiable
    grad_kl_v = torch.dot(grad_kl, vector.detach())
    return flat_grad(grad_kl_v, params, retain_graph=True).detach() + damping * vector
