"""Private torch kernels and their public-API fallbacks: each fallback is forced here and compared with the fast path.

Tolerances, stated per test: exact (``torch.equal``) where both paths compute the same floating-point operations in
the same order; ``atol`` where they round differently (a fused multiply-add, a fused kernel's operation order).
"""

from types import SimpleNamespace

import pytest
import torch

from pgcli.algo import kernels
from pgcli.algo.kernels import (
    ACTIVATION_BACKWARD,
    AdamHyper,
    AdamState,
    activation_backward,
    fused_adam_step,
    pick_adam_step,
    plain_adam_step,
    relu_backward,
    tanh_backward,
)
from pgcli.algo.policies import CategoricalPolicy, ValueNetwork
from pgcli.algo.rollout import fit_value
from pgcli.config import ModelConfig

HAS_FUSED_ADAM = pick_adam_step(torch) is fused_adam_step


def grad_and_output(activation, shape=(257, 63)):
    gen = torch.Generator().manual_seed(0)
    grad, x = torch.randn(shape, generator=gen), 3.0 * torch.randn(shape, generator=gen)
    x[0, :3] = 0.0  # relu's kink: out == 0 passes no gradient
    return grad, activation(x)


def test_this_torch_takes_the_private_kernels_and_a_torch_without_them_the_public_ops():
    # the default path stays the one every recorded metric history was computed with
    assert ACTIVATION_BACKWARD["tanh"] is torch.ops.aten.tanh_backward
    assert ACTIVATION_BACKWARD["relu"] is not relu_backward
    assert kernels.adam_step is fused_adam_step
    assert activation_backward(SimpleNamespace()) == {"tanh": tanh_backward, "relu": relu_backward}
    assert pick_adam_step(SimpleNamespace()) is plain_adam_step
    assert pick_adam_step(SimpleNamespace(_fused_adam_=torch._fused_adam_)) is plain_adam_step  # needs both kernels


def test_relu_fallback_equals_threshold_backward_exactly():
    # exact: both select the gradient or 0.0 (no arithmetic)
    grad, out = grad_and_output(torch.relu)
    assert torch.equal(relu_backward(grad, out), ACTIVATION_BACKWARD["relu"](grad, out))
    assert relu_backward(grad, out)[0, :3].eq(0).all()


def test_tanh_fallback_matches_tanh_backward_within_rounding():
    # within atol 1e-6 (a few ulp of gradients ~1): whether 1 - out^2 is one fused multiply-add depends on the CPU
    # build (on the CI machine, x86-64, they agree exactly)
    grad, out = grad_and_output(torch.tanh)
    assert torch.allclose(tanh_backward(grad, out), ACTIVATION_BACKWARD["tanh"](grad, out), rtol=0.0, atol=1e-6)
    x = torch.randn(50, requires_grad=True)
    (autograd,) = torch.autograd.grad(torch.tanh(x), x, torch.ones(50))
    assert torch.allclose(tanh_backward(torch.ones(50), torch.tanh(x).detach()), autograd, atol=1e-6)


def adam_run(step_fn, hyper, n_steps=30):
    """``n_steps`` Adam steps on four parameters with seeded gradients: the AdamState (params, exp_avgs, exp_avg_sqs,
    steps)."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.randn(shape, generator=gen) for shape in [(64, 4), (64,), (1, 64), (1,)]]
    state = AdamState(
        params,
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.tensor(0.0) for _ in params],
    )
    for _ in range(n_steps):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        step_fn(state, grads, hyper)
    return state


def optimizer_step(**options):
    """An AdamStep that runs ``torch.optim.Adam(**options).step()`` on the given state (the reference)."""

    def step(state, grads, hyper):
        leaves = [p.clone().requires_grad_() for p in state.params]
        opt = torch.optim.Adam(leaves, lr=hyper.lr, betas=(hyper.beta1, hyper.beta2), eps=hyper.eps, **options)
        for leaf, g, m, v, t in zip(leaves, grads, state.exp_avgs, state.exp_avg_sqs, state.steps, strict=True):
            leaf.grad = g
            opt.state[leaf] = {"step": t, "exp_avg": m, "exp_avg_sq": v}  # advanced in place
        opt.step()
        with torch.no_grad():
            for p, leaf in zip(state.params, leaves, strict=True):
                p.copy_(leaf)

    return step


HYPER = AdamHyper(lr=3e-3, beta1=0.8, beta2=0.95, eps=1e-6)


def test_plain_adam_step_is_torch_optim_adam_bit_for_bit():
    # exact: the same single-tensor update torch.optim.Adam(foreach=False) takes, op for op
    for ours, ref in zip(adam_run(plain_adam_step, HYPER), adam_run(optimizer_step(foreach=False), HYPER), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


@pytest.mark.skipif(not HAS_FUSED_ADAM, reason="this torch has no torch._fused_adam_")
def test_fused_adam_step_is_torch_fused_adam_bit_for_bit():
    # exact: the kernel torch.optim.Adam(fused=True) runs, on the same state
    for ours, ref in zip(adam_run(fused_adam_step, HYPER), adam_run(optimizer_step(fused=True), HYPER), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


@pytest.mark.skipif(not HAS_FUSED_ADAM, reason="this torch has no torch._fused_adam_")
def test_plain_adam_step_matches_the_fused_kernel_within_rounding():
    # within atol 1e-6 after 30 steps (parameters ~1): the fused kernel orders the same operations differently
    fused, plain = adam_run(fused_adam_step, HYPER), adam_run(plain_adam_step, HYPER)
    for a, b in zip(fused[0] + fused[1] + fused[2], plain[0] + plain[1] + plain[2], strict=True):
        assert torch.allclose(a, b, rtol=0.0, atol=1e-6)
    assert [t.item() for t in fused[3]] == [t.item() for t in plain[3]] == [30.0] * 4  # step counts: exact


@pytest.fixture
def public_kernels(monkeypatch):
    """Force every fallback: the public activation derivatives and the plain Adam step."""
    monkeypatch.setitem(ACTIVATION_BACKWARD, "tanh", tanh_backward)
    monkeypatch.setitem(ACTIVATION_BACKWARD, "relu", relu_backward)
    monkeypatch.setattr(kernels, "adam_step", plain_adam_step)


def fit(activation):
    torch.manual_seed(0)
    value = ValueNetwork(4, ModelConfig(activation=activation))
    optimizer = torch.optim.Adam(value.parameters(), lr=1e-2)
    obs, returns = torch.randn(300, 4), torch.randn(300)
    losses = [fit_value(value, optimizer, obs, returns, n_epochs=3, batch_size=64) for _ in range(2)]
    return losses, list(value.parameters()), [optimizer.state[p]["exp_avg_sq"] for p in value.parameters()]


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_fit_value_on_the_fallbacks_matches_the_fast_path(activation, request):
    # within rel 1e-5 (losses) and atol 1e-6 (parameters, Adam moments) after 30 steps: the paths round differently
    fast = fit(activation)
    request.getfixturevalue("public_kernels")
    slow = fit(activation)
    assert slow[0] == pytest.approx(fast[0], rel=1e-5)
    for a, b in zip(fast[1] + fast[2], slow[1] + slow[2], strict=True):
        assert torch.allclose(a, b, rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_fisher_product_on_the_fallbacks_matches_the_fast_path(activation, request):
    # within rtol 1e-5: the Jacobian products go through the activation derivatives only
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 3, ModelConfig(activation=activation))
    obs, vector = torch.randn(40, 4), torch.randn(sum(p.numel() for p in policy.actor_parameters()))
    fast = policy.fisher_product(obs)
    request.getfixturevalue("public_kernels")
    slow = policy.fisher_product(obs)
    assert fast is not None and slow is not None
    assert torch.allclose(slow(vector), fast(vector), rtol=1e-5, atol=1e-7)
