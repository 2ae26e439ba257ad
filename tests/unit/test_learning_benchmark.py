"""benchmarks/_learning.py: variant rows, the late-evaluation columns, truncation and resuming, on synthetic runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_learning", REPO / "benchmarks" / "_learning.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


learning = load_script()


def run(seed: int, curve: list[tuple[int, float]], variant: str = "", extra: tuple[str, ...] = ()) -> dict:
    job = learning.Job("trpo", "hopper", seed, 100, 10, 3000.0, curve[-1][0], extra, variant)
    return {
        "algo": "trpo",
        "variant": variant,
        "env": "hopper",
        "seed": seed,
        "overrides": job.overrides(),
        "steps": curve[-1][0],
        "final_eval_return": curve[-1][1],
        "best_eval_return": max(v for _, v in curve),
        "threshold": 3000.0,
        "steps_to_threshold": next((s for s, v in curve if v >= 3000.0), None),
        "eval_curve": curve,
        "train_sps": 1000.0,
        "wall_time_s": 10.0,
    }


CURVE_A = [(100, 1000.0), (200, 3000.0), (300, 2000.0), (400, 4000.0)]
CURVE_B = [(100, 500.0), (200, 1500.0), (300, 2500.0), (400, 2500.0)]


def test_variants_get_their_own_rows_with_all_three_summaries_and_the_late_columns():
    runs = [run(0, CURVE_A), run(1, CURVE_B), run(0, CURVE_B, "kl_lin", ("algo.target_kl_schedule=linear",))]
    rows = {r["algo"]: r for r in learning.summarise(runs, late_from=300)}
    assert set(rows) == {"trpo", "trpo [kl_lin]"}
    preset = rows["trpo"]
    assert preset["n_seeds"] == 2
    assert preset["final_mean"] == pytest.approx(3250.0) and preset["final_std"] == pytest.approx(750.0)
    assert preset["best_mean"] == pytest.approx(3250.0) and preset["best_std"] == pytest.approx(750.0)
    # last 5 evals = all four: A 2500, B 1750
    assert preset["last_evals_mean"] == pytest.approx(2125.0) and preset["last_evals_std"] == pytest.approx(375.0)
    # evaluations from step 300: A (2000, 4000): mean 3000, std 1000; B (2500, 2500): mean 2500, std 0
    assert preset["late_mean"] == pytest.approx(2750.0) and preset["late_swing"] == pytest.approx(500.0)
    assert rows["trpo [kl_lin]"]["n_seeds"] == 1
    table = learning.markdown(list(rows.values()))
    assert "evals from 300: mean | swing (std)" in table and "| 2750.0 | 500.0 |" in table


def test_truncate_cuts_the_curve_and_recomputes_final_best_and_threshold():
    cut = learning.truncate(run(0, CURVE_A), 300)
    assert cut["eval_curve"] == CURVE_A[:3] and cut["steps"] == 300
    assert (cut["final_eval_return"], cut["best_eval_return"], cut["steps_to_threshold"]) == (2000.0, 3000.0, 200)
    assert cut["variant"] == "preset, first 0k of 0k"
    assert learning.truncate(run(0, CURVE_A), 1000)["final_eval_return"] == 4000.0  # nothing to cut


def test_run_all_skips_the_jobs_already_in_out_and_keeps_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    done = run(0, CURVE_A, "kl_lin", ("algo.target_kl_schedule=linear",))
    job = learning.Job("trpo", "hopper", 0, 100, 10, 3000.0, 400, ("algo.target_kl_schedule=linear",), "kl_lin")
    out = tmp_path / "r.json"
    # the job is already there: no training process starts (it would take minutes), the table is rewritten from it
    runs = learning.run_all([job], n_jobs=1, out=tmp_path / "r.json", script="x", previous=[done])
    assert runs == [done]
    assert "skipping 1 run(s) already in" in capsys.readouterr().out
    assert not out.exists() or json.loads(out.read_text())["runs"] == [done]
    other_seed = learning.Job("trpo", "hopper", 1, 100, 10, 3000.0, 400, ("algo.target_kl_schedule=linear",), "kl_lin")
    assert tuple(other_seed.overrides()) != tuple(done["overrides"])  # a different seed is not skipped


def test_per_run_table_has_a_row_per_seed_with_its_late_mean_and_swing():
    table = learning.markdown_per_run([run(1, CURVE_B), run(0, CURVE_A)], late_from=300)
    rows = table.splitlines()[2:]
    assert rows == [
        "| hopper | trpo | 0 | 400 | 4000.0 | 2500.0 | 4000.0 | 3000.0 | 1000.0 |",
        "| hopper | trpo | 1 | 400 | 2500.0 | 1750.0 | 2500.0 | 2500.0 | 0.0 |",
    ]
