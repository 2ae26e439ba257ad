"""GRPO math (group advantages, k3 KL, asymmetric clip, loss aggregation) against hand-computed numbers."""

import math

import pytest
import torch

from pgcli.ops.aggregate import LOSS_AGGREGATIONS, constant_loss, seq_mean_loss, token_mean_loss
from pgcli.ops.grpo import (
    ADVANTAGE_MODES,
    KL_ESTIMATORS,
    REWARD_SCALES,
    clip_bounds,
    clip_fractions,
    group_normalized_advantages,
    grpo_clipped_objective,
    k1_kl,
    k2_kl,
    k3_kl,
)

NAN = float("nan")  # padding holds garbage; every function must ignore it
EPS = 1e-4
SQRT2 = math.sqrt(2.0)


def prefix_mask(lengths: list[int], max_len: int) -> torch.Tensor:
    return (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]).float()


# --- outcome mode -------------------------------------------------------------------------------------------------
# Two groups of three, interleaved ids, lengths 1..3:
#   ep 0 (g0) [1]           R = 1    ep 1 (g1) [0]          R = 0
#   ep 2 (g0) [0.5, 0.5]    R = 1    ep 3 (g1) [2, 2, 2]    R = 6
#   ep 4 (g0) [1, 1, 2]     R = 4    ep 5 (g1) [3, 3]       R = 6
# g0: mean 2, R - mean = (-1, -1, 2), std = sqrt((1 + 1 + 4) / 3) = sqrt(2)
# g1: mean 4, R - mean = (-4, 2, 2),  std = sqrt((16 + 4 + 4) / 3) = 2 sqrt(2)
# batch: R = {1, 0, 1, 6, 4, 6}, mean 3, squared deviations 4 + 9 + 4 + 9 + 1 + 9 = 36, std = sqrt(36 / 6) = sqrt(6)
OUTCOME_REWARDS = torch.tensor(
    [[1.0, NAN, NAN], [0.0, NAN, NAN], [0.5, 0.5, NAN], [2.0, 2.0, 2.0], [1.0, 1.0, 2.0], [3.0, 3.0, NAN]]
)
OUTCOME_MASK = prefix_mask([1, 1, 2, 3, 3, 2], 3)
OUTCOME_GROUPS = torch.tensor([0, 1, 0, 1, 0, 1])


def outcome_expected(s0: float, s1: float) -> torch.Tensor:
    """Centred returns divided by s0 (group 0) and s1 (group 1), on the real steps."""
    a, b, c, d = -1 / s0, 2 / s0, -4 / s1, 2 / s1
    return torch.tensor([[a, 0, 0], [c, 0, 0], [a, a, 0], [d, d, d], [b, b, b], [d, d, 0]])


@pytest.mark.parametrize(
    ("scale", "s0", "s1"),
    [
        ("group", SQRT2 + EPS, 2 * SQRT2 + EPS),  # g0 advantages -0.70706, 1.41411; g1 -1.41416, 0.70708
        ("batch", math.sqrt(6) + EPS, math.sqrt(6) + EPS),  # group mean, batch std (TRL "batch")
        ("none", 1.0, 1.0),  # Dr. GRPO: R - mean only
    ],
)
def test_outcome_advantages_per_scale(scale, s0, s1):
    out = group_normalized_advantages(OUTCOME_REWARDS, OUTCOME_MASK, OUTCOME_GROUPS, mode="outcome", scale=scale)
    torch.testing.assert_close(out.advantages, outcome_expected(s0, s1))
    assert out.degenerate.tolist() == [False, False]
    torch.testing.assert_close(out.group_return_mean, torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(out.group_return_std, torch.tensor([SQRT2, 2 * SQRT2]))


def test_outcome_group_scale_literal_numbers():
    out = group_normalized_advantages(OUTCOME_REWARDS, OUTCOME_MASK, OUTCOME_GROUPS, mode="outcome", scale="group")
    # -1 / (1.414214 + 0.0001) = -0.707056; 2 / (2.828427 + 0.0001) = 0.707082
    assert out.advantages[0, 0].item() == pytest.approx(-0.707056, abs=1e-6)
    assert out.advantages[3, 2].item() == pytest.approx(0.707082, abs=1e-6)


def test_outcome_discounted_return():
    # gamma = 0.5: R = 1 + 0.5 + 0.25 = 1.75 and R = 1; mean 1.375, R - mean = +-0.375
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, NAN, NAN]])
    out = group_normalized_advantages(
        rewards, prefix_mask([3, 1], 3), torch.tensor([0, 0]), mode="outcome", scale="none", gamma=0.5
    )
    torch.testing.assert_close(out.advantages, torch.tensor([[0.375, 0.375, 0.375], [-0.375, 0.0, 0.0]]))
    torch.testing.assert_close(out.group_return_mean, torch.tensor([1.375]))
    torch.testing.assert_close(out.group_return_std, torch.tensor([0.375]))


def test_population_std_gives_unit_advantages_for_two_members():
    # population std of {0, 2} is 1 (the unbiased std would be sqrt(2)): advantages exactly -1 and +1 with eps = 0
    out = group_normalized_advantages(
        torch.tensor([[0.0], [2.0]]), torch.ones(2, 1), torch.tensor([0, 0]), mode="outcome", scale="group", eps=0.0
    )
    assert out.advantages.flatten().tolist() == [-1.0, 1.0]


# --- process mode -------------------------------------------------------------------------------------------------
# g0: ep 0 [2, 0, 2], ep 1 [0]      step rewards {2, 0, 2, 0}: mean 1, std 1, centred ep 0 [1, -1, 1], ep 1 [-1]
# g1: ep 2 [4],       ep 3 [6, 4, 6] step rewards {4, 6, 4, 6}: mean 5, std 1, centred ep 2 [-1], ep 3 [1, -1, 1]
# reward-to-go (gamma 1) of [1, -1, 1] is [1, 0, 1]; batch: {2, 0, 2, 0, 4, 6, 4, 6}, mean 3, std sqrt(40 / 8)
PROCESS_REWARDS = torch.tensor([[2.0, 0.0, 2.0], [0.0, NAN, NAN], [4.0, NAN, NAN], [6.0, 4.0, 6.0]])
PROCESS_MASK = prefix_mask([3, 1, 1, 3], 3)
PROCESS_GROUPS = torch.tensor([0, 0, 1, 1])
PROCESS_CENTRED = torch.tensor([[1.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])


@pytest.mark.parametrize(("scale", "divisor"), [("group", 1.0 + EPS), ("batch", math.sqrt(5) + EPS), ("none", 1.0)])
def test_process_advantages(scale, divisor):
    out = group_normalized_advantages(PROCESS_REWARDS, PROCESS_MASK, PROCESS_GROUPS, mode="process", scale=scale)
    torch.testing.assert_close(out.advantages, PROCESS_CENTRED / divisor)
    assert out.degenerate.tolist() == [False, False]
    # returns: g0 {4, 0}, g1 {4, 16}
    torch.testing.assert_close(out.group_return_mean, torch.tensor([2.0, 10.0]))
    torch.testing.assert_close(out.group_return_std, torch.tensor([2.0, 6.0]))


def test_process_advantages_discounted():
    # gamma 0.5 on the centred [1, -1, 1]: t=2: 1; t=1: -1 + 0.5 * 1 = -0.5; t=0: 1 + 0.5 * -0.5 = 0.75
    out = group_normalized_advantages(
        PROCESS_REWARDS, PROCESS_MASK, PROCESS_GROUPS, mode="process", scale="none", gamma=0.5
    )
    expected = torch.tensor([[0.75, -0.5, 1.0], [-1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.75, -0.5, 1.0]])
    torch.testing.assert_close(out.advantages, expected)


# --- step_baseline mode -------------------------------------------------------------------------------------------
# g0: ep 0 [1, 1, 1] G = [3, 2, 1];  ep 1 [1] G = [1];  ep 2 [2, 0] G = [2, 0]
#     baseline t=0: mean(3, 1, 2) = 2; t=1: mean(2, 0) = 1 (ep 1 ended); t=2: 1 (ep 0 alone)
#     G - b: ep 0 [1, 1, 0], ep 1 [-1], ep 2 [0, -1]; std over the 6 entries = sqrt((1 + 1 + 0 + 1 + 0 + 1) / 6)
# g1: ep 3 [2, 2] G = [4, 2];  ep 4 [0, 0] G = [0, 0];  baseline [2, 1]; G - b: ep 3 [2, 1], ep 4 [-2, -1]
#     std = sqrt((4 + 1 + 4 + 1) / 4) = sqrt(2.5)
# batch std over all 10 entries: sqrt((4 + 10) / 10) = sqrt(1.4)
STEP_REWARDS = torch.tensor([[1.0, 1.0, 1.0], [1.0, NAN, NAN], [2.0, 0.0, NAN], [2.0, 2.0, NAN], [0.0, 0.0, NAN]])
STEP_MASK = prefix_mask([3, 1, 2, 2, 2], 3)
STEP_GROUPS = torch.tensor([0, 0, 0, 1, 1])
STEP_G0 = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
STEP_G1 = torch.tensor([[2.0, 1.0, 0.0], [-2.0, -1.0, 0.0]])


@pytest.mark.parametrize(
    ("scale", "s0", "s1"),
    [
        ("group", math.sqrt(4 / 6) + EPS, math.sqrt(2.5) + EPS),
        ("batch", math.sqrt(1.4) + EPS, math.sqrt(1.4) + EPS),
        ("none", 1.0, 1.0),
    ],
)
def test_step_baseline_advantages(scale, s0, s1):
    out = group_normalized_advantages(STEP_REWARDS, STEP_MASK, STEP_GROUPS, mode="step_baseline", scale=scale)
    torch.testing.assert_close(out.advantages, torch.cat([STEP_G0 / s0, STEP_G1 / s1]))
    assert out.degenerate.tolist() == [False, False]
    # returns: g0 {3, 1, 2}, g1 {4, 0}
    torch.testing.assert_close(out.group_return_mean, torch.tensor([2.0, 2.0]))
    torch.testing.assert_close(out.group_return_std, torch.tensor([math.sqrt(2 / 3), 2.0]))


def test_step_baseline_discounted():
    # gamma 0.5: ep 0 [2, 2] G = [3, 2]; ep 1 [1] G = [1]; b = [2, 2]; G - b: ep 0 [1, 0], ep 1 [-1]
    rewards = torch.tensor([[2.0, 2.0], [1.0, NAN]])
    out = group_normalized_advantages(
        rewards, prefix_mask([2, 1], 2), torch.tensor([0, 0]), mode="step_baseline", scale="none", gamma=0.5
    )
    torch.testing.assert_close(out.advantages, torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))


# --- degenerate groups --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
@pytest.mark.parametrize("scale", REWARD_SCALES)
@pytest.mark.parametrize("eps", [EPS, 0.0])
def test_degenerate_groups_get_exact_zero(mode, scale, eps):
    # g0: three identical episodes;  g1: [1] vs [3], informative in every mode;  g2: one member, population std 0
    # with eps = 0 the "group" scale computes 0 / 0 for g0 and g2: the result must still be exactly 0, not NaN
    rewards = torch.tensor(
        [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [1.0, NAN, NAN], [3.0, NAN, NAN], [7.0, 7.0, NAN]]
    )
    mask = prefix_mask([3, 3, 3, 1, 1, 2], 3)
    out = group_normalized_advantages(rewards, mask, torch.tensor([0, 0, 0, 1, 1, 2]), mode=mode, scale=scale, eps=eps)
    assert out.degenerate.tolist() == [True, False, True]
    assert not out.advantages.isnan().any()
    assert torch.equal(out.advantages[[0, 1, 2, 5]], torch.zeros(4, 3))
    assert (out.advantages[3:5, 0].abs() > 0).all()
    assert torch.equal(out.group_return_std[2], torch.tensor(0.0))


def test_degeneracy_depends_on_the_mode():
    # CartPole-like +1 per step, lengths 3 and 1: returns differ but every step reward is equal
    constant = torch.tensor([[1.0, 1.0, 1.0], [1.0, NAN, NAN]])
    # same return 0.1 through different steps: 0.05 + 0.05 == 0.1 exactly in float32
    same_return = torch.tensor([[0.1, NAN], [0.05, 0.05]])
    degenerate = {
        (name, mode): group_normalized_advantages(
            rewards, prefix_mask(lengths, rewards.shape[1]), torch.tensor([0, 0]), mode=mode, scale="group"
        ).degenerate.item()
        for name, rewards, lengths in [("constant", constant, [3, 1]), ("same_return", same_return, [1, 2])]
        for mode in ADVANTAGE_MODES
    }
    assert degenerate == {
        ("constant", "outcome"): False,
        ("constant", "process"): True,  # z-scored constant rewards are all 0
        ("constant", "step_baseline"): False,
        ("same_return", "outcome"): True,
        ("same_return", "process"): False,
        ("same_return", "step_baseline"): True,  # G_0 = 0.1 for both; at t=1 ep 1 is alone, its own baseline
    }


# --- KL estimators ------------------------------------------------------------------------------------------------
def test_k3_kl_nonnegative_and_zero_at_equality():
    gen = torch.Generator().manual_seed(0)
    logp, ref_logp = torch.randn(1000, generator=gen) * 3, torch.randn(1000, generator=gen) * 3
    assert (k3_kl(logp, ref_logp) >= 0).all()
    # tiny differences, where exp(x) - x - 1 in float32 can round below zero
    near = ref_logp + torch.randn(1000, generator=gen) * 1e-7
    assert (k3_kl(near, ref_logp) >= 0).all()
    assert torch.equal(k3_kl(logp, logp), torch.zeros(1000))


def test_k3_kl_by_hand():
    # x = ref - logp = 1: e - 1 - 1 = 0.7182818; x = -1: 1/e + 1 - 1 = 0.3678794
    kl = k3_kl(torch.tensor([-1.5, 0.0]), torch.tensor([-0.5, -1.0]))
    torch.testing.assert_close(kl, torch.tensor([0.7182818, 0.3678794]))


def test_k1_k2_k3_by_hand():
    # logp - ref = -1 and 1: k1 = -1, 1; k2 = 1/2, 1/2; k3 as above
    logp, ref = torch.tensor([-1.5, 0.0]), torch.tensor([-0.5, -1.0])
    torch.testing.assert_close(KL_ESTIMATORS["k1"](logp, ref), torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(KL_ESTIMATORS["k2"](logp, ref), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(KL_ESTIMATORS["k3"](logp, ref), torch.tensor([0.7182818, 0.3678794]))
    assert (k1_kl, k2_kl, k3_kl) == tuple(KL_ESTIMATORS.values())


def test_kl_estimators_expected_gradients_as_a_loss_term():
    # exact expectation over a 3-action categorical pi = softmax(theta), the samples held fixed (as in the loss):
    # E[grad k1] = 0, E[grad k2] = grad KL(pi || ref), E[grad k3] = grad KL(ref || pi)
    theta = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.5], dtype=torch.float64), 0)

    def grad(objective) -> torch.Tensor:  # d objective(log pi) / d theta
        return torch.autograd.grad(objective(torch.log_softmax(theta, 0)), theta)[0]

    expected = {
        name: grad(lambda logp, est=est: (logp.exp().detach() * est(logp, ref)).sum())
        for name, est in KL_ESTIMATORS.items()
    }
    torch.testing.assert_close(expected["k1"], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(expected["k2"], grad(lambda logp: (logp.exp() * (logp - ref)).sum()))
    torch.testing.assert_close(expected["k3"], grad(lambda logp: (ref.exp() * (ref - logp)).sum()))


def test_k3_kl_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        k3_kl(torch.zeros(3), torch.zeros(2))


# --- clipping -----------------------------------------------------------------------------------------------------
RATIO = torch.tensor([[0.7, 0.7, 1.0], [1.3, 1.3, 1.25]])
ADV = torch.tensor([[-1.0, 1.0, 2.0], [1.0, -1.0, 1.0]])


def test_clip_bounds():
    assert clip_bounds(0.2) == pytest.approx((0.8, 1.2))
    assert clip_bounds(0.2, 0.28) == pytest.approx((0.8, 1.28))


def test_asymmetric_clipped_objective_and_gradient():
    low, high = clip_bounds(0.2, 0.28)
    ratio = RATIO.clone().requires_grad_()
    objective = grpo_clipped_objective(ratio, ADV, low, high)
    # (0.7, -1): min(-0.7, 0.8 * -1) = -0.8 clipped | (0.7, 1): min(0.7, 0.8) = 0.7 | (1.0, 2): 2
    # (1.3, 1): min(1.3, 1.28) = 1.28 clipped | (1.3, -1): min(-1.3, -1.28) = -1.3 | (1.25, 1): inside [0.8, 1.28]
    torch.testing.assert_close(objective.detach(), torch.tensor([[-0.8, 0.7, 2.0], [1.28, -1.3, 1.25]]))
    objective.sum().backward()
    # clipped terms pass no gradient; the others pass A
    torch.testing.assert_close(ratio.grad, torch.tensor([[0.0, 1.0, 2.0], [0.0, -1.0, 1.0]]))
    # symmetric eps = 0.2 clips the last one at 1.2
    symmetric = grpo_clipped_objective(RATIO, ADV, *clip_bounds(0.2))
    assert symmetric[1, 2].item() == pytest.approx(1.2)


def test_clip_fractions_low_and_high():
    low, high = clip_bounds(0.2, 0.28)
    # low bound active at [0, 0] (0.7 < 0.8, A < 0); high bound at [1, 0] (1.3 > 1.28, A > 0); 1.25 is not clipped
    assert clip_fractions(RATIO, ADV, low, high, torch.ones(2, 3)) == pytest.approx((1 / 6, 1 / 6))
    assert clip_fractions(RATIO, ADV, low, high, prefix_mask([3, 1], 3)) == pytest.approx((1 / 4, 1 / 4))
    assert clip_fractions(RATIO, ADV, low, high, prefix_mask([3, 0], 3)) == pytest.approx((1 / 3, 0.0))
    # symmetric 0.2: [1, 2] (1.25 > 1.2, A > 0) joins the high side
    assert clip_fractions(RATIO, ADV, *clip_bounds(0.2), torch.ones(2, 3)) == pytest.approx((1 / 6, 2 / 6))


def test_clip_bad_inputs_raise():
    with pytest.raises(ValueError, match="epsilon must be in"):
        clip_bounds(1.5)
    with pytest.raises(ValueError, match="epsilon_high"):
        clip_bounds(0.2, -0.1)
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        grpo_clipped_objective(RATIO, ADV, 1.2, 0.8)
    with pytest.raises(ValueError, match="one shape"):
        grpo_clipped_objective(RATIO, ADV[0], 0.8, 1.2)
    with pytest.raises(ValueError, match="no real step"):
        clip_fractions(RATIO, ADV, 0.8, 1.2, torch.zeros(2, 3))


# --- loss aggregation ---------------------------------------------------------------------------------------------
# lengths 3 and 1; loss [1, 2, 3] and [4]; the padding holds 100 (ignored)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
LOSS_MASK = prefix_mask([3, 1], 3)


def test_loss_aggregations_by_hand():
    assert seq_mean_loss(LOSS, LOSS_MASK, max_len=5).item() == pytest.approx(3.0)  # (6 / 3 + 4 / 1) / 2
    assert token_mean_loss(LOSS, LOSS_MASK, max_len=5).item() == pytest.approx(2.5)  # 10 / 4
    assert constant_loss(LOSS, LOSS_MASK, max_len=5).item() == pytest.approx(1.0)  # 10 / (2 * 5)
    assert constant_loss(LOSS, LOSS_MASK, max_len=3).item() == pytest.approx(10 / 6)
    assert list(LOSS_AGGREGATIONS.items()) == [
        ("seq_mean", seq_mean_loss),
        ("token_mean", token_mean_loss),
        ("constant", constant_loss),
    ]


@pytest.mark.parametrize(
    ("name", "step_weights"),
    [
        ("seq_mean", [[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]]),  # 1 / (E * |o_i|): the short episode's step weighs 3x
        ("token_mean", [[1 / 4, 1 / 4, 1 / 4], [1 / 4, 0, 0]]),  # 1 / (number of real steps)
        ("constant", [[1 / 10, 1 / 10, 1 / 10], [1 / 10, 0, 0]]),  # 1 / (E * max_len)
    ],
)
def test_loss_aggregation_step_weights(name, step_weights):
    loss = LOSS.clone().requires_grad_()
    LOSS_AGGREGATIONS[name](loss, LOSS_MASK, max_len=5).backward()
    torch.testing.assert_close(loss.grad, torch.tensor(step_weights))


def test_loss_aggregation_bad_inputs_raise():
    for aggregate in LOSS_AGGREGATIONS.values():
        with pytest.raises(ValueError, match="max_len must be >= the padded length"):
            aggregate(LOSS, LOSS_MASK, max_len=2)
        with pytest.raises(ValueError, match="one shape"):
            aggregate(LOSS, LOSS_MASK[:1], max_len=3)
    with pytest.raises(ValueError, match="at least one real step"):
        seq_mean_loss(LOSS, prefix_mask([3, 0], 3), max_len=3)


# --- bad options and layouts --------------------------------------------------------------------------------------
def call_advantages(**overrides):
    kwargs = {"rewards": OUTCOME_REWARDS, "mask": OUTCOME_MASK, "group_ids": OUTCOME_GROUPS}
    kwargs |= {"mode": "outcome", "scale": "group"} | overrides
    return group_normalized_advantages(**kwargs)


def test_bad_mode_names_option_and_allowed_values():
    allowed = r"\('outcome', 'process', 'step_baseline'\)"
    with pytest.raises(ValueError, match=rf"mode must be one of {allowed} \(got 'gae'\)"):
        call_advantages(mode="gae")


def test_bad_scale_names_option_and_allowed_values():
    with pytest.raises(ValueError, match=r"scale must be one of \('group', 'batch', 'none'\) \(got 'std'\)"):
        call_advantages(scale="std")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gamma": 1.5}, "gamma must be in"),
        ({"eps": -1.0}, "eps must be >= 0"),
        ({"mask": OUTCOME_MASK[:, :2]}, "mask must have the shape of rewards"),
        ({"group_ids": OUTCOME_GROUPS[:5]}, "group_ids must be a torch.long tensor of shape"),
        ({"group_ids": OUTCOME_GROUPS.float()}, "group_ids must be a torch.long tensor"),
        ({"group_ids": torch.tensor([0, 2, 0, 2, 0, 2])}, r"without gaps \(no episode in groups \[1\]\)"),
        ({"rewards": OUTCOME_REWARDS[0]}, "rewards must be a float"),
        ({"mask": torch.ones(6, 3) * 0.5}, "only 0.0 and 1.0"),
        ({"mask": 1.0 - OUTCOME_MASK}, "prefix mask"),
    ],
)
def test_bad_inputs_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        call_advantages(**overrides)
