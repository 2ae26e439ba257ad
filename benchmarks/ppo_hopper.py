"""PPO on Hopper-v5 (docs/benchmarks/ppo.md): why the zoo preset stands still, and SB3 PPO settings that hop.

`pgcli train algo=ppo env=hopper` is SB3 PPO. Every run here is that command, run in Python (``pgcli.training.run_job``
through ``benchmarks/_learning.py``: the composed config, the same env, wrappers, seeds and evaluation) with one named
variant's overrides added, e.g. ``preset=ppo_hopper_zoo env.id=Hopper-v4``. Evaluation: every ``--eval-every`` env steps
(default 50k, the presets' own), 10 deterministic episodes on the separate evaluation env (seed + 10000, frozen
normalisation statistics).

Resumable: each run's result is one JSON file in ``--out`` (default ``benchmarks/results/ppo_hopper/``), named
``<variant>-s<seed>-<steps>k.json`` and written when the run ends; a run whose file exists is skipped, so the same
command continues an interrupted benchmark, and two invocations can share the directory. After each invocation the
directory's ``summary.md`` (the table) and ``curves.png`` are rewritten from all its runs. Each run also records its
CPU time (user + system of the training process), which a loaded machine disturbs less than wall time.

    .venv/bin/python benchmarks/ppo_hopper.py --variants cleanrl cleanrl_4env --seeds 0 1 2 --jobs 2     # 1M
    .venv/bin/python benchmarks/ppo_hopper.py --variants zoo zoo_gamma099 zoo_logstd0 --seeds 0 1 \\
        --steps 100000 --eval-every 10000 --jobs 2
    .venv/bin/python benchmarks/ppo_hopper.py --variants preset --seeds 0 1 2 --jobs 2    # the shipped preset, 1M
    .venv/bin/python benchmarks/ppo_hopper.py --report benchmarks/results/ppo_hopper
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _learning import RESULTS, Job, last_evals_mean, plot_curves, run_one

THRESHOLD = 2400.0
"""The target at 1M env steps (3-seed mean), about rl-baselines3-zoo's 2410 (Hopper-v3) and CleanRL's
2383 +- 272 (Hopper-v4)."""
EVAL_EPISODES = 10

# SB3's PPO defaults as CleanRL's ppo_continuous_action.py runs them on MuJoCo (PPO paper, Table 3): one env,
# 2048-step rollouts, minibatch 64, 10 epochs, 64x64 tanh with orthogonal init, log-std 0, obs + reward normalisation.
_CLEANRL = ("~preset", "total_steps=1000000", "env.n_envs=1", "algo.lr_schedule=linear")
VARIANTS: dict[str, tuple[str, ...]] = {
    "preset": (),
    "zoo": ("preset=ppo_hopper_zoo",),
    "zoo_v4": ("preset=ppo_hopper_zoo", "env.id=Hopper-v4"),
    "zoo_gamma099": ("preset=ppo_hopper_zoo", "algo.gamma=0.99"),
    "zoo_logstd0": ("preset=ppo_hopper_zoo", "model.log_std_init=0.0"),
    "cleanrl": _CLEANRL,
    "cleanrl_constlr": ("~preset", "total_steps=1000000", "env.n_envs=1"),
    "cleanrl_4env": (*_CLEANRL, "env.n_envs=4", "algo.n_steps=512"),
}
"""Variant name -> Hydra overrides on top of ``algo=ppo env=hopper``. ``preset`` is whatever conf/preset/ppo_hopper.yaml
ships; the others pin their settings (``~preset`` drops the shipped preset: conf/algo/ppo.yaml is SB3's defaults)."""


@dataclass(frozen=True)
class VariantJob:
    """One run: a named variant on one seed."""

    variant: str
    job: Job


def run_variant(vjob: VariantJob) -> dict[str, Any]:
    """Train one run (in a fresh process) and label its result with the variant; add its CPU time."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = run_one(vjob.job)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # "algo" labels the curves of plot_curves: one line per (variant, budget)
    steps = vjob.job.steps or 0
    return {
        **result,
        "variant": vjob.variant,
        "algo": f"{vjob.variant} ({steps // 1000}k)",
        "variant_overrides": list(vjob.job.extra),
        "steps_requested": steps,
        "cpu_time_s": cpu,
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, requested steps), over seeds: mean and std of the final, last-5 and best eval returns; times."""
    rows = []
    for variant, steps in sorted({(r["variant"], r["steps_requested"]) for r in runs}):
        group = sorted(
            (r for r in runs if r["variant"] == variant and r["steps_requested"] == steps), key=lambda r: r["seed"]
        )
        final = np.array([r["final_eval_return"] for r in group])
        last = np.array([last_evals_mean(r["eval_curve"]) for r in group])
        best = np.array([r["best_eval_return"] for r in group])
        rows.append(
            {
                "variant": variant,
                "steps": steps,
                "seeds": [r["seed"] for r in group],
                "final_mean": float(final.mean()),
                "final_std": float(final.std()),
                "last5_mean": float(last.mean()),
                "last5_std": float(last.std()),
                "best_mean": float(best.mean()),
                "best_std": float(best.std()),
                "finals": [round(float(v), 1) for v in final],
                # standing still scores ~1 per step for 1000 steps (the alive bonus); hopping adds forward velocity
                "final_len_mean": float(
                    np.mean([r["eval_len_curve"][-1][1] if r.get("eval_len_curve") else np.nan for r in group])
                ),
                "final_return_per_step": float(
                    np.mean(
                        [
                            r["eval_curve"][-1][1] / r["eval_len_curve"][-1][1] if r.get("eval_len_curve") else np.nan
                            for r in group
                        ]
                    )
                ),
                "wall_s_mean": float(np.mean([r["wall_time_s"] for r in group])),
                "cpu_s_mean": float(np.mean([r.get("cpu_time_s", float("nan")) for r in group])),
                "train_sps_mean": float(np.mean([r["train_sps"] for r in group])),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table (mean ± std over seeds; population std)."""
    header = (
        "| variant | steps | seeds | final eval | last 5 evals | best eval | finals per seed | final eval len | "
        "final return/step | wall s/run | CPU s/run | train SPS |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['steps']:,} | {len(r['seeds'])} | "
            f"{r['final_mean']:.0f} ± {r['final_std']:.0f} | {r['last5_mean']:.0f} ± {r['last5_std']:.0f} | "
            f"{r['best_mean']:.0f} ± {r['best_std']:.0f} | {', '.join(f'{v:.0f}' for v in r['finals'])} | "
            f"{r['final_len_mean']:.0f} | {r['final_return_per_step']:.2f} | "
            f"{r['wall_s_mean']:.0f} | {r['cpu_s_mean']:.0f} | {r['train_sps_mean']:,.0f} |"
        )
    return "\n".join(lines)


def run_path(out: Path, variant: str, seed: int, steps: int) -> Path:
    """Where one run's result lives: one JSON per run, so runs can be added by any number of invocations."""
    return out / f"{variant}-s{seed}-{steps // 1000}k.json"


def load_runs(paths: list[Path]) -> list[dict[str, Any]]:
    """Every run result in ``paths``: directories of per-run JSON files, or one JSON file with a ``runs`` list (the
    first 1M round, 2026-11-23, was written that way by an earlier version of this script)."""
    runs = []
    for path in paths:
        if path.is_dir():
            runs += [json.loads(p.read_text()) for p in sorted(path.glob("*-s*-*k.json"))]
            continue
        for r in json.loads(path.read_text())["runs"]:
            budget = [int(o.split("=")[1]) for o in r["overrides"] if o.startswith("total_steps=")]
            runs.append({"steps_requested": budget[-1] if budget else r["steps"], **r})
    return runs


def run_all(todo: list[VariantJob], *, n_jobs: int, out: Path) -> None:
    """Run ``todo`` (``n_jobs`` processes at a time); write each run's JSON as soon as it finishes."""
    from pgcli.training.build import git_state

    meta = {
        "command": "benchmarks/ppo_hopper.py " + " ".join(sys.argv[1:]),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "jobs": n_jobs,
        **git_state(),
    }
    with mp.get_context("spawn").Pool(n_jobs, maxtasksperchild=1) as pool:
        for r in pool.imap_unordered(run_variant, todo):
            r |= {
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "meta": meta,
                "load_avg_end": [round(v, 2) for v in os.getloadavg()],
            }
            run_path(out, r["variant"], r["seed"], r["steps_requested"]).write_text(json.dumps(r, indent=1))
            print(
                f"{r['variant']:>16} seed {r['seed']}: final {r['final_eval_return']:7.1f}  last5 "
                f"{last_evals_mean(r['eval_curve']):7.1f}  best {r['best_eval_return']:7.1f}  "
                f"{r['wall_time_s']:.0f} s wall, {r['cpu_time_s']:.0f} s CPU",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["preset"], choices=sorted(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument("--eval-every", type=int, default=50_000)
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (one process each)")
    parser.add_argument("--out", type=Path, default=RESULTS / "ppo_hopper", help="directory: one JSON per run")
    parser.add_argument(
        "--report", type=Path, nargs="+", help="print the table of the runs in these dirs (or JSON files), exit"
    )
    args = parser.parse_args()
    if args.report:
        print(markdown(summarise(load_runs(args.report))))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    todo = [
        VariantJob(v, Job("ppo", "hopper", s, args.eval_every, EVAL_EPISODES, THRESHOLD, args.steps, VARIANTS[v]))
        for v in args.variants
        for s in args.seeds
        if not run_path(args.out, v, s, args.steps).is_file()
    ]
    n_all = len(args.variants) * len(args.seeds)
    print(f"{len(todo)} runs to do, {n_all - len(todo)} already in {args.out}", flush=True)
    if todo:
        run_all(todo, n_jobs=args.jobs, out=args.out)
    runs = load_runs([args.out])
    table = markdown(summarise(runs))
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"wrote {args.out}/summary.md and {plot_curves(runs, args.out / 'curves.png')}")


if __name__ == "__main__":
    main()
