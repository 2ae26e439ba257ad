"""benchmarks/presets_table.py: the all-presets results table aggregated from a small synthetic MLflow store."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO, Store


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("presets_table", REPO / "benchmarks" / "presets_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


table = load_script()


def log_run(
    store: Store,
    *,
    algo: str,
    env: str,
    env_id: str,
    seed: int,
    budget: int,
    evals: list[float],
    start_s: float,
    wall_s: float,
    status: str = "FINISHED",
    cpu: str = "",
) -> str:
    from mlflow.entities import Metric, Param

    client = store.client()
    exp = client.get_experiment_by_name("presets")
    exp_id = exp.experiment_id if exp else client.create_experiment("presets")
    tags = {
        "algo": algo,
        "env": env,
        "env_id": env_id,
        "seed": str(seed),
        "git_commit": "abcdef0123",
        "git_dirty": "false",
        **({"cpu": cpu} if cpu else {}),
    }
    run = client.create_run(exp_id, start_time=int(start_s * 1000), tags=tags)
    every = budget // len(evals)
    metrics = [Metric("eval/return_mean", v, int(start_s * 1000), (i + 1) * every) for i, v in enumerate(evals)]
    metrics.append(Metric("time/sps", 1000.0 + seed, int(start_s * 1000), budget))
    params = [Param("total_steps", str(budget)), Param("algo", algo), Param("env", env), Param("seed", str(seed))]
    client.log_batch(run.info.run_id, metrics=metrics, params=params)
    client.set_terminated(run.info.run_id, status, end_time=int((start_s + wall_s) * 1000))
    return run.info.run_id


def test_rows_per_preset_and_budget_with_final_last5_best_over_seeds(store: Store) -> None:
    t0 = 1_790_000_000.0
    curves = {0: [10, 20, 30, 40, 50, 60], 1: [0, 100, 80, 70, 60, 40], 2: [5, 5, 5, 5, 5, 5]}
    for seed, evals in curves.items():
        log_run(
            store,
            algo="ppo",
            env="cartpole",
            env_id="CartPole-v1",
            seed=seed,
            budget=60_000,
            evals=evals,
            start_s=t0,
            wall_s=120.0,
            cpu="CPU B" if seed else "",
        )
    # the same preset at another budget: its own row, never averaged in
    log_run(
        store,
        algo="ppo",
        env="cartpole",
        env_id="CartPole-v1",
        seed=0,
        budget=6_000,
        evals=[1.0, 3.0],
        start_s=t0,
        wall_s=12.0,
    )
    # a failed run is not a result
    log_run(
        store,
        algo="ppo",
        env="cartpole",
        env_id="CartPole-v1",
        seed=3,
        budget=60_000,
        evals=[999.0],
        start_s=t0,
        wall_s=1.0,
        status="FAILED",
    )

    results = table.stored_results(store.uri)
    assert len(results) == 4
    rows = table.summarise(results)
    assert [(r["preset"], r["budget"], r["n"]) for r in rows] == [
        ("ppo_cartpole", 6_000, 1),
        ("ppo_cartpole", 60_000, 3),
    ]
    big = rows[1]
    finals = [60, 40, 5]
    last5 = [sum(c[-5:]) / 5 for c in curves.values()]
    bests = [60, 100, 5]
    for key, values in (("final", finals), ("last5", last5), ("best", bests)):
        mean = sum(values) / 3
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
        assert big[key] == pytest.approx((mean, std)), key
    assert big["wall_s"] == pytest.approx(120.0) and big["sps"] == pytest.approx(1001.0)
    assert big["seeds"] == [0, 1, 2] and big["commits"] == ["abcdef0"]
    assert big["cpus"] == ["CPU B"]  # the CPU models that ran the row (a run from before the tag has none)

    md = table.markdown(rows)
    assert "| ppo_cartpole | CartPole-v1 | 6,000 | 1 (n < 3) | 3.000 | 2.000 | 3.000 |" in md  # n = 1: no ± 0.0
    assert "| ppo_cartpole | CartPole-v1 | 60,000 | 3 | 35.0 ± " in md


def test_a_seed_measured_twice_counts_once_and_json_round_trip(store: Store, tmp_path: Path) -> None:
    t0 = 1_790_000_000.0
    log_run(
        store, algo="trpo", env="hopper", env_id="Hopper-v5", seed=0, budget=1000, evals=[1.0], start_s=t0, wall_s=1
    )
    log_run(
        store,
        algo="trpo",
        env="hopper",
        env_id="Hopper-v5",
        seed=0,
        budget=1000,
        evals=[3.0],
        start_s=t0 + 86_400,
        wall_s=1,
    )
    results = table.stored_results(store.uri)
    (row,) = table.summarise(results)
    assert row["n"] == 1 and row["final"][0] == 3.0  # the later run of seed 0

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n\n{table.MARK_START}\nold\n{table.MARK_END}\n\nafter\n")
    out = tmp_path / "presets.json"
    md = table.write_outputs(results, out, doc)
    assert sorted(table.load_json(out), key=lambda r: r.run_id) == sorted(results, key=lambda r: r.run_id)
    text = doc.read_text()
    assert "old" not in text and md in text and text.endswith("after\n")


def test_presets_split_into_algo_and_env() -> None:
    algos, envs = {"ppo", "sb3_trpo", "trpo"}, {"hopper", "cartpole"}
    assert table.split_preset("sb3_trpo_hopper", algos, envs) == ("sb3_trpo", "hopper")
    assert table.split_preset("trpo_cartpole", algos, envs) == ("trpo", "cartpole")
    assert table.split_preset("ppo_hopper_zoo", algos, envs) is None
    assert "trpo_hopper" in table.shipped_presets()


def test_rl_on_text_tasks_is_left_to_its_own_benchmark_but_sft_is_a_row() -> None:
    shipped = table.shipped_presets()
    assert "grpo_addition" not in shipped  # it starts from an SFT run (init=): benchmarks/lm_grpo.py measures it
    assert "sft_addition" in shipped and "grpo_hopper" in shipped and "ppo_cartpole" in shipped
