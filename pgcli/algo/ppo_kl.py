"""PPO-Penalty: PPO with an adaptive KL penalty (Schulman et al., 2017, "Proximal Policy Optimization Algorithms",
section 4).

Each update, on a batch of T x N steps collected with pi_old (``pgcli.algo.rollout``):

1. Advantages by GAE(gamma, lambda) (Schulman et al., 2016), termination and truncation kept apart; standardised
   over the batch when ``normalize_advantage``. Value targets R_t = A_t + V(s_t).
2. ``n_epochs`` passes of Adam over shuffled minibatches of the penalised objective (PPO eq. 8), as a loss:
       loss = -mean_t[ r_t(theta) A_t ] + beta * mean_t[ KL(pi_old(.|s_t) || pi_theta(.|s_t)) ]
              - ent_coef * mean_t[ H(pi_theta(.|s_t)) ] + vf_coef * mean_t[ (V(s_t) - R_t)^2 ],
   r_t(theta) = pi_theta(a_t|s_t) / pi_old(a_t|s_t), the KL in closed form, the global gradient norm clipped to
   ``max_grad_norm``.
3. Adapt the penalty from d = mean KL(pi_old || pi_new) over the batch after the epochs (PPO section 4):
       d < d_target / 1.5  ->  beta <- beta / 2;      d > 1.5 d_target  ->  beta <- 2 beta.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from pgcli.algo.checkpoint import Restored, Stateful
from pgcli.algo.control_base import ActorCriticTrainer
from pgcli.algo.policies import DistParams, Policy, ValueNetwork, detach_params
from pgcli.algo.rollout import Rollout, minibatches
from pgcli.config import PPOKLConfig
from pgcli.ops.advantages import normalize
from pgcli.ops.losses import approx_kl, explained_variance, ppo_penalty_beta_update


class PPOKLLoss(NamedTuple):
    """PPO-Penalty loss terms (0-dim tensors); the update minimises the sum of the ``loss_*`` terms."""

    loss_policy: Tensor
    """-mean(ratio * A)."""
    loss_kl: Tensor
    """beta * mean KL(pi_old || pi_theta)."""
    loss_entropy: Tensor
    """-ent_coef * mean entropy."""
    loss_value: Tensor
    """vf_coef * mean (V(s) - R)^2."""
    kl: Tensor
    """mean KL(pi_old || pi_theta) (diagnostic)."""
    value_mse: Tensor
    """mean (V(s) - R)^2 (diagnostic)."""
    entropy: Tensor
    """mean entropy of pi_theta (diagnostic)."""
    approx_kl: Tensor
    """k3 sample estimate of KL(pi_old || pi_theta) (diagnostic)."""


def ppo_kl_loss(
    policy: Policy,
    value: ValueNetwork,
    obs: Tensor,
    actions: Tensor,
    old: DistParams,
    old_log_probs: Tensor,
    advantages: Tensor,
    returns: Tensor,
    *,
    beta: float,
    ent_coef: float,
    vf_coef: float,
) -> PPOKLLoss:
    """The penalised surrogate (PPO eq. 8) plus entropy bonus and value loss on a minibatch of B samples.

    Args:
        policy: the policy being optimised.
        value: the value network.
        obs: [B, D] states.
        actions: [B] or [B, A] actions taken.
        old: pi_old's distribution parameters at ``obs`` (detached, per sample).
        old_log_probs: [B] log pi_old(a|s).
        advantages: [B] advantages.
        returns: [B] value targets.
        beta: KL-penalty coefficient.
        ent_coef: entropy bonus coefficient.
        vf_coef: value-loss coefficient.
    """
    new = policy.dist_params(obs)
    log_ratio = policy.log_prob_of(new, actions) - old_log_probs  # [B]
    kl = policy.kl_of(old, new).mean()
    entropy = policy.entropy_of(new).mean()
    value_mse = F.mse_loss(value(obs), returns)
    return PPOKLLoss(
        loss_policy=-(log_ratio.exp() * advantages).mean(),
        loss_kl=beta * kl,
        loss_entropy=-ent_coef * entropy,
        loss_value=vf_coef * value_mse,
        kl=kl,
        value_mse=value_mse,
        entropy=entropy,
        approx_kl=approx_kl(log_ratio),
    )


class PPOKL(ActorCriticTrainer[PPOKLConfig]):
    """PPO with the adaptive KL penalty instead of the clipped ratio."""

    checked_losses = ("train/policy_loss", "train/kl_penalty", "train/value_loss", "train/grad_norm")

    def __init__(self, cfg: PPOKLConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        # once each: a CNN torso shared by both (model.share_features) is in both lists
        self.params = list(dict.fromkeys([*self.policy.actor_parameters(), *self.value.critic_parameters()]))
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.learning_rate, eps=1e-5)
        self.beta = cfg.beta_init

    def _checked_parameters(self) -> Iterable[Tensor]:
        return self.params

    def _update(self, batch: Rollout, advantages: Tensor, returns: Tensor) -> dict[str, float]:
        """Steps 2-3: epochs of minibatch Adam on the penalised objective, then the beta rule."""
        cfg, policy = self.cfg, self.policy
        obs, actions, old_log_probs = batch.obs.flatten(0, 1), batch.actions.flatten(0, 1), batch.log_probs.flatten()
        if cfg.normalize_advantage:
            advantages = normalize(advantages)
        with torch.no_grad():
            # state-independent parameters (the Gaussian's log_std [A]) broadcast to [B, A] so minibatches slice them
            old = tuple(
                p.expand(obs.shape[0], -1) if p.dim() == 1 else p for p in detach_params(policy.dist_params(obs))
            )
        history: dict[str, list[Tensor]] = {}
        grad_norms: list[Tensor] = []
        for _ in range(cfg.n_epochs):
            for mb in minibatches(obs, actions, old_log_probs, advantages, returns, *old, batch_size=cfg.batch_size):
                mb_obs, mb_actions, mb_old_log_probs, mb_adv, mb_returns, *mb_old = mb
                terms = ppo_kl_loss(
                    policy,
                    self.value,
                    mb_obs,
                    mb_actions,
                    tuple(mb_old),
                    mb_old_log_probs,
                    mb_adv,
                    mb_returns,
                    beta=self.beta,
                    ent_coef=cfg.ent_coef,
                    vf_coef=cfg.vf_coef,
                )
                self.optimizer.zero_grad(set_to_none=True)
                (terms.loss_policy + terms.loss_kl + terms.loss_entropy + terms.loss_value).backward()
                grad_norms.append(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
                self.optimizer.step()
                for key, term in terms._asdict().items():
                    history.setdefault(key, []).append(term.detach())
        with torch.no_grad():
            new = policy.dist_params(obs)
            kl = float(policy.kl_of(old, new).mean())
            log_ratio = policy.log_prob_of(new, actions) - old_log_probs
        beta_used, self.beta = self.beta, ppo_penalty_beta_update(self.beta, kl, cfg.kl_target)
        means = {key: float(torch.stack(values).mean()) for key, values in history.items()}
        return {
            "train/policy_loss": means["loss_policy"],
            "train/kl_penalty": means["loss_kl"],
            "train/value_loss": means["value_mse"],
            "train/entropy": means["entropy"],
            "train/kl": kl,
            "train/approx_kl": float(approx_kl(log_ratio)),
            "train/beta": beta_used,
            "train/beta_next": self.beta,
            "train/explained_variance": explained_variance(batch.values.flatten(), returns),
            "train/grad_norm": float(torch.stack(grad_norms).mean()),  # before clipping, mean over minibatches
        }

    def _stateful(self) -> dict[str, Stateful | None]:
        return {"policy": self.policy, "value": self.value, "optimizer": self.optimizer}

    def _counters(self) -> dict[str, Any]:
        """The env steps and the adaptive beta."""
        return super()._counters() | {"beta": self.beta}

    def _restore(self, restored: Restored) -> None:
        super()._restore(restored)
        self.beta = float(restored.values["beta"])
