"""MinAtar learning: SB3's PPO (algo=ppo) and pgcli's own PPO-Penalty (algo=ppo_kl) on MinAtar Breakout with the CNN
policy, against the MinAtar paper's published learning curves (docs/benchmarks/pixels.md, "MinAtar learning").

Each algorithm gets its preset (conf/preset/ppo_minatar_breakout.yaml: gymnax-blines' MinAtar PPO settings;
ppo_kl_minatar_breakout.yaml: the same rollout and optimiser with the KL penalty in place of the clip) and one
evaluation protocol for both: every 100k env steps, 10 deterministic episodes on the separate evaluation env (sticky
actions stay on). The run loop, curves and table are ``benchmarks/_learning.py``; runs go one at a time (``--jobs 1``),
and the JSON is rewritten after every run, so ``--append`` resumes an interrupted benchmark where it stopped.

    nice -n 5 .venv/bin/python benchmarks/minatar_learning.py --append                 # 2 algos x 3 seeds at 3M
    .venv/bin/python benchmarks/minatar_learning.py --report benchmarks/results/minatar_learning.json
    .venv/bin/python benchmarks/minatar_learning.py --table benchmarks/results/minatar_learning.json --doc  # the page
    .venv/bin/python benchmarks/minatar_learning.py --steps 20000 --seeds 0 --out /tmp/minatar_smoke.json   # smoke
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from _learning import LAST_EVALS, RESULTS, Job, add_common_arguments, main_for, summarise

STEPS = 3_006_464
"""3M env steps, rounded up to whole rollouts of the presets (64 envs x 128 steps)."""
EVAL_EVERY = 100_000
EVAL_EPISODES = 10
PUBLISHED = {"DQN": 9.9, "AC(lambda=0.8)": 16.8, "AC(lambda=0)": 13.8}
"""MinAtar Breakout at 3M frames (= env steps: MinAtar has no frame skip), read off the learning curves of Young & Tian
(2019, arXiv:1903.03176) as the MinAtar README shows them (img/learning_curves.gif, kenjyoung/MinAtar @ 4241f24): the
moving average of training returns over 100 episodes, mean of 30 seeds, sticky actions 0.1 and difficulty ramping as
here, but the full action set of 6 actions (here: the minimal set of 3). Read by tracing each curve's colour over
3M +- 0.03M; the shaded standard errors are within +-0.3 there."""
THRESHOLD = PUBLISHED["AC(lambda=0.8)"]
"""A run "reaches" the paper's best agent at 3M frames (AC(0.8)) when an evaluation scores this or more."""


def jobs(args: Any) -> list[Job]:
    return [
        Job(a, e, s, EVAL_EVERY, EVAL_EPISODES, THRESHOLD, args.steps or STEPS, tuple(args.set), args.variant)
        for e in args.envs
        for a in args.algos
        for s in args.seeds
    ]


def table(path: Path, last: int = LAST_EVALS) -> str:
    """The page's table (docs/benchmarks/pixels.md, "MinAtar learning"): per algorithm, mean ± std over seeds of the
    final, last-``last`` and best evaluations, and of each run's last ``last`` logged training returns
    (``rollout/ep_return_mean``: the sampling policy's own episodes, the figure the MinAtar paper's curves show)."""
    runs = json.loads(path.read_text())["runs"]
    header = (
        f"| algo | seeds | steps | final eval | last {last} evals | best eval | training return (last {last} "
        "logged) | train SPS | wall min/run |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in summarise(runs):
        group = [r for r in runs if r["algo"] == row["algo"] and r["train_return_curve"]]
        train = [float(np.mean([v for _, v in r["train_return_curve"][-last:]])) for r in group]
        lines.append(
            f"| {row['algo']} | {row['n_seeds']} | {row['steps']:,} | {row['final_mean']:.1f} ± "
            f"{row['final_std']:.1f} | {row['last_evals_mean']:.1f} ± {row['last_evals_std']:.1f} | "
            f"{row['best_mean']:.1f} ± {row['best_std']:.1f} | {np.mean(train):.1f} ± {np.std(train):.1f} | "
            f"{row['train_sps_mean']:,.0f} | {row['wall_time_s_mean'] / 60:.1f} |"
        )
    return "\n".join(lines)


DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "pixels.md"
START, END = "<!-- minatar-learning:start -->", "<!-- minatar-learning:end -->"


def write_doc(text: str) -> str:
    """Put ``text`` between the MinAtar table's markers in docs/benchmarks/pixels.md; return it."""
    head, rest = DOC.read_text().split(START, 1)
    DOC.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["minatar_breakout"])
    parser.add_argument("--algos", nargs="+", default=["ppo", "ppo_kl"])
    parser.add_argument("--table", type=Path, help="print the page's table of a results JSON, exit")
    parser.add_argument("--doc", action="store_true", help="with --table: also write it into docs/benchmarks/pixels.md")
    add_common_arguments(parser, out=RESULTS / "minatar_learning.json")
    args = parser.parse_args()
    if args.table:
        print(write_doc(table(args.table)) if args.doc else table(args.table))
        return
    main_for(jobs, parser, script="benchmarks/minatar_learning.py")


if __name__ == "__main__":
    main()
