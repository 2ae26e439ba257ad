"""pgcli.ops.lm against hand-computed values on tiny batches of completions."""

from __future__ import annotations

import math

import pytest
import torch

from pgcli.ops.aggregate import BatchTotals, batch_totals
from pgcli.ops.grpo import clip_bounds, k3_kl
from pgcli.ops.lm import (
    batch_mean_advantages,
    clipped_policy_loss,
    group_advantages,
    kl_penalized_rewards,
    kl_shaped_rewards,
    last_token_mask,
    masked_mean,
    masked_whiten,
    micro_batches,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_clipped_policy_loss,
    token_advantages,
    token_gae,
    truncated_completions,
    zero_variance_groups,
)

T = torch.tensor


def test_group_advantages_mean_and_std_and_mean_only():
    # group 0: rewards 1, 0 (mean .5, population std .5); group 1: 1, 1 (zero variance)
    rewards, groups = T([1.0, 0.0, 1.0, 1.0]), T([0, 0, 1, 1])
    out = group_advantages(rewards, groups, scale="group", eps=0.0)
    assert torch.equal(out.advantages, T([1.0, -1.0, 0.0, 0.0]))
    assert out.zero_variance.tolist() == [False, True]
    mean_only = group_advantages(rewards, groups, scale="none")
    assert torch.equal(mean_only.advantages, T([0.5, -0.5, 0.0, 0.0]))


def test_group_advantages_three_members_with_eps():
    # rewards 3, 0, 0: mean 1, population std sqrt(2)
    out = group_advantages(T([3.0, 0.0, 0.0]), T([0, 0, 0]), scale="group", eps=1e-4)
    std = math.sqrt(2.0)
    assert torch.allclose(out.advantages, T([2.0, -1.0, -1.0]) / (std + 1e-4))


def test_rloo_leaves_each_member_out_of_its_baseline():
    rewards, groups = T([1.0, 0.0, 0.0, 2.0, 2.0, 2.0]), T([0, 0, 0, 1, 1, 1])
    out = rloo_advantages(rewards, groups)
    # 1 - (0 + 0) / 2 = 1; 0 - (1 + 0) / 2 = -0.5; group 1 has no variance
    assert torch.allclose(out.advantages, T([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    assert out.zero_variance.tolist() == [False, True]
    # equals G / (G - 1) * (R - mean_g R)
    assert torch.allclose(out.advantages[:3], 1.5 * (rewards[:3] - rewards[:3].mean()))


def test_rloo_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(T([1.0, 0.0, 1.0]), T([0, 0, 1]))


def test_batch_mean_baseline_ignores_groups():
    out = batch_mean_advantages(T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 1, 1]))
    assert torch.equal(out.advantages, T([0.5, -0.5, -0.5, 0.5]))
    assert out.zero_variance.tolist() == [False, False]


def test_zero_variance_groups_mask():
    groups = T([0, 0, 1, 1, 2, 2])
    assert zero_variance_groups(T([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), groups).tolist() == [True, False, True]


def test_layout_errors():
    with pytest.raises(ValueError, match="without gaps"):
        group_advantages(T([1.0, 0.0]), T([0, 2]), scale="group")
    with pytest.raises(ValueError, match="group_ids"):
        zero_variance_groups(T([1.0, 0.0]), T([0.0, 1.0]))
    with pytest.raises(ValueError, match="prefix mask"):
        last_token_mask(T([[0.0, 1.0]]))


def test_token_advantages_broadcast_and_zero_padding():
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.equal(token_advantages(T([2.0, -1.0]), mask), T([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


# completion 0: 2 tokens with A = +1; completion 1: 1 token with A = -1; C = 3, max_len = 4
MASK = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = T([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("loss_agg", "expected"),
    [
        ("token_mean", (-1.0 - 1.0 + 1.0) / 3),  # every real token weighs the same
        ("seq_mean", ((-1.0 - 1.0) / 2 + 1.0) / 2),  # per-completion mean, then mean: 0
        ("constant", (-1.0 - 1.0 + 1.0) / (2 * 4)),  # Dr. GRPO: sum / (B * max_len)
    ],
)
def test_loss_aggregations_at_ratio_one(loss_agg, expected):
    logp = T([[-1.0, -2.0, 5.0], [-0.5, 7.0, 7.0]])  # padding holds garbage
    out = clipped_policy_loss(logp, logp.clone(), ADV, MASK, low=0.8, high=1.2, loss_agg=loss_agg, max_len=4)
    assert out.loss.item() == pytest.approx(expected)
    assert out.clip_fraction == 0.0


def test_clipped_surrogate_with_epsilon_high_and_clip_fraction():
    low, high = clip_bounds(0.2, 0.28)
    old = torch.zeros(2, 3)
    # ratios: token (0,0) 1.5 with A > 0 -> clipped at 1.28; (0,1) 0.5 with A > 0 -> unclipped (min picks r A);
    # (1,0) 0.5 with A < 0 -> clipped at 0.8
    logp = T([[math.log(1.5), math.log(0.5), 0.0], [math.log(0.5), 0.0, 0.0]]).requires_grad_()
    out = clipped_policy_loss(logp, old, ADV, MASK, low=low, high=high, loss_agg="token_mean", max_len=3)
    assert out.loss.item() == pytest.approx(-(1.28 + 0.5 - 0.8) / 3)
    assert out.clip_fraction == pytest.approx(2 / 3)
    assert (out.clip_fraction_low, out.clip_fraction_high) == pytest.approx((1 / 3, 1 / 3))
    out.loss.backward()
    assert logp.grad is not None
    # clipped tokens and padding get no gradient; (0,1): d/dlogp of -(r A)/3 = -r/3 = -0.5/3
    assert logp.grad[0, 0] == 0.0 and logp.grad[1, 0] == 0.0 and logp.grad[0, 2] == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-0.5 / 3)


def test_clipped_policy_loss_rejects_unknown_aggregation():
    with pytest.raises(ValueError, match="loss_agg"):
        clipped_policy_loss(ADV, ADV, ADV, MASK, low=0.8, high=1.2, loss_agg="sum", max_len=3)


def test_per_token_k3_kl_and_masked_mean():
    logp = torch.log(T([[0.5, 0.5], [0.25, 0.1]]))
    ref = torch.log(T([[0.25, 0.5], [0.25, 0.3]]))
    kl = k3_kl(logp, ref)
    # x = log(ref / p): exp(x) - x - 1; 0.25 / 0.5 -> 0.5 + ln 2 - 1
    assert kl[0, 0].item() == pytest.approx(0.5 + math.log(2.0) - 1.0)
    assert kl[0, 1].item() == 0.0
    assert kl[1, 1].item() == pytest.approx(3.0 - math.log(3.0) - 1.0, rel=1e-5)
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    assert masked_mean(kl, mask).item() == pytest.approx((0.5 + math.log(2.0) - 1.0) / 3)


def test_last_token_mask():
    assert torch.equal(last_token_mask(T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])), T([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def test_kl_penalized_rewards():
    logp = T([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    ref = T([[-1.5, -1.0, 3.0], [-0.5, 3.0, 3.0]])
    rewards = kl_penalized_rewards(T([1.0, 0.0]), logp, ref, MASK, beta=0.1)
    # -0.1 * (logp - ref) on each real token, the score added on the last one
    assert torch.allclose(rewards, T([[-0.05, 0.1 + 1.0, 0.0], [0.05, 0.0, 0.0]]))


def test_token_gae_by_hand():
    rewards = T([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    values = T([[0.5, 0.8, 9.0], [1.0, 1.0, 1.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = token_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # row 0 ends at t=1: delta_1 = 1 - 0.8 = 0.2 (no bootstrap from the padding's 9.0);
    # delta_0 = 0 + 0.9 * 0.8 - 0.5 = 0.22; A_0 = 0.22 + 0.9 * 0.5 * 0.2 = 0.31
    # row 1: delta = (0 + 0.9 - 1, 0 + 0.9 - 1, 2 - 1) = (-0.1, -0.1, 1);
    # A_2 = 1, A_1 = -0.1 + 0.45, A_0 = -0.1 + 0.45 A_1
    a1 = -0.1 + 0.45 * 1.0
    assert torch.allclose(adv, T([[0.31, 0.2, 0.0], [-0.1 + 0.45 * a1, a1, 1.0]]))
    assert torch.allclose(ret, T([[0.81, 1.0, 0.0], [1.0 - 0.1 + 0.45 * a1, 1.0 + a1, 2.0]]))


def test_token_gae_lambda_one_is_return_minus_value():
    rewards, values, mask = T([[0.5, -0.1, 2.0]]), T([[1.0, 0.3, 0.7]]), torch.ones(1, 3)
    adv, _ = token_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, T([[2.4 - 1.0, 1.9 - 0.3, 2.0 - 0.7]]))


def test_masked_whiten_uses_only_the_real_tokens():
    values = T([[1.0, 3.0, 100.0], [2.0, -50.0, -50.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # real: 1, 3, 2 -> mean 2, population std sqrt(2/3)
    std = math.sqrt(2.0 / 3.0)
    expected = T([[-1.0 / std, 1.0 / std, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(masked_whiten(values, mask), expected, atol=1e-6)


# --- a 2-prompt batch: G = 2 completions of each, C = 2 tokens ------------------------------------------------------
GROUPS2 = T([0, 0, 1, 1])
MASK2 = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
REWARDS2 = T([1.0, 0.0, 1.0, 1.0])
LOGP2 = T([[-1.0, -2.0], [-0.5, 9.0], [-1.0, -1.0], [-2.0, -0.3]])  # padding holds garbage
REF2 = LOGP2 - T([[0.5, -0.5], [1.0, 9.0], [0.0, 0.2], [0.1, 0.0]])  # log pi - log pi_ref = k1 per token


def test_kl_shaped_rewards_subtract_the_sequence_k1_kl():
    # R - 0.1 * sum_t k1: 1 - 0.1 * 0, 0 - 0.1 * 1, 1 - 0.1 * 0.2, 1 - 0.1 * 0.1
    shaped = kl_shaped_rewards(REWARDS2, LOGP2, REF2, MASK2, beta=0.1)
    assert torch.allclose(shaped, T([1.0, -0.1, 0.98, 0.99]))
    # RLOO on the shaped rewards: the KL separates the completions of prompt 1, whose task rewards tie
    assert torch.allclose(rloo_advantages(shaped, GROUPS2).advantages, T([1.1, -1.1, -0.01, 0.01]))
    assert torch.equal(kl_shaped_rewards(REWARDS2, LOGP2, REF2, MASK2, beta=0.0), REWARDS2)


def whitened(values: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the real entries (population std), 0.0 on padding: the expected REINFORCE++ output."""
    real = [v for row, m in zip(values, mask.tolist(), strict=True) for v, k in zip(row, m, strict=True) if k]
    mean = sum(real) / len(real)
    std = math.sqrt(sum((v - mean) ** 2 for v in real) / len(real))
    return T(
        [
            [(v - mean) / std if k else 0.0 for v, k in zip(row, m, strict=True)]
            for row, m in zip(values, mask.tolist(), strict=True)
        ]
    )


@pytest.mark.parametrize(
    ("baseline", "raw"),
    [
        # A_t = R' - 0.1 * sum_{t' >= t} k1_{t'}; R' = R
        ("none", [[1.0, 1.05], [-0.1, 0.0], [0.98, 0.98], [0.99, 1.0]]),
        # R' = R - mean_g R: (0.5, -0.5) and (0, 0)
        ("group", [[0.5, 0.55], [-0.6, 0.0], [-0.02, -0.02], [-0.01, 0.0]]),
    ],
)
def test_reinforce_pp_advantages_by_hand(baseline, raw):
    adv = reinforce_pp_advantages(REWARDS2, GROUPS2, LOGP2, REF2, MASK2, beta=0.1, baseline=baseline, eps=0.0)
    assert torch.allclose(adv, whitened(raw, MASK2), atol=1e-5)


def test_reinforce_pp_discounts_the_token_returns_and_needs_no_reference_without_kl():
    # beta = 0, gamma = 0.5: the reward sits on the last token, so A_0 = 0.5 R on two-token completions
    adv = reinforce_pp_advantages(REWARDS2, GROUPS2, LOGP2, None, MASK2, beta=0.0, gamma=0.5, eps=0.0)
    assert torch.allclose(adv, whitened([[0.5, 1.0], [0.0, 0.0], [0.5, 1.0], [0.5, 1.0]], MASK2), atol=1e-6)
    with pytest.raises(ValueError, match="baseline must be one of"):
        reinforce_pp_advantages(REWARDS2, GROUPS2, LOGP2, None, MASK2, beta=0.0, baseline="mean")


def test_truncated_completions_are_those_without_eos_at_the_end():
    eos = 2
    tokens = T([[5, 2], [2, 0], [5, 6], [6, 0]])  # EOS last; EOS alone; cut at C; cut at a shorter limit
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    assert truncated_completions(tokens, mask, eos_id=eos).tolist() == [False, False, True, True]
    with pytest.raises(ValueError, match="tokens must have the shape of mask"):
        truncated_completions(tokens[:, :1], mask, eos_id=eos)


def test_gspo_sequence_ratio_is_clipped_per_completion():
    low, high = 0.8, 1.2
    # log-ratios per token: row 0 (0.1, 0.3) -> s = e^0.2 = 1.2214 > 1.2 with A > 0: clipped at 1.2;
    # row 1 (-0.4) -> s = e^-0.4 = 0.6703 < 0.8 with A < 0: clipped at 0.8;
    # row 2 (0.1, -0.1) -> s = 1 with A > 0: unclipped
    old = torch.zeros(3, 2)
    logp = T([[0.1, 0.3], [-0.4, 5.0], [0.1, -0.1]]).requires_grad_()
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    adv = token_advantages(T([1.0, -1.0, 2.0]), mask)
    out = sequence_clipped_policy_loss(logp, old, adv, mask, low=low, high=high, loss_agg="seq_mean", max_len=2)
    assert out.loss.item() == pytest.approx(-(1.2 - 0.8 + 2.0) / 3)
    assert (out.clip_fraction_low, out.clip_fraction_high) == pytest.approx((1 / 5, 2 / 5))  # tokens of rows 1, 0
    out.loss.backward()
    assert logp.grad is not None
    # clipped completions get no gradient; row 2: d/dlogp_t of -(1/3) s A with s = exp(mean_t logp_t): -(1/3) 2 / 2
    assert torch.equal(logp.grad[:2], torch.zeros(2, 2))
    assert torch.allclose(logp.grad[2], T([-1.0 / 3, -1.0 / 3]))


def test_gspo_equals_the_token_loss_on_one_token_completions_and_wants_one_advantage_per_completion():
    logp, old = T([[0.3], [-0.1], [0.05], [-0.4]]), torch.zeros(4, 1)
    adv, mask = T([[1.0], [-1.0], [0.5], [2.0]]), torch.ones(4, 1)
    kwargs = {"low": 0.9, "high": 1.1, "loss_agg": "token_mean", "max_len": 1}
    token = clipped_policy_loss(logp, old, adv, mask, **kwargs)
    sequence = sequence_clipped_policy_loss(logp, old, adv, mask, **kwargs)
    assert sequence.loss.item() == pytest.approx(token.loss.item())
    assert sequence.clip_fraction == token.clip_fraction
    with pytest.raises(ValueError, match="one value per completion"):
        sequence_clipped_policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), T([[1.0, 2.0]]), torch.ones(1, 2), **kwargs | {"max_len": 2}
        )


def ragged_batch():
    """8 completions of up to 5 tokens (lengths 1 to 5), a drifted policy and per-completion advantages."""
    gen = torch.Generator().manual_seed(0)
    lengths = T([5, 1, 3, 4, 2, 5, 1, 3])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()  # [8, 5]
    old = -torch.rand(8, 5, generator=gen)
    logp = old + 0.3 * torch.randn(8, 5, generator=gen)
    adv = token_advantages(torch.randn(8, generator=gen), mask)
    return logp, old, adv, mask


@pytest.mark.parametrize("loss", [clipped_policy_loss, sequence_clipped_policy_loss])
@pytest.mark.parametrize("loss_agg", ["seq_mean", "token_mean", "constant"])
def test_micro_batch_shares_sum_to_the_minibatch_loss_and_gradient(loss, loss_agg):
    # chunks of 3, 3 and 2 rows with the minibatch's totals: their losses, clip fractions and gradients add up to
    # the whole minibatch's (gradient accumulation over micro-batches)
    logp, old, adv, mask = ragged_batch()
    kwargs = {"low": 0.8, "high": 1.2, "loss_agg": loss_agg, "max_len": 6}
    whole_logp = logp.clone().requires_grad_()
    whole = loss(whole_logp, old, adv, mask, **kwargs)
    whole.loss.backward()
    assert 0 < whole.clip_fraction < 1  # the clip is active on some tokens
    totals = batch_totals(mask)
    assert totals == BatchTotals(n_rows=8, n_real=24)
    chunked_logp = logp.clone().requires_grad_()
    parts = [
        loss(chunked_logp[rows], old[rows], adv[rows], mask[rows], **kwargs, totals=totals)
        for rows in micro_batches(torch.arange(8), 3)
    ]
    sum(part.loss for part in parts).backward()
    assert sum(part.loss.item() for part in parts) == pytest.approx(whole.loss.item(), rel=1e-6)
    for key in ("clip_fraction", "clip_fraction_low", "clip_fraction_high"):
        assert sum(getattr(part, key) for part in parts) == pytest.approx(getattr(whole, key))
    assert torch.allclose(chunked_logp.grad, whole_logp.grad, atol=1e-7)


def test_masked_mean_shares_sum_to_the_mean_and_totals_must_cover_the_chunk():
    logp, _, _, mask = ragged_batch()
    totals = batch_totals(mask)
    shares = [masked_mean(logp[rows], mask[rows], totals=totals) for rows in micro_batches(torch.arange(8), 3)]
    assert sum(shares).item() == pytest.approx(masked_mean(logp, mask).item(), rel=1e-6)
    with pytest.raises(ValueError, match="must cover"):
        masked_mean(logp, mask, totals=BatchTotals(n_rows=8, n_real=10))
    with pytest.raises(ValueError, match="must cover"):
        clipped_policy_loss(
            logp,
            logp,
            logp,
            mask,
            low=0.8,
            high=1.2,
            loss_agg="token_mean",
            max_len=5,
            totals=BatchTotals(n_rows=4, n_real=24),
        )


def test_micro_batches_split_the_rows_in_order():
    rows = T([7, 2, 5, 0, 1, 4, 3, 6])
    assert [c.tolist() for c in micro_batches(rows, 3)] == [[7, 2, 5], [0, 1, 4], [3, 6]]
    (whole,) = micro_batches(rows, 0)
    assert whole is rows
    with pytest.raises(ValueError, match=">= 0"):
        micro_batches(rows, -1)
