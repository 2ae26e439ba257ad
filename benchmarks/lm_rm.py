"""Reward models on addition: held-out pairwise accuracy by label noise (docs/benchmarks/lm.md, "Reward models").

One ``pgcli rm env=addition`` per (noise, seed) with the ``rm_addition`` preset (2-digit addition, 128,000 checker
pairs in batches of 32) and a TinyGPT of d_model 64 (``model.d_model=64 model.d_ff=256``), ``algo.label_noise`` p
(each training pair's label flipped with probability p; held-out pairs are clean). Each run is a real CLI subprocess
with ``tracking=off`` and 1 torch thread, two at a time; the final, last-evaluations and best held-out pairwise
accuracies come from its metrics.csv. Resumable: one JSON per run in benchmarks/results/lm_rm/ (``--force`` redoes).

    .venv/bin/python benchmarks/lm_rm.py run --seeds 0 1 2 --noise 0 0.1 0.2 0.3
    .venv/bin/python benchmarks/lm_rm.py table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_grpo  # the CLI runner and the metrics reader of the text benchmarks

RESULTS = Path(__file__).resolve().parent / "results" / "lm_rm"
MODEL = ["model.d_model=64", "model.d_ff=256"]


def one(noise: float, seed: int, force: bool) -> None:
    out = RESULTS / f"rm_noise{noise}_s{seed}.json"
    if out.exists() and not force:
        return
    overrides = ["env=addition", *MODEL, f"algo.label_noise={noise}", f"seed={seed}"]
    wall, history, line = lm_grpo.run_cli("rm", overrides, RESULTS / "runs" / out.stem)
    curve = history.get("eval/pairwise_accuracy", [])
    result = {
        "noise": noise,
        "seed": seed,
        "command": line,
        "wall_s": wall,
        "accuracy": curve[-1][1] if curve else float("nan"),
        "last_mean": statistics.mean(v for _, v in curve[-5:]) if curve else float("nan"),  # its last 5 (here: 4)
        "best": max((v for _, v in curve), default=float("nan")),
        "curve": curve,
        "margin": lm_grpo.last(history, "eval/reward_margin"),
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"noise {noise} seed {seed}: pairwise accuracy {result['accuracy']:.3f} ({wall:.0f} s)", flush=True)


def run(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    jobs = [(noise, seed) for noise in args.noise for seed in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(one, noise, seed, args.force) for noise, seed in jobs]:
            future.result()


def table(args: argparse.Namespace) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("rm_noise*_s*.json"))]
    print(
        "| label noise | seeds | final pairwise accuracy | mean of the last 5 evals (here all 4) | best "
        "| per seed (final) | reward margin |"
    )
    print("|---|---|---|---|---|---|---|")
    for noise in sorted({r["noise"] for r in rows}):
        runs = sorted((r for r in rows if r["noise"] == noise), key=lambda r: r["seed"])

        def stat(key: str, runs: list[dict] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{statistics.mean(values):.3f} +- {statistics.pstdev(values):.3f}"

        seeds = ", ".join(f"{r['accuracy']:.3f}" for r in runs)
        print(
            f"| {noise} | {len(runs)} | {stat('accuracy')} | {stat('last_mean')} | {stat('best')} | {seeds} "
            f"| {statistics.mean(r['margin'] for r in runs):.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--force", action="store_true")
    sub.add_parser("table")
    args = parser.parse_args()
    {"run": run, "table": table}[args.part](args)


if __name__ == "__main__":
    main()
