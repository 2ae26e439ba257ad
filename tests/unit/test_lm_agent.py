"""Multi-turn text tasks (docs/lm.md, "Multi-turn agents"): countdown with a calculator on scripted actions, its
reference solutions, the turns as SFT demonstrations, batched play, and the advantages of Flow-GRPO and of
whole-trajectory GRPO against hand-computed values."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.lm_agent import LMAgentGRPO, trajectory_advantages
from pgcli.algo.lm_base import kl_reference
from pgcli.algo.lm_grpo import ESTIMATORS, STD_EPS
from pgcli.algo.lm_rollout import CompletionBatch
from pgcli.config import CountdownToolEnvConfig, FlowGRPOConfig, GRPOConfig, LMModelConfig
from pgcli.lm.agent import CountdownCalculator, operate, reference_actions
from pgcli.lm.load import make_text_policy, make_text_task
from pgcli.lm.play import play
from pgcli.lm.tasks import Problem

QUESTION = Problem("3,5,7>22=", "3*5+7")


def calculator(**kw) -> CountdownCalculator:
    task = make_text_task(CountdownToolEnvConfig(**({"n_eval": 16} | kw)), LMModelConfig())
    assert isinstance(task, CountdownCalculator)
    return task


def test_a_scripted_solution_is_solved_in_two_turns():
    task = calculator()
    state, turns = task.play(QUESTION, ["3*5", "15+7", "1+1"])  # the third action comes after the end
    assert state.solved and state.turns == 2 and task.done(state)
    assert [t.transcript for t in turns] == ["3*5=15", "15+7=22"]
    assert [t.prompt for t in turns] == ["3,5,7>22=", "7,15>22="]
    assert task.correct(QUESTION, "3*5;15+7") and task.rewards([QUESTION], ["3*5;15+7"]) == [1.0]


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ("3*9", "missing_number"),
        ("5*5", "missing_number"),
        ("3-7", "negative"),
        ("3 x 5", "malformed"),
        ("03+5", "malformed"),
        ("", "malformed"),
        ("3+5+7", "malformed"),
    ],
)
def test_a_wrong_tool_call_spends_the_turn_and_changes_nothing_else(action: str, error: str):
    task = calculator()
    start = task.start(QUESTION)
    state, turn = task.step(start, action)
    assert turn.error == error and turn.result is None and turn.transcript == f"{action}=!{error}"
    assert state.numbers == start.numbers and state.turns == 1 and not state.solved
    # the next prompt shows the failed action (cut to an operation's 4 characters), then the same numbers
    assert state.prompt == f"{action[:4]}!3,5,7>22=" and task.start(Problem(state.prompt, "")).prompt == state.prompt
    after, turn = task.step(state, "3*5")
    assert turn.prompt == state.prompt and after.prompt == "7,15>22="  # a valid operation clears it


def test_a_cut_off_action_is_a_truncated_tool_error_even_when_it_would_run():
    task = calculator()
    state, turn = task.step(task.start(QUESTION), "3*5", truncated=True)
    assert turn.error == "truncated" and state.numbers == (3, 5, 7)


def test_the_turn_limit_ends_an_unsolved_episode():
    task = calculator(max_turns=3)
    state, turns = task.play(QUESTION, ["x", "y", "z", "3*5"])
    assert len(turns) == 3 and task.done(state) and not state.solved
    assert not task.well_formed(QUESTION, "x;y;z") and task.well_formed(QUESTION, "3*5;15+7")


def test_one_number_left_ends_the_episode():
    task = calculator()
    state, turns = task.play(QUESTION, ["3+5", "8+7", "1+1"])  # 15, not 22: nothing left to combine
    assert state.numbers == (15,) and task.done(state) and not state.solved and len(turns) == 2


def test_operate_is_the_calculator():
    assert operate((4, 4, 1), "4*4") == (16, "")
    assert operate((4, 1), "4-4") == (None, "missing_number")  # one 4 left
    assert operate((2, 2), "2-2") == (0, "")


def test_reference_actions_take_products_first_then_sums_then_differences():
    assert reference_actions("3+5*7-2") == ["5*7", "3+35", "38-2"]
    assert reference_actions("2-5+9") == ["2+9", "11-5"]  # never a negative intermediate
    assert reference_actions("7*4*2") == ["7*4", "28*2"]


def test_every_reference_solves_its_question_without_a_tool_error():
    task = calculator(n_numbers=4, max_turns=3)
    for problem in task.sample(np.random.default_rng(0), 300):
        state, turns = task.play(problem, task.reference_actions(problem))
        assert state.solved and not any(t.error for t in turns), (problem, turns)
        assert task.demonstration(problem) == ";".join(t.action for t in turns)
        assert all(len(t.prompt) <= task.puzzle.max_prompt_chars for t in turns)


def test_the_turn_task_demonstrates_the_reference_action_of_each_state():
    task = calculator()
    turns = task.turn_task()
    problems = turns.sample(np.random.default_rng(1), 400)
    for problem in problems:  # the action runs and its result leads on towards the target
        result, error = operate(task.start(problem).numbers, turns.demonstration(problem))
        assert error == "" and result is not None
    assert len({p.prompt.count(",") for p in problems}) == 2  # first turns (3 numbers) and second turns (2)
    assert turns.max_completion_len == task.max_completion_len


def test_a_held_out_question_never_starts_a_turn_demonstration():
    task = calculator()
    held_out = {p.prompt for p in task.eval_problems()}
    drawn = []
    rng = np.random.default_rng(2)
    for _ in range(300):  # the first turn of a demonstration is its question's prompt
        problem = task.turn_task().puzzle.draw(rng)
        if problem.prompt.count(",") == 2:
            drawn.append(problem.prompt)
    assert drawn and not set(drawn) & held_out


def test_play_keeps_every_turn_as_a_row_of_its_trajectory():
    task = calculator()
    policy = make_text_policy(task, LMModelConfig(d_model=32, d_ff=64, n_layers=1), torch.device("cpu"))
    problems = task.sample(np.random.default_rng(3), 6)
    episodes = play(
        task,
        policy,
        problems,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    rows = episodes.rows
    assert len(rows.trajectory) == sum(len(t) for t in episodes.turns) >= len(problems)
    for i, turns in enumerate(episodes.turns):
        mine = (rows.trajectory == i).nonzero().squeeze(1)
        prompts = [task.vocab.decode(rows.prompt_tokens[r][rows.prompt_mask[r]].tolist()) for r in mine.tolist()]
        actions = [task.vocab.decode(rows.tokens[r].tolist()) for r in mine.tolist()]
        assert prompts == [t.prompt for t in turns] and actions == [t.action for t in turns]
        assert task.done(episodes.states[i])


def two_question_batch() -> CompletionBatch:
    """G = 2 trajectories of 2 questions. Question 0: trajectory 0 solves in 2 turns, trajectory 1 fails in 3;
    question 1: trajectory 2 solves in 1 turn, trajectory 3 fails in 2. Rows are turns, in play's order (by round)."""
    trajectory = torch.tensor([0, 1, 2, 3, 0, 1, 3, 1])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])  # per trajectory
    mask = torch.ones(len(trajectory), 3)
    batch = CompletionBatch(
        prompt_tokens=torch.zeros(len(trajectory), 2, dtype=torch.long),
        prompt_mask=torch.ones(len(trajectory), 2, dtype=torch.bool),
        tokens=torch.zeros(len(trajectory), 3, dtype=torch.long),
        mask=mask,
        rewards=rewards[trajectory],
        correct=rewards[trajectory].bool(),
        group_ids=trajectory // 2,
        sample_seconds=0.0,
        trajectory=trajectory,
    )
    return batch


def test_flow_grpo_normalises_over_the_turns_of_each_question():
    batch = two_question_batch()
    advantages = ESTIMATORS[FlowGRPOConfig](FlowGRPOConfig(), batch, torch.zeros(8, 3), None)
    # question 0: turn rewards 1, 1, 0, 0, 0: mean 0.4, population std sqrt(0.24); question 1: 1, 0, 0: mean 1/3
    std0, std1 = 0.24**0.5, (2 / 9) ** 0.5
    solved0, failed0 = 0.6 / (std0 + STD_EPS), -0.4 / (std0 + STD_EPS)
    solved1, failed1 = (2 / 3) / (std1 + STD_EPS), -(1 / 3) / (std1 + STD_EPS)
    expected = torch.tensor([solved0, failed0, solved1, failed1, solved0, failed0, failed1, failed0])
    torch.testing.assert_close(advantages, expected[:, None].expand(8, 3))


def test_whole_trajectory_grpo_normalises_over_trajectories_and_gives_each_turn_its_trajectorys_advantage():
    batch = two_question_batch()
    advantages = trajectory_advantages(GRPOConfig(), batch, torch.zeros(8, 3), None)
    a = 0.5 / (0.5 + STD_EPS)  # each question: rewards 1 and 0, mean 0.5, population std 0.5
    expected = torch.tensor([a, -a, a, -a, a, -a, -a, -a])
    torch.testing.assert_close(advantages, expected[:, None].expand(8, 3))


class Recorder:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    def update(self, step, agent):
        return None

    def diverged(self, step, what):
        return RuntimeError(what)


def make_agent_trainer(algo: str) -> LMAgentGRPO:
    task = calculator()
    model = LMModelConfig(d_model=32, d_ff=64, n_layers=1)
    policy = make_text_policy(task, model, torch.device("cpu"))
    kw = {"group_size": 4, "n_groups": 2, "batch_size": 8, "learning_rate": 1e-3}
    cfg = FlowGRPOConfig(**kw) if algo == "flow_grpo" else GRPOConfig(**kw, n_iterations=1)
    return LMAgentGRPO(
        cfg,
        task=task,
        policy=policy,
        reference=kl_reference(cfg, policy, None),
        model=model,
        seed=0,
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize("algo", ["flow_grpo", "grpo"])
def test_learn_counts_turns_and_logs_the_multi_turn_metrics(algo: str):
    trainer = make_agent_trainer(algo)
    recorder = Recorder()
    steps = trainer.learn(20, recorder)  # type: ignore[arg-type]
    step, stats = recorder.logged[0]
    assert steps == trainer.steps == recorder.logged[-1][0] >= 20 and step >= 8  # 8 trajectories, >= 1 turn each
    assert 1.0 <= stats["rollout/turns_mean"] <= 4.0 and step == round(stats["rollout/turns_mean"] * 8)
    kinds = sum(stats[f"rollout/errors_{k}"] for k in ("malformed", "missing_number", "negative", "truncated"))
    assert stats["rollout/tool_error_rate"] == pytest.approx(kinds)
    assert {"train/policy_loss", "train/approx_kl", "rollout/accuracy"} <= set(stats)


def test_a_multi_turn_trainer_resumes_exactly(tmp_path: Path):
    straight = make_agent_trainer("flow_grpo")
    straight.learn(16, Recorder())  # type: ignore[arg-type]
    path = straight.save(tmp_path / "ckpt")
    straight.learn(48, Recorder())  # type: ignore[arg-type]
    torch.manual_seed(5)
    resumed = make_agent_trainer("flow_grpo")
    resumed.load(path)
    resumed.learn(48, Recorder())  # type: ignore[arg-type]
    assert resumed.steps == straight.steps
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_hugging_face_model_plays_the_task_in_its_own_tokens(tiny_hf_model: Path):
    from pgcli.config import HFModelConfig

    model = HFModelConfig(path=str(tiny_hf_model), max_new_tokens=6)
    task = make_text_task(CountdownToolEnvConfig(n_eval=16), model)
    assert isinstance(task, CountdownCalculator) and task.max_completion_len == 6
    policy = make_text_policy(task, model, torch.device("cpu"))
    episodes = play(
        task,
        policy,
        task.eval_problems()[:3],
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert all(task.done(state) for state in episodes.states)
    assert len(episodes.rows.trajectory) == sum(len(t) for t in episodes.turns)
    # a random model's actions are tool errors: each one is shown, cut to an operation's length, in the next prompt
    for turns in episodes.turns:
        for before, after in itertools.pairwise(turns):
            if before.error:
                assert after.prompt.startswith(before.action[: task.puzzle.max_answer_chars] + "!")
