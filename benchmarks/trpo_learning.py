"""TRPO learning: our TRPO (algo=trpo) vs sb3-contrib's (algo=sb3_trpo) with rl-baselines3-zoo presets
(docs/benchmarks/trpo.md).

Each algorithm gets its zoo preset (conf/preset/{trpo,sb3_trpo}_<env>.yaml) and one evaluation protocol for both:
every ``eval_every`` env steps, 10 deterministic episodes on the separate evaluation env (seed + 10000, frozen
normalisation statistics). The run loop, curves and table are ``benchmarks/_learning.py``; curves, final returns,
the mean of the last 5 evaluations and steps-to-threshold land in one JSON, rewritten after every run.

Targets: CartPole-v1 reaches 500 within 100k steps (3 seeds); Pendulum-v1 >= -250 within 100k;
Hopper-v5 at 1M steps vs sb3-contrib's published 3372 +- 215 (rl-baselines3-zoo benchmark, Hopper-v3).

    .venv/bin/python benchmarks/trpo_learning.py                                  # cartpole + pendulum, both algos
    .venv/bin/python benchmarks/trpo_learning.py --envs hopper --out benchmarks/results/trpo_hopper.json --jobs 2
    .venv/bin/python benchmarks/trpo_learning.py --envs hopper --algos trpo --steps 300000   # a shorter budget
    .venv/bin/python benchmarks/trpo_learning.py --report benchmarks/results/trpo_hopper.json
    # preset ablations: a named variant, resumable (--append skips the runs already in --out)
    .venv/bin/python benchmarks/trpo_learning.py --envs hopper --algos trpo --steps 500000 --variant kl_lin \
        --append --late-from 300000 --out benchmarks/results/trpo_ablation_hopper.json
"""

from __future__ import annotations

import argparse
from typing import Any

from _learning import RESULTS, Job, add_common_arguments, main_for

THRESHOLDS = {"cartpole": 500.0, "pendulum": -250.0, "hopper": 3372.0}
"""What a run must reach; Hopper's is sb3-contrib's published mean (rl-baselines3-zoo, Hopper-v3)."""
EVAL_EVERY = {"cartpole": 5_000, "pendulum": 5_000, "hopper": 50_000, "walker2d": 50_000, "halfcheetah": 50_000}
EVAL_EPISODES = 10


VARIANTS: dict[str, tuple[str, ...]] = {
    "n4096": ("algo.n_steps=2048",),
    "lam098": ("algo.gae_lambda=0.98",),
    "norew": ("env.normalize_reward=false",),
    "kl_lin": ("algo.target_kl_schedule=linear",),
    "kl_lin_vf_lin": ("algo.target_kl_schedule=linear", "algo.lr_schedule=linear"),
    "vf_lin": ("algo.lr_schedule=linear",),
    "n4096_logstd": ("algo.n_steps=2048", "model.log_std_init=-0.5"),
    "lam098_norew": ("algo.gae_lambda=0.98", "env.normalize_reward=false"),
    "g995": ("algo.gamma=0.995",),
    "g999": ("algo.gamma=0.999",),
    "ls05": ("model.log_std_init=-0.5",),
    "ls05_n1024": ("model.log_std_init=-0.5", "algo.n_steps=512"),
    "g995_ls05_n1024": ("algo.gamma=0.995", "model.log_std_init=-0.5", "algo.n_steps=512"),
}
"""Named ablations (``--variant NAME``): Hydra overrides on top of the preset. A name not listed here
labels the ``--set`` overrides instead (docs/benchmarks/trpo.md, "Ablations: the shipped presets")."""


def jobs(args: Any) -> list[Job]:
    extra = (*VARIANTS.get(args.variant, ()), *args.set)
    return [
        Job(a, e, s, EVAL_EVERY.get(e, 10_000), EVAL_EPISODES, THRESHOLDS.get(e), args.steps, extra, args.variant)
        for e in args.envs
        for a in args.algos
        for s in args.seeds
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["cartpole", "pendulum"])
    parser.add_argument("--algos", nargs="+", default=["trpo", "sb3_trpo"])
    add_common_arguments(parser, out=RESULTS / "trpo_learning.json")
    main_for(jobs, parser, script="benchmarks/trpo_learning.py")


if __name__ == "__main__":
    main()
