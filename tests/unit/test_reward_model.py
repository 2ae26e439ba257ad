"""The reward model of ``pgcli rm`` (docs/lm.md, "Reward models: `pgcli rm`"): the preference pairs generated from the
tasks, the scalar head on the last real token, exact resume of the trainer, and the config rules (the Bradley-Terry
loss: test_ops_preference.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.reward_model import RewardModelTrainer
from pgcli.config import AdditionEnvConfig, CountdownEnvConfig, LMModelConfig, RMConfig, SortEnvConfig
from pgcli.errors import ConfigError
from pgcli.lm.load import make_text_policy, make_text_task
from pgcli.lm.pairs import PairGenerator, addition_credit, perturb_digits
from pgcli.lm.reward_model import PolicySampler, RewardModel, evaluate_pairs, load_reward_model, score_texts
from pgcli.lm.tasks import Task, make_task

TINY = LMModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32)
CPU = torch.device("cpu")


def _addition(n_digits: int = 2) -> Task:
    return make_task(AdditionEnvConfig(id="addition", n_digits=n_digits, n_eval=64))


# --------------------------------------------------------------------------------------------------------------------
# the pairs
# --------------------------------------------------------------------------------------------------------------------

TASKS = {
    "addition": AdditionEnvConfig(id="addition", n_digits=3, n_eval=64),
    "sort": SortEnvConfig(id="sort", n_digits=4, n_eval=64),
    "countdown": CountdownEnvConfig(id="countdown", n_eval=64),
}


@pytest.mark.parametrize("name", list(TASKS))
def test_checker_pairs_put_a_correct_completion_over_a_wrong_one(name: str):
    task = make_task(TASKS[name])
    pairs = PairGenerator(task, "checker").sample(np.random.default_rng(0), 300)
    for pair in pairs:
        assert task.correct(pair.problem, pair.chosen), pair
        assert not task.correct(pair.problem, pair.rejected), pair
        assert not pair.flipped
        assert len(task.vocab.encode(pair.rejected)) < task.max_completion_len  # the EOS still fits
    if name == "countdown":  # wrong but well formed, and not always the reference on the chosen side
        assert all(task.well_formed(p.problem, p.rejected) for p in pairs)
        assert any(p.chosen != p.problem.answer for p in pairs)


def test_digit_perturbations_change_drop_or_add_one_digit():
    rng = np.random.default_rng(0)
    seen = {perturb_digits("1234", rng, max_chars=5) for _ in range(300)}
    assert any(len(s) == 3 for s in seen) and any(len(s) == 5 for s in seen) and any(len(s) == 4 for s in seen)
    assert "1234" not in seen
    assert all(sum(a != b for a, b in zip(s, "1234", strict=True)) == 1 for s in seen if len(s) == 4)
    assert all(len(perturb_digits("12", rng, max_chars=2)) <= 2 for _ in range(100))  # never past the longest answer


@pytest.mark.parametrize("name", list(TASKS))
def test_partial_pairs_are_both_wrong_with_more_credit_chosen(name: str):
    task = make_task(TASKS[name])
    generator = PairGenerator(task, "partial")
    for pair in generator.sample(np.random.default_rng(1), 200):
        assert not task.correct(pair.problem, pair.chosen) and not task.correct(pair.problem, pair.rejected)
        credit = generator.completions.credit
        assert credit(pair.problem, pair.chosen) > credit(pair.problem, pair.rejected)


def test_addition_credit_is_minus_the_distance_to_the_answer():
    task = _addition()
    problem = task.eval_problems()[0]
    assert addition_credit(problem, str(int(problem.answer) + 7)) == -7


def test_label_noise_flips_the_expected_share_of_pairs():
    task = _addition(3)
    pairs = PairGenerator(task, "checker", label_noise=0.2).sample(np.random.default_rng(2), 6000)
    flipped = np.array([p.flipped for p in pairs])
    assert abs(flipped.mean() - 0.2) < 0.02  # 3.9 standard deviations of a binomial share at n = 6000
    assert all(
        not task.correct(p.problem, p.chosen) and task.correct(p.problem, p.rejected) for p in pairs if p.flipped
    )
    assert all(task.correct(p.problem, p.chosen) for p in pairs if not p.flipped)


def test_held_out_pairs_come_from_held_out_problems_only_and_are_the_same_for_every_run():
    task = _addition(2)
    held_out = {p.prompt for p in task.eval_problems()}
    generator = PairGenerator(task, "checker", label_noise=0.3)
    evaluation = generator.eval_pairs(seed=1234)
    assert [p.problem.prompt for p in evaluation] == [p.prompt for p in task.eval_problems()]
    assert not any(p.flipped for p in evaluation)  # clean labels: accuracy is measured against the checker
    assert evaluation == PairGenerator(_addition(2), "checker").eval_pairs(seed=1234)
    training = generator.sample(np.random.default_rng(0), 4000)
    assert not {p.problem.prompt for p in training} & held_out


def test_an_unknown_pair_kind_is_a_config_error():
    with pytest.raises(ConfigError, match=r"algo\.pairs must be one of checker, partial, policy"):
        PairGenerator(_addition(), "random")


def _sampler(task: Task, k: int = 4, seed: int = 0) -> PolicySampler:
    """A random tiny TinyGPT as the init policy: nearly all of its samples are wrong."""
    torch.manual_seed(seed)
    return PolicySampler(task, make_text_policy(task, TINY, CPU).eval(), k, temperature=1.0, top_p=1.0, device=CPU)


def test_policy_pairs_reject_the_init_policys_first_wrong_sample_and_are_reproducible():
    task = _addition()
    sampler = _sampler(task)
    pairs = PairGenerator(task, "policy", policy_samples=sampler).sample(np.random.default_rng(0), 48)
    rng = np.random.default_rng(0)  # the same draws by hand: the problems, then k samples of each
    problems = task.sample(rng, 48)
    drawn = sampler(problems, rng)
    assert [len(d) for d in drawn] == [4] * 48
    assert any(p.from_policy for p in pairs)
    for pair, problem, samples in zip(pairs, problems, drawn, strict=True):
        assert pair.problem == problem and task.correct(problem, pair.chosen) and not pair.flipped
        assert not task.correct(problem, pair.rejected)
        wrong = [s for s in samples if not task.correct(problem, s)]
        assert pair.from_policy == bool(wrong) and (not wrong or pair.rejected == wrong[0])
    again = PairGenerator(task, "policy", policy_samples=_sampler(task)).sample(np.random.default_rng(0), 48)
    assert again == pairs


def test_a_prompt_the_policy_always_gets_right_falls_back_to_the_checkers_wrong_completion():
    task = _addition()

    def samples(problems, rng):  # odd rows: every sample right; even rows: one wrong sample, one right
        return [[p.answer] * 2 if i % 2 else ["x" + p.answer, p.answer] for i, p in enumerate(problems)]

    pairs = PairGenerator(task, "policy", policy_samples=samples).sample(np.random.default_rng(3), 40)
    assert [p.from_policy for p in pairs] == [i % 2 == 0 for i in range(40)]
    for i, pair in enumerate(pairs):
        assert task.correct(pair.problem, pair.chosen)
        assert (
            pair.rejected == "x" + pair.problem.answer if i % 2 == 0 else not task.correct(pair.problem, pair.rejected)
        )


def test_policy_pairs_take_label_noise_and_held_out_pairs_are_clean_and_fixed():
    task = _addition()
    generator = PairGenerator(task, "policy", label_noise=0.3, policy_samples=_sampler(task))
    flipped = [p.flipped for p in generator.sample(np.random.default_rng(0), 400)]
    assert 0.2 < np.mean(flipped) < 0.4
    held_out = generator.eval_pairs(seed=7)
    assert [p.problem for p in held_out] == task.eval_problems() and not any(p.flipped for p in held_out)
    assert all(not task.correct(p.problem, p.rejected) for p in held_out)
    assert held_out == PairGenerator(task, "policy", policy_samples=_sampler(task)).eval_pairs(seed=7)


def test_policy_pairs_need_the_policys_samples():
    with pytest.raises(ValueError, match="policy_samples"):
        PairGenerator(_addition(), "policy")


# --------------------------------------------------------------------------------------------------------------------
# the model and the trainer
# --------------------------------------------------------------------------------------------------------------------


def _reward_model(task: Task, seed: int = 0) -> RewardModel:
    torch.manual_seed(seed)
    return RewardModel(make_text_policy(task, TINY, CPU))


def test_a_fresh_head_scores_zero_and_the_loss_starts_at_log_2():
    task = _addition()
    pairs = PairGenerator(task).eval_pairs(seed=0)
    result = evaluate_pairs(_reward_model(task), task.vocab, pairs, CPU, n_table_rows=3)
    assert result.extra["eval/pairwise_accuracy"] == 0.0  # every pair a tie: none ranked right
    assert result.extra["eval/reward_margin"] == 0.0
    assert result.extra["eval/loss"] == pytest.approx(math.log(2))
    assert result.samples is not None and len(result.samples) == 3 and result.samples[0]["chosen"] == pairs[0].chosen


def test_the_reward_reads_the_last_real_token_whatever_the_padding():
    task = _addition()
    model = _reward_model(task)
    torch.nn.init.normal_(model.head.weight)
    prompts, completions = ["1+2=", "12+34=", "5+67="], ["3", "46", "7"]
    together = score_texts(model, task.vocab, prompts, completions, CPU)
    alone = np.concatenate(
        [score_texts(model, task.vocab, [p], [c], CPU) for p, c in zip(prompts, completions, strict=True)]
    )
    assert np.allclose(together, alone, atol=1e-5)
    assert len(set(np.round(together, 6))) == 3


def _trainer(task: Task, **algo) -> RewardModelTrainer:
    torch.manual_seed(0)
    policy = make_text_policy(task, TINY, CPU)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # what init= gives: a frozen copy of the start
    cfg = RMConfig(batch_size=16, **algo)
    return RewardModelTrainer(cfg, task=task, policy=policy, reference=reference, model=TINY, seed=0, device=CPU)


class _Monitor:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, stats: dict[str, float]) -> None:
        self.logged.append((step, stats))

    def update(self, step: int, agent: object) -> None:
        pass

    def diverged(self, quantity: str, step: int, value: str) -> Exception:
        return RuntimeError(quantity)


def test_training_logs_the_loss_and_a_resumed_trainer_continues_exactly(tmp_path: Path):
    task = _addition()
    straight = _trainer(task)
    monitor = _Monitor()
    straight.learn(64, monitor)
    first = monitor.logged[0][1]
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-6)  # the zero head: every reward 0
    assert {"train/pairwise_accuracy", "train/reward_margin", "train/grad_norm", "train/learning_rate"} <= set(first)
    assert [step for step, _ in monitor.logged] == [16, 32, 48, 64]

    stopped = _trainer(task)
    stopped.learn(32, _Monitor())
    stopped.save(tmp_path / "ckpt")
    resumed = _trainer(task)
    resumed.load(tmp_path / "ckpt")
    rest = _Monitor()
    resumed.learn(64, rest)
    assert rest.logged == monitor.logged[2:]


def test_a_policy_pair_run_logs_its_fallback_share_and_resumes_exactly(tmp_path: Path):
    task = _addition()
    straight = _trainer(task, pairs="policy", policy_samples=2)
    monitor = _Monitor()
    straight.learn(48, monitor)
    assert all(0.0 <= stats["train/policy_pair_fallback_frac"] <= 1.0 for _, stats in monitor.logged)
    stopped = _trainer(task, pairs="policy", policy_samples=2)
    stopped.learn(16, _Monitor())
    stopped.save(tmp_path / "ckpt")
    resumed = _trainer(task, pairs="policy", policy_samples=2)
    resumed.load(tmp_path / "ckpt")
    rest = _Monitor()
    resumed.learn(48, rest)
    assert rest.logged == monitor.logged[1:]


def test_the_saved_model_loads_back_with_the_same_rewards(tmp_path: Path):
    task = _addition()
    trainer = _trainer(task)
    trainer.learn(32, _Monitor())
    trainer.save(tmp_path / "model")
    loaded = load_reward_model(task, TINY, CPU, tmp_path / "model")
    prompts, completions = ["1+2=", "12+34="], ["3", "47"]
    expected = score_texts(trainer.reward_model, task.vocab, prompts, completions, CPU)
    assert np.allclose(score_texts(loaded, task.vocab, prompts, completions, CPU), expected, atol=1e-6)


def test_make_text_task_gives_the_pairs_a_task_with_its_puzzle():
    task = make_text_task(TASKS["sort"], TINY)
    assert PairGenerator(task).eval_pairs(seed=0)


# --------------------------------------------------------------------------------------------------------------------
# the config
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [-0.1, 0.5, 0.9])
def test_label_noise_outside_zero_to_a_half_is_one_line(noise: float):
    with pytest.raises(ConfigError, match=r"algo.label_noise must be in \[0, 0.5\)") as info:
        RMConfig(label_noise=noise)
    assert "\n" not in str(info.value)


def test_policy_pairs_without_init_are_one_line_naming_the_fix():
    from pgcli.config.compose import compose_train_config

    with pytest.raises(ConfigError, match=r"init must be an SFT run with algo.pairs=policy \(got None\); ") as info:
        compose_train_config(["algo=rm", "env=addition", "algo.pairs=policy"])
    assert "\n" not in str(info.value)
    cfg = compose_train_config(
        ["algo=rm", "env=addition", "algo.pairs=policy", "init=outputs/sft", "algo.policy_samples=8"]
    )
    assert isinstance(cfg.algo, RMConfig) and cfg.algo.pairs == "policy" and cfg.algo.policy_samples == 8
    with pytest.raises(ConfigError, match=r"algo.policy_samples must be >= 1"):
        RMConfig(policy_samples=0)


def test_rm_composes_on_a_text_task_only():
    from pgcli.config.compose import compose_train_config

    cfg = compose_train_config(["algo=rm", "env=addition", "algo.label_noise=0.1", "algo.pairs=partial"])
    assert isinstance(cfg.algo, RMConfig) and cfg.algo.label_noise == 0.1 and cfg.algo.pairs == "partial"
    with pytest.raises(ConfigError, match="algo=rm trains on text tasks only"):
        compose_train_config(["algo=rm", "env=cartpole"])
