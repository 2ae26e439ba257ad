"""``pgcli compare``'s x axis names what a step counts: environment steps, or on a text task sampled completions
(turns on a multi-turn task), demonstrations (SFT) or preference pairs (a reward model)."""

from __future__ import annotations

from pgcli.compare.report import steps_label


def test_a_text_panel_counts_what_its_runs_steps_count() -> None:
    assert steps_label("CartPole-v1", {"ppo"}) == "environment steps"
    assert steps_label("addition", {"grpo", "ppo_lm"}) == "sampled completions"
    assert steps_label("countdown_tool", {"flow_grpo"}) == "sampled turns"
    assert steps_label("addition", {"sft"}) == "demonstrations"
    assert steps_label("addition", {"grpo", "rm"}) == "preference pairs / sampled completions"
