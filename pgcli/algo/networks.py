"""The multilayer perceptron under pgcli's own policies and value networks, and its Jacobian without autograd.

:class:`MLP`: Linear -> activation per hidden width, then a linear head; orthogonal initialisation with gain sqrt(2)
on hidden layers and a caller-chosen head gain (SB3, CleanRL; Engstrom et al., 2020).

For tanh and relu, whose derivative is a function of their output, the network is differentiated by hand from the
cached activations of one forward pass (``pgcli.algo.kernels.ACTIVATION_BACKWARD``), a handful of matmuls per layer
and no autograd graph:

- :meth:`MLP.mse_grad_fn`: the gradient of mean((f(x) - y)^2) per parameter, for ``pgcli.algo.rollout.fit_value``'s
  thousands of small critic steps per update;
- :meth:`MLP.linearize` -> :class:`Linearization`: J v (forward mode) and J^T u (backprop) at one batch, J = d f(x) /
  d theta, for the policies' Fisher-vector products (TRPO's conjugate gradient).

Other activations return None there and callers use autograd; both give the same numbers up to rounding
(tests/unit/test_rollout.py, tests/unit/test_policies.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pgcli.algo.kernels import ACTIVATION_BACKWARD, ActivationBackward


class Activation(NamedTuple):
    """One ``model.activation``: the function our networks call and the same function as a module (SB3's
    ``activation_fn``)."""

    function: Callable[[Tensor], Tensor]
    module: type[nn.Module]


ACTIVATIONS: dict[str, Activation] = {
    "tanh": Activation(torch.tanh, nn.Tanh),
    "relu": Activation(torch.relu, nn.ReLU),
    "elu": Activation(F.elu, nn.ELU),
    "gelu": Activation(F.gelu, nn.GELU),
    "leaky_relu": Activation(F.leaky_relu, nn.LeakyReLU),
}
"""The one activation table, by ``model.activation`` name (the names ``pgcli.config.rules.ACTIVATIONS`` accepts; tanh
and relu also have explicit derivatives: ``ACTIVATION_BACKWARD``)."""
HIDDEN_GAIN = math.sqrt(2.0)
"""Orthogonal-init gain of hidden layers (SB3, CleanRL; Engstrom et al., 2020)."""


class MLP(nn.Module):
    """Fully connected network: Linear -> activation for each hidden width, then a linear output layer.

    The forward pass calls ``F.linear`` on each layer's parameters directly instead of chaining ``nn.Module`` calls:
    on batches of 8 observations the per-module call overhead is a visible share of a rollout step.
    """

    obs_dtype = torch.float32
    """The dtype observations are handed over in (``pgcli.algo.cnn.CNNNet`` takes uint8 frames)."""

    def __init__(
        self,
        in_dim: int,
        hidden_sizes: Sequence[int],
        out_dim: int,
        *,
        activation: str,
        ortho_init: bool,
        out_gain: float,
    ) -> None:
        super().__init__()
        sizes = [in_dim, *(int(h) for h in hidden_sizes), out_dim]
        linears = [nn.Linear(a, b) for a, b in itertools.pairwise(sizes)]
        self.layers = nn.ModuleList(linears)  # registers the parameters
        # plain references for the forward pass (a tuple is not registered a second time in the state dict)
        self._linears = tuple(linears)
        self.activation_name, self.activation = activation, ACTIVATIONS[activation].function
        if ortho_init:
            for layer in linears:
                nn.init.orthogonal_(layer.weight, gain=out_gain if layer is linears[-1] else HIDDEN_GAIN)
                nn.init.zeros_(layer.bias)

    @property
    def device(self) -> torch.device:
        return self._linears[0].weight.device

    def forward(self, x: Tensor) -> Tensor:
        """[B, in_dim] -> [B, out_dim]."""
        *hidden, out = self._linears
        for layer in hidden:
            x = self.activation(F.linear(x, layer.weight, layer.bias))
        return F.linear(x, out.weight, out.bias)

    def linearize(self, x: Tensor) -> Linearization | None:
        """The network's Jacobian at the batch ``x`` [B, in_dim] (:class:`Linearization`), or None when the activation
        has no explicit derivative here (then callers use autograd)."""
        act_backward = ACTIVATION_BACKWARD.get(self.activation_name)
        if act_backward is None:
            return None
        weights = [layer.weight for layer in self._linears]
        with torch.no_grad():
            inputs, output = _forward_cached(
                x, [w.T for w in weights], [layer.bias for layer in self._linears], self.activation
            )
        return Linearization(weights, inputs, output, act_backward)

    def mse_grads(self, x: Tensor, target: Tensor) -> tuple[Tensor, list[Tensor]]:
        """mean((f(x) - target)^2) and its gradient w.r.t. each parameter, in ``self.parameters()`` order.

        For tanh and relu the gradient is backpropagated explicitly (:meth:`mse_grad_fn`); other activations use
        autograd. Both give the same numbers (tests/unit/test_rollout.py).

        Args:
            x: [B, in_dim] inputs.
            target: [B, out_dim] regression targets.

        Returns:
            (loss, grads): the 0-dim detached loss and one gradient per parameter.
        """
        fn = self.mse_grad_fn()
        if fn is None:
            loss = F.mse_loss(self(x), target)
            return loss.detach(), list(torch.autograd.grad(loss, list(self.parameters())))
        diff, grads = fn(x, target)
        return diff.square().mean(), grads

    def mse_grad_fn(self) -> Callable[[Tensor, Tensor], tuple[Tensor, list[Tensor]]] | None:
        """A function (x, target) -> (f(x) - target, gradient of mean((f(x) - target)^2) per parameter), or None when
        the activation has no explicit derivative here.

        The gradient is backpropagated by hand: a handful of matmuls per layer, no autograd graph or engine. The
        function holds the parameters (and their transposes) as tensors, which in-place optimizer steps keep
        current, so a loop of small critic steps pays no per-call module lookups (``pgcli.algo.rollout.fit_value``
        runs thousands per update). It returns the residual rather than the loss, so callers that need the loss
        only for logging can compute all of them at once.
        """
        act_backward = ACTIVATION_BACKWARD.get(self.activation_name)
        if act_backward is None:
            return None
        act = self.activation
        weights = [layer.weight for layer in self._linears]
        weights_t = [w.T for w in weights]
        biases = [layer.bias for layer in self._linears]

        @torch.no_grad()
        def fn(x: Tensor, target: Tensor) -> tuple[Tensor, list[Tensor]]:
            inputs, output = _forward_cached(x, weights_t, biases, act)
            diff = output.sub_(target)  # [B, out_dim]
            return diff, _backprop(diff * (2.0 / diff.numel()), inputs, weights, act_backward)

        return fn


def _forward_cached(
    x: Tensor, weights_t: Sequence[Tensor], biases: Sequence[Tensor], act: Callable[[Tensor], Tensor]
) -> tuple[list[Tensor], Tensor]:
    """An MLP forward pass that keeps each layer's input: (inputs [x, a_1, ..., a_{L-1}], output)."""
    inputs = [x]
    for i in range(len(weights_t) - 1):
        inputs.append(act(torch.addmm(biases[i], inputs[i], weights_t[i])))
    return inputs, torch.addmm(biases[-1], inputs[-1], weights_t[-1])


def _backprop(
    grad_out: Tensor,
    inputs: Sequence[Tensor],
    weights: Sequence[Tensor],
    act_backward: ActivationBackward,
) -> list[Tensor]:
    """J^T u for the output gradient u = ``grad_out`` of an MLP whose layer inputs are ``inputs``: one gradient per
    parameter, in ``MLP.parameters()`` order (weight, bias per layer)."""
    grads: list[Tensor] = [grad_out] * (2 * len(weights))
    for i in range(len(weights) - 1, -1, -1):
        grads[2 * i], grads[2 * i + 1] = grad_out.T @ inputs[i], grad_out.sum(0)  # weight, bias
        if i > 0:
            grad_out = act_backward(grad_out @ weights[i], inputs[i])  # through the previous activation
    return grads


class Linearization:
    """An MLP's Jacobian J = d f(x) / d theta at one batch x, applied without autograd from cached activations.

    ``jvp(v)`` = J v (forward-mode: each layer's tangent is dW a + W da + db, through the activation's derivative)
    and ``vjp(u)`` = J^T u (backprop). Parameters and tangents are in ``MLP.parameters()`` order (weight, bias per
    layer). Only for activations whose derivative is a function of their output (tanh, relu).
    """

    def __init__(
        self,
        weights: Sequence[Tensor],
        inputs: list[Tensor],
        output: Tensor,
        act_backward: ActivationBackward,
    ) -> None:
        self.weights, self.inputs, self.output, self.act_backward = weights, inputs, output, act_backward

    @torch.no_grad()
    def jvp(self, tangents: Sequence[Tensor]) -> Tensor:
        """J v for ``tangents`` [dW_0, db_0, dW_1, db_1, ...] (shaped as the parameters) -> [B, out_dim]."""
        d_in: Tensor | None = None  # tangent of the current layer's input (the batch x itself has none)
        for i, weight in enumerate(self.weights):
            d_weight, d_bias = tangents[2 * i], tangents[2 * i + 1]
            d_pre = torch.addmm(d_bias, self.inputs[i], d_weight.T)  # [B, out]
            if d_in is not None:
                d_pre.addmm_(d_in, weight.T)
            # the activation's derivative is diagonal: its backward applied to a tangent is its forward derivative
            d_in = d_pre if i == len(self.weights) - 1 else self.act_backward(d_pre, self.inputs[i + 1])
        assert d_in is not None
        return d_in

    @torch.no_grad()
    def vjp(self, grad_out: Tensor) -> list[Tensor]:
        """J^T u for ``grad_out`` u [B, out_dim]: one gradient per parameter, in ``MLP.parameters()`` order."""
        return _backprop(grad_out, self.inputs, self.weights, self.act_backward)
