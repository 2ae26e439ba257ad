"""pgcli.sweeps.study: the search space, the study's budget, the sweeper's settings and a trial's reports through
storage."""

from __future__ import annotations

import pytest

from pgcli.errors import ConfigError
from pgcli.sweeps.study import (
    TRIAL_ENV,
    OptunaSearchConfig,
    SearchSpace,
    TrialLink,
    TrialPruned,
    check_budget,
    make_pruner,
    make_sampler,
)

optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402


def test_hydra_sweep_syntax_becomes_optuna_distributions() -> None:
    space = SearchSpace.parse(
        {"algo.learning_rate": "tag(log, interval(1e-4, 3e-3))", "algo.gamma": "choice(0.9, 0.95)"},
        [
            "algo.n_steps=range(32,129,32)",
            "algo.n_epochs=int(interval(1,10))",
            "algo.clip_range=interval(0.1,0.3)",
            "total_steps=500",
            "env=pendulum",
        ],
    )
    d = space.distributions
    assert d["algo.learning_rate"] == FloatDistribution(1e-4, 3e-3, log=True)
    assert d["algo.gamma"] == CategoricalDistribution([0.9, 0.95])
    assert d["algo.n_steps"] == IntDistribution(32, 128, step=32)  # Hydra's range excludes its stop: 32..128
    assert d["algo.n_epochs"] == IntDistribution(1, 10) and d["algo.clip_range"] == FloatDistribution(0.1, 0.3)
    assert space.fixed == ["total_steps=500", "env=pendulum"]  # passed to every trial as they are
    assert space.size() is None  # continuous dimensions
    assert space.trial_overrides({"algo.gamma": 0.9}) == ["total_steps=500", "env=pendulum", "algo.gamma=0.9"]


def test_a_discrete_space_counts_its_points() -> None:
    space = SearchSpace.parse({"algo.gamma": "choice(0.9, 0.95, 0.99)", "algo.n_steps": "range(32, 97, 32)"}, [])
    assert space.size() == 9 and space.first_point() == {"algo.gamma": 0.9, "algo.n_steps": 32}


@pytest.mark.parametrize(
    ("params", "arguments", "message"),
    [
        ({"total_steps": "choice(1000, 2000)"}, [], "sets total_steps: that is the study's budget"),
        ({"n_seeds": 3}, [], "sets n_seeds"),  # a fixed value here would apply per trial, not to the study
        ({}, ["eval.episodes=choice(5,10)"], "sets eval.episodes"),
        ({}, ["seed=0"], "no search space"),
        ({"algo.learning_rate": "tag(log, interval(0, 1e-3))"}, [], "log-scaled"),
        ({"algo.gamma": "glob(*)"}, [], "not supported"),
    ],
)
def test_bad_search_spaces_are_one_line_errors(params: dict, arguments: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SearchSpace.parse(params, arguments)


def test_a_fixed_budget_on_the_command_line_is_fine() -> None:
    assert SearchSpace.parse({"algo.gamma": "choice(0.9, 0.99)"}, ["total_steps=500"]).fixed == ["total_steps=500"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pruner": "medain"}, "hydra.sweeper.pruner must be one of none, median, hyperband"),
        ({"pruner": "median"}, "needs a storage"),
        ({"sampler": "cmaes"}, "hydra.sweeper.sampler must be one of tpe, random"),
        ({"direction": "up"}, "hydra.sweeper.direction"),
        ({"n_jobs": 0}, "hydra.sweeper.n_jobs must be >= 1"),
        ({"max_failure_rate": 2.0}, "max_failure_rate must be in"),
    ],
)
def test_bad_sweeper_settings_are_one_line_errors(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OptunaSearchConfig(**settings)


def test_a_study_is_bound_to_the_budget_of_its_first_sweep() -> None:
    study = optuna.create_study(study_name="s")
    check_budget(study, {"total_steps": 5000, "n_seeds": 2, "eval.episodes": 10}, None)
    assert study.user_attrs["budget"] == {"total_steps": 5000, "n_seeds": 2, "eval.episodes": 10}
    check_budget(study, {"total_steps": 5000, "n_seeds": 2, "eval.episodes": 10}, None)  # same budget: resumes
    with pytest.raises(ConfigError) as err:
        check_budget(study, {"total_steps": 9000, "n_seeds": 2, "eval.episodes": 10}, "sqlite:///x.db")
    msg = str(err.value)
    assert "\n" not in msg and "total_steps=5000 n_seeds=2" in msg and "total_steps=9000 n_seeds=2" in msg
    assert "hydra.sweeper.study_name=s_2" in msg


def test_a_resumed_studys_sampler_draws_new_points() -> None:
    # The sampler of a sweep is seeded with seed + the trials already in the study: the fixed seed of the former
    # preset (sampler.seed: 0) replayed the same points on every resume.
    cfg = OptunaSearchConfig(sampler="random", seed=0)
    dist = {"x": FloatDistribution(0.0, 1.0)}

    def first_point(n_existing: int) -> float:
        study = optuna.create_study(sampler=make_sampler(cfg, n_existing))
        return study.ask(dist).params["x"]

    assert first_point(0) == first_point(0)  # seeded: reproducible
    assert first_point(3) != first_point(0)


def test_pruners_take_their_resource_in_env_steps() -> None:
    cfg = OptunaSearchConfig(pruner="median", storage="sqlite://", pruner_warmup_steps=7)
    median = make_pruner(cfg, eval_every=100, max_resource=1000)
    assert isinstance(median, optuna.pruners.MedianPruner) and median._n_warmup_steps == 7
    band = make_pruner(OptunaSearchConfig(pruner="hyperband", storage="sqlite://"), eval_every=100, max_resource=1000)
    assert isinstance(band, optuna.pruners.HyperbandPruner)
    assert band._min_resource == 100 and band._max_resource == 1000  # first rung: one evaluation
    assert isinstance(make_pruner(OptunaSearchConfig(), eval_every=0, max_resource=1), optuna.pruners.NopPruner)


def test_a_job_reports_through_the_storage_and_is_pruned(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweeper's side: a study in SQLite with one completed trial (evaluation 100 at steps 10 and 20) and running
    # ones. The job's side opens the study by name from the variables the sweeper set for it, and reports.
    from omegaconf import OmegaConf

    url = f"sqlite:///{tmp_path}/optuna.db"
    cfg = OptunaSearchConfig(storage=url, pruner="median", pruner_startup_trials=1)
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    done = study.ask()
    done.report(100.0, 10)
    done.report(100.0, 20)
    study.tell(done, 100.0)

    def link_to(trial: optuna.trial.Trial) -> TrialLink:
        monkeypatch.setenv(TRIAL_ENV, str(trial.number))
        monkeypatch.setenv("PGCLI_OPTUNA_STUDY", "s")
        monkeypatch.setenv("PGCLI_OPTUNA_TRIAL_ID", str(trial._trial_id))
        link = TrialLink.from_job(OmegaConf.structured(cfg), n_seeds=2, total_steps=10, eval_every=10)
        assert link is not None and link.number == trial.number and link.max_step == 20
        return link

    good, bad, last = study.ask(), study.ask(), study.ask()
    report_good = link_to(good).reporter(offset=0)
    assert report_good is not None
    report_good(10, 150.0)  # above the completed trial's 100 at step 10: goes on

    report_bad = link_to(bad).reporter(offset=0)
    assert report_bad is not None
    with pytest.raises(TrialPruned) as pruned:
        report_bad(10, 50.0)
    assert pruned.value.trial == bad.number and pruned.value.step == 10 and "pruned at step 10" in str(pruned.value)

    # seed 1 of 2 (offset 10 = one seed's total_steps): its final evaluation is the trial's last, never pruned there
    report_last = link_to(last).reporter(offset=10)
    assert report_last is not None
    report_last(10, 50.0)

    stored = {t.number: t.intermediate_values for t in optuna.load_study(study_name="s", storage=url).trials}
    assert stored[good.number] == {10: 150.0} and stored[bad.number] == {10: 50.0} and stored[last.number] == {20: 50.0}


def test_no_trial_outside_a_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    monkeypatch.delenv(TRIAL_ENV, raising=False)
    assert (
        TrialLink.from_job(OmegaConf.structured(OptunaSearchConfig()), n_seeds=1, total_steps=1, eval_every=1) is None
    )
