"""pgcli.compare: IQM, bootstrap bands and step grids against hand-computed cases; `pgcli compare` end to end on
synthetic metric histories logged straight into a temporary SQLite store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgcli.compare import aggregate, bootstrap_ci, common_grid, curves_on_grid, group_key, iqm, main
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
    s = aggregate(("ppo", "cartpole"), curves)
    assert s.n_runs == 4 and s.final_mean == 26.5 and s.final_iqm == 2.5
    assert s.final_std == pytest.approx(np.std([1, 2, 3, 100], ddof=1))
    np.testing.assert_allclose(s.curve_mean, [0.0, 0.0, 26.5])
    assert s.final_ci[0] <= 26.5 <= s.final_ci[1]
    np.testing.assert_allclose([s.curve_lo[-1], s.curve_hi[-1]], s.final_ci)


def test_group_key_reads_params_then_tags() -> None:
    assert group_key({"algo": "ppo"}, {"env": "cartpole"}, ["algo", "env", "missing"]) == ("ppo", "cartpole", "?")


# --------------------------------------------------------------------------------------------------------------------
# pgcli compare on synthetic runs
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def store(migrated_store: Store) -> Store:
    return migrated_store


def log_synthetic_sweep(store: Store) -> str:
    """A sweep parent with 4 PPO and 3 A2C children whose eval curves are known; returns the parent id."""
    from mlflow.entities import Metric, Param, RunTag

    client = store.client()
    exp = client.create_experiment("synthetic", artifact_location=(store.root / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="sweep", tags={"pgcli_role": "sweep"}).info.run_id
    finals = {"ppo": [1.0, 2.0, 3.0, 100.0], "a2c": [0.0, 3.0, 6.0]}
    for algo, values in finals.items():
        for seed, final in enumerate(values):
            run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "seed": str(seed), "env": "cartpole"})
            run_id = run.info.run_id
            curve = [(0, 0.0), (1000, final / 2), (2000, final)] if algo == "ppo" else [(0, final), (2000, final)]
            client.log_batch(
                run_id,
                metrics=[Metric("eval/return_mean", v, 0, s) for s, v in curve],
                params=[Param("algo", algo), Param("env", "cartpole")],
                tags=[RunTag("algo", algo)],
            )
            client.set_terminated(run_id, "FINISHED")
    failed = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_batch(failed, metrics=[Metric("eval/return_mean", -1e9, 0, 2000)], params=[Param("algo", "ppo")])
    client.set_terminated(failed, "FAILED")  # left out by default
    client.set_terminated(parent, "FINISHED")
    return parent


def test_compare_a_sweep_gives_the_expected_table_and_logs_it(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = log_synthetic_sweep(store)
    out = tmp_path / "report"
    assert main(["--parent", parent, "--out", str(out), f"tracking.uri={store.uri}"]) == 0
    printed = capsys.readouterr()
    table = (out / "compare.md").read_text()
    assert table.splitlines()[2].startswith("| algo | env | runs |")
    a2c_row = next(line for line in table.splitlines() if line.startswith("| a2c "))
    ppo_row = next(line for line in table.splitlines() if line.startswith("| ppo "))
    # a2c finals 0, 3, 6: mean 3, std 3, IQM 3, bootstrap CI edges = min and max (3 runs)
    assert a2c_row == "| a2c | cartpole | 3 | 3.0 ± 3.0 | 3.0 | [0.0, 6.0] | 2000 |"
    # ppo finals 1, 2, 3, 100 (the FAILED run is left out): mean 26.5, std 49.0, IQM 2.5
    assert ppo_row.startswith("| ppo | cartpole | 4 | 26.5 ± 49.0 | 2.5 | [")
    assert ppo_row in printed.out and "1 unfinished run(s) left out" in printed.err
    assert (out / "compare.png").stat().st_size > 1000 and "<table>" in (out / "compare.html").read_text()
    logged = {a.path for a in store.client().list_artifacts(parent, "compare")}
    assert logged == {"compare/compare.md", "compare/compare.html", "compare/compare.png"}


def test_compare_without_selection_takes_the_latest_sweep_and_groups_by_any_key(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_synthetic_sweep(store)
    assert main(["--group-by", "seed", "--out", str(tmp_path), f"tracking.uri={store.uri}"]) == 0
    table = (tmp_path / "compare.md").read_text()
    assert "| 3 | 1 | 100.0 ± 0.0 |" in table  # seed 3: only the ppo run with final 100


def test_compare_reports_unknown_selections(store: Store) -> None:
    from pgcli.errors import PgcliError

    log_synthetic_sweep(store)
    with pytest.raises(PgcliError, match="unknown experiment"):
        main(["--experiment", "nope", f"tracking.uri={store.uri}"])
    with pytest.raises(PgcliError, match="logged 'no/such_metric'"):
        main(["--experiment", "synthetic", "--metric", "no/such_metric", f"tracking.uri={store.uri}"])
