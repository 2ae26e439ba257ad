"""Policy and value networks of pgcli's own trainers (TRPO, VPG, PPO-Penalty, GRPO).

Two stochastic policies share one small interface (:class:`Policy`):

- :class:`CategoricalPolicy` (``Discrete`` actions): pi(a|s) = softmax(f(s))_a, f an MLP giving logits.
- :class:`DiagGaussianPolicy` (``Box`` actions): pi(a|s) = N(mu(s), diag(exp(2 * log_std))), with a
  state-independent ``log_std`` parameter (Schulman et al., 2015, TRPO section 8; SB3's ``DiagGaussianDistribution``).

Each exposes its distribution as a tuple of tensors (:data:`DistParams`: ``(logits,)`` or ``(mean, log_std)``) so
that log-probabilities, entropies and the closed-form KL(old || new) are computed from one forward pass and stay
twice differentiable (TRPO's Fisher-vector products differentiate the KL twice). ``distribution`` returns the
equivalent ``torch.distributions`` object for callers that want it.

Sampling avoids building ``torch.distributions`` objects: constructing a ``Categorical`` costs ~80 us per call, more
than the 64x64 MLP itself (docs/benchmarks/README.md, perf anchors section 1). Categorical sampling uses the Gumbel-max
trick, argmax(logits + G) with G = -log(E), E ~ Exp(1), which draws exactly from softmax(logits).

Continuous actions: the env acts in [-1, 1] (``RescaleAction``). Actions are sampled unclipped (their log-probability
is the Gaussian's) and clipped to the action bounds only on their way to the env (:meth:`Policy.to_env`).

The value network :class:`ValueNetwork` is separate from the policy (no shared trunk), as in SB3's default
``net_arch=dict(pi=[64, 64], vf=[64, 64])`` and the TRPO paper. Both are built on ``pgcli.algo.networks.MLP``, whose
hand-written Jacobian gives the Fisher-vector products (:meth:`Policy.fisher_product`) and the critic's gradients.

On frames (``model=cnn``; docs/pixels.md) both are a CNN torso with the MLP head after it
(``pgcli.algo.cnn.CNNNet``): one torso for both when ``model.share_features`` (:func:`make_actor_critic`; as SB3's
``share_features_extractor``: the policy's and the value's updates both train it), else one each. Observations reach
them as uint8 frames (:func:`obs_layout`, ``obs_dtype``), scaled by 1/255 in the torso on the device. Without a
hand-written Jacobian, ``fisher_product`` is None there and TRPO differentiates the KL twice (autograd).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from pgcli.algo.cnn import CNNNet, Torso, make_torso, orthogonal_init
from pgcli.algo.networks import MLP
from pgcli.config import ModelConfig
from pgcli.config.pixels import CNNModelConfig

DistParams = tuple[Tensor, ...]
"""A policy's distribution at a batch of states: ``(logits [B, n],)`` or ``(mean [B, A], log_std [A])``."""

POLICY_HEAD_GAIN = 0.01
"""Small policy head: the initial policy is near uniform / near zero-mean (Andrychowicz et al., 2021)."""
VALUE_HEAD_GAIN = 1.0
"""Value head gain (SB3)."""
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Policy(Protocol):
    """What a trainer needs from a stochastic policy. Shapes: B states ([B, D] vectors or [B, C, H, W] frames),
    actions [B] (discrete) or [B, A]."""

    @property
    def obs_dtype(self) -> torch.dtype:
        """The dtype its observations are handed over in: float32 (an MLP) or uint8 (frames)."""
        ...

    def dist_params(self, obs: Tensor) -> DistParams:
        """Differentiable distribution parameters at ``obs`` [B, D]."""
        ...

    def distribution(self, obs: Tensor) -> Distribution:
        """The policy at ``obs`` [B, D] as a ``torch.distributions`` object (batch shape [B])."""
        ...

    def sample(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions at ``obs`` [B, D] (the mode when ``deterministic``), unclipped; the fastest path."""
        ...

    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """(actions, log_prob [B]) at ``obs`` [B, D]."""
        ...

    def log_prob(self, obs: Tensor, actions: Tensor) -> Tensor:
        """log pi(a|s) [B]."""
        ...

    def entropy(self, obs: Tensor) -> Tensor:
        """H(pi(.|s)) [B]."""
        ...

    def kl(self, obs: Tensor, old: DistParams) -> Tensor:
        """KL(old || pi(.|s)) [B], closed form, differentiable w.r.t. the current parameters."""
        ...

    def log_prob_of(self, params: DistParams, actions: Tensor) -> Tensor:
        """log-probability [B] of ``actions`` under ``params``."""
        ...

    def entropy_of(self, params: DistParams) -> Tensor:
        """Entropy [B] of ``params``."""
        ...

    def kl_of(self, old: DistParams, new: DistParams) -> Tensor:
        """KL(old || new) [B]."""
        ...

    def actor_parameters(self) -> list[nn.Parameter]:
        """The parameters that define the policy (what TRPO's natural gradient moves)."""
        ...

    def fisher_product(self, obs: Tensor) -> Callable[[Tensor], Tensor] | None:
        """v -> F v at the states ``obs`` [B, D], F the Fisher information matrix averaged over the batch, in
        ``actor_parameters()`` order; None when the network's activation has no explicit Jacobian (use autograd)."""
        ...

    def to_env(self, actions: Tensor) -> np.ndarray:
        """Actions as the env takes them (continuous: clipped to the action bounds)."""
        ...

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Env-ready actions for a numpy batch of observations, without gradients."""
        ...

    # the nn.Module methods trainers use (both policies are modules)
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...


def detach_params(params: DistParams) -> DistParams:
    """``params`` with every tensor detached (the 'old' policy of a KL or ratio)."""
    return tuple(p.detach() for p in params)


def obs_tensor(obs: np.ndarray, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """A numpy observation batch as a tensor of ``dtype`` (a policy's ``obs_dtype``; no copy when it already has it,
    on the CPU)."""
    return torch.as_tensor(obs, dtype=dtype, device=device)


class _PolicyModule(nn.Module):
    """What both policies compute the same way from their ``dist_params`` and ``*_of`` functions."""

    net: MLP | CNNNet

    @property
    def obs_dtype(self) -> torch.dtype:
        return self.net.obs_dtype

    def dist_params(self, obs: Tensor) -> DistParams:
        raise NotImplementedError

    def log_prob_of(self, params: DistParams, actions: Tensor) -> Tensor:
        raise NotImplementedError

    def entropy_of(self, params: DistParams) -> Tensor:
        raise NotImplementedError

    def kl_of(self, old: DistParams, new: DistParams) -> Tensor:
        raise NotImplementedError

    def log_prob(self, obs: Tensor, actions: Tensor) -> Tensor:
        return self.log_prob_of(self.dist_params(obs), actions)

    def entropy(self, obs: Tensor) -> Tensor:
        return self.entropy_of(self.dist_params(obs))

    def kl(self, obs: Tensor, old: DistParams) -> Tensor:
        return self.kl_of(old, self.dist_params(obs))

    def actor_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())


class CategoricalPolicy(_PolicyModule):
    """pi(a|s) = softmax(logits(s)) over ``n_actions`` discrete actions."""

    def __init__(
        self, obs_shape: int | tuple[int, ...], n_actions: int, model: AnyModel, *, torso: Torso | None = None
    ) -> None:
        super().__init__()
        self.net = network(obs_shape, model.pi_hidden_sizes, n_actions, model, out_gain=POLICY_HEAD_GAIN, torso=torso)
        self.n_actions = n_actions

    def dist_params(self, obs: Tensor) -> DistParams:
        return (self.net(obs),)

    def distribution(self, obs: Tensor) -> Distribution:
        return Categorical(logits=self.net(obs), validate_args=False)

    def sample(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        logits = self.net(obs)  # [B, n]
        if deterministic:
            return logits.argmax(-1)
        # Gumbel-max: argmax(logits - log E), E ~ Exp(1), is an exact sample of softmax(logits)
        return (logits - torch.empty_like(logits).exponential_().log_()).argmax(-1)  # [B]

    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        params = self.dist_params(obs)
        logits = params[0]
        if deterministic:
            actions = logits.argmax(-1)
        else:
            actions = (logits - torch.empty_like(logits).exponential_().log_()).argmax(-1)
        return actions, self.log_prob_of(params, actions)

    def log_prob_of(self, params: DistParams, actions: Tensor) -> Tensor:
        log_p = torch.log_softmax(params[0], dim=-1)  # [B, n]
        return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy_of(self, params: DistParams) -> Tensor:
        log_p = torch.log_softmax(params[0], dim=-1)
        return -(log_p.exp() * log_p).sum(-1)

    def kl_of(self, old: DistParams, new: DistParams) -> Tensor:
        # sum_a p_old(a) (log p_old(a) - log p_new(a))
        log_p_old = torch.log_softmax(old[0], dim=-1)
        log_p_new = torch.log_softmax(new[0], dim=-1)
        return (log_p_old.exp() * (log_p_old - log_p_new)).sum(-1)

    def fisher_product(self, obs: Tensor) -> Callable[[Tensor], Tensor] | None:
        # F = J^T M J / B with J = d logits / d theta and M = diag(p) - p p^T, the Hessian of KL(p_old || softmax(z))
        # in z at z = z_old (the KL's first derivative vanishes there, so this IS the KL's Hessian in theta)
        lin = self.net.linearize(obs)
        if lin is None:
            return None
        probs = torch.softmax(lin.output, dim=-1)  # [B, n]
        params = self.actor_parameters()
        sizes, batch = [p.numel() for p in params], obs.shape[0]

        def fvp(vector: Tensor) -> Tensor:
            d_logits = lin.jvp([v.view_as(p) for v, p in zip(vector.split(sizes), params, strict=True)])
            m_d = probs * (d_logits - (probs * d_logits).sum(-1, keepdim=True))  # M J v, [B, n]
            return torch.cat([g.reshape(-1) for g in lin.vjp(m_d / batch)])

        return fvp

    def to_env(self, actions: Tensor) -> np.ndarray:
        return actions.detach().cpu().numpy()

    @torch.no_grad()
    def predict(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.to_env(self.sample(obs_tensor(obs, self.net.device, self.net.obs_dtype), deterministic))


class DiagGaussianPolicy(_PolicyModule):
    """pi(a|s) = N(mean(s), diag(exp(log_std))^2), ``log_std`` a state-independent parameter."""

    def __init__(
        self,
        obs_shape: int | tuple[int, ...],
        action_space: gym.spaces.Box,
        model: AnyModel,
        *,
        torso: Torso | None = None,
    ) -> None:
        super().__init__()
        action_dim = int(np.prod(action_space.shape))
        self.net = network(obs_shape, model.pi_hidden_sizes, action_dim, model, out_gain=POLICY_HEAD_GAIN, torso=torso)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(model.log_std_init)))
        self.low = np.asarray(action_space.low, dtype=np.float32).reshape(-1)
        self.high = np.asarray(action_space.high, dtype=np.float32).reshape(-1)

    def dist_params(self, obs: Tensor) -> DistParams:
        return self.net(obs), self.log_std

    def distribution(self, obs: Tensor) -> Distribution:
        mean = self.net(obs)
        return Independent(
            Normal(mean, self.log_std.exp().expand_as(mean), validate_args=False), 1, validate_args=False
        )

    def sample(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        mean = self.net(obs)  # [B, A]
        if deterministic:
            return mean
        return torch.addcmul(mean, torch.randn_like(mean), self.log_std.exp())

    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        mean = self.net(obs)
        if deterministic:
            return mean, self.log_prob_of((mean, self.log_std), mean)
        noise = torch.randn_like(mean)  # [B, A]
        actions = mean + noise * self.log_std.exp()
        # (a - mean) / std is the noise itself: log N(a) = sum(-noise^2 / 2 - log_std - log(2 pi) / 2)
        log_prob = (-0.5 * noise.square() - self.log_std - HALF_LOG_2PI).sum(-1)
        return actions, log_prob

    def log_prob_of(self, params: DistParams, actions: Tensor) -> Tensor:
        mean, log_std = params
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - HALF_LOG_2PI).sum(-1)

    def entropy_of(self, params: DistParams) -> Tensor:
        mean, log_std = params
        return (log_std + 0.5 + HALF_LOG_2PI).sum(-1).expand(mean.shape[0])

    def kl_of(self, old: DistParams, new: DistParams) -> Tensor:
        # per dim: log(s_new / s_old) + (s_old^2 + (m_old - m_new)^2) / (2 s_new^2) - 1/2
        (mean_old, log_std_old), (mean_new, log_std_new) = old, new
        var_ratio = torch.exp(2.0 * (log_std_old - log_std_new))
        mean_term = (mean_old - mean_new).square() * torch.exp(-2.0 * log_std_new)
        return (log_std_new - log_std_old + 0.5 * (var_ratio + mean_term - 1.0)).sum(-1)

    def fisher_product(self, obs: Tensor) -> Callable[[Tensor], Tensor] | None:
        # KL(old || new) per action dim: log s_n - log s_o + (s_o^2 + (m_o - m_n)^2) / (2 s_n^2) - 1/2. Its Hessian
        # at new = old: 1 / s^2 in the mean, 2 in log_std, 0 across, so F = [J^T diag(1/s^2) J / B for the mean
        # network's parameters, 2 I for log_std]
        lin = self.net.linearize(obs)
        if lin is None:
            return None
        params, net_params = self.actor_parameters(), list(self.net.parameters())
        sizes, batch = [p.numel() for p in params], obs.shape[0]
        inv_var = torch.exp(-2.0 * self.log_std.detach())  # [A]
        log_std_index = next(i for i, p in enumerate(params) if p is self.log_std)
        net_index = [next(i for i, q in enumerate(params) if q is p) for p in net_params]

        def fvp(vector: Tensor) -> Tensor:
            chunks = [v.view_as(p) for v, p in zip(vector.split(sizes), params, strict=True)]
            d_mean = lin.jvp([chunks[i] for i in net_index])  # [B, A]
            out: list[Tensor] = [torch.empty(0)] * len(params)
            for i, grad in zip(net_index, lin.vjp(d_mean * (inv_var / batch)), strict=True):
                out[i] = grad
            out[log_std_index] = 2.0 * chunks[log_std_index]
            return torch.cat([g.reshape(-1) for g in out])

        return fvp

    def to_env(self, actions: Tensor) -> np.ndarray:
        return np.clip(actions.detach().cpu().numpy(), self.low, self.high)

    @torch.no_grad()
    def predict(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.to_env(self.sample(obs_tensor(obs, self.log_std.device, self.net.obs_dtype), deterministic))


class PolicySnapshot:
    """A frozen copy of a policy that acts as its trainer's ``act`` does: what an evaluation in another process
    gets (``hardware.eval_process``), so training can go on changing the policy meanwhile."""

    def __init__(self, policy: Policy) -> None:
        self.policy = copy.deepcopy(policy)

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.policy.predict(obs, deterministic)


class ValueNetwork(nn.Module):
    """V(s): an MLP with a scalar head, separate from the policy (on frames: a CNN torso, maybe the policy's, and the
    head after it)."""

    def __init__(self, obs_shape: int | tuple[int, ...], model: AnyModel, *, torso: Torso | None = None) -> None:
        super().__init__()
        self.net = network(obs_shape, model.vf_hidden_sizes, 1, model, out_gain=VALUE_HEAD_GAIN, torso=torso)

    def forward(self, obs: Tensor) -> Tensor:
        """[B, D] (or [B, C, H, W] frames) -> [B]."""
        return self.net(obs).squeeze(-1)

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def mse_grads(self, obs: Tensor, returns: Tensor) -> tuple[Tensor, list[Tensor]]:
        """mean((V(obs) - returns)^2) for [B, D] obs and [B] returns, and its gradient per critic parameter."""
        return self.net.mse_grads(obs, returns.unsqueeze(-1))

    def mse_grad_fn(self) -> Callable[[Tensor, Tensor], tuple[Tensor, list[Tensor]]] | None:
        """:meth:`MLP.mse_grad_fn` for [B, D] obs and [B, 1] returns (None: use :meth:`mse_grads`)."""
        return self.net.mse_grad_fn()


def obs_dim(obs_space: gym.Space) -> int:
    """Flat observation size; only 1-D ``Box`` observation spaces are supported."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"pgcli's own trainers need a 1-D Box observation space, got {obs_space}")
    return int(obs_space.shape[0])


def frame_shape(obs_space: gym.Space) -> tuple[int, int, int]:
    """(C, H, W) of an image observation space: a 3-D uint8 ``Box`` (``pgcli.envs.pixels``' frames)."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 3 or obs_space.dtype != np.uint8:
        raise ValueError(f"model=cnn needs (C, H, W) uint8 frames, got {obs_space}")
    channels, height, width = (int(n) for n in obs_space.shape)
    return channels, height, width


def obs_layout(obs_space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype one observation is stored in (rollout buffers): (D,) float32 for a 1-D ``Box``, (C, H, W)
    uint8 for frames (a quarter of float32's memory; the torso scales them on the device).

    Raises:
        ValueError: for other observation spaces.
    """
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 3:
        return frame_shape(obs_space), torch.uint8
    return (obs_dim(obs_space),), torch.float32


AnyModel = ModelConfig | CNNModelConfig
"""The model configs of pgcli's own policies: an MLP (``model=mlp``) or a CNN torso with MLP heads (``model=cnn``)."""


def network(
    obs_shape: int | tuple[int, ...],
    hidden_sizes: list[int],
    out_dim: int,
    model: AnyModel,
    *,
    out_gain: float,
    torso: Torso | None = None,
) -> MLP | CNNNet:
    """The network under a policy or value head: an MLP on D = ``obs_shape`` inputs, or (``model=cnn``) ``torso`` (a
    new one for frames of ``obs_shape`` (C, H, W) when None) with an MLP head."""
    if isinstance(model, CNNModelConfig):
        if torso is None:
            if isinstance(obs_shape, int) or len(obs_shape) != 3:
                raise ValueError(f"model=cnn needs frames of shape (C, H, W), got {obs_shape}")
            torso = new_torso(obs_shape, model)
        in_dim = torso.features_dim
    elif isinstance(obs_shape, int):
        in_dim, torso = obs_shape, None
    else:
        raise ValueError(f"an MLP takes D inputs, got the shape {obs_shape}")
    # built after the torso: its initialisation draws from torch's RNG after the torso's
    head = MLP(
        in_dim, hidden_sizes, out_dim, activation=model.activation, ortho_init=model.ortho_init, out_gain=out_gain
    )
    return head if torso is None else CNNNet(torso, head)


def new_torso(obs_shape: tuple[int, ...], model: CNNModelConfig) -> Torso:
    """The torso ``model.arch`` names for frames of ``obs_shape`` (C, H, W), initialised as SB3 does with
    ``ortho_init``."""
    torso = make_torso(model.arch, obs_shape)
    return orthogonal_init(torso) if model.ortho_init else torso


def _obs_shape(obs_space: gym.Space, model: AnyModel) -> int | tuple[int, ...]:
    return frame_shape(obs_space) if isinstance(model, CNNModelConfig) else obs_dim(obs_space)


def make_policy(
    obs_space: gym.Space, action_space: gym.Space, model: AnyModel, *, torso: Torso | None = None
) -> Policy:
    """The policy for these spaces: categorical for ``Discrete``, diagonal Gaussian for a 1-D ``Box``; an MLP on a
    1-D ``Box`` of observations, or ``torso`` (or a new one) and an MLP head on frames (``model=cnn``).

    Raises:
        ValueError: for other observation or action spaces.
    """
    shape = _obs_shape(obs_space, model)
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalPolicy(shape, int(action_space.n), model, torso=torso)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return DiagGaussianPolicy(shape, action_space, model, torso=torso)
    raise ValueError(f"pgcli's own trainers support Discrete and 1-D Box action spaces, got {action_space}")


def make_value(obs_space: gym.Space, model: AnyModel, *, torso: Torso | None = None) -> ValueNetwork:
    """The value network for this observation space (on frames: on ``torso``, or a new one)."""
    return ValueNetwork(_obs_shape(obs_space, model), model, torso=torso)


def make_actor_critic(obs_space: gym.Space, action_space: gym.Space, model: AnyModel) -> tuple[Policy, ValueNetwork]:
    """The policy, then the value network (in that order: an MLP's parameters come from the seed as they always did).
    With ``model=cnn`` and ``model.share_features`` both heads sit on one torso (SB3's ``share_features_extractor``):
    one module, in both ``actor_parameters()`` and ``critic_parameters()``, trained by both updates."""
    shared = None
    if isinstance(model, CNNModelConfig) and model.share_features:
        shared = new_torso(frame_shape(obs_space), model)
    return make_policy(obs_space, action_space, model, torso=shared), make_value(obs_space, model, torso=shared)


def shares_parameters(policy: Policy, value: ValueNetwork) -> bool:
    """Whether the policy and the value network share parameters (a shared CNN torso)."""
    actor = {id(p) for p in policy.actor_parameters()}
    return any(id(p) in actor for p in value.critic_parameters())
