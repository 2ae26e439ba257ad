"""Flat-vector helpers and the Fisher-vector product against explicit Hessians / Fisher matrices."""

import pytest
import torch
from torch import nn
from torch.autograd.functional import hessian
from torch.distributions import Categorical, Normal, kl_divergence

from pgcli.ops.autodiff import fisher_vector_product, flat_grad, flat_params, set_flat_params
from pgcli.ops.cg import conjugate_gradient

DAMPING = 0.1
F64 = torch.float64


def test_flat_grad_fills_unused_params_with_zeros():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    unused = torch.ones(2, 2, requires_grad=True)
    b = torch.tensor(3.0, requires_grad=True)
    out = (a**2).sum() * b  # d/da = 2ab = [6, 12]; d/db = 5
    assert torch.equal(flat_grad(out, [a, unused, b]), torch.tensor([6.0, 12.0, 0.0, 0.0, 0.0, 0.0, 5.0]))
    with pytest.raises(ValueError, match="scalar"):
        flat_grad(a * 2, [a])


def test_flat_params_roundtrip_and_mismatch():
    net = nn.Linear(2, 3)
    params = list(net.parameters())
    flat = flat_params(params)
    assert flat.shape == (9,) and not flat.requires_grad
    set_flat_params(params, torch.arange(9.0))
    assert torch.equal(net.weight, torch.arange(6.0).view(3, 2)) and torch.equal(net.bias, torch.tensor([6.0, 7, 8]))
    set_flat_params(params, flat)
    assert torch.equal(flat_params(params), flat)
    with pytest.raises(ValueError, match=r"\[9\]"):
        set_flat_params(params, torch.zeros(8))


def _gaussian_policy() -> tuple[torch.Tensor, nn.Linear, nn.Parameter]:
    torch.manual_seed(0)
    obs = torch.randn(5, 3, dtype=F64)  # [B, obs_dim]
    mean_net = nn.Linear(3, 2).to(F64)
    log_std = nn.Parameter(torch.tensor([-0.3, 0.2], dtype=F64))  # state-independent
    return obs, mean_net, log_std


def test_fvp_matches_hessian_diagonal_gaussian():
    obs, mean_net, log_std = _gaussian_policy()
    params = [mean_net.weight, mean_net.bias, log_std]
    old = Normal(mean_net(obs).detach(), log_std.exp().detach())

    def mean_kl(theta: torch.Tensor) -> torch.Tensor:  # same policy, parameters as one flat vector [10]
        w, b, ls = theta[:6].view(2, 3), theta[6:8], theta[8:10]
        return kl_divergence(old, Normal(obs @ w.T + b, ls.exp())).sum(-1).mean()

    fisher = hessian(mean_kl, flat_params(params))  # [10, 10]
    kl = kl_divergence(old, Normal(mean_net(obs), log_std.exp())).sum(-1).mean()
    v = torch.randn(10, dtype=F64)
    fvp = fisher_vector_product(kl, params, v, damping=DAMPING)
    assert torch.allclose(fvp, fisher @ v + DAMPING * v, atol=1e-5)
    # by hand: Fisher of N(mu, sigma) is 1/sigma^2 for the bias, 2 for log sigma, and 0 between them
    e_bias0, e_logstd1 = torch.zeros(10, dtype=F64), torch.zeros(10, dtype=F64)
    e_bias0[6], e_logstd1[9] = 1.0, 1.0
    fvp_bias0 = fisher_vector_product(kl, params, e_bias0, damping=0.0)
    fvp_logstd1 = fisher_vector_product(kl, params, e_logstd1, damping=0.0)
    assert fvp_bias0[6].item() == pytest.approx(torch.exp(torch.tensor(0.6)).item())  # 1 / exp(-0.3)^2
    assert fvp_bias0[8:].abs().max().item() < 1e-12
    assert torch.allclose(fvp_logstd1[8:], torch.tensor([0.0, 2.0], dtype=F64))


def test_fvp_matches_exact_fisher_categorical():
    torch.manual_seed(1)
    obs = torch.randn(4, 2, dtype=F64)  # [B, obs_dim]
    logits_net = nn.Linear(2, 3).to(F64)  # 3 actions
    params = list(logits_net.parameters())  # 9 parameters
    probs = torch.softmax(logits_net(obs), -1).detach()  # [B, 3]
    # exact Fisher: mean over states of sum over actions pi(a|s) grad log pi(a|s) grad log pi(a|s)^T
    fisher = torch.zeros(9, 9, dtype=F64)
    for s in range(obs.shape[0]):
        for a in range(3):
            g = flat_grad(torch.log_softmax(logits_net(obs[s]), -1)[a], params)
            fisher += probs[s, a] * torch.outer(g, g) / obs.shape[0]
    old = Categorical(probs=probs)
    kl = kl_divergence(old, Categorical(logits=logits_net(obs))).mean()

    def mean_kl(theta: torch.Tensor) -> torch.Tensor:
        w, b = theta[:6].view(3, 2), theta[6:]
        return kl_divergence(old, Categorical(logits=obs @ w.T + b)).mean()

    assert torch.allclose(hessian(mean_kl, flat_params(params)), fisher, atol=1e-10)
    v = torch.randn(9, dtype=F64)
    assert torch.allclose(fisher_vector_product(kl, params, v, damping=DAMPING), fisher @ v + DAMPING * v, atol=1e-5)
    # the retained graph serves every CG iteration: CG with FVPs solves (F + damping I) x = g
    g = torch.randn(9, dtype=F64)
    x, _ = conjugate_gradient(lambda u: fisher_vector_product(kl, params, u, damping=DAMPING), g, n_iters=50)
    assert torch.allclose(x, torch.linalg.solve(fisher + DAMPING * torch.eye(9, dtype=F64), g), atol=1e-6)


def test_fvp_shape_mismatch_raises():
    obs, mean_net, log_std = _gaussian_policy()
    kl = (mean_net(obs) ** 2).mean() + log_std.sum()
    with pytest.raises(ValueError, match=r"\[10\]"):
        fisher_vector_product(kl, [mean_net.weight, mean_net.bias, log_std], torch.zeros(9, dtype=F64), damping=0.1)
