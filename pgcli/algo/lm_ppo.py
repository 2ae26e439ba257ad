"""PPO with a value network for language models (Ouyang et al., 2022, "InstructGPT"; Ziegler et al., 2019), the RLHF
baseline, on verifiable text tasks (docs/algorithms/lm.md, "PPO with a value network (`LMPPO`)").

One update: M prompts, G completions each from the old policy pi_old (the same sampler as GRPO), then

    r_t   = -beta * (log pi_old(o_t) - log pi_ref(o_t)) + [t = |o|] R      the KL-penalised per-token reward
    A_t   = GAE(gamma, lambda) over the tokens of each completion with V_phi (terminal after the last token)
    J(theta) = agg_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps_high) A_t) + c_ent H_t,  rho_t = pi_theta / pi_old
    L(phi)   = 1/2 mean_t max((V_phi - R_t)^2, (clip(V_phi, V_old +- clip_range_vf) - R_t)^2),  R_t = A_t + V_old

for `n_iterations` epochs of minibatches; A is whitened over the batch's tokens when `normalize_advantage` (on
several processes, the global batch's). The value
network V_phi is a copy of the initial (SFT) policy's transformer with a scalar head on its final hidden states, trained
by its own Adam; the state before token t is the prompt and o_<t, read at the position that predicts o_t. `train/kl_ref`
is the same per-token k3 KL to the reference as the critic-free trainers log, so the table of docs/benchmarks/lm.md
("What RL adds to the supervised warm start") compares like with like. With `model.micro_batch` = k > 0, the policy
and the value steps each run their forward/backward passes k completions at a time and accumulate the gradients
before one clip and one step (every mean over the minibatch's `BatchTotals`: the unchunked step up to float32
summation order). The math is in `pgcli.ops.lm`; sampling in `pgcli.algo.lm_rollout`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from pgcli.algo.checkpoint import Stateful
from pgcli.algo.lm_base import TextRLTrainer
from pgcli.algo.lm_rollout import CompletionBatch
from pgcli.config import PPOLMConfig
from pgcli.hardware import distributed
from pgcli.lm.model import CausalLM
from pgcli.ops.aggregate import BatchTotals
from pgcli.ops.grpo import clip_bounds, k3_kl
from pgcli.ops.lm import (
    clipped_policy_loss,
    kl_penalized_rewards,
    masked_mean,
    masked_whiten,
    micro_batches,
    token_gae,
    zero_variance_groups,
)


class ValueModel(nn.Module):
    """V(prompt, o_<t): a copy of the policy's trunk and a linear head on its final hidden states."""

    def __init__(self, trunk: CausalLM) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, prompt_tokens: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> Tensor:
        """Values [B, C]: column t is the value of the state before completion token t."""
        p = prompt_tokens.shape[1]
        tokens = torch.cat([prompt_tokens, completion], 1)  # [B, P + C]
        mask = torch.cat([prompt_mask, completion_mask], 1)
        hidden = self.trunk.hidden(tokens, mask)[:, p - 1 : -1]  # [B, C, D]: the positions that predict o_t
        return self.head(hidden).squeeze(-1)


class LMPPO(TextRLTrainer[PPOLMConfig]):
    """PPO with a value network on a text task (module docstring); built, sampling, checkpoints and resume as
    :class:`pgcli.algo.lm_base.TextRLTrainer`, plus the value network and its optimizer."""

    checked_losses = ("train/policy_loss", "train/value_loss", "train/grad_norm")

    def __init__(self, cfg: PPOLMConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.value = ValueModel(copy.deepcopy(self.policy)).to(self.device)
        self.vf_optimizer = torch.optim.Adam(self.value.parameters(), lr=cfg.vf_learning_rate)

    def _update(self, batch: CompletionBatch) -> dict[str, float]:
        cfg = self.cfg
        zero_variance = zero_variance_groups(batch.rewards, batch.group_ids)
        keep = torch.ones_like(batch.group_ids, dtype=torch.bool)
        if cfg.drop_degenerate_groups:
            keep = ~zero_variance[batch.group_ids]
        rows = keep.nonzero().squeeze(1)
        stats = {
            "train/zero_variance_frac": float(zero_variance.float().mean()),
            "train/dropped_frac": 1.0 - len(rows) / len(keep),
        }
        if len(rows) == 0:
            return stats
        mask = batch.mask
        with torch.no_grad():  # by micro-batches: the model did not change since sampling
            old_logp = self._batch_logprobs(self.policy, batch)  # [B, C]
            ref_logp = old_logp if self.reference is None else self._batch_logprobs(self.reference, batch)
            old_values = self._by_rows(batch, lambda rows: self._values(batch, rows, mask.shape[1]))  # [B, C]
            rewards = kl_penalized_rewards(batch.rewards, old_logp, ref_logp, mask, beta=cfg.beta)
            advantages, returns = token_gae(rewards, old_values, mask, gamma=cfg.gamma, lam=cfg.gae_lambda)
            if cfg.normalize_advantage:
                # over the global batch's tokens: on several processes, every rank's share of them
                advantages = masked_whiten(advantages, mask * keep[:, None], total=distributed.all_sum)

        totals = dict.fromkeys(
            ("policy_loss", "value_loss", "entropy", "kl_ref", "clip_fraction", "approx_kl", "grad_norm"), 0.0
        )
        n_minibatches = 0
        for _ in range(cfg.n_iterations):
            for mb in rows[torch.randperm(len(rows), device=self.device)].split(self._minibatch_rows()):
                mb_totals = distributed.minibatch_totals(mask[mb], micro_batch=self.micro_batch)
                step = self._policy_step(
                    batch, mb, old_logp=old_logp, ref_logp=ref_logp, advantages=advantages, totals=mb_totals
                )
                step["value_loss"] = self._critic_step(
                    batch, mb, returns=returns, old_values=old_values, totals=mb_totals
                )
                n_minibatches += 1
                for key, value in step.items():
                    totals[key] += value
        self.n_updates += 1
        stats |= self._step_means(totals, n_minibatches)
        # the global batch's token mean (the ranks' token counts differ: a mean of their means would not be it)
        reward_sum, n_tokens = distributed.all_sum(
            torch.stack([torch.where(mask.bool(), rewards, 0.0)[rows].sum(), mask[rows].sum()])
        )
        stats["train/token_reward_mean"] = float(reward_sum / n_tokens)
        return stats

    def _policy_step(
        self,
        batch: CompletionBatch,
        mb: Tensor,
        *,
        old_logp: Tensor,
        ref_logp: Tensor,
        advantages: Tensor,
        totals: BatchTotals | None,
    ) -> dict[str, float]:
        """One policy step on completions `mb` [B'] (old_logp, ref_logp, advantages: [B, C]): the forward/backward
        passes `model.micro_batch` completions at a time (0: all at once, `totals` None), each pass's loss its share
        of the minibatch's (`totals`), the gradients accumulated; then one clip and one step."""
        cfg = self.cfg
        low, high = clip_bounds(cfg.epsilon, cfg.epsilon_high)
        stats = dict.fromkeys(("policy_loss", "entropy", "kl_ref", "clip_fraction", "approx_kl"), 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        for rows in micro_batches(mb, self.micro_batch):
            width = int(batch.mask[rows].sum(1).max())  # drop columns that are padding in every row
            mask = batch.mask[rows, :width]
            logp, entropy = self._logprobs(self.policy, batch, rows, width)
            pol = clipped_policy_loss(
                logp,
                old_logp[rows, :width],
                advantages[rows, :width],
                mask,
                low=low,
                high=high,
                loss_agg=cfg.loss_agg,
                max_len=self.task.max_completion_len,
                totals=totals,
            )
            loss = pol.loss - cfg.ent_coef * masked_mean(entropy, mask, totals=totals)
            loss.backward()
            stats["policy_loss"] += pol.loss.item()
            stats["entropy"] += float(masked_mean(entropy.detach(), mask, totals=totals))
            stats["clip_fraction"] += pol.clip_fraction
            # KL(old || pi_theta) before the step, from this forward pass (SB3's approx_kl)
            stats["approx_kl"] += float(masked_mean(k3_kl(old_logp[rows, :width], logp.detach()), mask, totals=totals))
            if self.reference is not None:
                stats["kl_ref"] += float(masked_mean(k3_kl(logp.detach(), ref_logp[rows, :width]), mask, totals=totals))
        stats["grad_norm"] = distributed.optimizer_step(
            self.optimizer, self.policy.parameters(), cfg.max_grad_norm, stats
        )
        return stats

    def _critic_step(
        self, batch: CompletionBatch, mb: Tensor, *, returns: Tensor, old_values: Tensor, totals: BatchTotals | None
    ) -> float:
        """One value step on completions `mb` [B'] (returns, old_values: [B, C]), by micro-batches as
        `_policy_step`; returns the minibatch's value loss."""
        cfg = self.cfg
        vf_loss_sum = 0.0
        self.vf_optimizer.zero_grad(set_to_none=True)
        for rows in micro_batches(mb, self.micro_batch):
            width = int(batch.mask[rows].sum(1).max())
            mask = batch.mask[rows, :width]
            values = self._values(batch, rows, width)
            target, old_v = returns[rows, :width], old_values[rows, :width]
            value_loss = (values - target) ** 2
            if cfg.clip_range_vf is not None:  # PPO2 / TRL value clipping around the old estimate
                clipped = old_v + (values - old_v).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
                value_loss = torch.max(value_loss, (clipped - target) ** 2)
            vf_loss = 0.5 * masked_mean(value_loss, mask, totals=totals)
            vf_loss.backward()
            vf_loss_sum += vf_loss.item()
        shares = {"value_loss": vf_loss_sum}
        distributed.optimizer_step(self.vf_optimizer, self.value.parameters(), cfg.max_grad_norm, shares)
        return shares["value_loss"]

    def _values(self, batch: CompletionBatch, rows: Tensor, width: int) -> Tensor:
        """V_phi [B', width] before each of the first `width` sampled tokens of completions `rows`."""
        return self.value(
            batch.prompt_tokens[rows],
            batch.prompt_mask[rows],
            batch.tokens[rows, :width],
            batch.mask[rows, :width].bool(),
        )

    def _trained_parameters(self) -> Iterable[Tensor]:
        return [*self.policy.parameters(), *self.value.parameters()]

    def _modules(self) -> dict[str, Stateful | None]:
        """``model.pt``'s state dicts: the policy, the value network, the reference and both optimizers."""
        return {
            "policy": self.policy,
            "value": self.value,
            "optimizer": self.optimizer,
            "vf_optimizer": self.vf_optimizer,
            "reference": self.reference,
        }
