"""Policies and value network: log-probs, entropies and KLs against torch.distributions; samplers; init; factory."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from pgcli.algo.networks import MLP
from pgcli.algo.policies import (
    CategoricalPolicy,
    DiagGaussianPolicy,
    ValueNetwork,
    detach_params,
    make_policy,
    make_value,
)
from pgcli.config import ModelConfig

BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def gaussian(log_std_init: float = 0.0) -> DiagGaussianPolicy:
    torch.manual_seed(0)
    return DiagGaussianPolicy(4, ACT2, ModelConfig(log_std_init=log_std_init))


def categorical(n: int = 3) -> CategoricalPolicy:
    torch.manual_seed(0)
    return CategoricalPolicy(4, n, ModelConfig())


def test_factory_picks_policy_by_action_space_and_rejects_others():
    assert isinstance(make_policy(BOX4, gym.spaces.Discrete(2), ModelConfig()), CategoricalPolicy)
    assert isinstance(make_policy(BOX4, ACT2, ModelConfig()), DiagGaussianPolicy)
    with pytest.raises(ValueError, match="action spaces"):
        make_policy(BOX4, gym.spaces.MultiBinary(3), ModelConfig())
    with pytest.raises(ValueError, match="observation space"):
        make_policy(gym.spaces.Discrete(5), ACT2, ModelConfig())
    assert make_value(BOX4, ModelConfig())(torch.zeros(7, 4)).shape == (7,)


def test_orthogonal_init_gains_and_zero_biases():
    torch.manual_seed(0)
    net = MLP(4, [64, 64], 2, activation="tanh", ortho_init=True, out_gain=0.01)
    hidden = net.layers[1].weight  # 64x64 orthogonal * sqrt(2): W W^T = 2 I
    assert torch.allclose(hidden @ hidden.T, 2.0 * torch.eye(64), atol=1e-5)
    head = net.layers[2].weight  # 2x64, rows orthonormal * 0.01
    assert torch.allclose(head @ head.T, 1e-4 * torch.eye(2), atol=1e-8)
    assert all(torch.count_nonzero(layer.bias) == 0 for layer in net.layers)
    value_head = ValueNetwork(4, ModelConfig()).net.layers[2].weight
    assert torch.allclose(value_head @ value_head.T, torch.ones(1, 1), atol=1e-6)


def test_hidden_sizes_and_activation_come_from_the_model_config():
    model = ModelConfig(pi_hidden_sizes=[8, 16, 4], vf_hidden_sizes=[5], activation="relu")
    policy = CategoricalPolicy(4, 2, model)
    assert [tuple(layer.weight.shape) for layer in policy.net.layers] == [(8, 4), (16, 8), (4, 16), (2, 4)]
    assert [tuple(layer.weight.shape) for layer in ValueNetwork(4, model).net.layers] == [(5, 4), (1, 5)]
    assert policy.net.activation is torch.relu


def test_log_std_is_state_independent_parameter_initialised_from_config():
    policy = gaussian(log_std_init=-0.5)
    assert torch.equal(policy.log_std.detach(), torch.full((2,), -0.5))
    assert any(p is policy.log_std for p in policy.actor_parameters())


@pytest.mark.parametrize("make", [categorical, gaussian])
def test_log_prob_entropy_kl_match_torch_distributions(make):
    policy = make()
    obs = torch.randn(16, 4)
    old = detach_params(policy.dist_params(obs))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    dist, actions = policy.distribution(obs), policy.sample(obs)
    if isinstance(policy, CategoricalPolicy):
        old_dist = Categorical(logits=old[0])
    else:
        old_dist = Independent(Normal(old[0], old[1].exp().expand_as(old[0])), 1)
    assert torch.allclose(policy.log_prob(obs, actions), dist.log_prob(actions), atol=1e-5)
    assert torch.allclose(policy.entropy(obs), dist.entropy(), atol=1e-5)
    assert torch.allclose(policy.kl(obs, old), kl_divergence(old_dist, dist), atol=1e-5)


@pytest.mark.parametrize("make", [categorical, gaussian])
def test_act_log_prob_equals_log_prob_of_its_actions(make):
    policy = make()
    obs = torch.randn(32, 4)
    actions, log_prob = policy.act(obs)
    assert torch.allclose(log_prob, policy.log_prob(obs, actions), atol=1e-5)
    mode, _ = policy.act(obs, deterministic=True)
    assert torch.equal(mode, policy.sample(obs, deterministic=True))


@pytest.mark.parametrize("make", [categorical, gaussian])
def test_kl_is_zero_with_zero_gradient_at_old_params(make):
    policy = make()
    obs = torch.randn(8, 4)
    kl = policy.kl(obs, detach_params(policy.dist_params(obs))).mean()
    grads = torch.autograd.grad(kl, policy.actor_parameters(), create_graph=True)
    assert abs(kl.item()) < 1e-7
    assert all(g.abs().max() < 1e-6 for g in grads)


def test_gumbel_max_sampling_follows_softmax():
    policy = categorical(3)
    with torch.no_grad():
        policy.net.layers[-1].bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
    obs = torch.zeros(1, 4).expand(60_000, 4)
    torch.manual_seed(1)
    counts = torch.bincount(policy.sample(obs), minlength=3).double() / 60_000
    expected = torch.softmax(policy.dist_params(obs[:1])[0][0].double(), 0)
    assert torch.allclose(counts, expected, atol=0.01)
    assert torch.equal(policy.sample(obs[:5], deterministic=True), torch.full((5,), 2))


def test_gaussian_samples_have_policy_mean_and_std():
    policy = gaussian(log_std_init=math.log(0.5))
    obs = torch.randn(1, 4).expand(50_000, 4)
    samples = policy.sample(obs).detach()
    mean = policy.sample(obs[:1], deterministic=True).detach()[0]
    assert torch.allclose(samples.mean(0), mean, atol=0.01)
    assert torch.allclose(samples.std(0), torch.full((2,), 0.5), atol=0.01)


def test_continuous_actions_are_clipped_only_for_the_env():
    policy = gaussian(log_std_init=math.log(5.0))  # wide: many samples fall outside [-1, 1]
    obs = torch.randn(256, 4)
    actions, _ = policy.act(obs)
    assert actions.abs().max() > 1.0  # stored unclipped: the log-prob is the Gaussian's
    env_actions = policy.to_env(actions)
    assert env_actions.dtype == np.float32 and np.abs(env_actions).max() <= 1.0
    np.testing.assert_array_equal(env_actions, np.clip(actions.detach().numpy(), -1.0, 1.0))


def test_predict_takes_numpy_of_any_float_dtype():
    policy = gaussian()
    out = policy.predict(np.zeros((3, 4), dtype=np.float64))
    assert out.shape == (3, 2)
    discrete = categorical(2).predict(np.zeros((5, 4), dtype=np.float32))
    assert discrete.shape == (5,) and discrete.dtype == np.int64


def _policy64(kind: str, activation: str):
    torch.manual_seed(3)
    model = ModelConfig(pi_hidden_sizes=[7, 5], activation=activation, log_std_init=-0.4)
    space = gym.spaces.Discrete(3) if kind == "categorical" else ACT2
    policy = make_policy(BOX4, space, model).double()
    for p in policy.parameters():  # away from the small-head init, so every layer matters
        p.data.normal_(0.0, 0.6)
    return policy


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_fisher_product_equals_the_hessian_of_the_mean_kl(kind, activation):
    # J^T M J v (no autograd) against the Hessian-vector product of the mean KL(old || new) by double backprop
    from pgcli.ops.autodiff import fisher_vector_product

    policy = _policy64(kind, activation)
    obs = torch.randn(40, 4, dtype=torch.float64)
    params = policy.actor_parameters()
    new = policy.dist_params(obs)
    kl = policy.kl_of(detach_params(new), new).mean()
    fisher = policy.fisher_product(obs)
    assert fisher is not None
    for _ in range(3):
        v = torch.randn(sum(p.numel() for p in params), dtype=torch.float64)
        assert torch.allclose(fisher(v), fisher_vector_product(kl, params, v, damping=0.0), atol=1e-10)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_linearization_matches_forward_and_reverse_mode_autodiff(activation):
    from torch.func import functional_call, jvp, vjp

    torch.manual_seed(4)
    net = MLP(4, [6, 5], 3, activation=activation, ortho_init=False, out_gain=1.0).double()
    x = torch.randn(9, 4, dtype=torch.float64)
    names = [n for n, _ in net.named_parameters()]
    theta = tuple(p.detach() for p in net.parameters())
    tangents = tuple(torch.randn_like(p) for p in theta)

    def f(*params):
        return functional_call(net, dict(zip(names, params, strict=True)), (x,))

    lin = net.linearize(x)
    out, jv = jvp(f, theta, tangents)
    assert torch.allclose(lin.output, out) and torch.allclose(lin.jvp(list(tangents)), jv, atol=1e-12)
    u = torch.randn_like(out)
    _, pullback = vjp(f, *theta)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(lin.vjp(u), pullback(u), strict=True))


def test_fisher_product_is_none_for_activations_without_an_explicit_derivative():
    policy = make_policy(BOX4, ACT2, ModelConfig(activation="elu"))
    assert policy.fisher_product(torch.randn(3, 4)) is None


def test_trpo_fisher_product_on_a_cnn_policy_is_the_hessian_of_the_mean_kl():
    # frames (model=cnn; docs/pixels.md) take TRPO's autograd route: no hand-written Jacobian through the convolutions
    from torch.func import functional_call, jacrev

    from pgcli.algo.trpo import fisher_vector_product_fn
    from pgcli.config.pixels import CNNModelConfig
    from pgcli.ops.autodiff import fisher_vector_product

    torch.manual_seed(5)
    frames = gym.spaces.Box(0, 255, (2, 5, 5), np.uint8)
    policy = make_policy(frames, gym.spaces.Discrete(3), CNNModelConfig(pi_hidden_sizes=[8])).double()
    for p in policy.parameters():  # away from the init's near-uniform policy
        p.data.normal_(0.0, 0.1)
    obs = torch.randint(0, 256, (6, 2, 5, 5), dtype=torch.uint8)
    assert policy.fisher_product(obs) is None  # the MLP fast path does not apply
    params = policy.actor_parameters()
    new = policy.dist_params(obs)
    kl = policy.kl_of(detach_params(new), new).mean()
    trpo_fvp = fisher_vector_product_fn(kl, params, damping=0.0)  # what TRPO's policy step uses on frames

    # the closed form: F = mean_b J_b^T (diag(p_b) - p_b p_b^T) J_b, J_b = d logits_b / d theta
    names = [name for name, _ in policy.net.named_parameters()]  # the categorical policy's parameters are its net's

    def logits(*theta: torch.Tensor) -> torch.Tensor:
        return functional_call(policy.net, dict(zip(names, theta, strict=True)), (obs,))

    jac = torch.cat([j.flatten(2) for j in jacrev(logits, argnums=tuple(range(len(params))))(*params)], dim=2)
    probs = torch.softmax(new[0].detach(), -1)  # [B, n]
    for _ in range(3):
        v = torch.randn(sum(p.numel() for p in params), dtype=torch.float64)
        jv = jac @ v  # [B, n]
        m_jv = probs * (jv - (probs * jv).sum(-1, keepdim=True))
        closed_form = torch.einsum("bnp,bn->p", jac, m_jv) / obs.shape[0]
        assert torch.allclose(trpo_fvp(v), fisher_vector_product(kl, params, v, damping=0.0), atol=1e-10)
        assert torch.allclose(trpo_fvp(v), closed_form, atol=1e-10)
