"""GRPO vs PPO vs TRPO learning curves through pgcli's own build/train path (issue 4).

Every run is ``pgcli.build.train`` on a config composed exactly as ``pgcli train algo=<a> env=<e> seed=<s>`` composes
it (so each algorithm gets its preset, the same env builder, wrappers and seeds) with one evaluation protocol for all:
``eval.every`` env steps, ``eval.episodes`` deterministic episodes on the separate evaluation env. Runs go to
throw-away directories with ``tracking=off``; the curves, final returns and steps-to-threshold land in one JSON.

    .venv/bin/python benchmarks/grpo_learning.py                         # the published table (27 runs)
    .venv/bin/python benchmarks/grpo_learning.py --envs cartpole --algos grpo --seeds 0 --set algo.n_groups=2
    .venv/bin/python benchmarks/grpo_learning.py --jobs 2                # runs in parallel processes

Each run is its own process (torch threads = 1), so ``--jobs`` parallel runs do not share state.
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
STEPS = {"cartpole": 200_000, "acrobot": 200_000, "pendulum": 200_000}
THRESHOLDS = {"pendulum": -200.0}
"""Where gymnasium registers none: Pendulum-v1's conventional 'solved' level (conf/env/pendulum.yaml)."""
EVAL_EVERY = 10_000
EVAL_EPISODES = 10


def run_one(algo: str, env: str, seed: int, steps: int, extra: list[str], eval_every: int, eval_episodes: int) -> dict:
    """Train one (algo, env, seed) with pgcli's build path; return its evaluation curve and summary."""
    from pgcli.build import RunContext, train
    from pgcli.cli import compose_train_config
    from pgcli.env import reward_threshold

    overrides = [f"algo={algo}", f"env={env}", f"seed={seed}", f"total_steps={steps}", "tracking=off",
                 "progress=false", f"eval.every={eval_every}", f"eval.episodes={eval_episodes}",
                 "eval.deterministic=true", *extra]  # fmt: skip
    cfg = compose_train_config(overrides)
    with tempfile.TemporaryDirectory(prefix=f"grpo_bench_{algo}_{env}_") as tmp:
        ctx = RunContext(algo_name=algo, env_name=env, output_dir=Path(tmp), overrides=overrides)
        start = time.perf_counter()
        summary = train(cfg, ctx)
        wall = time.perf_counter() - start
        curve, train_sps = read_curve(Path(tmp) / "metrics.csv")
    threshold = THRESHOLDS.get(env, reward_threshold(cfg.env))
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


CHECKPOINTS = (50_000, 100_000)
"""Budgets at which the report also gives the mean evaluation return (the last evaluation at or before it)."""


def eval_at(curve: list[tuple[int, float]], budget: int) -> float:
    """The last evaluation return at or before ``budget`` env steps (nan if none)."""
    before = [value for step, value in curve if step <= budget]
    return before[-1] if before else float("nan")


def summarise(runs: list[dict]) -> list[dict[str, Any]]:
    """Mean, std, min over seeds per (env, algo)."""
    rows = []
    for env, algo in sorted({(r["env"], r["algo"]) for r in runs}):
        group = [r for r in runs if r["env"] == env and r["algo"] == algo]
        final = np.array([r["final_eval_return"] for r in group])
        to_threshold = [r["steps_to_threshold"] for r in group]
        rows.append({
            "env": env, "algo": algo, "n_seeds": len(group), "steps": int(np.mean([r["steps"] for r in group])),
            "final_mean": float(final.mean()), "final_std": float(final.std()), "final_min": float(final.min()),
            "best_mean": float(np.mean([r["best_eval_return"] for r in group])),
            **{f"eval_at_{b // 1000}k_mean": float(np.mean([eval_at(r["eval_curve"], b) for r in group]))
               for b in CHECKPOINTS},
            "seeds_solved": sum(s is not None for s in to_threshold),
            "median_steps_to_threshold": (float(np.median([s for s in to_threshold if s is not None]))
                                          if any(s is not None for s in to_threshold) else None),
            "train_sps_mean": float(np.mean([r["train_sps"] for r in group])),
            "wall_time_s_mean": float(np.mean([r["wall_time_s"] for r in group])),
        })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    at = " | ".join(f"eval at {b // 1000}k" for b in CHECKPOINTS)
    header = (
        f"| env | algo | seeds | steps | {at} | final eval (mean ± std, min) | seeds >= threshold | "
        "median steps to it | train SPS |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for r in rows:
        steps_to = "-" if r["median_steps_to_threshold"] is None else f"{r['median_steps_to_threshold']:,.0f}"
        at_values = " | ".join(f"{r[f'eval_at_{b // 1000}k_mean']:.1f}" for b in CHECKPOINTS)
        lines.append(f"| {r['env']} | {r['algo']} | {r['n_seeds']} | {r['steps']:,} | {at_values} | "
                     f"{r['final_mean']:.1f} ± {r['final_std']:.1f} ({r['final_min']:.1f}) | "
                     f"{r['seeds_solved']}/{r['n_seeds']} | {steps_to} | {r['train_sps_mean']:,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(STEPS))
    parser.add_argument("--algos", nargs="+", default=["grpo", "ppo", "trpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: per env, STEPS)")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run, e.g. algo.n_groups=2")
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES)
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (one process each)")
    parser.add_argument("--out", type=Path, default=RESULTS / "grpo_learning.json")
    parser.add_argument("--report", type=Path, help="print the tables of an existing results JSON and exit")
    args = parser.parse_args()
    if args.report:
        print(markdown(summarise(json.loads(args.report.read_text())["runs"])))
        return
    from pgcli.build import git_state

    jobs = [(a, e, s, args.steps or STEPS.get(e, 200_000), args.set, args.eval_every, args.eval_episodes)
            for e in args.envs for a in args.algos for s in args.seeds]  # fmt: skip
    meta = {"command": "benchmarks/grpo_learning.py " + " ".join(sys.argv[1:]), "machine": platform.platform(),
            "processor": platform.processor(), "python": platform.python_version(), "jobs": args.jobs,
            "eval": {"every": args.eval_every, "episodes": args.eval_episodes, "deterministic": True},
            **git_state()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for r in pool.imap(_star_run, jobs):
            runs.append(r)
            print(f"{r['algo']:>5} {r['env']:<9} seed {r['seed']}: final {r['final_eval_return']:8.1f}  best "
                  f"{r['best_eval_return']:8.1f}  to-threshold {r['steps_to_threshold']}  {r['wall_time_s']:.0f} s",
                  flush=True)  # fmt: skip
            rows = summarise(runs)  # rewritten after every run: an interrupted benchmark keeps what it measured
            args.out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1))
    print(markdown(rows))
    print(f"wrote {args.out}")


def _star_run(job: tuple) -> dict:
    return run_one(*job)


if __name__ == "__main__":
    main()
