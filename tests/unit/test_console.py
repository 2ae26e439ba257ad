"""The end-of-run summary: the best evaluation is reported only when it beats the final one, with its directory
only when it was saved."""

from dataclasses import replace
from pathlib import Path

from pgcli.config.compose import compose_train_config
from pgcli.training.console import print_budget_note, print_summary
from pgcli.training.summary import TrainSummary


def summary(tmp_path: Path, *, final: float, best: float) -> TrainSummary:
    return TrainSummary(
        run_id=None,
        steps=1000,
        final_return=final,
        final_return_std=0.0,
        wall_time_s=1.0,
        output_dir=tmp_path,
        tracking_uri=None,
        reward_threshold=None,
        best_return=best,
        best_step=500,
    )


def test_the_best_evaluation_is_reported_when_it_beats_the_final_one(tmp_path: Path, capsys):
    print_summary(summary(tmp_path, final=10.0, best=10.0), algo="ppo", env="cartpole", seed=0)
    assert "best eval return" not in capsys.readouterr().out

    print_summary(summary(tmp_path, final=10.0, best=30.0), algo="ppo", env="cartpole", seed=0)
    line = next(x for x in capsys.readouterr().out.splitlines() if "best eval return" in x)
    assert line.strip() == "best eval return   30.0 at step 500"  # eval.save_best=false: no directory to show

    (tmp_path / "best_model").mkdir()
    print_summary(summary(tmp_path, final=10.0, best=30.0), algo="ppo", env="cartpole", seed=0)
    line = next(x for x in capsys.readouterr().out.splitlines() if "best eval return" in x)
    assert line.endswith(f"at step 500 ({tmp_path / 'best_model'})")


def test_the_rollout_rounding_note_names_the_option_that_avoids_it(capsys):
    overrides = ["algo=vpg", "env=cartpole", "total_steps=300", "algo.n_steps=64", "env.n_envs=2", "tracking=off"]
    print_budget_note(compose_train_config(overrides), overrides)
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith("pgcli: note: total_steps=300 is not a whole number of rollouts")
    assert "training stops at 384 env steps" in note and "a multiple of 128 (e.g. total_steps=256 or 384)" in note

    overrides = ["algo=vpg", "env=cartpole", "total_steps=384", "algo.n_steps=64", "env.n_envs=2", "tracking=off"]
    print_budget_note(compose_train_config(overrides), overrides)
    assert capsys.readouterr().err == ""


def test_a_presets_own_budget_gets_no_rounding_note_but_a_typed_rollout_size_does(capsys):
    # ppo_cartpole: the zoo's total_steps=100000 over rollouts of 32 x 8 = 256 steps, as the zoo's own runs overshoot
    cfg = compose_train_config(["tracking=off"])
    assert cfg.planned_steps == 100_096
    print_budget_note(cfg, ["tracking=off"])
    assert capsys.readouterr().err == ""
    # the same budget with a rollout size typed on the command line: the note names it
    overrides = ["algo.n_steps=48", "tracking=off"]
    print_budget_note(compose_train_config(overrides), overrides)
    assert "pgcli: note: total_steps=100000 is not a whole number of rollouts" in capsys.readouterr().err


def text_summary(tmp_path: Path, metrics: dict[str, float], start: dict[str, float] | None = None) -> TrainSummary:
    return TrainSummary(
        run_id=None,
        steps=64,
        final_return=0.1,
        final_return_std=0.2,
        wall_time_s=1.0,
        output_dir=tmp_path,
        tracking_uri=None,
        reward_threshold=None,
        final_metrics=metrics,
        step_unit="sampled completions",
        start_metrics=start or {},
        final_n=256,
    )


def test_a_text_summary_names_its_held_out_metrics_in_one_column(tmp_path: Path, capsys):
    metrics = {"eval/accuracy": 0.055, "eval/proxy_reward_sampled_mean": 0.5, "eval/kl_ref": -1e-9}
    print_summary(text_summary(tmp_path, metrics), algo="grpo", env="addition", seed=0)
    out = capsys.readouterr().out
    assert "final eval return" not in out and "0.1 ± 0.2" not in out  # an accuracy is not an episode return
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    column = next(line for line in lines if "proxy_reward_sampled_mean" in line).index("0.500")
    assert all(line[column - 1] == " " and line[column] != " " for line in lines), out  # long keys keep the column
    assert next(line for line in lines if "kl_ref" in line).endswith(" 0.000")  # not -0.000
    assert next(line for line in lines if "final evaluation" in line).endswith(" 256 held-out problems")


def test_an_rlhf_summary_names_gold_and_proxy(tmp_path: Path, capsys):
    metrics = {"eval/accuracy": 0.043, "eval/proxy_reward_mean": 0.653, "eval/kl_ref": 0.2}
    start = {"eval/accuracy": 0.055, "eval/proxy_reward_mean": 0.41, "eval/kl_ref": 0.0}
    print_summary(text_summary(tmp_path, metrics, start), algo="grpo", env="addition", seed=0)
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "gold (task checker)   0.055 -> 0.043" in lines
    assert "proxy (reward model)  0.410 -> 0.653" in lines
    assert lines.index("gold (task checker)   0.055 -> 0.043") < lines.index("proxy (reward model)  0.410 -> 0.653")


def test_a_reward_models_pairwise_accuracy_is_not_an_eval_return(tmp_path: Path, capsys):
    summary = text_summary(tmp_path, {"eval/pairwise_accuracy": 0.9, "eval/reward_margin": 1.5})
    summary = replace(summary, step_unit="preference pairs", best_return=0.95, best_step=32)
    print_summary(summary, algo="rm", env="addition", seed=0)
    out = capsys.readouterr().out
    assert "eval return" not in out
    assert "  final evaluation   256 held-out pairs" in out and "  pairwise_accuracy  0.900" in out
    assert "  best eval          0.950 (pairwise accuracy) at step 32" in out
