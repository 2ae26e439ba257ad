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

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from pgcli.algo.checkpoint import load_checkpoint, save_checkpoint
from pgcli.algo.guard import check_update
from pgcli.algo.policies import DistParams, Policy, PolicySnapshot, detach_params, make_actor_critic
from pgcli.algo.rollout import Rollout, RolloutCollector, fit_critic
from pgcli.config import ModelConfig, VPGConfig
from pgcli.config.pixels import CNNModelConfig
from pgcli.contracts import Monitor
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


class VPG:
    """REINFORCE with a learned baseline: one policy-gradient step per batch, then value regression."""

    def __init__(
        self, cfg: VPGConfig, *, env: VectorEnv, model: ModelConfig | CNNModelConfig, seed: int, device: torch.device
    ) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        policy, value = make_actor_critic(env.single_observation_space, env.single_action_space, model)
        self.policy, self.value = policy.to(device), value.to(device)
        self.pi_optimizer = torch.optim.Adam(self.policy.actor_parameters(), lr=cfg.learning_rate)
        self.vf_optimizer = torch.optim.Adam(self.value.critic_parameters(), lr=cfg.vf_learning_rate)
        self.collector = RolloutCollector(env, n_steps=cfg.n_steps, seed=seed, device=device)
        self.steps = 0
        """Env steps taken (continues across a checkpoint)."""

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        cfg = self.cfg
        while self.steps < total_steps:
            batch = self.collector.collect(self.policy, self.value, monitor, self.steps)
            self.steps += batch.n_samples
            step = self.steps
            advantages, returns = batch.gae(gamma=cfg.gamma, lam=cfg.gae_lambda)
            stats = self._policy_step(batch, advantages.flatten()) | self._critic_steps(batch, returns.flatten())
            check_update(
                monitor,
                step,
                stats,
                ("train/policy_loss", "train/value_loss", "train/grad_norm"),
                params=[*self.policy.parameters(), *self.value.parameters()],
            )
            monitor.log(step, stats)
            monitor.update(step, self)
        return self.steps

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

    # -- Trainer interface -------------------------------------------------------------------------------------------
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.policy.predict(obs, deterministic)

    def snapshot(self) -> PolicySnapshot:
        """A frozen copy of the policy, to evaluate in another process while training goes on."""
        return PolicySnapshot(self.policy)

    def _stateful(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "value": self.value,
            "pi_optimizer": self.pi_optimizer,
            "vf_optimizer": self.vf_optimizer,
        }

    def save(self, path: Path) -> Path:
        """``path/model.pt`` (networks and optimizers), ``normalizer.npz`` when the env normalises, and
        ``state.json`` (env steps, RNG and env states; pgcli.algo.checkpoint)."""
        return save_checkpoint(path, self.env, self._stateful(), {"steps": self.steps})

    def load(self, path: Path) -> None:
        restored = load_checkpoint(path, self.env, self.device, self._stateful())
        self.steps = int(restored.values["steps"])
        if restored.obs is not None:
            self.collector.last_obs = restored.obs

    def close(self) -> None:
        self.env.close()
