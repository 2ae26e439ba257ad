"""Trust Region Policy Optimization (Schulman et al., 2015, "Trust Region Policy Optimization", ICML).

Each update, on a batch of T x N steps collected with pi_old (``pgcli.algo.rollout``):

1. Advantages by GAE(gamma, lambda) (Schulman et al., 2016), termination and truncation kept apart; standardised
   over the batch when ``normalize_advantage``. Value targets R_t = A_t + V(s_t).
2. Surrogate objective and its gradient (TRPO eq. 14, with the advantage in place of Q):
       L(theta) = mean_t[ pi_theta(a_t|s_t) / pi_old(a_t|s_t) * A_t ],   g = grad L at theta_old.
3. Natural-gradient direction s ~= F^-1 g by ``cg_max_steps`` steps of conjugate gradient, where F v is the
   Hessian-vector product of the mean KL(pi_old || pi_theta) at theta_old (TRPO appendix C), plus ``cg_damping`` * v,
   optionally on every ``fvp_sub_sampling``-th sample. At theta_old the KL's gradient in the distribution
   parameters z vanishes, so its Hessian is exactly J^T M J, with J = dz/dtheta and M the Hessian of the KL in z
   (diag(p) - p p^T for logits; 1/sigma^2 for the mean, 2 for log_std); F v is computed so, as a Jacobian-vector
   and a vector-Jacobian product of the policy network (``Policy.fisher_product``), or by double backprop of the KL
   for activations without an explicit derivative.
4. Step to the trust-region boundary: theta_new = theta_old + beta s with beta = sqrt(2 delta / (s^T F s)),
   delta = ``target_kl`` (the largest step whose quadratic KL model equals delta). With ``target_kl_schedule``
   linear, delta = target_kl_final + (target_kl - target_kl_final) * p, p = 1 - steps / total_steps the fraction
   of training left at the update (``linear_schedule``): the trust region shrinks as training ends.
5. Backtracking line search on beta * c^j, c = ``line_search_shrinking_factor``, j = 0 .. ``line_search_max_iter``
   - 1: accept the first step with mean KL(pi_old || pi_new) <= delta and L(theta_new) > L(theta_old); if none
   passes, keep theta_old. With ``npg`` the full step is taken without the search (natural policy gradient; Kakade,
   2002).
6. Value network: ``n_critic_updates`` epochs of Adam on minibatches of mean (V(s_t) - R_t)^2. Only the value
   network's parameters are in its optimizer, so the critic never moves the policy outside the trust region
   (except through a CNN torso shared by both, ``model.share_features``, as sb3-contrib's TRPO with a shared
   features extractor: there the trust region bounds step 5 only; ``share_features=false`` keeps the guarantee).
   With ``lr_schedule`` linear, Adam's step size is learning_rate * p (decays to 0, as tianshou's lr_decay).

Defaults follow sb3-contrib's TRPO and Spinning Up (docs/algorithms/trpo.md). The J^T M J form of step 3 costs about
a forward and a backward pass per CG iteration, where double backprop costs several (docs/benchmarks/trpo.md, "Speed").
A CNN policy (``model=cnn``; docs/pixels.md) has no hand-written Jacobian and takes the double-backprop route.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from pgcli.algo.checkpoint import Stateful
from pgcli.algo.control_base import ActorCriticTrainer
from pgcli.algo.policies import DistParams, Policy, detach_params, shares_parameters
from pgcli.algo.rollout import CriticProcess, Rollout, fit_critic
from pgcli.config import TRPOConfig
from pgcli.contracts import Monitor
from pgcli.hardware.placement import usable_cpus
from pgcli.ops.advantages import normalize
from pgcli.ops.autodiff import flat_grad, flat_params, set_flat_params
from pgcli.ops.cg import conjugate_gradient
from pgcli.ops.linesearch import backtracking_line_search
from pgcli.ops.losses import approx_kl


class SurrogateTerms(NamedTuple):
    """The TRPO surrogate at the current parameters and its diagnostics (0-dim tensors)."""

    loss_policy: Tensor
    """-L(theta) = -mean(ratio * A)."""
    kl: Tensor
    """mean KL(pi_old || pi_theta), closed form."""
    entropy: Tensor
    """mean entropy of pi_theta."""
    approx_kl: Tensor
    """k3 sample estimate of KL(pi_old || pi_theta)."""


def surrogate_terms(
    policy: Policy, new: DistParams, old: DistParams, actions: Tensor, old_log_probs: Tensor, advantages: Tensor
) -> SurrogateTerms:
    """Surrogate loss and KL of the distribution ``new`` (computed by ``policy`` on the batch) against ``old``.

    Args:
        policy: the policy whose distribution family ``new`` and ``old`` belong to.
        new: distribution parameters at the batch states under the current parameters (differentiable).
        old: the same under pi_old (detached).
        actions: [B] or [B, A] actions taken.
        old_log_probs: [B] log pi_old(a|s).
        advantages: [B] advantages.
    """
    log_ratio = policy.log_prob_of(new, actions) - old_log_probs  # [B]
    return SurrogateTerms(
        loss_policy=-(log_ratio.exp() * advantages).mean(),
        kl=policy.kl_of(old, new).mean(),
        entropy=policy.entropy_of(new).mean(),
        approx_kl=approx_kl(log_ratio),
    )


def fisher_vector_product_fn(kl: Tensor, params: Sequence[Tensor], *, damping: float) -> Callable[[Tensor], Tensor]:
    """v -> (F + damping * I) v, F the Hessian of the mean KL(old || new) ``kl`` at new = old (TRPO appendix C).

    The same products as ``pgcli.ops.autodiff.fisher_vector_product``, but grad KL (with its graph) is built once
    here, so each call is a single backward pass through it instead of two; CG calls it up to cg_max_steps + 1 times.

    Args:
        kl: scalar mean KL with the old distribution detached, twice differentiable w.r.t. ``params``.
        params: the actor's parameters (P elements).
        damping: added as damping * v.

    Returns:
        A function from a [P] vector to the [P] damped Fisher-vector product.
    """
    grad_kl = flat_grad(kl, params, create_graph=True)  # [P], differentiable

    def fvp(vector: Tensor) -> Tensor:
        return flat_grad(grad_kl @ vector, params, retain_graph=True) + damping * vector

    return fvp


def linear_schedule(initial: float, final: float, steps: int, total_steps: int) -> float:
    """final + (initial - final) * p, p = 1 - steps / total_steps the fraction of training left, clipped to [0, 1]."""
    remaining = min(max(1.0 - steps / max(total_steps, 1), 0.0), 1.0)
    return final + (initial - final) * remaining


def damped(fisher: Callable[[Tensor], Tensor], damping: float) -> Callable[[Tensor], Tensor]:
    """v -> F v + damping * v."""
    return lambda vector: fisher(vector) + damping * vector


class TRPO(ActorCriticTrainer[TRPOConfig]):
    """TRPO (or NPG with ``cfg.npg``) with a separate value network fitted by Adam."""

    checked_losses = ("train/policy_loss", "train/value_loss", "train/grad_norm")

    def __init__(self, cfg: TRPOConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.vf_optimizer = torch.optim.Adam(self.value.critic_parameters(), lr=cfg.learning_rate)
        self.critic_process = (
            CriticProcess(self.value, self.vf_optimizer)
            if cfg.critic_process
            and self.device.type == "cpu"
            and usable_cpus() >= 2
            and not shares_parameters(self.policy, self.value)
            else None
        )
        """Step 6 in a second process while this one takes steps 2-5 (``algo.critic_process``; same numbers). Not with
        a shared CNN torso, which steps 5 and 6 both move (``pgcli.config.run`` refuses the combination)."""

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        cfg = self.cfg
        while self.steps < total_steps:
            schedule = self._schedule(total_steps)  # by the steps before this update's rollout
            batch, advantages, returns = self._rollout(monitor)
            self._set_vf_learning_rate(schedule["train/vf_learning_rate"])
            critic = self.critic_process if self.critic_process is not None and self.critic_process.ready() else None
            if critic is not None:  # step 6 starts there, on this batch, while steps 2-5 run here
                critic.submit(
                    self.value,
                    self.vf_optimizer,
                    batch.obs.flatten(0, 1),
                    returns,
                    n_epochs=cfg.n_critic_updates,
                    batch_size=cfg.batch_size,
                )
            stats = self._policy_step(batch, advantages, schedule["train/target_kl"])
            stats |= self._critic_steps(batch, returns, remote=critic is not None)
            if cfg.target_kl_schedule != "constant" or cfg.lr_schedule != "constant":
                stats |= schedule
            self._report(monitor, stats, self.checked_losses, self._checked_parameters())
        return self.steps

    def _schedule(self, total_steps: int) -> dict[str, float]:
        """This update's trust-region radius and critic step size (their constants unless scheduled)."""
        cfg = self.cfg
        target_kl, vf_lr = cfg.target_kl, cfg.learning_rate
        if cfg.target_kl_schedule == "linear":
            target_kl = linear_schedule(cfg.target_kl, cfg.target_kl_final, self.steps, total_steps)
        if cfg.lr_schedule == "linear":
            vf_lr = linear_schedule(cfg.learning_rate, 0.0, self.steps, total_steps)
        return {"train/target_kl": target_kl, "train/vf_learning_rate": vf_lr}

    def _policy_step(self, batch: Rollout, advantages: Tensor, target_kl: float) -> dict[str, float]:
        """Steps 2-5: surrogate gradient, CG on Fisher-vector products, trust-region step of radius ``target_kl``,
        line search."""
        cfg, policy = self.cfg, self.policy
        obs, actions, old_log_probs = batch.obs.flatten(0, 1), batch.actions.flatten(0, 1), batch.log_probs.flatten()
        if cfg.normalize_advantage:
            advantages = normalize(advantages)
        params = policy.actor_parameters()

        new = policy.dist_params(obs)
        old = detach_params(new)
        before = surrogate_terms(policy, new, old, actions, old_log_probs, advantages)
        grad = flat_grad(-before.loss_policy, params, retain_graph=True)  # g = grad L  [P]

        # F on every k-th state (openai/baselines trpo_mpi: k = 5)
        sub_obs = obs if cfg.fvp_sub_sampling == 1 else obs[:: cfg.fvp_sub_sampling]
        fisher = policy.fisher_product(sub_obs)
        if fisher is not None:  # J^T M J v from cached activations: no double backprop
            fvp = damped(fisher, cfg.cg_damping)
        else:  # the Hessian of the mean KL by double backprop
            sub_new = new if cfg.fvp_sub_sampling == 1 else policy.dist_params(sub_obs)
            kl = policy.kl_of(detach_params(sub_new), sub_new).mean()
            fvp = fisher_vector_product_fn(kl, params, damping=cfg.cg_damping)
        direction, cg_residual = conjugate_gradient(
            fvp, grad, n_iters=cfg.cg_max_steps, residual_tol=cfg.cg_residual_tol
        )
        s_f_s = float(direction @ fvp(direction))
        full_step = math.sqrt(2.0 * target_kl / max(s_f_s, 1e-12)) * direction  # [P]
        old_objective = -before.loss_policy.item()

        candidates: list[SurrogateTerms] = []  # the terms at each parameter vector evaluate() saw, in order

        @torch.no_grad()
        def evaluate() -> tuple[float, float]:
            candidates.append(surrogate_terms(policy, policy.dist_params(obs), old, actions, old_log_probs, advantages))
            return -float(candidates[-1].loss_policy), float(candidates[-1].kl)

        if cfg.npg:
            set_flat_params(params, flat_params(params) + full_step)
            evaluate()  # for the logged terms
            success, n_backtracks = True, 0
        else:
            search = backtracking_line_search(
                params,
                full_step,
                evaluate,
                backtrack_coeff=cfg.line_search_shrinking_factor,
                max_backtracks=cfg.line_search_max_iter,
                max_kl=target_kl,
                old_objective=old_objective,
            )
            success, n_backtracks = search.success, search.n_backtracks
        # the accepted step is the last one evaluated; a failed search restored theta_old, where the terms are before's
        after = candidates[-1] if success else SurrogateTerms(*(t.detach() for t in before))
        return {
            "train/kl": float(after.kl),
            "train/approx_kl": float(after.approx_kl),
            "train/surrogate_improvement": -float(after.loss_policy) - old_objective,
            "train/policy_loss": float(after.loss_policy),
            "train/line_search_success": float(success),
            "train/line_search_steps": float(n_backtracks),
            "train/cg_residual": cg_residual,
            "train/step_size": float(full_step.norm()),
            "train/grad_norm": float(grad.norm()),
            "train/entropy": before.entropy.item(),
        }

    def _set_vf_learning_rate(self, learning_rate: float) -> None:
        """The critic's Adam step size for this update (``lr_schedule``)."""
        if self.cfg.lr_schedule != "constant":  # constant: the optimizer's own lr, untouched
            for group in self.vf_optimizer.param_groups:
                group["lr"] = learning_rate

    def _critic_steps(self, batch: Rollout, returns: Tensor, *, remote: bool = False) -> dict[str, float]:
        """Step 6: ``n_critic_updates`` epochs of Adam minibatch regression of V onto the GAE returns (``remote``:
        the result of the critic process's fit, started on the same batch)."""
        if remote and self.critic_process is not None:
            return batch.critic_stats(self.critic_process.result(self.value, self.vf_optimizer), returns)
        epochs, batch_size = self.cfg.n_critic_updates, self.cfg.batch_size
        return fit_critic(self.value, self.vf_optimizer, batch, returns, n_epochs=epochs, batch_size=batch_size)

    def _stateful(self) -> dict[str, Stateful | None]:
        return {"policy": self.policy, "value": self.value, "vf_optimizer": self.vf_optimizer}

    def close(self) -> None:
        if self.critic_process is not None:
            self.critic_process.close()
        super().close()
