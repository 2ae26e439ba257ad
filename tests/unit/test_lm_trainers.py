"""The language-model trainers (pgcli.algo.lm_grpo, lm_ppo): sampling, one update's direction, metrics, dropping
zero-variance groups, exact resume from a checkpoint. Tiny model and task, CPU, a few seconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.lm_grpo import LMGRPO
from pgcli.algo.lm_ppo import LMPPO
from pgcli.algo.lm_rollout import sample_completions
from pgcli.config import GRPOConfig, PPOLMConfig, REINFORCEConfig, RLOOConfig
from pgcli.lm.model import POLICY_FILE, TinyGPT, TinyGPTSizes, completion_logprobs
from pgcli.lm.tasks import Addition, Problem, Task

CPU = torch.device("cpu")


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0


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
    sizes = TinyGPTSizes(vocab_size=task.vocab.size, max_len=task.max_prompt_len + task.max_completion_len,
                         n_layers=1, n_heads=2, d_model=32, d_ff=64)  # fmt: skip
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
    "ppo_lm": lambda **kw: PPOLMConfig(**({"group_size": 4, "n_groups": 4, "batch_size": 8} | kw)),
}


def make_trainer(algo: str, task: Task | None = None, **kw) -> LMGRPO | LMPPO:
    task = task or make_task()
    cfg = CONFIGS[algo](**kw)
    trainer_class = LMPPO if algo == "ppo_lm" else LMGRPO
    return trainer_class(cfg, task=task, policy=make_policy(task), reference=None, model=Sampling(), seed=0,
                         device=CPU)  # type: ignore[arg-type]  # fmt: skip


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
    batch = sample_completions(task, policy, problems, group_size=4, temperature=1.0, top_p=1.0,
                               generator=torch.Generator().manual_seed(0), device=CPU)  # fmt: skip
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
    batch = sample_completions(task, trainer.policy, problems, group_size=4, temperature=1.0, top_p=1.0,
                               generator=trainer.generator, device=CPU)  # fmt: skip
    assert batch.rewards.max() > batch.rewards.min()  # seeds are fixed: the sample has a signal

    def seq_logp() -> torch.Tensor:
        with torch.no_grad():
            logp, _ = completion_logprobs(trainer.policy, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                          batch.mask.bool())  # fmt: skip
        return (logp * batch.mask).sum(1)

    before = seq_logp()
    trainer._update(batch)
    change = seq_logp() - before
    rewarded = batch.rewards > batch.rewards.mean()
    assert change[rewarded].mean() > change[~rewarded].mean()
    assert change[rewarded].mean() > 0


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo_lm"])
def test_zero_variance_groups_are_dropped_and_leave_the_policy_alone(algo):
    trainer, monitor = make_trainer(algo, make_task(reward=lambda problem, completion: 0.5),
                                    drop_degenerate_groups=True), Recorder()  # fmt: skip
    before = params_of(trainer)
    trainer.learn(16, monitor)  # type: ignore[arg-type]
    stats = monitor.metrics[-1][1]
    assert stats["train/zero_variance_frac"] == 1.0 and stats["train/dropped_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(trainer), strict=True))


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
