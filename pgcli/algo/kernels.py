"""The private torch kernels pgcli calls for speed, each detected once at import with a public-API fallback.

Private operators (``torch._fused_adam_``, ``torch.ops.aten.tanh_backward``, ...) are not part of torch's public API
and may change or vanish in any release. Every one used here is looked up with ``getattr`` when this module is
imported; where this torch has it, it is the path taken (the one every recorded metric history was computed with);
where it does not, the same computation in public ops is taken instead. tests/unit/test_kernels.py forces each
fallback and compares it with the fast path.

- Activation derivatives from the activation's output (:data:`ACTIVATION_BACKWARD`), for the hand-written backprop
  of ``pgcli.algo.networks``: d tanh = grad * (1 - out^2), d relu = grad where out > 0, else 0.
- One Adam step on explicit gradients (:data:`adam_step`), for ``pgcli.algo.rollout.fit_value``: the kernel
  ``torch.optim.Adam(fused=True)`` runs, called without ``Optimizer.step``'s per-call dispatch (about 50 us), else
  ``torch.optim.Adam``'s single-tensor step written out (Kingma & Ba, 2015, algorithm 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

ActivationBackward = Callable[[Tensor, Tensor], Tensor]
"""(gradient w.r.t. an activation's output, that output) -> gradient w.r.t. the activation's input."""


def tanh_backward(grad: Tensor, out: Tensor) -> Tensor:
    """grad * (1 - out^2), the derivative of tanh through its output ``out`` (any shape, that of ``grad``).

    ``1 - out^2`` is one multiply-add (``addcmul``): on the CI machine this matches aten's ``tanh_backward`` bit for
    bit, where ``grad * (1 - out * out)`` (two roundings) does not."""
    return grad * torch.addcmul(torch.ones_like(out), out, out, value=-1.0)


def relu_backward(grad: Tensor, out: Tensor) -> Tensor:
    """grad where out > 0, else 0: the derivative of relu through its output ``out`` (any shape, that of ``grad``)."""
    return grad.masked_fill(out <= 0, 0.0)


def activation_backward(aten: Any) -> dict[str, ActivationBackward]:
    """The explicit activation derivatives by activation name: aten's one-kernel ``tanh_backward`` and
    ``threshold_backward`` where the operator namespace ``aten`` (``torch.ops.aten``) has them, else
    :func:`tanh_backward` and :func:`relu_backward`."""
    table: dict[str, ActivationBackward] = {"tanh": tanh_backward, "relu": relu_backward}
    if (fused_tanh := getattr(aten, "tanh_backward", None)) is not None:
        table["tanh"] = fused_tanh
    if (fused_threshold := getattr(aten, "threshold_backward", None)) is not None:
        table["relu"] = lambda grad, out: fused_threshold(grad, out, 0.0)  # grad * (out > 0)
    return table


ACTIVATION_BACKWARD: dict[str, ActivationBackward] = activation_backward(torch.ops.aten)
"""d activation / d input from the activation's OUTPUT, for the activations that have one here (tanh, relu)."""


class AdamState(NamedTuple):
    """Adam's state on explicit tensors, one per parameter in each list, advanced in place by an :data:`AdamStep`."""

    params: list[Tensor]
    exp_avgs: list[Tensor]
    """First moments m, each shaped as its parameter."""
    exp_avg_sqs: list[Tensor]
    """Second moments v, each shaped as its parameter."""
    steps: list[Tensor]
    """Step counts t: 0-dim float tensors (Adam's ``state["step"]``)."""


class AdamHyper(NamedTuple):
    """Adam's hyperparameters (no weight decay, amsgrad or maximize)."""

    lr: float
    beta1: float
    beta2: float
    eps: float


AdamStep = Callable[[AdamState, list[Tensor], AdamHyper], None]
"""One Adam step, in place, on every parameter of the state with its gradient (the list, one per parameter)."""


def plain_adam_step(state: AdamState, grads: list[Tensor], hyper: AdamHyper) -> None:
    """The step ``torch.optim.Adam(foreach=False)`` takes (no weight decay, amsgrad or maximize), in public ops.

    Per parameter p with gradient g, at step t (its 0-dim float tensor in ``state.steps``, incremented first):
    m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
    p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
    """
    lr, beta1, beta2, eps = hyper
    per_param = zip(state.params, grads, state.exp_avgs, state.exp_avg_sqs, state.steps, strict=True)
    for param, grad, exp_avg, exp_avg_sq, step_t in per_param:
        step_t += 1
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def fused_adam_step(state: AdamState, grads: list[Tensor], hyper: AdamHyper) -> None:
    """:func:`plain_adam_step` through the private kernels ``torch.optim.Adam(fused=True).step()`` runs (only where
    :func:`pick_adam_step` found them): the same update, rounded differently (ulp-level differences)."""
    params, exp_avgs, exp_avg_sqs, steps = state
    lr, beta1, beta2, eps = hyper
    torch._foreach_add_(steps, 1)
    torch._fused_adam_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=0.0,
        eps=eps,
        amsgrad=False,
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def pick_adam_step(namespace: Any) -> AdamStep:
    """:func:`fused_adam_step` where the module ``namespace`` (``torch``) has both kernels it calls, else
    :func:`plain_adam_step`."""
    has_kernels = all(getattr(namespace, name, None) is not None for name in ("_fused_adam_", "_foreach_add_"))
    return fused_adam_step if has_kernels else plain_adam_step


adam_step: AdamStep = pick_adam_step(torch)
"""The Adam step ``fit_value`` takes on this torch."""
