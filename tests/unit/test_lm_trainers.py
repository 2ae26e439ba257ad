"""The language-model trainers (pgcli.algo.lm_grpo, lm_ppo): sampling, one update's direction, metrics, dropping
zero-variance groups and truncated completions, where the KL to the reference goes (reward or loss, which estimator),
exact resume from a checkpoint, micro-batches giving the minibatch's update. Tiny model and task, CPU, a few
seconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.lm_base import kl_reference
from pgcli.algo.lm_grpo import ESTIMATORS, LMGRPO, token_loss
from pgcli.algo.lm_ppo import LMPPO
from pgcli.algo.lm_rollout import CompletionBatch, batch_prompts, sample_completions
from pgcli.config import GRPOConfig, GSPOConfig, PPOLMConfig, REINFORCEConfig, ReinforcePPConfig, RLOOConfig
from pgcli.lm.model import POLICY_FILE, TinyGPT, TinyGPTSizes, completion_logprobs
from pgcli.lm.tasks import Addition, Problem, Task
from pgcli.ops.aggregate import token_mean_loss
from pgcli.ops.grpo import KL_ESTIMATORS, k3_kl
from pgcli.ops.lm import masked_mean

CPU = torch.device("cpu")


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    micro_batch: int = 0


def first_digit_is_one(problem: Problem, completion: str) -> float:
    """A reward a random tiny model rarely earns: the completion starts with '1'."""
    return float(completion.startswith("1"))


def starts_low(problem: Problem, completion: str) -> float:
    """A reward a random tiny model earns about 1 time in 3: the completion starts with 0 to 4."""
    return float(completion[:1] in set("01234"))


def make_task(reward=first_digit_is_one) -> Task:
    return Task("addition", Addition(2), n_eval=20, eval_seed=0, reward_fn=reward)


def make_policy(task: Task) -> TinyGPT:
    torch.manual_seed(0)
    sizes = TinyGPTSizes(
        vocab_size=task.vocab.size,
        max_len=task.max_prompt_len + task.max_completion_len,
        n_layers=1,
        n_heads=2,
        d_model=32,
        d_ff=64,
    )
    return TinyGPT(sizes)


DR_GRPO = {
    "group_size": 4,
    "n_groups": 4,
    "batch_size": 8,
    "scale_rewards": "none",
    "loss_agg": "constant",
    "beta": 0.04,
}
CONFIGS = {
    "grpo": lambda **kw: GRPOConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8, "beta": 0.04} | kw)),
    "dr_grpo": lambda **kw: GRPOConfig(**(DR_GRPO | kw)),
    "rloo": lambda **kw: RLOOConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
    "reinforce": lambda **kw: REINFORCEConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
    "gspo": lambda **kw: GSPOConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
    "reinforce_pp": lambda **kw: ReinforcePPConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
    "reinforce_pp_baseline": lambda **kw: ReinforcePPConfig(
        **({"group_size": 4, "n_groups": 4, "batch_size": 8, "baseline": "group"} | kw)
    ),
    "ppo_lm": lambda **kw: PPOLMConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
}


def make_trainer(algo: str, task: Task | None = None, *, micro_batch: int = 0, **kw) -> LMGRPO | LMPPO:
    task = task or make_task()
    cfg = CONFIGS[algo](**kw)
    trainer_class = LMPPO if algo == "ppo_lm" else LMGRPO
    policy = make_policy(task)
    return trainer_class(
        cfg,
        task=task,
        policy=policy,
        reference=kl_reference(cfg, policy, None),
        model=Sampling(micro_batch=micro_batch),
        seed=0,
        device=CPU,
    )


LM_METRICS = {
    "train/entropy",
    "train/clip_fraction",
    "train/approx_kl",
    "rollout/reward_mean",
    "rollout/completion_len",
    "time/tokens_per_s",
    "train/dropped_frac",
    "train/zero_variance_frac",
}


class Recorder:
    """Stands in for TrainingMonitor: keeps what a trainer reports."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.updates: list[int] = []

    def log(self, step, metrics):
        self.metrics.append((step, dict(metrics)))

    def update(self, step, agent):
        self.updates.append(step)


def params_of(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.policy.parameters()]


def test_sampled_groups_share_their_prompt_and_are_scored_by_the_task():
    task = make_task()
    policy = make_policy(task)
    problems = task.sample(np.random.default_rng(0), 3)
    batch = sample_completions(
        task,
        policy,
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
        device=CPU,
    )
    assert batch.tokens.shape[0] == 12 and batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    prompts = batch.prompt_tokens.view(3, 4, -1)
    assert torch.equal(prompts, prompts[:, :1].expand_as(prompts))
    texts = [task.vocab.decode(row) for row in batch.tokens.tolist()]
    expected = [first_digit_is_one(problems[b // 4], text) for b, text in enumerate(texts)]
    assert batch.rewards.tolist() == expected
    assert batch.tokens.shape[1] <= task.max_completion_len
    assert (batch.mask.sum(1) >= 1).all() and batch.n_tokens == int(batch.mask.sum())


@pytest.mark.parametrize("algo", list(CONFIGS))
def test_learn_counts_completions_and_logs_the_language_rl_metrics(algo):
    trainer, monitor = make_trainer(algo), Recorder()
    before = params_of(trainer)
    steps = trainer.learn(32, monitor)  # type: ignore[arg-type]
    assert steps == 32 and monitor.updates == [16, 32]
    stats = monitor.metrics[-1][1]
    assert set(stats) >= LM_METRICS
    assert ("train/kl_ref" in stats) == (trainer.cfg.beta > 0)
    assert stats["time/tokens_per_s"] > 0 and 1 <= stats["rollout/completion_len"] <= 4
    assert any(not torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))


@pytest.mark.parametrize("algo", list(CONFIGS))
def test_one_update_raises_the_likelihood_of_the_rewarded_completions(algo):
    # one epoch, one minibatch, no KL: the policy gradient must move log-probs up for A > 0, down for A < 0
    task = make_task(reward=starts_low)
    ppo = {"normalize_advantage": False, "gae_lambda": 1.0} if algo == "ppo_lm" else {}
    trainer = make_trainer(algo, task, n_iterations=1, batch_size=16, beta=0.0, learning_rate=1e-3, **ppo)
    problems = task.sample(trainer.prompt_rng, 4)
    batch = sample_completions(
        task,
        trainer.policy,
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=trainer.generator,
        device=CPU,
    )
    assert batch.rewards.max() > batch.rewards.min()  # seeds are fixed: the sample has a signal

    def seq_logp() -> torch.Tensor:
        with torch.no_grad():
            logp, _ = completion_logprobs(
                trainer.policy, batch.prompt_tokens, batch.prompt_mask, batch.tokens, batch.mask.bool()
            )
        return (logp * batch.mask).sum(1)

    before = seq_logp()
    trainer._update(batch)
    change = seq_logp() - before
    rewarded = batch.rewards > batch.rewards.mean()
    assert change[rewarded].mean() > change[~rewarded].mean()
    assert change[rewarded].mean() > 0


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo_lm"])
def test_zero_variance_groups_are_dropped_and_leave_the_policy_alone(algo):
    trainer, monitor = (
        make_trainer(algo, make_task(reward=lambda problem, completion: 0.5), drop_degenerate_groups=True),
        Recorder(),
    )
    before = params_of(trainer)
    trainer.learn(16, monitor)  # type: ignore[arg-type]
    stats = monitor.metrics[-1][1]
    assert stats["train/zero_variance_frac"] == 1.0 and stats["train/dropped_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))


def sampled_batch(trainer, task: Task) -> CompletionBatch:
    """16 completions of 4 training prompts from the trainer's policy."""
    problems = task.sample(trainer.prompt_rng, 4)
    return sample_completions(
        task,
        trainer.policy,
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=trainer.generator,
        device=CPU,
    )


def test_rloo_baseline_is_the_leave_one_out_mean_of_the_kl_shaped_rewards():
    # 2 prompts, 2 completions each: R' = R - 0.1 sum_t (log pi_old - log pi_ref) = 1, -0.1, 0.98, 0.99;
    # A = R' - the other member's R' (tests/unit/test_ops_lm.py has the same batch)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    old_logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-1.0, -1.0], [-2.0, -0.3]])
    ref_logp = old_logp - torch.tensor([[0.5, -0.5], [1.0, 0.0], [0.0, 0.2], [0.1, 0.0]])
    empty = torch.zeros(4, 1, dtype=torch.long)
    batch = CompletionBatch(
        prompt_tokens=empty,
        prompt_mask=empty.bool(),
        tokens=torch.zeros(4, 2, dtype=torch.long),
        mask=mask,
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        correct=torch.zeros(4).bool(),
        group_ids=torch.tensor([0, 0, 1, 1]),
        sample_seconds=0.0,
    )
    cfg = RLOOConfig(group_size=2, n_groups=2, batch_size=4, beta=0.1)
    advantages = ESTIMATORS[RLOOConfig](cfg, batch, old_logp, ref_logp)
    expected = torch.tensor([[1.1, 1.1], [-1.1, 0.0], [-0.01, -0.01], [0.01, 0.01]])
    assert torch.allclose(advantages, expected)
    without_kl = ESTIMATORS[RLOOConfig](cfg, batch, old_logp, None)  # beta = 0: no reference
    assert torch.allclose(without_kl, torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def loss_terms(algo: str, **kw):
    """token_loss on a sampled batch, with a reference the policy has drifted from."""
    task = make_task(reward=starts_low)
    trainer = make_trainer(algo, task, **kw)
    assert trainer.reference is not None
    with torch.no_grad():
        for param in trainer.reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    batch = sampled_batch(trainer, task)
    with torch.no_grad():
        old_logp = trainer._batch_logprobs(trainer.policy, batch)
        ref_logp = trainer._batch_logprobs(trainer.reference, batch)
    out = token_loss(
        trainer.policy,
        trainer.cfg,
        batch,
        torch.arange(16),
        old_logp=old_logp,
        ref_logp=ref_logp,
        advantages=torch.zeros_like(old_logp),
        temperature=1.0,
        max_len=task.max_completion_len,
    )
    kl_k3 = float(masked_mean(k3_kl(old_logp, ref_logp), batch.mask))
    return out, old_logp, ref_logp, batch, kl_k3


@pytest.mark.parametrize("algo", ["rloo", "reinforce_pp"])
def test_rloo_and_reinforce_pp_put_the_kl_in_the_reward_not_in_the_loss(algo):
    out, *_, kl_k3 = loss_terms(algo)
    assert out.loss_kl.item() == 0.0
    assert out.kl_ref == pytest.approx(kl_k3) and kl_k3 > 0  # still logged as train/kl_ref


@pytest.mark.parametrize("algo", ["grpo", "reinforce", "gspo"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimator_chooses_the_kl_term_of_the_loss(algo, estimator):
    out, old_logp, ref_logp, batch, kl_k3 = loss_terms(algo, kl_estimator=estimator, loss_agg="token_mean")
    # the policy has not moved since sampling: log pi_theta = log pi_old
    kl = KL_ESTIMATORS[estimator](old_logp, ref_logp)
    expected = 0.04 * token_mean_loss(kl, batch.mask, max_len=old_logp.shape[1])
    assert out.loss_kl.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.kl_ref == pytest.approx(kl_k3)  # train/kl_ref is k3 whatever the estimator


def truncate(batch: CompletionBatch, rows: torch.Tensor, token: int) -> CompletionBatch:
    """`batch` with the last real token of `rows` replaced by `token` (a character, not EOS): cut-off completions."""
    tokens = batch.tokens.clone()
    tokens[rows, batch.mask[rows].sum(1).long() - 1] = token
    return batch._replace(tokens=tokens)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "gspo", "reinforce_pp"])
def test_mask_truncated_completions_leaves_completions_without_eos_out_of_the_loss(algo):
    task = make_task(reward=starts_low)
    digit = task.vocab.encode("1")[0]
    trainer = make_trainer(algo, task, mask_truncated_completions=True, beta=0.0, learning_rate=1e-3)
    batch = sampled_batch(trainer, task)
    before = params_of(trainer)
    stats = trainer._update(truncate(batch, torch.arange(16), digit))  # every completion cut off
    assert stats["rollout/truncated_frac"] == 1.0 and stats["train/dropped_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))
    mixed = truncate(batch, torch.arange(4), digit)  # the first prompt's 4 completions
    ended = batch.tokens.gather(1, batch.mask.sum(1).long()[:, None] - 1)[4:, 0] == task.vocab.eos_id
    stats = trainer._update(mixed)
    assert stats["rollout/truncated_frac"] == stats["train/dropped_frac"] == 1.0 - float(ended.float().sum()) / 16
    assert any(not torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))
    # without the option the same all-truncated batch trains
    plain = make_trainer(algo, task, beta=0.0, learning_rate=1e-3)
    stats = plain._update(truncate(batch, torch.arange(16), digit))
    assert stats["rollout/truncated_frac"] == 1.0 and stats["train/dropped_frac"] == 0.0


@pytest.mark.parametrize("algo", ["grpo", "ppo_lm"])
def test_resume_from_a_checkpoint_continues_exactly(algo, tmp_path: Path):
    straight = make_trainer(algo)
    straight.learn(16, Recorder())  # type: ignore[arg-type]
    path = straight.save(tmp_path / "step_16")
    assert (path / POLICY_FILE).is_file()
    straight.learn(48, Recorder())  # type: ignore[arg-type]

    torch.manual_seed(123)  # disturb the process RNG: load must restore it
    resumed = make_trainer(algo)
    resumed.load(path)
    assert resumed.steps == 16
    resumed.learn(48, Recorder())  # type: ignore[arg-type]
    assert resumed.steps == straight.steps == 48
    for a, b in zip(params_of(straight), params_of(resumed), strict=True):
        assert torch.equal(a, b)


MICRO_BATCH_CASES = {
    "grpo_seq_mean": ("grpo", {"loss_agg": "seq_mean"}),
    "grpo_token_mean": ("grpo", {"loss_agg": "token_mean"}),
    "grpo_constant": ("grpo", {"loss_agg": "constant"}),
    "rloo": ("rloo", {}),
    "gspo": ("gspo", {}),
    "reinforce_pp": ("reinforce_pp", {}),
    "ppo_lm": ("ppo_lm", {"clip_range_vf": 0.2}),
}


def drift_reference(trainer) -> None:
    """Move the reference away from the policy, so the KL terms have a gradient."""
    with torch.no_grad():
        for param in trainer.reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("case", list(MICRO_BATCH_CASES))
def test_micro_batches_give_the_minibatch_update_and_stats(case):
    # micro_batch=3 does not divide batch_size=8 (passes of 3, 3, 2 completions): one update from the same state
    # must equal the unchunked one up to float32 summation order, stats included (docs/lm.md, "Memory")
    algo, kw = MICRO_BATCH_CASES[case]
    task = make_task(reward=starts_low)
    kw = {"beta": 0.04, "ent_coef": 0.01, "n_iterations": 2, "epsilon": 0.1} | kw
    if algo == "gspo":
        kw["epsilon"] = 3e-3  # GSPO's sequence-ratio clip is small
    whole, chunked = (make_trainer(algo, task, micro_batch=size, **kw) for size in (0, 3))
    for trainer in (whole, chunked):
        drift_reference(trainer)
        # SGD, not Adam: Adam's first step is about lr * sign(g), and some gradients are float noise around an exact
        # 0 (attention's key bias), whose sign the summation order decides; SGD keeps the parameters' difference at
        # the size of the gradients' difference
        trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.5)
        if isinstance(trainer, LMPPO):
            trainer.vf_optimizer = torch.optim.SGD(trainer.value.parameters(), lr=0.5)
    batch = sampled_batch(whole, task)
    rows_per_pass: list[int] = []  # completions in each forward pass of the chunked trainer's policy
    chunked.policy.tok_emb.register_forward_hook(lambda module, args, out: rows_per_pass.append(out.shape[0]))
    stats = []
    for trainer in (whole, chunked):
        torch.manual_seed(0)  # the same minibatches
        stats.append(trainer._update(batch))
    assert max(rows_per_pass) == 3 and 2 in rows_per_pass
    assert stats[0].keys() == stats[1].keys() and "train/kl_ref" in stats[0]
    assert stats[0]["train/clip_fraction"] > 0  # the clip and its fraction are exercised
    for key, value in stats[0].items():
        assert stats[1][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    modules = ["policy", "value"] if algo == "ppo_lm" else ["policy"]
    for name in modules:
        for a, b in zip(getattr(whole, name).parameters(), getattr(chunked, name).parameters(), strict=True):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_batch_prompts_are_the_distinct_prompts_of_the_rows():
    task = make_task()
    trainer = make_trainer("grpo", task)
    batch = sampled_batch(trainer, task)
    rows = torch.tensor([13, 2, 3, 7, 12, 0])  # groups 3, 0, 0, 1, 3, 0
    tokens, mask, index = batch_prompts(batch, rows)
    assert index is not None and tokens.shape[0] == 3  # three distinct prompts
    assert torch.equal(tokens[index], batch.prompt_tokens[rows]) and torch.equal(mask[index], batch.prompt_mask[rows])
    own = batch_prompts(batch._replace(prompt_ids=None), rows)  # nothing known to be shared: each row's own
    assert own[2] is None and torch.equal(own[0], batch.prompt_tokens[rows])


@pytest.mark.parametrize(
    ("algo", "sampler_logprobs", "on_policy_rows", "passed_rows"),
    [("grpo", False, 8, 8), ("rloo", False, 0, 16), ("grpo", True, 0, 0), ("rloo", True, 0, 16)],
)
def test_pi_old_comes_from_the_sampler_or_the_first_minibatch_pass(algo, sampler_logprobs, on_policy_rows, passed_rows):
    """pi_old without a pass of its own: the sampler's log-probs (TinyGPT's); without them (a Hugging Face model), with
    n_iterations=1 the first step's minibatch takes its own log-probs (detached) and the other rows get one no-grad
    pass. RLOO's KL-shaped rewards read pi_old of every row, from a pass like pi_ref's whatever the sampler gives.
    Each way equals a separate no-grad pass of the sampling policy (float tolerance)."""
    task = make_task(reward=starts_low)
    trainer = make_trainer(algo, task, n_iterations=1, beta=0.04)
    batch = sampled_batch(trainer, task)
    assert batch.logprobs is not None
    if not sampler_logprobs:
        batch = batch._replace(logprobs=None)
    with torch.no_grad():
        expected = trainer._batch_logprobs(trainer.policy, batch)
    passes, steps = [], []
    batch_logprobs, policy_step = trainer._batch_logprobs, trainer._policy_step

    def spy_logprobs(model, batch, rows=None):
        passes.append((model is trainer.policy, None if rows is None else rows.clone(), bool(steps)))
        return batch_logprobs(model, batch, rows)

    def spy_step(batch, mb, *, old_logp, **kw):
        steps.append((mb.clone(), kw["on_policy"], old_logp))
        return policy_step(batch, mb, old_logp=old_logp, **kw)

    trainer._batch_logprobs, trainer._policy_step = spy_logprobs, spy_step  # type: ignore[method-assign]
    trainer._update(batch)
    (first, on_policy, old_logp), (second, *_) = steps
    assert on_policy == (on_policy_rows > 0)
    policy_rows = [rows for is_policy, rows, after in passes if is_policy and not after]
    assert sum(len(rows) for rows in policy_rows) == passed_rows
    if on_policy_rows:  # the pass covers exactly the rows the first step does not
        assert set(policy_rows[0].tolist()) == set(second.tolist()) and len(first) == on_policy_rows
    mask = batch.mask.bool()
    assert torch.allclose(old_logp[mask], expected[mask], atol=1e-5)  # after the update: every row filled


@pytest.mark.parametrize("algo", ["rloo", "reinforce_pp"])
def test_a_kl_in_the_reward_is_exactly_zero_while_the_policy_is_the_reference(algo):
    """pi_old for the KL-shaped reward comes from the same pass as pi_ref's, not from the sampler (equal only up to
    float32 summation order): with the reference a copy of the policy, k1 is 0.0 on every token, so rewards that are
    all equal give no advantage at all (REINFORCE++ whitens: float noise would become unit-size advantages)."""
    task = make_task(reward=lambda problem, completion: 0.0)
    trainer = make_trainer(algo, task, n_iterations=1, beta=0.04)
    batch = sampled_batch(trainer, task)
    seen = []
    advantages = trainer._advantages

    def spy(batch, old_logp, ref_logp):
        seen.append((old_logp.clone(), ref_logp.clone()))
        return advantages(batch, old_logp, ref_logp)

    trainer._advantages = spy  # type: ignore[method-assign]
    before = params_of(trainer)
    stats = trainer._update(batch)
    ((old_logp, ref_logp),) = seen
    assert torch.equal(old_logp * batch.mask, ref_logp * batch.mask)
    assert stats["train/grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))
