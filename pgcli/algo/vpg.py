"""Vanilla policy gradient: REINFORCE with a learned baseline (Williams, 1992; Sutton et al., 2000).

Each update, on a batch of T x N steps collected with pi_theta (``pgcli.algo.rollout``):

1. Advantages by GAE(gamma, lambda) (Schulman et al., 2016), termination and truncation kept apart. With
   ``gae_lambda = 1`` this is exactly the discounted reward-to-go minus the baseline, A_t = G_t - V(s_t), with G_t
   bootstrapped from V only where an episode was cut off (truncation or the end of the rollout): REINFORCE with a
   baseline. Standardised over the batch when ``normalize_advantage``. Value targets R_t = A_t + V(s_t).
2. One gradient step of Adam on the policy (policy-gradient theorem; Spinning Up's VPG):
       loss = -mean_t[ log pi_theta(a_t|s_t) * A_t ] - ent_coef * mean_t[ H(pi_theta(.|s_t)) ],
   with the global gradient norm clipped to ``max_grad_norm``.
3. Value network: ``n_critic_updates`` epochs of Adam on minibatches of mean (V(s_t) - R_t)^2.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from pgcli.algo.checkpoint import Stateful
from pgcli.algo.control_base import ActorCriticTrainer
from pgcli.algo.policies import DistParams, Policy, detach_params
from pgcli.algo.rollout import Rollout, fit_critic
from pgcli.config import VPGConfig
from pgcli.ops.advantages import normalize
from pgcli.ops.losses import approx_kl


class VPGLoss(NamedTuple):
    """Policy-gradient loss terms (0-dim tensors); the update minimises their sum."""

    loss_policy: Tensor
    """-mean(log pi(a|s) * A)."""
    loss_entropy: Tensor
    """-ent_coef * mean entropy."""
    entropy: Tensor
    """mean entropy of pi_theta (diagnostic)."""


def vpg_loss(policy: Policy, new: DistParams, actions: Tensor, advantages: Tensor, *, ent_coef: float) -> VPGLoss:
    """REINFORCE loss of the distribution ``new`` (computed by ``policy`` on the batch states).

    Args:
        policy: the policy whose distribution family ``new`` belongs to.
        new: distribution parameters at the batch states (differentiable).
        actions: [B] or [B, A] actions taken.
        advantages: [B] advantages (constants).
        ent_coef: entropy bonus coefficient.
    """
    entropy = policy.entropy_of(new).mean()
    return VPGLoss(
        loss_policy=-(policy.log_prob_of(new, actions) * advantages).mean(),
        loss_entropy=-ent_coef * entropy,
        entropy=entropy,
    )


class VPG(ActorCriticTrainer[VPGConfig]):
    """REINFORCE with a learned baseline: one policy-gradient step per batch, then value regression."""

    checked_losses = ("train/policy_loss", "train/value_loss", "train/grad_norm")

    def __init__(self, cfg: VPGConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.pi_optimizer = torch.optim.Adam(self.policy.actor_parameters(), lr=cfg.learning_rate)
        self.vf_optimizer = torch.optim.Adam(self.value.critic_parameters(), lr=cfg.vf_learning_rate)

    def _update(self, batch: Rollout, advantages: Tensor, returns: Tensor) -> dict[str, float]:
        return self._policy_step(batch, advantages) | self._critic_steps(batch, returns)

    def _policy_step(self, batch: Rollout, advantages: Tensor) -> dict[str, float]:
        """Step 2: one clipped Adam step on the REINFORCE loss over the whole batch."""
        cfg, policy = self.cfg, self.policy
        obs, actions, old_log_probs = batch.obs.flatten(0, 1), batch.actions.flatten(0, 1), batch.log_probs.flatten()
        if cfg.normalize_advantage:
            advantages = normalize(advantages)
        new = policy.dist_params(obs)
        old = detach_params(new)
        terms = vpg_loss(policy, new, actions, advantages, ent_coef=cfg.ent_coef)
        self.pi_optimizer.zero_grad(set_to_none=True)
        (terms.loss_policy + terms.loss_entropy).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.actor_parameters(), cfg.max_grad_norm)
        self.pi_optimizer.step()
        with torch.no_grad():
            after = policy.dist_params(obs)
            log_ratio = policy.log_prob_of(after, actions) - old_log_probs
            kl = policy.kl_of(old, after).mean()
        return {
            "train/policy_loss": terms.loss_policy.item(),
            "train/entropy": terms.entropy.item(),
            "train/kl": kl.item(),
            "train/approx_kl": float(approx_kl(log_ratio)),
            "train/grad_norm": float(grad_norm),
        }

    def _critic_steps(self, batch: Rollout, returns: Tensor) -> dict[str, float]:
        """Step 3: ``n_critic_updates`` epochs of Adam minibatch regression of V onto the GAE returns."""
        epochs, batch_size = self.cfg.n_critic_updates, self.cfg.batch_size
        return fit_critic(self.value, self.vf_optimizer, batch, returns, n_epochs=epochs, batch_size=batch_size)

    def _stateful(self) -> dict[str, Stateful | None]:
        return {
            "policy": self.policy,
            "value": self.value,
            "pi_optimizer": self.pi_optimizer,
            "vf_optimizer": self.vf_optimizer,
        }
