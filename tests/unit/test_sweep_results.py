"""pgcli.sweeps.results: what an Optuna search leaves (best-so-far line, history points, importances, the re-run
command, the summary lines), and compare's trial parameters (pgcli.compare.groups.name_trial_params)."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from pgcli.compare.groups import RunCurve, make_groups
from pgcli.sweeps.results import (
    BASE_ATTR,
    MIN_TRIALS_FOR_IMPORTANCE,
    TrialPoint,
    best_overrides,
    best_so_far,
    history_figure,
    importances,
    rerun_command,
    save_results,
    summary_lines,
    trial_points,
)

optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")
FloatDistribution, CategoricalDistribution = (
    optuna.distributions.FloatDistribution,
    optuna.distributions.CategoricalDistribution,
)
TrialState = optuna.trial.TrialState


def test_best_so_far_follows_the_direction() -> None:
    assert best_so_far([3.0, 1.0, 5.0, 4.0], maximize=True) == [3.0, 3.0, 5.0, 5.0]
    assert best_so_far([3.0, 1.0, 5.0, 0.5], maximize=False) == [3.0, 1.0, 1.0, 0.5]
    assert best_so_far([], maximize=True) == []


def trial(number: int, state: object, value: float | None = None, **kwargs: object) -> object:
    t = optuna.trial.create_trial(
        state=state,
        value=value,
        params={"x": 0.1 * number},
        distributions={"x": FloatDistribution(0.0, 10.0)},
        **kwargs,
    )
    t.number = number
    return t


def test_history_points_mark_pruned_trials_and_skip_what_has_no_value() -> None:
    trials = [
        trial(2, TrialState.PRUNED, intermediate_values={128: -50.0, 256: -40.0}),  # at its last evaluation
        trial(0, TrialState.COMPLETE, 1.5),
        trial(1, TrialState.FAIL),
        trial(3, TrialState.PRUNED, user_attrs={"duplicate_of": 0}),  # a repeated sample: never ran
        trial(4, TrialState.PRUNED),  # pruned before its first evaluation: nothing to draw
    ]
    assert trial_points(trials) == [TrialPoint(0, 1.5, pruned=False), TrialPoint(2, -40.0, pruned=True)]

    fig = history_figure(trial_points(trials), maximize=True, title="Optuna study 's'")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "complete trial",
        "best so far (max)",
        "pruned (last evaluation reported)",
    ]
    assert ax.get_title() == "optimization history" and fig.get_suptitle() == "Optuna study 's'"


def test_the_rerun_command_is_one_quoted_line_without_credentials() -> None:
    command = rerun_command(
        ["tracking.uri=http://user:pw@host:5000", "experiment=my exp", "model.hidden_sizes=[64,64]"]
    )
    assert command == ("pgcli train tracking.uri=http://***@host:5000 'experiment=my exp' 'model.hidden_sizes=[64,64]'")
    assert shlex.split(command)[3] == "experiment=my exp"


def test_the_best_trial_is_rerun_with_its_own_sweeps_base_overrides() -> None:
    recorded = trial(3, TrialState.COMPLETE, 1.0, user_attrs={BASE_ATTR: ["env=pendulum", "n_seeds=2"]})
    assert best_overrides(recorded, ["env=cartpole"]) == ["env=pendulum", "n_seeds=2", "x=0.30000000000000004"]
    older = trial(0, TrialState.COMPLETE, 1.0)  # ran before trials recorded their base: this sweep's
    assert best_overrides(older, ["env=cartpole"]) == ["env=cartpole", "x=0.0"]


def study_of(n_complete: int) -> object:
    """A study whose objective is 10 * x (y is noise): x is the important parameter."""
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(0)
    distributions = {"x": FloatDistribution(0.0, 1.0), "y": CategoricalDistribution([1, 2])}
    for i in range(n_complete):
        x, y = float(rng.uniform()), int(rng.integers(1, 3))
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x, "y": y}, distributions=distributions, value=10 * x, user_attrs={BASE_ATTR: ["algo=ppo"]}
            )
        )
        if i == 0:
            study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    return study


def test_importance_needs_enough_complete_trials_and_says_why() -> None:
    found, reason = importances(study_of(MIN_TRIALS_FOR_IMPORTANCE - 1), MIN_TRIALS_FOR_IMPORTANCE - 1)
    assert found is None and reason == f"fANOVA needs 5 complete trials, the study has {MIN_TRIALS_FOR_IMPORTANCE - 1}"
    found, reason = importances(study_of(12), 12)
    assert found is not None and not reason
    assert list(found) == ["x", "y"] and sum(found.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("n_complete", [2, 8])
def test_save_results_writes_the_plots_it_can_and_the_summary_names_them(tmp_path: Path, n_complete: int) -> None:
    results = save_results(study_of(n_complete), ["algo=ppo"], tmp_path)
    drawn = ["optuna_history.png"] + (["optuna_importance.png"] if n_complete >= MIN_TRIALS_FOR_IMPORTANCE else [])
    assert results["plots"] == drawn and sorted(p.name for p in tmp_path.glob("*.png")) == drawn
    assert (tmp_path / "optimization_results.yaml").is_file()
    assert results["n_complete"] == n_complete and results["n_failed"] == 1
    lines = summary_lines(results, tmp_path)
    best = results["best_params"]
    assert lines[0] == (
        f"pgcli: best trial {results['best_trial']} of study '{results['study_name']}': value "
        f"{results['best_value']:.2f} with x={best['x']:.4g} y={best['y']}"
    )
    assert lines[1] == f"pgcli: re-run the best trial: pgcli train algo=ppo x={best['x']} y={best['y']}"
    assert lines[2] == f"pgcli: Optuna plots: {tmp_path / 'optuna_history.png'}" + (
        ", optuna_importance.png" if len(drawn) == 2 else ""
    )
    assert lines[3:] == (
        [] if len(drawn) == 2 else ["pgcli: no importance plot: fANOVA needs 5 complete trials, the study has 2"]
    )


def test_no_complete_trial_has_no_best_and_no_crash(tmp_path: Path) -> None:
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    results = save_results(study, [], tmp_path)
    assert results["plots"] == [] and "best_params" not in results
    assert summary_lines(results, tmp_path) == [
        f"pgcli: no trial of study '{study.study_name}' completed: no best trial to re-run",
        "pgcli: no importance plot: fANOVA needs 5 complete trials, the study has 0",
    ]


def run(trial_number: str, seed: int, **params: str) -> RunCurve:
    config = {"algo": "ppo", "env.id": "Pendulum-v1", "seed": str(seed), "total_steps": "128", **params}
    return RunCurve(f"r{trial_number}{seed}", config, {"trial": trial_number}, np.zeros(1), np.zeros(1))


def test_compare_names_each_trials_sampled_values_and_orders_trials_by_number() -> None:
    runs = [
        run(str(n), seed, **{"algo.gamma": g, "algo.learning_rate": lr, "algo.n_epochs": "10"})
        for n, g, lr in ((2, "0.99", "0.000312345678"), (10, "0.9", "0.001"))
        for seed in (0, 1)
    ]
    groups, notes = make_groups(runs, ["algo", "env_id", "trial"])
    assert not notes
    assert [(g.key[2], g.setting, len(g.runs)) for g in groups] == [
        ("2", {"algo.gamma": "0.99", "algo.learning_rate": "0.0003123"}, 2),
        ("10", {"algo.gamma": "0.9", "algo.learning_rate": "0.001"}, 2),
    ]
    # a key of its own (--group-by) is its column, not repeated in the config
    groups, _ = make_groups(runs, ["algo", "env_id", "algo.gamma", "trial"])
    assert [g.setting for g in groups] == [{"algo.learning_rate": "0.001"}, {"algo.learning_rate": "0.0003123"}]
