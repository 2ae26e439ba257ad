"""TRPO learning: our TRPO (algo=trpo) vs sb3-contrib's (algo=sb3_trpo) with rl-baselines3-zoo presets (issue 3).

Every run is ``pgcli.build.train`` on a config composed exactly as ``pgcli train algo=<a> env=<e> seed=<s>`` composes
it, so each algorithm gets its zoo preset (conf/preset/{trpo,sb3_trpo}_<env>.yaml), the same env builder, wrappers
and seeds, and one evaluation protocol: every ``eval_every`` env steps, 10 deterministic episodes on the separate
evaluation env (seed + 10000, frozen normalisation statistics). Runs go to throw-away directories with
``tracking=off``; curves, final returns and steps-to-threshold land in one JSON, rewritten after every run.

Targets (issue 3): CartPole-v1 reaches 500 within 100k steps (3 seeds); Pendulum-v1 >= -250 within 100k;
Hopper-v5 at 1M steps vs sb3-contrib's published 3372 +- 215 (rl-baselines3-zoo benchmark, Hopper-v3).

    .venv/bin/python benchmarks/trpo_learning.py                                  # cartpole + pendulum, both algos
    .venv/bin/python benchmarks/trpo_learning.py --envs hopper --algos trpo --out benchmarks/results/trpo_hopper.json
    .venv/bin/python benchmarks/trpo_learning.py --envs hopper --algos trpo --steps 300000   # a shorter budget

Each run is its own process (1 torch thread); ``--jobs`` runs that many in parallel.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
THRESHOLDS = {"cartpole": 500.0, "pendulum": -250.0, "hopper": 3372.0}
"""What a run must reach (issue 3); Hopper's is sb3-contrib's published mean (rl-baselines3-zoo, Hopper-v3)."""
EVAL_EVERY = {"cartpole": 5_000, "pendulum": 5_000, "hopper": 50_000, "walker2d": 50_000, "halfcheetah": 50_000}
EVAL_EPISODES = 10


def run_one(algo: str, env: str, seed: int, steps: int | None, extra: list[str], eval_every: int) -> dict[str, Any]:
    """Train one (algo, env, seed) with pgcli's build path; return its evaluation curve and summary."""
    from pgcli.build import RunContext, train
    from pgcli.cli import compose_train_config

    overrides = [f"algo={algo}", f"env={env}", f"seed={seed}", "tracking=off", "progress=false",
                 f"eval.every={eval_every}", f"eval.episodes={EVAL_EPISODES}", "eval.deterministic=true",
                 *([f"total_steps={steps}"] if steps else []), *extra]  # fmt: skip
    cfg = compose_train_config(overrides)
    with tempfile.TemporaryDirectory(prefix=f"trpo_bench_{algo}_{env}_") as tmp:
        ctx = RunContext(algo_name=algo, env_name=env, output_dir=Path(tmp), overrides=overrides)
        start = time.perf_counter()
        summary = train(cfg, ctx)
        wall = time.perf_counter() - start
        curve, train_sps = read_curve(Path(tmp) / "metrics.csv")
    threshold = THRESHOLDS.get(env)
    reached = [step for step, value in curve if threshold is not None and value >= threshold]
    return {
        "algo": algo,
        "env": env,
        "env_id": cfg.env.id,
        "seed": seed,
        "overrides": overrides,
        "steps": summary.steps,
        "final_eval_return": summary.final_return,
        "final_eval_std": summary.final_return_std,
        "best_eval_return": max((v for _, v in curve), default=float("nan")),
        "threshold": threshold,
        "steps_to_threshold": reached[0] if reached else None,
        "eval_curve": curve,
        "wall_time_s": wall,
        "train_sps": train_sps,
    }


def read_curve(csv_path: Path) -> tuple[list[tuple[int, float]], float]:
    """(step, eval/return_mean) pairs and the last time/sps from a run's metrics.csv."""
    curve, sps = [], float("nan")
    for line in csv_path.read_text().splitlines()[1:]:
        key, step, value = line.rsplit(",", 2)
        if key == "eval/return_mean":
            curve.append((int(step), float(value)))
        elif key == "time/sps":
            sps = float(value)
    return sorted(curve), sps


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean, std, min over seeds per (env, algo)."""
    rows = []
    for env, algo in sorted({(r["env"], r["algo"]) for r in runs}):
        group = [r for r in runs if r["env"] == env and r["algo"] == algo]
        final = np.array([r["final_eval_return"] for r in group])
        to_threshold = [r["steps_to_threshold"] for r in group]
        reached = [s for s in to_threshold if s is not None]
        rows.append({
            "env": env, "algo": algo, "n_seeds": len(group), "steps": int(np.mean([r["steps"] for r in group])),
            "final_mean": float(final.mean()), "final_std": float(final.std()), "final_min": float(final.min()),
            "final_max": float(final.max()), "best_mean": float(np.mean([r["best_eval_return"] for r in group])),
            "threshold": THRESHOLDS.get(env), "seeds_reaching": len(reached),
            "median_steps_to_threshold": float(np.median(reached)) if reached else None,
            "train_sps_mean": float(np.mean([r["train_sps"] for r in group])),
            "wall_time_s_mean": float(np.mean([r["wall_time_s"] for r in group])),
        })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | algo | seeds | steps | final eval mean ± std (min..max) | best eval (mean) | threshold | "
             "seeds reaching it | median steps to it | train SPS | wall s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        steps_to = "-" if r["median_steps_to_threshold"] is None else f"{r['median_steps_to_threshold']:,.0f}"
        lines.append(f"| {r['env']} | {r['algo']} | {r['n_seeds']} | {r['steps']:,} | {r['final_mean']:.1f} ± "
                     f"{r['final_std']:.1f} ({r['final_min']:.1f}..{r['final_max']:.1f}) | {r['best_mean']:.1f} | "
                     f"{r['threshold']} | {r['seeds_reaching']}/{r['n_seeds']} | {steps_to} | "
                     f"{r['train_sps_mean']:,.0f} | {r['wall_time_s_mean']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["cartpole", "pendulum"])
    parser.add_argument("--algos", nargs="+", default=["trpo", "sb3_trpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the preset's)")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (one process each)")
    parser.add_argument("--out", type=Path, default=RESULTS / "trpo_learning.json")
    args = parser.parse_args()
    from pgcli.build import git_state

    jobs = [(a, e, s, args.steps, args.set, EVAL_EVERY.get(e, 10_000))
            for e in args.envs for a in args.algos for s in args.seeds]  # fmt: skip
    meta = {"command": "benchmarks/trpo_learning.py " + " ".join(sys.argv[1:]), "machine": platform.platform(),
            "python": platform.python_version(), "jobs": args.jobs,
            "eval": {"every": {e: EVAL_EVERY.get(e, 10_000) for e in args.envs}, "episodes": EVAL_EPISODES,
                     "deterministic": True},
            **git_state()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for r in pool.imap(_star_run, jobs):
            runs.append(r)
            print(f"{r['algo']:>8} {r['env']:<9} seed {r['seed']}: final {r['final_eval_return']:8.1f}  best "
                  f"{r['best_eval_return']:8.1f}  to-threshold {r['steps_to_threshold']}  {r['wall_time_s']:.0f} s",
                  flush=True)  # fmt: skip
            rows = summarise(runs)  # rewritten after every run: an interrupted benchmark keeps what it measured
            args.out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1))
    print(markdown(rows))
    print(f"wrote {args.out}")


def _star_run(job: tuple) -> dict[str, Any]:
    return run_one(*job)


if __name__ == "__main__":
    main()
