"""GRPO on tokens (Shao et al., 2024, "DeepSeekMath", section 4.1) and its critic-free relatives, RLOO, REINFORCE
with a batch-mean baseline, GSPO and REINFORCE++, for RL fine-tuning of a language model on verifiable text tasks
(docs/algorithms/lm.md).

One update: M training prompts, G completions each sampled from the old policy pi_old with the key/value cache,
one verifiable reward R_i per completion, then mu epochs of minibatch steps on

    J(theta) = agg_{i,t} [ min(r_{i,t} A_{i,t}, clip(r_{i,t}, 1 - eps, 1 + eps_high) A_{i,t})
                           - beta * kl(pi_theta, pi_ref)_{i,t} + c_ent * H(pi_theta(.|q, o_{i,<t})) ]
    r_{i,t} = pi_theta(o_{i,t}|q, o_{i,<t}) / pi_old(o_{i,t}|q, o_{i,<t})      (GSPO: s_i on every token, below)
    kl = k1, k2 or k3 (`kl_estimator`; k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 by default)

where the advantage comes from the config's estimator (`ESTIMATORS`; k1_{i,t} = log pi_old - log pi_ref):

    algo=grpo          A_i = (R_i - mean_g R) / (std_g R + eps)   (scale_rewards=group; batch: the batch std;
                       none: R_i - mean_g R, Dr. GRPO with loss_agg=constant, preset grpo_addition_dr)
    algo=rloo          A_i = R'_i - mean_{j in g, j != i} R'_j,  R'_i = R_i - beta sum_t k1_{i,t}   (Ahmadian et
                       al., 2024; TRL's RLOOTrainer): the KL is in the reward, the loss has no KL term
    algo=reinforce     A_i = R_i - mean_batch R                       (Williams, 1992, with a mean baseline)
    algo=gspo          A_i as grpo; the ratio is s_i = exp(mean_t log r_{i,t}), clipped per completion
                       (Zheng et al., 2025)
    algo=reinforce_pp  A_{i,t} = whiten_batch(R'_i - beta sum_{t' >= t} k1_{i,t'}), R'_i = R_i or, with
                       baseline=group, R_i - mean_g R (Hu et al., 2025); the KL is in the reward

`agg` is `loss_agg` (seq_mean: GRPO's (1/G) sum_i (1/|o_i|) sum_t; token_mean: DAPO; constant: Dr. GRPO's
sum / (B * max_completion_len)). pi_ref is the reference (SFT) policy; beta = 0 skips its forward pass. With
`drop_degenerate_groups`, prompts whose G rewards are all equal are left out; with `mask_truncated_completions`,
completions that hit the length limit without EOS (TRL's option of that name). With `model.micro_batch` = k > 0, each
minibatch step runs its forward/backward passes k completions at a time and accumulates the gradients before one clip
and one step; every aggregate takes the minibatch's `BatchTotals`, so the step is the unchunked one up to float32
summation order. pi_old is the sampler's log-probabilities (`CompletionBatch.logprobs`) or, without them, the
first step's own forward pass and one no-grad pass over the other rows (`TextRLTrainer._old_logprobs`). The math is
in `pgcli.ops.lm` and `pgcli.ops.grpo`; sampling in `pgcli.algo.lm_rollout`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from pgcli.algo.lm_base import CriticFreeConfig, TextRLTrainer
from pgcli.algo.lm_rollout import CompletionBatch, batch_prompts
from pgcli.config import FlowGRPOConfig, GRPOConfig, GSPOConfig, REINFORCEConfig, ReinforcePPConfig, RLOOConfig
from pgcli.hardware import distributed, sharding
from pgcli.lm.model import CausalLM, completion_logprobs
from pgcli.ops.aggregate import LOSS_AGGREGATIONS, BatchTotals
from pgcli.ops.grpo import KL_ESTIMATORS, clip_bounds, k3_kl
from pgcli.ops.lm import (
    PolicyLoss,
    batch_mean_advantages,
    clipped_policy_loss,
    group_advantages,
    kl_shaped_rewards,
    masked_mean,
    micro_batches,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_clipped_policy_loss,
    token_advantages,
    truncated_completions,
    zero_variance_groups,
)

STD_EPS = 1e-4
"""Added to the std before dividing the GRPO advantages (TRL's value)."""

KL_IN_LOSS = (GRPOConfig, REINFORCEConfig, GSPOConfig, FlowGRPOConfig)
"""Configs whose KL to the reference is a loss term (`kl_estimator`); RLOO and REINFORCE++ fold it into the reward."""
KL_IN_REWARD = (RLOOConfig, ReinforcePPConfig)
"""Configs whose advantages read log pi_old of every completion when beta > 0 (the KL in the reward)."""


def _group_normalized(
    cfg: GRPOConfig | GSPOConfig | FlowGRPOConfig, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None
) -> Tensor:
    """GRPO's (and GSPO's) A_i on every token of completion i: [B, C]. Flow-GRPO's rows are turns, each with its
    trajectory's reward, grouped by question: the same normalisation, over the turns of the question's trajectories."""
    adv = group_advantages(batch.rewards, batch.group_ids, scale=cfg.scale_rewards, eps=STD_EPS)
    return token_advantages(adv.advantages, batch.mask)


def _leave_one_out(cfg: RLOOConfig, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
    """RLOO's A_i on the KL-shaped rewards (the sampling policy's sequence k1, as TRL): [B, C]."""
    shaped = batch.rewards
    if ref_logp is not None:
        shaped = kl_shaped_rewards(batch.rewards, old_logp, ref_logp, batch.mask, beta=cfg.beta)  # [B]
    return token_advantages(rloo_advantages(shaped, batch.group_ids).advantages, batch.mask)


def _batch_mean(cfg: REINFORCEConfig, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
    """REINFORCE's A_i = R_i - mean_batch R on every token: [B, C]."""
    return token_advantages(batch_mean_advantages(batch.rewards, batch.group_ids).advantages, batch.mask)


def _reinforce_pp(cfg: ReinforcePPConfig, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
    """REINFORCE++'s whitened returns of the KL-shaped token rewards: [B, C]."""
    return reinforce_pp_advantages(
        batch.rewards,
        batch.group_ids,
        old_logp,
        ref_logp,
        batch.mask,
        beta=cfg.beta,
        gamma=cfg.gamma,
        baseline=cfg.baseline,
    )


ESTIMATORS: dict[type, Callable[[Any, CompletionBatch, Tensor, Tensor | None], Tensor]] = {
    GRPOConfig: _group_normalized,
    RLOOConfig: _leave_one_out,
    REINFORCEConfig: _batch_mean,
    GSPOConfig: _group_normalized,
    ReinforcePPConfig: _reinforce_pp,
    FlowGRPOConfig: _group_normalized,
}
"""The advantage estimator of each algo config: (cfg, batch, old_logp [B, C], ref_logp [B, C] or None) -> [B, C]."""

POLICY_LOSSES: dict[type, Callable[..., PolicyLoss]] = {
    GRPOConfig: clipped_policy_loss,
    RLOOConfig: clipped_policy_loss,
    REINFORCEConfig: clipped_policy_loss,
    GSPOConfig: sequence_clipped_policy_loss,  # one ratio per completion
    ReinforcePPConfig: clipped_policy_loss,
    FlowGRPOConfig: clipped_policy_loss,
}
"""The clipped surrogate of each algo config: token ratios, or GSPO's sequence ratio."""


STEP_STATS = ("policy_loss", "loss", "entropy", "kl_ref", "clip_fraction", "approx_kl")
"""A minibatch step's metrics (``train/<name>``, averaged over the update's steps), besides ``grad_norm``."""


class TokenLoss(NamedTuple):
    """The loss terms on a minibatch (summed by the update) and its diagnostics; on a micro-batch with the
    minibatch's `BatchTotals`, each its share of the minibatch's."""

    loss_policy: Tensor
    loss_kl: Tensor
    loss_entropy: Tensor
    kl_ref: float
    """Mean per-token k3 KL to the reference (nan when beta = 0), whatever the estimator in the loss."""
    entropy: float
    clip_fraction: float
    approx_kl: float
    """Mean per-token k3 KL(old || pi_theta) before the step (SB3's and CleanRL's `approx_kl`, verl's `ppo_kl`)."""
    logp: Tensor
    """[B', C'] log pi_theta of the rows' sampled tokens in their first C' columns, detached."""


def token_loss(
    policy: CausalLM,
    cfg: CriticFreeConfig,
    batch: CompletionBatch,
    rows: Tensor,
    *,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    temperature: float,
    max_len: int,
    totals: BatchTotals | None = None,
) -> TokenLoss:
    """The objective above on completions `rows` of `batch`; old_logp, ref_logp and advantages are [B', C] for them
    (old_logp None: pi_theta is still the sampling policy, so pi_old is its own log-probabilities, detached: TRL's
    shortcut for num_iterations = 1). With `totals` (those of the minibatch `rows` is a micro-batch of), every term
    and diagnostic is the micro-batch's share of the minibatch's: the shares of its micro-batches sum to it."""
    mask = batch.mask[rows]
    width = int(mask.sum(1).max())  # drop columns that are padding in every row of these completions
    if sharding.in_lockstep(policy):  # as many log-prob chunks, each a pass through the sharded head, on every rank
        width = sharding.widest(width)
    mask, advantages = mask[:, :width], advantages[:, :width]
    prompt_tokens, prompt_mask, prompt_index = batch_prompts(batch, rows)
    logp, entropy = completion_logprobs(
        policy,
        prompt_tokens,
        prompt_mask,
        batch.tokens[rows, :width],
        mask.bool(),
        temperature=temperature,
        prompt_index=prompt_index,
    )
    old_logp = logp.detach() if old_logp is None else old_logp[:, :width]
    low, high = clip_bounds(cfg.epsilon, cfg.epsilon_high)
    policy_loss = POLICY_LOSSES[type(cfg)](
        logp, old_logp, advantages, mask, low=low, high=high, loss_agg=cfg.loss_agg, max_len=max_len, totals=totals
    )
    aggregate = LOSS_AGGREGATIONS[cfg.loss_agg]
    loss_kl, kl_ref = torch.zeros((), device=mask.device), float("nan")
    if ref_logp is not None:
        ref_logp = ref_logp[:, :width]
        kl_ref = float(masked_mean(k3_kl(logp.detach(), ref_logp), mask, totals=totals))
        if isinstance(cfg, KL_IN_LOSS):  # DeepSeekMath eq. 3: the KL sits inside the per-token sum
            kl = KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)  # [B', C]
            loss_kl = cfg.beta * aggregate(kl, mask, max_len=max_len, totals=totals)
    return TokenLoss(
        loss_policy=policy_loss.loss,
        loss_kl=loss_kl,
        loss_entropy=-cfg.ent_coef * aggregate(entropy, mask, max_len=max_len, totals=totals),
        kl_ref=kl_ref,
        entropy=float(masked_mean(entropy.detach(), mask, totals=totals)),
        clip_fraction=policy_loss.clip_fraction,
        approx_kl=float(masked_mean(k3_kl(old_logp, logp.detach()), mask, totals=totals)),
        logp=logp.detach(),
    )


class LMGRPO(TextRLTrainer[CriticFreeConfig]):
    """Critic-free trainer on a text task: GRPO, Dr. GRPO, RLOO, REINFORCE, GSPO or REINFORCE++, by the config's
    type; built, sampling, checkpoints and resume as :class:`pgcli.algo.lm_base.TextRLTrainer`."""

    checked_losses = ("train/policy_loss", "train/loss", "train/grad_norm")

    def _update(self, batch: CompletionBatch) -> dict[str, float]:
        cfg = self.cfg
        zero_variance = zero_variance_groups(batch.rewards, batch.group_ids)  # [M]
        truncated = truncated_completions(batch.tokens, batch.mask, eos_id=self.task.vocab.stop_ids)  # [B]
        stats = {
            "train/zero_variance_frac": float(zero_variance.float().mean()),
            "rollout/truncated_frac": float(truncated.float().mean()),
        }
        keep = torch.ones_like(batch.group_ids, dtype=torch.bool)
        if cfg.drop_degenerate_groups:  # DAPO dynamic sampling (without resampling): no signal, no gradient
            keep &= ~zero_variance[batch.group_ids]
        if cfg.mask_truncated_completions:  # TRL's option: a cut-off completion's reward says little about it
            keep &= ~truncated
        rows = keep.nonzero().squeeze(1)  # [B']
        stats["train/dropped_frac"] = 1.0 - len(rows) / len(keep)
        if len(rows) == 0:
            return stats
        first_epoch = self._minibatches(rows)
        # pi_old: the sampler's log-probs where they are the forward pass's function; else the first step's
        # minibatch reads its own forward pass (the policy has not moved since sampling) and one pass covers the rest.
        # A KL in the reward takes pi_old of every completion from the pass pi_ref's comes from, so that k1 is exactly
        # 0 where the policy is the reference (no float noise for the whitening to blow up).
        kl_in_reward = isinstance(cfg, KL_IN_REWARD) and self.reference is not None
        sampled = None if kl_in_reward else batch.logprobs
        own = first_epoch[0][:0] if sampled is not None or kl_in_reward else first_epoch[0]
        with torch.no_grad():  # one pass each (by micro-batches)
            ref_logp = None if self.reference is None else self._batch_logprobs(self.reference, batch)
            old_logp = sampled if sampled is not None else self._old_logprobs(batch, own)
        # advantages over the whole batch (baselines, whitening), as TRL; left-out rows only leave the loss
        advantages = self._advantages(batch, old_logp, ref_logp)  # [B, C]

        totals = dict.fromkeys((*STEP_STATS, "grad_norm"), 0.0)
        n_minibatches = 0
        self.policy.train()
        for epoch in range(cfg.n_iterations):  # mu policy updates per batch
            for mb in first_epoch if epoch == 0 else self._minibatches(rows):
                fresh = n_minibatches == 0 and len(own) > 0
                step = self._policy_step(
                    batch, mb, old_logp=old_logp, ref_logp=ref_logp, advantages=advantages, on_policy=fresh
                )
                n_minibatches += 1
                for key, value in step.items():
                    totals[key] += value
        self.n_updates += 1
        interval = cfg.ref_update_interval if isinstance(cfg, GRPOConfig) else 0
        if self.reference is not None and interval > 0 and self.n_updates % interval == 0:
            self.reference.load_state_dict(self.policy.state_dict())
        return stats | self._step_means(totals, n_minibatches)

    def _minibatches(self, rows: Tensor) -> tuple[Tensor, ...]:
        """One epoch's minibatches of the trained completions `rows` [B'], shuffled: this rank's share of
        `algo.batch_size` each."""
        return rows[torch.randperm(len(rows), device=self.device)].split(self._minibatch_rows())

    def _policy_step(
        self,
        batch: CompletionBatch,
        mb: Tensor,
        *,
        old_logp: Tensor,
        ref_logp: Tensor | None,
        advantages: Tensor,
        on_policy: bool = False,
    ) -> dict[str, float]:
        """One optimizer step on completions `mb` [B'] of `batch` (old_logp, ref_logp, advantages: [B, C]): the
        forward/backward passes `model.micro_batch` completions at a time (0: all at once), the gradients
        accumulated, each pass's loss its share of the minibatch's (docs/lm.md, "Memory"); then one clip and one
        step. `on_policy`: the policy is still the sampling one, so these rows' pi_old is their own log-probs,
        written into `old_logp` for later epochs. Returns the minibatch's loss terms, diagnostics and gradient norm."""
        totals = distributed.minibatch_totals(batch.mask[mb], micro_batch=self.micro_batch)
        stats = dict.fromkeys(STEP_STATS, 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        for rows in micro_batches(mb, self.micro_batch):
            out = token_loss(
                self.policy,
                self.cfg,
                batch,
                rows,
                old_logp=None if on_policy else old_logp[rows],
                ref_logp=None if ref_logp is None else ref_logp[rows],
                advantages=advantages[rows],
                temperature=self.temperature,
                max_len=self.task.max_completion_len,
                totals=totals,
            )
            if on_policy:
                old_logp[rows, : out.logp.shape[1]] = out.logp
            loss = out.loss_policy + out.loss_kl + out.loss_entropy
            loss.backward()
            stats["policy_loss"] += out.loss_policy.item()
            stats["loss"] += loss.item()
            stats["entropy"] += out.entropy
            stats["kl_ref"] += out.kl_ref
            stats["clip_fraction"] += out.clip_fraction
            stats["approx_kl"] += out.approx_kl
        stats["grad_norm"] = distributed.optimizer_step(
            self.optimizer, self.policy.parameters(), self.cfg.max_grad_norm, stats
        )
        return stats

    def _advantages(self, batch: CompletionBatch, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
        """The config's advantage estimator (`ESTIMATORS`) on `batch`: [B, C]."""
        return ESTIMATORS[type(self.cfg)](self.cfg, batch, old_logp, ref_logp)
