"""GRPO on tokens (Shao et al., 2024, "DeepSeekMath", section 4.1) and its critic-free relatives, RLOO and REINFORCE
with a batch-mean baseline, for RL fine-tuning of a small language model on verifiable text tasks
(docs/algorithms/lm.md).

One update: M training prompts, G completions each sampled from the old policy pi_old with the key/value cache,
one verifiable reward R_i per completion, then mu epochs of minibatch steps on

    J(theta) = agg_{i,t} [ min(r_{i,t} A_i, clip(r_{i,t}, 1 - eps, 1 + eps_high) A_i)
                           - beta * k3(pi_theta, pi_ref)_{i,t} + c_ent * H(pi_theta(.|q, o_{i,<t})) ]
    r_{i,t} = pi_theta(o_{i,t}|q, o_{i,<t}) / pi_old(o_{i,t}|q, o_{i,<t})
    k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1

where the sequence advantage A_i is broadcast to every token of completion i and comes from the config's estimator:

    algo=grpo       A_i = (R_i - mean_g R) / (std_g R + eps)   (scale_rewards=group; batch: the batch std;
                    none: R_i - mean_g R, Dr. GRPO with loss_agg=constant, preset grpo_addition_dr)
    algo=rloo       A_i = R_i - mean_{j in g, j != i} R_j          (Ahmadian et al., 2024)
    algo=reinforce  A_i = R_i - mean_batch R                       (Williams, 1992, with a mean baseline)

`agg` is `loss_agg` (seq_mean: GRPO's (1/G) sum_i (1/|o_i|) sum_t; token_mean: DAPO; constant: Dr. GRPO's
sum / (B * max_completion_len)). pi_ref is the reference (SFT) policy; beta = 0 skips its forward pass. With
`drop_degenerate_groups`, prompts whose G rewards are all equal are left out (their GRPO/RLOO advantages are 0).
The math is in `pgcli.ops.lm` and `pgcli.ops.grpo`; sampling in `pgcli.algo.lm_rollout`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from pgcli.algo.base import Monitor
from pgcli.algo.checkpoint import Stateful
from pgcli.algo.guard import check_update
from pgcli.algo.lm_rollout import (
    CompletionBatch,
    SamplingSettings,
    generator_state,
    load_text_trainer,
    rollout_stats,
    sample_completions,
    save_text_trainer,
    set_generator_state,
)
from pgcli.config import GRPOConfig, REINFORCEConfig, RLOOConfig
from pgcli.lm.model import TinyGPT, completion_logprobs
from pgcli.lm.tasks import TextTask
from pgcli.ops.grpo import LOSS_AGGREGATIONS, clip_bounds, k3_kl
from pgcli.ops.lm import (
    SequenceAdvantages,
    batch_mean_advantages,
    clipped_policy_loss,
    group_advantages,
    masked_mean,
    rloo_advantages,
    token_advantages,
)

STD_EPS = 1e-4
"""Added to the std before dividing the GRPO advantages (TRL's value)."""

CriticFreeConfig = GRPOConfig | RLOOConfig | REINFORCEConfig

ESTIMATORS: dict[type, Callable[..., SequenceAdvantages]] = {
    GRPOConfig: lambda cfg, rewards, groups: group_advantages(rewards, groups, scale=cfg.scale_rewards, eps=STD_EPS),
    RLOOConfig: lambda cfg, rewards, groups: rloo_advantages(rewards, groups),
    REINFORCEConfig: lambda cfg, rewards, groups: batch_mean_advantages(rewards, groups),
}
"""The sequence-level advantage estimator of each algo config."""


class TokenLoss(NamedTuple):
    """The loss terms on a minibatch (summed by the update) and its diagnostics."""

    loss_policy: Tensor
    loss_kl: Tensor
    loss_entropy: Tensor
    kl_ref: float
    """Mean per-token k3 KL to the reference (nan when beta = 0)."""
    entropy: float
    clip_fraction: float


def token_loss(
    policy: TinyGPT,
    cfg: CriticFreeConfig,
    batch: CompletionBatch,
    rows: Tensor,
    *,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    temperature: float,
    max_len: int,
) -> TokenLoss:
    """The objective above on completions `rows` of `batch`; old_logp, ref_logp and advantages are [B', C] for them."""
    mask = batch.mask[rows]
    width = int(mask.sum(1).max())  # drop columns that are padding in every row of this minibatch
    mask, old_logp, advantages = mask[:, :width], old_logp[:, :width], advantages[:, :width]
    logp, entropy = completion_logprobs(policy, batch.prompt_tokens[rows], batch.prompt_mask[rows],
                                        batch.tokens[rows, :width], mask.bool(), temperature=temperature)  # fmt: skip
    low, high = clip_bounds(cfg.epsilon, cfg.epsilon_high)
    policy_loss = clipped_policy_loss(logp, old_logp, advantages, mask, low=low, high=high, loss_agg=cfg.loss_agg,
                                      max_len=max_len)  # fmt: skip
    aggregate = LOSS_AGGREGATIONS[cfg.loss_agg]
    loss_kl, kl_ref = torch.zeros((), device=mask.device), float("nan")
    if ref_logp is not None:  # DeepSeekMath eq. 3: the KL sits inside the per-token sum
        kl = k3_kl(logp, ref_logp[:, :width])  # [B', C]
        loss_kl = cfg.beta * aggregate(kl, mask, max_len=max_len)
        kl_ref = float(masked_mean(kl.detach(), mask))
    return TokenLoss(
        loss_policy=policy_loss.loss,
        loss_kl=loss_kl,
        loss_entropy=-cfg.ent_coef * aggregate(entropy, mask, max_len=max_len),
        kl_ref=kl_ref,
        entropy=float(masked_mean(entropy.detach(), mask)),
        clip_fraction=policy_loss.clip_fraction,
    )


class LMGRPO:
    """Critic-free trainer on a text task: GRPO, Dr. GRPO, RLOO or REINFORCE, by the config's type."""

    def __init__(
        self,
        cfg: CriticFreeConfig,
        *,
        task: TextTask,
        policy: TinyGPT,
        reference: TinyGPT | None,
        model: SamplingSettings,
        seed: int,
        device: torch.device,
    ) -> None:
        self.cfg, self.task, self.device = cfg, task, device
        self.temperature, self.top_p = model.temperature, model.top_p
        self.policy = policy.to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate)
        # pi_ref: the SFT model the run starts from (DeepSeekMath); none at all when beta = 0
        self.reference: TinyGPT | None = None
        if cfg.beta > 0:
            self.reference = (copy.deepcopy(self.policy) if reference is None else reference.to(device)).eval()
            self.reference.requires_grad_(False)
        self.estimator = ESTIMATORS[type(cfg)]
        self.prompt_rng = np.random.default_rng(seed)  # training prompts
        self.generator = torch.Generator(device=device).manual_seed(seed)  # token sampling
        self.steps = 0
        self.n_updates = 0

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        while self.steps < total_steps:
            start = time.perf_counter()
            # 1. G completions of each of M prompts from the old policy, scored by the task
            problems = self.task.sample(self.prompt_rng, self.cfg.n_groups)
            batch = sample_completions(self.task, self.policy, problems, group_size=self.cfg.group_size,
                                       temperature=self.temperature, top_p=self.top_p, generator=self.generator,
                                       device=self.device)  # fmt: skip
            self.steps += len(batch.rewards)
            # 2. sequence advantages; 3. mu epochs of clipped minibatch steps
            stats = rollout_stats(batch) | self._update(batch)
            stats["time/update_s"] = time.perf_counter() - start
            stats["time/tokens_per_s_overall"] = batch.n_tokens / stats["time/update_s"]  # sampling + update
            losses = ("train/policy_loss", "train/loss", "train/grad_norm") if "train/loss" in stats else ()
            check_update(monitor, self.steps, stats, losses, params=self.policy.parameters())
            monitor.log(self.steps, stats)
            monitor.update(self.steps, agent=self)
        return self.steps

    def _update(self, batch: CompletionBatch) -> dict[str, float]:
        cfg = self.cfg
        adv = self.estimator(cfg, batch.rewards, batch.group_ids)
        stats = {"train/zero_variance_frac": float(adv.zero_variance.float().mean())}
        keep = torch.ones_like(batch.group_ids, dtype=torch.bool)
        if cfg.drop_degenerate_groups:  # DAPO dynamic sampling (without resampling): no signal, no gradient
            keep = ~adv.zero_variance[batch.group_ids]
        rows = keep.nonzero().squeeze(1)  # [B']
        stats["train/dropped_frac"] = 1.0 - len(rows) / len(keep)
        if len(rows) == 0:
            return stats
        advantages = token_advantages(adv.advantages, batch.mask)  # [B, C]
        max_len = self.task.max_completion_len
        with torch.no_grad():  # one batched pass each: the policy did not change since sampling
            old_logp = self._logprobs(self.policy, batch)
            ref_logp = None if self.reference is None else self._logprobs(self.reference, batch)

        totals = dict.fromkeys(("policy_loss", "loss", "entropy", "kl_ref", "clip_fraction", "grad_norm"), 0.0)
        n_minibatches = 0
        self.policy.train()
        for _ in range(cfg.n_iterations):  # mu policy updates per batch
            for mb in rows[torch.randperm(len(rows), device=self.device)].split(cfg.batch_size):
                out = token_loss(self.policy, cfg, batch, mb, old_logp=old_logp[mb],
                                 ref_logp=None if ref_logp is None else ref_logp[mb], advantages=advantages[mb],
                                 temperature=self.temperature, max_len=max_len)  # fmt: skip
                loss = out.loss_policy + out.loss_kl + out.loss_entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                n_minibatches += 1
                totals["policy_loss"] += out.loss_policy.item()
                totals["loss"] += loss.item()
                totals["entropy"] += out.entropy
                totals["kl_ref"] += out.kl_ref
                totals["clip_fraction"] += out.clip_fraction
                totals["grad_norm"] += float(grad_norm)
        self.n_updates += 1
        interval = cfg.ref_update_interval if isinstance(cfg, GRPOConfig) else 0
        if self.reference is not None and interval > 0 and self.n_updates % interval == 0:
            self.reference.load_state_dict(self.policy.state_dict())
        with torch.no_grad():  # KL(old || new) over the whole update: k3 on the sampled tokens
            new_logp = self._logprobs(self.policy, batch)
            approx_kl = float(masked_mean(k3_kl(old_logp, new_logp)[rows], batch.mask[rows]))
        stats |= {f"train/{key}": value / n_minibatches for key, value in totals.items()}
        stats["train/approx_kl"] = approx_kl
        if self.reference is None:
            del stats["train/kl_ref"]
        return stats

    def _logprobs(self, model: TinyGPT, batch: CompletionBatch) -> Tensor:
        """log pi(o_t | q, o_<t) [B, C] of the sampled tokens under `model` at the sampling temperature."""
        return completion_logprobs(model, batch.prompt_tokens, batch.prompt_mask, batch.tokens, batch.mask.bool(),
                                   temperature=self.temperature)[0]  # fmt: skip

    def save(self, path: Path) -> Path:
        """``model.pt`` (policy, reference, optimizer), ``policy.pt`` and ``state.json`` (completions so far,
        updates, the prompt and sampling generators, the process RNGs); see `pgcli.algo.lm_rollout`."""
        values = {
            "steps": self.steps,
            "n_updates": self.n_updates,
            "prompt_rng": self.prompt_rng.bit_generator.state,
            "generator": generator_state(self.generator),
        }
        return save_text_trainer(path, self.policy, self._modules(), values)

    def load(self, path: Path) -> None:
        values = load_text_trainer(path, self.device, self._modules())
        self.steps, self.n_updates = int(values["steps"]), int(values["n_updates"])
        self.prompt_rng.bit_generator.state = values["prompt_rng"]
        set_generator_state(self.generator, values["generator"])

    def _modules(self) -> dict[str, Stateful | None]:
        return {"policy": self.policy, "optimizer": self.optimizer, "reference": self.reference}

    def close(self) -> None:
        """Nothing to release: a text task holds no env."""
