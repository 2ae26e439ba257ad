"""Policy-gradient math for language-model fine-tuning on verifiable tasks: B completions of up to C tokens.

Layout: a batch holds B sampled completions, per-token tensors are [B, C] with a float prefix `mask` (1.0 on the
sampled tokens up to and including EOS, then 0.0 on padding), per-completion tensors are [B], and `group_ids` [B]
(long, 0..M-1) names the prompt a completion answers; the G completions of one prompt form a group. The control
GRPO math in `pgcli.ops.grpo` is the same math on episodes and is reused here, not repeated: the outcome advantage
(`group_normalized_advantages` on one-step "episodes"), `k3_kl`, `clip_bounds`, `grpo_clipped_objective`,
`clip_fractions` and `LOSS_AGGREGATIONS` (seq_mean / token_mean / constant). Implemented here:

- sequence-level advantages, one per completion, broadcast to its tokens by `token_advantages`:
    `group_advantages`   A_i = (R_i - mean_g R) / (std_g R + eps), or R_i - mean_g R with scale "none"
                         (GRPO, Shao et al., 2024; Dr. GRPO, Liu et al., 2025)
    `rloo_advantages`    A_i = R_i - (1 / (G - 1)) sum_{j in g, j != i} R_j       (Ahmadian et al., 2024, RLOO)
    `batch_mean_advantages`  A_i = R_i - mean_batch R                            (REINFORCE with a mean baseline)
- `kl_shaped_rewards`: R_i - beta sum_t (log pi(o_t) - log pi_ref(o_t)), the sequence k1 KL folded into the reward
  before the leave-one-out baseline (RLOO as Ahmadian et al., 2024 and TRL's RLOOTrainer define it).
- `reinforce_pp_advantages`: REINFORCE++ (Hu et al., 2025): the return-to-go of the KL-shaped token rewards
  (`kl_penalized_rewards`), R'_i - beta sum_{t' >= t} k1_{t'} with gamma = 1, whitened over the batch's tokens;
  R'_i = R_i, or R_i - mean_g R with the group baseline (REINFORCE++-baseline).
- `zero_variance_groups`: groups whose rewards are all equal (no signal; DAPO's dynamic sampling drops them).
- `truncated_completions`: completions that hit the length limit without EOS (TRL's `mask_truncated_completions`).
- `clipped_policy_loss`: the clipped surrogate, -min(r A, clip(r, 1 - eps, 1 + eps_high) A), aggregated with a
  `loss_agg` of `LOSS_AGGREGATIONS`, plus the clip fraction; `sequence_clipped_policy_loss`: the same with GSPO's
  sequence ratio s_i = exp(mean_t (log pi_theta - log pi_old)) (Zheng et al., 2025) in place of the token ratio.
- `masked_mean`, `masked_whiten`: statistics over the real tokens.
- `micro_batches`: a minibatch's rows in chunks for gradient accumulation. Every loss and statistic above that
  averages over a minibatch takes the minibatch's `BatchTotals` (`pgcli.ops.aggregate.batch_totals`) and then returns a
  chunk's share of it: the shares of the chunks sum to the minibatch's value, so the accumulated gradient is the
  minibatch's (up to float32 summation order).
- `kl_penalized_rewards` and `token_gae`: the per-token reward of RLHF (Ziegler et al., 2019; Ouyang et al., 2022),
  r_t = -beta (log pi(y_t) - log pi_ref(y_t)) + [t = last] R, and GAE over the tokens of each completion
  (gamma, lambda) with a value head, for PPO.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from pgcli.ops.advantages import gae
from pgcli.ops.aggregate import LOSS_AGGREGATIONS, BatchTotals
from pgcli.ops.grpo import clip_fractions, group_normalized_advantages, grpo_clipped_objective


def _check_sequence_batch(rewards: Tensor, group_ids: Tensor) -> int:
    """Validate [B] rewards and [B] group ids (every group of 0..M-1 non-empty) and return M."""
    if rewards.ndim != 1 or not rewards.is_floating_point() or rewards.shape[0] == 0:
        raise ValueError(f"rewards must be a non-empty float [B] tensor (got {rewards.dtype} {tuple(rewards.shape)})")
    if group_ids.shape != rewards.shape or group_ids.dtype != torch.long:
        raise ValueError(
            f"group_ids must be a torch.long tensor of shape [B] = {tuple(rewards.shape)} "
            f"(got {group_ids.dtype} {tuple(group_ids.shape)})"
        )
    if group_ids.min() < 0:
        raise ValueError(f"group_ids must be >= 0 (got min {int(group_ids.min())})")
    n_groups = int(group_ids.max()) + 1
    missing = (torch.bincount(group_ids, minlength=n_groups) == 0).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"group_ids must cover 0..{n_groups - 1} without gaps (no completion in groups {missing})")
    return n_groups


def _check_token_batch(mask: Tensor, **tensors: Tensor) -> None:
    """Validate a [B, C] float prefix mask (at least one real token per row) and tensors of its shape."""
    if mask.ndim != 2 or not mask.is_floating_point():
        raise ValueError(f"mask must be a float [B, C] tensor (got {mask.dtype} {tuple(mask.shape)})")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} must have the shape of mask {tuple(mask.shape)} (got {tuple(tensor.shape)})")
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError("mask must hold only 0.0 and 1.0")
    if mask.shape[1] == 0 or (mask[:, 0] == 0).any() or (mask[:, 1:] > mask[:, :-1]).any():
        raise ValueError("mask must be a prefix mask: each completion's tokens first (at least one), then padding")


class SequenceAdvantages(NamedTuple):
    """One advantage per completion and which groups carry no signal."""

    advantages: Tensor
    """[B] advantage of each completion; 0.0 for every member of a zero-variance group."""
    zero_variance: Tensor
    """[M] bool: all the group's rewards are equal."""


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Groups whose completions all got the same reward: their group-relative advantages are all zero.

    Args:
        rewards: [B] reward of each completion.
        group_ids: [B] long, the group (prompt) of each completion, values 0..M-1, every group non-empty.

    Returns:
        [M] bool.

    Raises:
        ValueError: on a bad layout.
    """
    n_groups = _check_sequence_batch(rewards, group_ids)
    high = rewards.new_full((n_groups,), -torch.inf).scatter_reduce(0, group_ids, rewards, reduce="amax")
    low = rewards.new_full((n_groups,), torch.inf).scatter_reduce(0, group_ids, rewards, reduce="amin")
    return high == low


def group_advantages(rewards: Tensor, group_ids: Tensor, *, scale: str, eps: float = 1e-4) -> SequenceAdvantages:
    """GRPO outcome advantages: reward minus the group mean, divided by the group std + eps ("group"), the batch
    std + eps ("batch") or nothing ("none", Dr. GRPO). Population stds; a zero-variance group gets exactly 0.0.

    This is `pgcli.ops.grpo.group_normalized_advantages(mode="outcome")` with each completion a one-step episode.

    Args:
        rewards: [B] reward of each completion.
        group_ids: [B] long group (prompt) of each completion, 0..M-1.
        scale: "group", "batch" or "none".
        eps: >= 0, added to the std before dividing.

    Returns:
        `SequenceAdvantages` (advantages [B], zero_variance [M]).

    Raises:
        ValueError: on a bad layout, scale or eps.
    """
    _check_sequence_batch(rewards, group_ids)
    out = group_normalized_advantages(
        rewards[:, None], torch.ones_like(rewards[:, None]), group_ids, mode="outcome", scale=scale, eps=eps
    )
    return SequenceAdvantages(out.advantages[:, 0], out.degenerate)


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> SequenceAdvantages:
    """REINFORCE leave-one-out: A_i = R_i - mean of the other members' rewards = G / (G - 1) * (R_i - mean_g R).

    Groups may differ in size G_g; each needs at least two members.

    Args:
        rewards: [B] reward of each completion.
        group_ids: [B] long group (prompt) of each completion, 0..M-1.

    Returns:
        `SequenceAdvantages` (advantages [B], zero_variance [M]).

    Raises:
        ValueError: on a bad layout or a group of one.
    """
    n_groups = _check_sequence_batch(rewards, group_ids)
    sizes = torch.bincount(group_ids, minlength=n_groups).to(rewards.dtype)  # [M]
    if (sizes < 2).any():
        raise ValueError(f"RLOO needs at least 2 completions per group (group sizes {sizes.long().tolist()})")
    sums = rewards.new_zeros(n_groups).index_add_(0, group_ids, rewards)  # [M]
    others = (sums[group_ids] - rewards) / (sizes[group_ids] - 1.0)  # [B]
    zero_variance = zero_variance_groups(rewards, group_ids)
    advantages = torch.where(zero_variance[group_ids], 0.0, rewards - others)
    return SequenceAdvantages(advantages, zero_variance)


def batch_mean_advantages(rewards: Tensor, group_ids: Tensor) -> SequenceAdvantages:
    """REINFORCE with the batch-mean baseline: A_i = R_i - mean_batch R (groups only feed `zero_variance`).

    Args:
        rewards: [B] reward of each completion.
        group_ids: [B] long group (prompt) of each completion, 0..M-1.

    Returns:
        `SequenceAdvantages` (advantages [B], zero_variance [M]); the advantages of a zero-variance group are not
        zeroed (the baseline is not the group's), dropping such groups is the caller's choice.

    Raises:
        ValueError: on a bad layout.
    """
    _check_sequence_batch(rewards, group_ids)
    return SequenceAdvantages(rewards - rewards.mean(), zero_variance_groups(rewards, group_ids))


def token_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Broadcast one advantage per completion [B] to each of its tokens: [B, C], 0.0 on padding."""
    if advantages.ndim != 1 or mask.ndim != 2 or advantages.shape[0] != mask.shape[0]:
        raise ValueError(f"need advantages [B] and mask [B, C] (got {tuple(advantages.shape)}, {tuple(mask.shape)})")
    return advantages[:, None] * mask


def truncated_completions(tokens: Tensor, mask: Tensor, *, eos_id: int | Sequence[int]) -> Tensor:
    """[B] bool: the completion hit the length limit without EOS (its last real token is not `eos_id`, or none of
    several stop tokens: a Hugging Face tokenizer also ends a completion at a newline).

    Args:
        tokens: [B, C] long sampled tokens.
        mask: [B, C] float prefix mask of real tokens (EOS included).
        eos_id: the end-of-sequence token (or the stop tokens).

    Raises:
        ValueError: on shapes or a bad mask.
    """
    _check_token_batch(mask)
    if tokens.shape != mask.shape:
        raise ValueError(f"tokens must have the shape of mask {tuple(mask.shape)} (got {tuple(tokens.shape)})")
    last = tokens.gather(1, mask.sum(1).long()[:, None] - 1)[:, 0]  # [B]
    return ~torch.isin(last, torch.as_tensor(eos_id, device=tokens.device).reshape(-1))


def kl_shaped_rewards(scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, *, beta: float) -> Tensor:
    """R_i - beta * sum_t (log pi(o_{i,t}) - log pi_ref(o_{i,t})) over the real tokens: the sequence-level k1 KL
    folded into each completion's reward, the sum over its tokens of `kl_penalized_rewards` (RLOO: Ahmadian et al.,
    2024; TRL's RLOOTrainer, with logp of the sampling policy). Arguments and errors as `kl_penalized_rewards`.

    Returns:
        [B] shaped rewards.
    """
    return kl_penalized_rewards(scores, logp, ref_logp, mask, beta=beta).sum(1)


REINFORCE_PP_BASELINES: tuple[str, ...] = ("none", "group")
"""Values of `baseline` accepted by `reinforce_pp_advantages`."""


def reinforce_pp_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    logp: Tensor,
    ref_logp: Tensor | None,
    mask: Tensor,
    *,
    beta: float,
    gamma: float = 1.0,
    baseline: str = "none",
    eps: float = 1e-8,
) -> Tensor:
    """REINFORCE++ token advantages (Hu et al., 2025): the return-to-go of the KL-shaped token rewards
    rho_{i,t} = -beta (logp - ref_logp)_{i,t} + [t = |o_i|] R'_i, so with gamma = 1
    A_{i,t} = R'_i - beta sum_{t' >= t} (logp - ref_logp)_{i,t'}, whitened over all real tokens of the batch
    (`masked_whiten`). R'_i = R_i ("none"), or R_i - mean_{j in g} R_j ("group": REINFORCE++-baseline).

    Args:
        rewards: [B] task reward of each completion.
        group_ids: [B] long group (prompt) of each completion, 0..M-1.
        logp: [B, C] log pi of the sampled tokens under the sampling policy.
        ref_logp: [B, C] log pi_ref of the same tokens, or None for no KL penalty (beta = 0).
        mask: [B, C] float prefix mask of real tokens.
        beta: >= 0, KL-penalty coefficient.
        gamma: discount over the tokens, in [0, 1].
        baseline: one of `REINFORCE_PP_BASELINES`.
        eps: added to the std of the whitening.

    Returns:
        [B, C] advantages, 0.0 on padding.

    Raises:
        ValueError: on a bad layout, shapes, baseline, beta or gamma.
    """
    n_groups = _check_sequence_batch(rewards, group_ids)
    if baseline not in REINFORCE_PP_BASELINES:
        raise ValueError(f"baseline must be one of {REINFORCE_PP_BASELINES} (got {baseline!r})")
    if baseline == "group":
        sums = rewards.new_zeros(n_groups).index_add_(0, group_ids, rewards)  # [M]
        rewards = rewards - (sums / torch.bincount(group_ids, minlength=n_groups))[group_ids]
    token_rewards = kl_penalized_rewards(rewards, logp, logp if ref_logp is None else ref_logp, mask, beta=beta)
    returns, _ = token_gae(token_rewards, torch.zeros_like(mask), mask, gamma=gamma, lam=1.0)  # no value: returns
    return masked_whiten(returns, mask, eps=eps)


class PolicyLoss(NamedTuple):
    """`clipped_policy_loss`'s result."""

    loss: Tensor
    """0-dim: the aggregated negated clipped surrogate (to minimise)."""
    clip_fraction: float
    """Fraction of real tokens where the clip is active (low bound with A < 0 or high bound with A > 0)."""
    clip_fraction_low: float
    """Fraction of real tokens clipped at 1 - epsilon with a negative advantage."""
    clip_fraction_high: float
    """Fraction of real tokens clipped at 1 + epsilon_high with a positive advantage."""


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    low: float,
    high: float,
    loss_agg: str,
    max_len: int,
    totals: BatchTotals | None = None,
    sequence: bool = False,
) -> PolicyLoss:
    """-min(r A, clip(r, low, high) A) per token with r = exp(logp - old_logp), aggregated by `loss_agg`.

    With `sequence`, GSPO (Zheng et al., 2025): -min(s_i A_i, clip(s_i, low, high) A_i) on every token of completion
    i, with the sequence ratio s_i = (pi_theta(o_i|q) / pi_old(o_i|q))^(1/|o_i|) = exp(mean_t (logp - old_logp)) in
    place of r ("seq_mean" gives the paper's (1/B) sum_i); the clip fraction counts the tokens of clipped completions.

    Args:
        logp: [B, C] log pi_theta of the sampled tokens (differentiable).
        old_logp: [B, C] log pi_old of the same tokens (the sampling policy; no gradient).
        advantages: [B, C] per-token advantages; with `sequence`, one value per completion on its real tokens
            (`token_advantages`).
        mask: [B, C] float prefix mask of real tokens.
        low: lower ratio bound (1 - epsilon, from `pgcli.ops.grpo.clip_bounds`).
        high: upper ratio bound (1 + epsilon_high).
        loss_agg: "seq_mean" (GRPO), "token_mean" (DAPO) or "constant" (Dr. GRPO: sum / (B * max_len)).
        max_len: the longest possible completion, >= C (the constant normaliser).
        totals: the minibatch these rows are a chunk of (None: they are the minibatch): the loss and the clip
            fractions are then the chunk's shares of the minibatch's.
        sequence: GSPO's sequence ratio instead of the token ratio.

    Returns:
        `PolicyLoss`.

    Raises:
        ValueError: on shapes, bounds, mask, an unknown `loss_agg` or, with `sequence`, advantages that vary within a
            completion.
    """
    _check_token_batch(mask, logp=logp, old_logp=old_logp, advantages=advantages)
    _check_loss_agg(loss_agg)
    real = mask.bool()
    if sequence:
        if (torch.where(real, advantages - advantages[:, :1], 0.0) != 0).any():
            raise ValueError("advantages must hold one value per completion (see token_advantages)")
        log_ratio = torch.where(real, logp - old_logp.detach(), 0.0).sum(1) / mask.sum(1)  # [B]: mean over real tokens
        ratio = torch.exp(log_ratio)[:, None].expand_as(mask)  # [B, C]: s_i on every token of completion i
    else:
        ratio = torch.exp(torch.where(real, logp - old_logp.detach(), 0.0))  # [B, C]; 1.0 on padding
    objective = grpo_clipped_objective(ratio, advantages, low, high)
    loss = LOSS_AGGREGATIONS[loss_agg](-objective, mask, max_len=max_len, totals=totals)
    frac_low, frac_high = clip_fractions(ratio.detach(), advantages, low, high, mask, totals=totals)
    return PolicyLoss(loss, frac_low + frac_high, frac_low, frac_high)


sequence_clipped_policy_loss = functools.partial(clipped_policy_loss, sequence=True)
"""GSPO's clipped surrogate: `clipped_policy_loss` with the sequence ratio."""


def _check_loss_agg(loss_agg: str) -> None:
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_agg must be one of {tuple(LOSS_AGGREGATIONS)} (got {loss_agg!r})")


def masked_mean(values: Tensor, mask: Tensor, *, totals: BatchTotals | None = None) -> Tensor:
    """Mean of `values` [B, C] over the real tokens of `mask` [B, C] (at least one): a 0-dim tensor. With `totals`
    (the minibatch these rows are a chunk of), the sum over the chunk's real tokens / the minibatch's: its share of
    the minibatch's mean."""
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have one shape")
    n_real: Tensor | int = mask.sum()
    if totals is not None:
        if totals.n_rows < mask.shape[0] or totals.n_real < n_real:
            raise ValueError(f"totals {tuple(totals)} must cover the chunk's {mask.shape[0]} rows and real tokens")
        n_real = totals.n_real
    if n_real == 0:
        raise ValueError("masked_mean: mask has no real token")
    return torch.where(mask.bool(), values, 0.0).sum() / n_real


def micro_batches(rows: Tensor, size: int) -> tuple[Tensor, ...]:
    """The row indices `rows` [B'] of a minibatch in chunks of at most `size` (0: one chunk, `rows` itself), in order.

    Raises:
        ValueError: on a negative size.
    """
    if size < 0:
        raise ValueError(f"micro-batch size must be >= 0 (got {size})")
    return (rows,) if size == 0 else rows.split(size)


def masked_whiten(
    values: Tensor, mask: Tensor, eps: float = 1e-8, *, total: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """(values - mean) / (std + eps) over the entries where `mask` [B, C] is 1.0 (population std); 0.0 elsewhere.

    PPO's advantage normalisation over a batch of completions' tokens (TRL's `whiten`, without re-adding the mean).
    `total` sums a tensor over the shares of a batch split across processes
    (`pgcli.hardware.distributed.all_sum`), so that the mean and std are the whole batch's (None: `values` is it).
    """
    if total is None:
        total = _own
    real = mask.bool()
    n_real = total(mask.sum())
    if n_real == 0:
        raise ValueError("masked_whiten: mask has no real token")
    mean = total(torch.where(real, values, 0.0).sum()) / n_real
    std = (total(torch.where(real, (values - mean) ** 2, 0.0).sum()) / n_real).sqrt()
    return torch.where(real, (values - mean) / (std + eps), 0.0)


def _own(tensor: Tensor) -> Tensor:
    """A batch's sum when it is all in this process: the sum itself."""
    return tensor


def last_token_mask(mask: Tensor) -> Tensor:
    """[B, C] float: 1.0 on each completion's last real token (its EOS, or the last token of a cut-off one)."""
    _check_token_batch(mask)
    lengths = mask.sum(1).long()  # [B]
    last = torch.zeros_like(mask)
    last[torch.arange(mask.shape[0], device=mask.device), lengths - 1] = 1.0
    return last


def kl_penalized_rewards(scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, *, beta: float) -> Tensor:
    """Per-token reward of RLHF: r_t = -beta * (log pi(y_t) - log pi_ref(y_t)), plus the task's score R on the
    completion's last real token (Ziegler et al., 2019; Ouyang et al., 2022). 0.0 on padding.

    Args:
        scores: [B] task reward of each completion.
        logp: [B, C] log pi of the sampled tokens under the sampling policy.
        ref_logp: [B, C] log pi_ref of the same tokens.
        mask: [B, C] float prefix mask of real tokens.
        beta: >= 0, KL-penalty coefficient.

    Returns:
        [B, C] rewards.

    Raises:
        ValueError: on shapes, a bad mask or beta < 0.
    """
    _check_token_batch(mask, logp=logp, ref_logp=ref_logp)
    if scores.shape != mask.shape[:1]:
        raise ValueError(f"scores must be [B] = {tuple(mask.shape[:1])} (got {tuple(scores.shape)})")
    if beta < 0:
        raise ValueError(f"beta must be >= 0 (got {beta})")
    penalty = -beta * torch.where(mask.bool(), logp - ref_logp, 0.0)  # [B, C]
    return penalty + scores[:, None] * last_token_mask(mask)


def token_gae(rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over the tokens of each completion: the episode ends (terminates) at its last real token, so
    delta_t = r_t + gamma V_{t+1} - V_t inside, delta_last = r_last - V_last, A_t = delta_t + gamma lam A_{t+1}.

    The state before token t is the prompt plus tokens < t, V_t its value; this is `pgcli.ops.advantages.gae` on
    the transposed [C, B] layout, every completion terminated at its last token.

    Args:
        rewards: [B, C] per-token rewards (e.g. `kl_penalized_rewards`).
        values: [B, C] value-head estimates V_t.
        mask: [B, C] float prefix mask of real tokens.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        (advantages, returns), both [B, C], 0.0 on padding; returns = advantages + values (value targets).

    Raises:
        ValueError: on shapes, a bad mask, gamma or lam.
    """
    _check_token_batch(mask, rewards=rewards, values=values)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1] (got {gamma}, {lam})")
    real = mask.bool()
    rewards = torch.where(real, rewards, 0.0)
    values = torch.where(real, values.detach(), 0.0)
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)  # [B, C]
    # a completion ends at its last real token; padding is cut off as well so nothing flows back from it
    ended = last_token_mask(mask) + (1.0 - mask)  # [B, C]
    adv, _ = gae(rewards.T, values.T, next_values.T, ended.T, ended.T, gamma=gamma, lam=lam)  # [C, B]
    adv = torch.where(real, adv.T, 0.0)
    return adv, torch.where(real, adv + values, 0.0)
