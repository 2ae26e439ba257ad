"""GRPO vs PPO vs TRPO learning curves through pgcli's own build/train path (docs/benchmarks/grpo.md).

Each algorithm gets its preset and one evaluation protocol for all: every 10k env steps, 10 deterministic episodes
on the separate evaluation env. The run loop, curves and table are ``benchmarks/_learning.py``; the curves, final
returns, the returns at 50k and 100k steps and steps-to-threshold land in one JSON, rewritten after every run.

    .venv/bin/python benchmarks/grpo_learning.py                         # the published table (27 runs)
    .venv/bin/python benchmarks/grpo_learning.py --envs cartpole --algos grpo --seeds 0 --set algo.n_groups=2
    .venv/bin/python benchmarks/grpo_learning.py --jobs 2                # runs in parallel processes
    .venv/bin/python benchmarks/grpo_learning.py --report benchmarks/results/grpo_learning.json
    # MuJoCo, resumable: --append skips the runs already in --out
    .venv/bin/python benchmarks/grpo_learning.py --envs hopper halfcheetah --algos grpo --steps 1000000 \
        --eval-every 50000 --append --late-from 300000 --out benchmarks/results/grpo_mujoco.json
"""

from __future__ import annotations

import argparse
from typing import Any

from _learning import RESULTS, Job, add_common_arguments, main_for

STEPS = {"cartpole": 200_000, "acrobot": 200_000, "pendulum": 200_000}
THRESHOLDS = {"cartpole": 475.0, "acrobot": -100.0, "pendulum": -200.0}
"""CartPole: the >= 475 target (gymnasium's reward_threshold); Acrobot: gymnasium's reward_threshold;
Pendulum (none registered): its conventional 'solved' level (conf/env/pendulum.yaml)."""
CHECKPOINTS = (50_000, 100_000)
"""Budgets at which the table also gives the mean evaluation return (the last evaluation at or before it)."""


def jobs(args: Any) -> list[Job]:
    return [
        Job(
            a,
            e,
            s,
            args.eval_every,
            args.eval_episodes,
            THRESHOLDS.get(e),
            args.steps or STEPS.get(e, 200_000),
            tuple(args.set),
            args.variant,
        )
        for e in args.envs
        for a in args.algos
        for s in args.seeds
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(STEPS))
    parser.add_argument("--algos", nargs="+", default=["grpo", "ppo", "trpo"])
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    add_common_arguments(parser, out=RESULTS / "grpo_learning.json")
    main_for(jobs, parser, script="benchmarks/grpo_learning.py", checkpoints=CHECKPOINTS)


if __name__ == "__main__":
    main()
