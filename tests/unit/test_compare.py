"""pgcli.commands.compare: IQM, bootstrap bands and step grids against hand-computed cases; grouping that never averages
different budgets, env ids, configs or a seed twice; `pgcli compare` end to end on synthetic metric histories logged
with MlflowClient into a real temporary SQLite store; its error paths as real `pgcli compare` subprocesses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pgcli.commands.compare import main
from pgcli.compare.groups import Group, RunCurve, check_keys, lookup, make_groups, mixed_rewards, reward_of
from pgcli.compare.report import figure, report_stem, table_rows
from pgcli.compare.stats import aggregate, bootstrap_ci, common_grid, curves_on_grid, iqm, mean_path
from pgcli.errors import ConfigError
from tests.conftest import Store


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([1, 2, 3, 100]) == 2.5  # drop 1 and 100
    assert iqm([7, 1, 100, 2, 3, 4, 5, 6]) == 4.5  # sorted 1..7,100: drop two each side -> mean(3, 4, 5, 6)
    assert iqm([1, 2, 3]) == 2.0  # int(0.75) = 0 cut: plain mean
    assert iqm([5.0]) == 5.0
    with pytest.raises(ValueError):
        iqm([])


def test_iqm_matches_scipy_trim_mean() -> None:
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(3).normal(size=11)
    assert iqm(x) == pytest.approx(stats.trim_mean(x, 0.25))


def test_bootstrap_band_of_three_runs_spans_min_to_max() -> None:
    # Three runs: the resample "all the lowest run" has probability 1/27 = 3.7% > 2.5%, so the 95% percentile band of
    # the mean has exactly the lowest and highest run as its edges; its centre stays the mean.
    runs = np.array([[0.0, 10.0], [3.0, 40.0], [6.0, 70.0]])  # [n_runs=3, n_points=2]
    lo, hi = bootstrap_ci(runs, n_boot=4000)
    np.testing.assert_allclose(lo, [0.0, 10.0])
    np.testing.assert_allclose(hi, [6.0, 70.0])


def test_bootstrap_band_narrows_around_the_mean_with_many_runs() -> None:
    runs = np.arange(40, dtype=float)  # mean 19.5, standard error ~1.83
    lo, hi = bootstrap_ci(runs, n_boot=4000)
    assert 19.5 - 2.5 * 1.83 < lo < 19.5 < hi < 19.5 + 2.5 * 1.83
    one_lo, one_hi = bootstrap_ci(np.array([[4.0, 5.0]]))
    np.testing.assert_array_equal(one_lo, [4.0, 5.0])  # one run: no spread
    np.testing.assert_array_equal(one_hi, [4.0, 5.0])
    with pytest.raises(ValueError):
        bootstrap_ci(np.zeros((0, 3)))


def test_common_grid_keeps_shared_steps_and_interpolates_the_rest() -> None:
    a = (np.array([0.0, 100.0, 200.0]), np.array([0.0, 10.0, 20.0]))
    b = (np.array([50.0, 150.0, 250.0]), np.array([5.0, 15.0, 25.0]))
    grid = common_grid([a, b])
    np.testing.assert_array_equal(grid, [50.0, 100.0, 150.0, 200.0])  # only where both runs have data
    np.testing.assert_allclose(curves_on_grid([a, b], grid), [[5, 10, 15, 20], [5, 10, 15, 20]])
    same = common_grid([a, a])
    np.testing.assert_array_equal(same, a[0])


def test_aggregate_final_return_stats() -> None:
    steps = np.array([0.0, 100.0, 200.0])
    curves = [(steps, np.array([0.0, 0.0, f])) for f in (1.0, 2.0, 3.0, 100.0)]
    s = aggregate(curves)
    assert s.n_runs == 4 and s.final_mean == 26.5 and s.final_iqm == 2.5
    assert s.final_std == pytest.approx(np.std([1, 2, 3, 100], ddof=1))
    np.testing.assert_allclose(s.curve_mean, [0.0, 0.0, 26.5])
    assert s.final_ci is not None and s.final_ci[0] <= 26.5 <= s.final_ci[1]
    assert s.curve_lo is not None and s.curve_hi is not None
    np.testing.assert_allclose([s.curve_lo[-1], s.curve_hi[-1]], s.final_ci)


def test_the_table_keeps_small_scores_visible_and_returns_at_one_decimal() -> None:
    steps = np.array([0.0, 100.0])
    accuracy = aggregate([(steps, np.array([0.0, a])) for a in (0.012, 0.020, 0.031)])  # text tasks' eval/accuracy
    returns = aggregate([(steps, np.array([0.0, r])) for r in (480.04, 500.0, 500.0)])
    groups = [Group(("grpo", "addition"), "1024"), Group(("ppo", "CartPole-v1"), "100000")]
    acc_row, ret_row = table_rows(groups, [accuracy, returns], with_setting=False)
    assert acc_row[4] == "0.021 ± 0.010" and acc_row[5] == "0.021"  # not "0.0 ± 0.0"; std over seeds, ddof 1
    assert ret_row[4] == "493.3 ± 11.5" and ret_row[5] == "493.3"


def test_one_run_has_no_spread_no_ci_and_no_band() -> None:
    s = aggregate([(np.array([0.0, 100.0]), np.array([1.0, 5.0]))])
    assert s.n_runs == 1 and s.final_mean == 5.0 and s.final_iqm == 5.0
    assert s.final_std is None and s.final_ci is None  # not "± 0.0" and a zero-width interval
    assert s.curve_lo is None and s.curve_hi is None
    np.testing.assert_array_equal(s.curve_mean, [1.0, 5.0])


def test_runs_without_common_steps_keep_their_finals_but_get_no_curve() -> None:
    early = (np.array([0.0, 100.0]), np.array([1.0, 2.0]))
    late = (np.array([500.0, 600.0]), np.array([3.0, 4.0]))
    s = aggregate([early, late])
    assert s.steps.size == 0 and s.curve_lo is None
    assert s.final_mean == 3.0


def test_mean_path_averages_x_and_y_at_each_common_step() -> None:
    # run a evaluated at 0, 10, 20; run b at 0, 10, 20, 30: the common steps are 0, 10, 20
    a = (np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 3.0]), np.array([0.5, 0.7, 0.4]))
    b = (np.array([0.0, 10.0, 20.0, 30.0]), np.array([0.0, 2.0, 4.0, 9.0]), np.array([0.4, 0.6, 0.2, 0.0]))
    steps, x_mean, y_mean = mean_path([a, b])
    assert (
        np.allclose(steps, [0, 10, 20])
        and np.allclose(x_mean, [0, 1.5, 3.5])
        and np.allclose(y_mean, [0.45, 0.65, 0.3])
    )


def test_against_a_metric_the_plot_draws_each_run_and_the_mean_path_without_a_band() -> None:
    from matplotlib.collections import PolyCollection

    runs = [
        RunCurve(
            f"r{seed}",
            {"algo": "ppo_lm", "env.id": "addition", "seed": str(seed), "total_steps": "20"},
            {"algo": "ppo_lm", "env_id": "addition", "seed": str(seed)},
            np.array([0.0, 10.0, 20.0]),
            np.array(acc),
            np.array(kl),
        )
        for seed, (kl, acc) in enumerate([([0.0, 1.0, 3.0], [0.5, 0.7, 0.4]), ([0.0, 2.0, 4.0], [0.4, 0.6, 0.2])])
    ]
    keys = ["algo", "env_id"]
    groups, _ = make_groups(runs, keys)
    stats = [aggregate([(r.steps, r.values) for r in g.runs]) for g in groups]
    fig = figure(groups, stats, keys, "eval/accuracy", x="eval/kl_ref")
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_xlabel() == "eval/kl_ref" and ax.get_ylabel() == "eval/accuracy"
    mean, *per_run = ax.get_lines()
    assert np.allclose(mean.get_xdata(), [0, 1.5, 3.5]) and np.allclose(mean.get_ydata(), [0.45, 0.65, 0.3])
    assert [list(line.get_xdata()) for line in per_run] == [[0, 1, 3], [0, 2, 4]]
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)  # no band against a metric


def curve(
    run_id: str, *, seed: int | None, steps: int = 1000, algo: str = "ppo", env_id: str = "CartPole-v1", **params: str
) -> RunCurve:
    """A synthetic run: params as pgcli logs them (flattened config), tags as pgcli sets them."""
    p = {"algo": algo, "env.id": env_id, "total_steps": str(steps), **params}
    t = {"algo": algo, "env_id": env_id}
    if seed is not None:
        p["seed"] = t["seed"] = str(seed)
    return RunCurve(run_id, p, t, np.array([0.0, float(steps)]), np.array([0.0, 1.0]))


def test_lookup_reads_env_id_from_its_tag_then_the_config() -> None:
    tagged = curve("a", seed=0, env_id="Acrobot-v1")
    untagged = RunCurve("b", {"env.id": "Pendulum-v1"}, {}, np.zeros(1), np.zeros(1))
    assert lookup(tagged, "env_id") == "Acrobot-v1" and lookup(untagged, "env_id") == "Pendulum-v1"
    assert lookup(tagged, "algo.learning_rate") == "?"
    assert lookup(RunCurve("c", {}, {"trial": "3"}, np.zeros(1), np.zeros(1)), "trial") == "3"
    assert lookup(tagged, "trial") == "-"  # not an Optuna trial


def test_a_run_s_reward_is_the_task_s_a_reward_model_s_pairs_or_a_reward_model_s_score() -> None:
    task = curve("t", seed=0, algo="grpo", env_id="addition")
    pairs = curve("p", seed=0, algo="rm", env_id="addition")
    by_id = curve("i", seed=0, algo="ppo_lm", env_id="addition", **{"env.reward": "rm:1f2e3d4c"})
    by_id.tags["reward_model_run_id"] = "1f2e3d4c5b6a79880011223344556677"
    by_dir = curve("d", seed=0, algo="grpo", env_id="addition", **{"env.reward": "rm:/runs/rm-addition-s0/"})
    assert [reward_of(r) for r in (task, pairs, by_id, by_dir)] == [
        "task",
        "pairwise accuracy",
        "rm:1f2e3d4c",
        "rm:rm-addition-s0",
    ]
    assert lookup(by_id, "reward") == "rm:1f2e3d4c"  # --group-by reward
    assert mixed_rewards([task, curve("t2", seed=1, algo="ppo", env_id="addition")], "eval/return_mean") is None
    assert mixed_rewards([task, by_id], "eval/accuracy") is None  # the checker's verdict whatever the reward
    note = mixed_rewards([task, by_id, pairs], "rollout/reward_mean")
    assert note is not None and note.startswith("rollout/reward_mean is a different score per reward")


def test_a_report_is_named_by_its_metric_and_x() -> None:
    assert report_stem("eval/return_mean") == "compare-eval_return_mean"
    assert report_stem("eval/accuracy", "eval/kl_ref") == "compare-eval_accuracy-vs-eval_kl_ref"


def test_sixteen_groups_keep_their_legend_inside_the_figure_below_the_axes() -> None:
    runs = [
        curve(f"r{i}", seed=0, algo="ppo_lm", env_id="addition", **{"algo.beta": f"{0.001 * (i + 1):.3f}"})
        for i in range(16)
    ]
    runs.append(curve("c", seed=0))  # a second panel with one group
    keys = ["algo", "env_id", "algo.beta"]
    groups, _ = make_groups(runs, keys)
    stats = [aggregate([(r.steps, r.values) for r in g.runs]) for g in groups]
    fig = figure(groups, stats, keys, "eval/return_mean", title="pgcli compare: 17 runs in 17 group(s)")
    fig.canvas.draw()
    canvas = fig.bbox
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent()
        assert canvas.x0 <= legend.x0 and legend.x1 <= canvas.x1 and canvas.y0 <= legend.y0, (legend, canvas)
        assert legend.y1 < ax.get_window_extent().y0  # below the axes, not over the curves
    addition = next(ax for ax in fig.axes if ax.get_title() == "addition")
    colours = [tuple(line.get_color()) for line in addition.get_lines()]
    assert len(set(colours)) == 16  # no colour twice in one legend
    assert fig.get_size_inches()[1] > 4.2 + 16 * 0.2


def test_groups_split_budgets_and_env_ids_and_say_so() -> None:
    runs = [curve(f"r{i}", seed=i % 3, steps=steps) for i, steps in enumerate([5000, 5000, 5000, 3000, 3000])]
    runs.append(curve("acro", seed=0, env_id="Acrobot-v1"))
    groups, notes = make_groups(runs, ["algo", "env_id"])
    assert [(g.key, g.budget, [r.run_id for r in g.runs]) for g in groups] == [
        (("ppo", "Acrobot-v1"), "1000", ["acro"]),
        (("ppo", "CartPole-v1"), "3000", ["r3", "r4"]),
        (("ppo", "CartPole-v1"), "5000", ["r0", "r1", "r2"]),
    ]
    assert notes == [
        "split ppo | CartPole-v1: runs of different budgets (2 x 3000, 3 x 5000 env steps) are not averaged"
    ]


def test_a_resumed_run_is_grouped_by_the_budget_it_was_resumed_to() -> None:
    # resumed from 3000 to 5000 steps: its params (total_steps, planned_steps) keep 3000, its total_steps tag says 5000
    resumed = curve("resumed", seed=0, steps=3000, planned_steps="3072")
    resumed.tags["total_steps"] = "5000"
    runs = [resumed, curve("s1", seed=1, steps=5000, planned_steps="5120")]
    (group,), notes = make_groups(runs, ["algo", "env_id"])
    assert group.budget == "5000" and [r.run_id for r in group.runs] == ["resumed", "s1"] and not notes
    assert lookup(resumed, "total_steps") == "5000"


def test_a_group_by_key_no_run_has_is_an_error_naming_the_keys() -> None:
    runs = [curve("a", seed=0, **{"algo.learning_rate": "0.1"}), curve("b", seed=1)]
    runs[1].tags["device"] = "cpu"
    check_keys(runs, ["algo.learning_rate", "seed", "total_steps", "env_id", "device"])  # one run with it is enough
    with pytest.raises(ConfigError) as raised:
        check_keys(runs, ["learning_rate"])
    message = str(raised.value)
    assert message.startswith("--group-by: no compared run has 'learning_rate'; did you mean algo.learning_rate? ")
    assert message.endswith("keys: algo, algo.learning_rate, env.id, env_id, seed, total_steps")
    with pytest.raises(ConfigError, match="no compared run has 'trial'; keys: algo, "):
        check_keys(runs, ["trial"])


def test_a_seed_twice_in_a_group_counts_once_the_latest_run() -> None:
    runs = [curve("old0", seed=0), curve("s1", seed=1), curve("new0", seed=0), curve("x", seed=None)]
    (group,), notes = make_groups(runs, ["algo", "env_id"])
    assert sorted(r.run_id for r in group.runs) == ["new0", "s1", "x"]  # a run without a seed is not a duplicate
    assert len(notes) == 1 and "duplicate seeds in ppo | CartPole-v1 | 1000 steps: seed 0 x2" in notes[0]
    assert "left out 1 older run(s)" in notes[0]


def test_runs_that_differ_in_config_are_separate_experiments() -> None:
    runs = [
        curve(f"lr{lr}-s{seed}", seed=seed, **{"algo.learning_rate": lr}) for lr in ("0.1", "0.01") for seed in (0, 1)
    ]
    runs += [curve("gpu", seed=2, **{"algo.learning_rate": "0.1", "hardware.device": "cuda", "progress": "False"})]
    groups, notes = make_groups(runs, ["algo", "env_id"])
    assert [(g.setting, sorted(r.run_id for r in g.runs)) for g in groups] == [
        ({"algo.learning_rate": "0.01"}, ["lr0.01-s0", "lr0.01-s1"]),
        ({"algo.learning_rate": "0.1"}, ["gpu", "lr0.1-s0", "lr0.1-s1"]),  # device and progress do not split
    ]
    assert notes == [
        "split ppo | CartPole-v1 | 1000 steps: runs differ in algo.learning_rate, so they are 2 experiments, not "
        "seeds of one (add the key to --group-by to name it in the table)"
    ]
    # named with --group-by, the key is a column and nothing needs splitting
    groups, notes = make_groups(runs, ["algo", "env_id", "algo.learning_rate"])
    assert [g.key for g in groups] == [("ppo", "CartPole-v1", "0.01"), ("ppo", "CartPole-v1", "0.1")] and not notes


# --------------------------------------------------------------------------------------------------------------------
# pgcli compare on synthetic runs in a real MLflow SQLite store
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


class RunLog:
    """Logs runs the way `pgcli train` does (params: flattened config; tags: algo, env_id, seed), one after another."""

    def __init__(self, store: Store, experiment: str) -> None:
        self.client = store.client()
        self.exp = self.client.create_experiment(experiment, artifact_location=(store.root / "artifacts").as_uri())
        self.clock = 1_700_000_000_000

    def run(
        self,
        algo: str,
        env_id: str,
        seed: int,
        final: float,
        *,
        total_steps: int = 5000,
        status: str = "FINISHED",
        parent: str | None = None,
        tags: dict[str, str] | None = None,
        **params: str,
    ) -> str:
        from mlflow.entities import Metric, Param, RunTag

        self.clock += 1000
        run_tags = {"algo": algo, "env_id": env_id, "seed": str(seed), **(tags or {})}
        if parent:
            run_tags["mlflow.parentRunId"] = parent
        run_id = self.client.create_run(self.exp, start_time=self.clock, tags=run_tags).info.run_id
        config = {"algo": algo, "env.id": env_id, "seed": str(seed), "total_steps": str(total_steps), **params}
        # eval every total_steps / 2: 0 at step 0, final / 2 half-way, final at the end
        points = [(0, 0.0), (total_steps // 2, final / 2), (total_steps, final)]
        self.client.log_batch(
            run_id,
            metrics=[Metric("eval/return_mean", v, self.clock, s) for s, v in points],
            params=[Param(k, v) for k, v in config.items()],
            tags=[RunTag(k, v) for k, v in run_tags.items()],
        )
        self.client.set_terminated(run_id, status)
        return run_id


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Store:
    """A store holding :func:`log_mixed_experiment`'s runs, made once for the tests that only read it."""
    mixed = Store(tmp_path_factory.mktemp("mixed") / "store")
    mixed.root.mkdir()
    shutil.copyfile(mlflow_schema_db, mixed.root / "mlflow.db")
    log_mixed_experiment(mixed)
    return mixed


def log_mixed_experiment(store: Store) -> None:
    """What one real experiment holds (docs/sweeps.md, "Comparing runs: `pgcli compare`"): mixed budgets, a sweep
    repeated (duplicate seeds), n = 1, two env ids, a grid over a hyperparameter, and Optuna trials."""
    log = RunLog(store, "cartpole")
    for seed, final in enumerate([100.0, 200.0, 999.0]):  # sweep A; its seed 2 is repeated by sweep B below
        log.run("ppo", "CartPole-v1", seed, final, **{"algo.learning_rate": "0.0003", "hardware.device": "cpu"})
    log.run("ppo", "CartPole-v1", 2, 300.0, **{"algo.learning_rate": "0.0003", "hardware.device": "cuda"})  # sweep B
    log.run("ppo", "CartPole-v1", 0, 500.0, total_steps=20000, **{"algo.learning_rate": "0.0003"})  # n = 1
    log.run("ppo", "CartPole-v1", 1, -1e9, status="FAILED", **{"algo.learning_rate": "0.0003"})  # left out
    for seed, final in enumerate([-100.0, -80.0]):  # another env in the same experiment: n = 2
        log.run("ppo", "Acrobot-v1", seed, final, **{"algo.learning_rate": "0.0003"})
    for lr, finals in (("0.1", [10.0, 20.0, 30.0]), ("0.01", [40.0, 50.0, 60.0])):  # a grid over the learning rate
        for seed, final in enumerate(finals):
            log.run("a2c", "CartPole-v1", seed, final, **{"algo.learning_rate": lr})
    for trial, lr in enumerate(("0.001", "0.002")):  # an Optuna search: 2 trials x 2 seeds
        for seed in range(2):
            log.run(
                "ppo",
                "Pendulum-v1",
                seed,
                -200.0 + 50 * trial + seed,
                tags={"trial": str(trial)},
                **{"algo.learning_rate": lr},
            )


def test_compare_splits_and_marks_what_cannot_be_averaged(
    mixed_store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["--experiment", "cartpole", "--out", str(out), f"tracking.uri={mixed_store.uri}"]) == 0
    printed = capsys.readouterr()
    report = (out / "compare-eval_return_mean.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert rows == [
        "| algo | env_id | trial | budget | config | n | final eval/return_mean (mean ± std) | IQM | 95% CI of mean "
        "| note |",
        "| a2c | CartPole-v1 | - | 5000 | algo.learning_rate=0.01 | 3 | 50.0 ± 10.0 | 50.0 | [40.0, 60.0] | - |",
        "| a2c | CartPole-v1 | - | 5000 | algo.learning_rate=0.1 | 3 | 20.0 ± 10.0 | 20.0 | [10.0, 30.0] | - |",
        "| ppo | Acrobot-v1 | - | 5000 | - | 2 | -90.0 ± 14.1 | -90.0 | [-100.0, -80.0] | n<3: CI unreliable |",
        # sweep B's seed 2 (300) replaced sweep A's (999); the device does not split; the FAILED run is left out
        "| ppo | CartPole-v1 | - | 5000 | - | 3 | 200.0 ± 100.0 | 200.0 | [100.0, 300.0] | - |",
        "| ppo | CartPole-v1 | - | 20000 | - | 1 | 500.0 | 500.0 | - | n=1: no spread, no CI |",
        # each Optuna trial with the values it was sampled (what differs between the trials)
        "| ppo | Pendulum-v1 | 0 | 5000 | algo.learning_rate=0.001 | 2 | "
        "-199.5 ± 0.7 | -199.5 | [-200.0, -199.0] | n<3: CI unreliable |",
        "| ppo | Pendulum-v1 | 1 | 5000 | algo.learning_rate=0.002 | 2 | "
        "-149.5 ± 0.7 | -149.5 | [-150.0, -149.0] | n<3: CI unreliable |",
    ]
    notes = [line[2:] for line in report.splitlines() if line.startswith("- ")]
    assert notes[0].startswith("split a2c | CartPole-v1 | 5000 steps: runs differ in algo.learning_rate")
    assert notes[1] == (
        "split ppo | CartPole-v1: runs of different budgets (4 x 5000, 1 x 20000 env steps) are not averaged"
    )
    assert notes[2] == (
        "duplicate seeds in ppo | CartPole-v1 | 5000 steps: seed 2 x2; used the latest run of each seed, "
        "left out 1 older run(s)"
    )
    assert notes[3].startswith("4 of 7 group(s) have fewer than 3 runs")
    assert rows[5] in printed.out and notes[2] in printed.out  # the terminal gets the table and the notes
    assert "1 unfinished run(s) left out" in printed.err
    assert (out / "compare-eval_return_mean.png").stat().st_size > 1000 and "duplicate seeds" in (
        out / "compare-eval_return_mean.html"
    ).read_text()
    assert report.splitlines()[0] == "# pgcli compare: 16 runs in 7 group(s), experiment cartpole"


def test_the_plot_has_one_panel_per_env_each_with_its_own_y_axis(mixed_store: Store) -> None:
    from matplotlib.collections import PolyCollection

    from pgcli.tracking.store import RunStore

    run_store = RunStore(mixed_store.uri)
    runs = []
    for rec in sorted(run_store.search(run_store.experiment_ids(["cartpole"])), key=lambda r: r.start_time):
        if rec.status == "FINISHED":
            steps, values = zip(*run_store.metric_history(rec.run_id, "eval/return_mean"), strict=True)
            runs.append(RunCurve(rec.run_id, rec.params, rec.tags, np.array(steps, float), np.array(values)))
    keys = ["algo", "env_id", "trial"]
    groups, _ = make_groups(runs, keys)
    stats = [aggregate([(r.steps, r.values) for r in g.runs]) for g in groups]
    fig = figure(
        groups, stats, keys, "eval/return_mean", title="pgcli compare: 16 runs in 7 group(s), experiment cartpole"
    )
    assert fig.get_suptitle().splitlines()[0] == "pgcli compare: 16 runs in 7 group(s), experiment cartpole"
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert sorted(panels) == ["Acrobot-v1", "CartPole-v1", "Pendulum-v1"]
    acrobot, cartpole = panels["Acrobot-v1"], panels["CartPole-v1"]
    assert not acrobot.get_shared_y_axes().joined(acrobot, cartpole)
    assert acrobot.get_ylim()[1] < 50 < 500 <= cartpole.get_ylim()[1]  # each panel scaled to its own returns
    # CartPole: 4 groups drawn, bands for the three with n = 3 and none for the n = 1 run
    assert len(cartpole.get_lines()) == 4
    assert sum(isinstance(c, PolyCollection) for c in cartpole.collections) == 3
    assert any("(n=1, <3 runs)" in t.get_text() for t in cartpole.get_legend().get_texts())


def log_synthetic_sweep(store: Store) -> str:
    """A sweep parent with 4 PPO and 3 A2C children whose eval curves are known; returns the parent id."""
    log = RunLog(store, "synthetic")
    parent = log.client.create_run(log.exp, run_name="sweep", tags={"pgcli_role": "sweep"}).info.run_id
    for algo, finals in {"ppo": [1.0, 2.0, 3.0, 100.0], "a2c": [0.0, 3.0, 6.0]}.items():
        for seed, final in enumerate(finals):
            log.run(algo, "CartPole-v1", seed, final, total_steps=2000, parent=parent)
    log.run("ppo", "CartPole-v1", 9, -1e9, total_steps=2000, parent=parent, status="FAILED")
    log.client.set_terminated(parent, "FINISHED")
    return parent


def test_compare_a_sweep_gives_the_expected_table_and_logs_it(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = log_synthetic_sweep(store)
    out = tmp_path / "report"
    assert main(["--parent", parent, "--out", str(out), f"tracking.uri={store.uri}"]) == 0
    printed = capsys.readouterr()
    table = (out / "compare-eval_return_mean.md").read_text()
    assert table.splitlines()[2].startswith("| algo | env_id | budget | n |")
    # a2c finals 0, 3, 6: mean 3, std 3, IQM 3, bootstrap CI edges = min and max (3 runs)
    assert "| a2c | CartPole-v1 | 2000 | 3 | 3.000 ± 3.000 | 3.000 | [0.000, 6.000] | - |" in table
    # ppo finals 1, 2, 3, 100 (the FAILED run is left out): mean 26.5, std 49.0, IQM 2.5
    ppo_row = next(line for line in table.splitlines() if line.startswith("| ppo "))
    assert ppo_row.startswith("| ppo | CartPole-v1 | 2000 | 4 | 26.5 ± 49.0 | 2.5 | [")
    assert ppo_row in printed.out and "1 unfinished run(s) left out" in printed.err
    logged = {a.path for a in store.client().list_artifacts(parent, "compare")}
    assert logged == {f"compare/compare-eval_return_mean.{s}" for s in ("md", "html", "png")}


def test_compare_without_selection_takes_the_latest_sweep_and_groups_by_more_keys(store: Store, tmp_path: Path) -> None:
    log_synthetic_sweep(store)
    assert main(["--group-by", "seed", "--out", str(tmp_path), f"tracking.uri={store.uri}"]) == 0
    table = (tmp_path / "compare-eval_return_mean.md").read_text()
    assert "| ppo | CartPole-v1 | 3 | 2000 | 1 | 100.0 | 100.0 | - | n=1: no spread, no CI |" in table


def test_compare_reports_unknown_selections(store: Store) -> None:
    log_synthetic_sweep(store)
    with pytest.raises(ConfigError, match="unknown experiment"):
        main(["--experiment", "nope", f"tracking.uri={store.uri}"])
    with pytest.raises(ConfigError, match="logged 'no/such_metric'"):
        main(["--experiment", "synthetic", "--metric", "no/such_metric", f"tracking.uri={store.uri}"])
    with pytest.raises(ConfigError, match="no run with id 'abc'"):
        main(["--parent", "abc", f"tracking.uri={store.uri}"])
