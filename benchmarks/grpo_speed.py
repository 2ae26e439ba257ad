"""GRPO training throughput as a fraction of what the env and the policy allow (docs/benchmarks/grpo.md).

Three loops on the same vector env (``pgcli.envs.make.make_vec_env``, the env's pgcli config) and the same policy
(``pgcli.algo.policies.make_policy``), measured in one process, interleaved round by round so that load from other
processes hits all three alike; the table reports medians over rounds:

- ``env+policy``: ``policy.sample`` + ``env.step`` in a bare loop: the ceiling of any on-policy collection;
- ``collect``: ``collect_groups``, GRPO's group collection alone (partial resets, bookkeeping, [E, L] padding);
- ``train``: ``GRPO.learn`` (collection + advantages + mu epochs of minibatch updates), no evaluation or logging.

It also reports the share of env steps that land in a member's episode over the training batches
(``train/collect_efficiency``, refilling sub-envs as members end) against the share had each group held G sub-envs
until its longest member ended (computed from the same episodes' lengths).

    .venv/bin/python benchmarks/grpo_speed.py                      # cartpole, pendulum, hopper; 5 rounds
    .venv/bin/python benchmarks/grpo_speed.py --envs cartpole --rounds 3 --steps 20000

SPS = env steps per second (every sub-env step, as the trainers count them).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pgcli.algo.grpo import GRPO, collect_groups
from pgcli.envs.make import make_vec_env
from pgcli.training.checks import train_config

RESULTS = Path(__file__).resolve().parent / "results"


class LengthMonitor:
    """Keeps only what the efficiency comparison needs (episode lengths, in member order, and collect_efficiency)."""

    def __init__(self) -> None:
        self.lengths: list[list[int]] = []
        self.efficiency: list[float] = []

    def add_episodes(self, step, returns, lengths):
        self.lengths.append(list(lengths))

    def log(self, step, metrics):
        self.efficiency.append(metrics["train/collect_efficiency"])

    def update(self, step, agent):
        pass


def env_policy_sps(trainer: GRPO, steps: int) -> float:
    """policy.sample + env.step, nothing else."""
    env, policy, device = trainer.env, trainer.policy, trainer.device
    obs, _ = env.reset(seed=0)
    n_steps = steps // env.num_envs
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(n_steps):
            actions = policy.sample(torch.as_tensor(obs, dtype=torch.float32, device=device))
            obs, *_ = env.step(policy.to_env(actions))
    return n_steps * env.num_envs / (time.perf_counter() - start)


def collect_sps(trainer: GRPO, steps: int) -> float:
    """collect_groups until `steps` env steps."""
    taken, start, rng = 0, time.perf_counter(), np.random.default_rng(0)
    while taken < steps:
        seeds = rng.integers(0, 2**31 - 1, size=trainer.cfg.n_groups).tolist()
        batch = collect_groups(
            trainer.env, trainer.policy, group_seeds=seeds, group_size=trainer.cfg.group_size, device=trainer.device
        )
        taken += batch.env_steps
    return taken / (time.perf_counter() - start)


def train_sps(trainer: GRPO, steps: int, monitor: LengthMonitor | None = None) -> float:
    """GRPO.learn for `steps` more env steps."""
    before, start = trainer.steps, time.perf_counter()
    trainer.learn(trainer.steps + steps, monitor or LengthMonitor())  # type: ignore[arg-type]
    return (trainer.steps - before) / (time.perf_counter() - start)


def wait_for_group_efficiency(lengths: list[int], group_size: int) -> float:
    """Share of useful env steps had each group held G sub-envs until its longest member ended (n_envs = G)."""
    groups = np.asarray(lengths).reshape(-1, group_size)
    return float(groups.sum() / (group_size * groups.max(1)).sum())


def measure(env_name: str, steps: int, rounds: int) -> dict:
    # Not run_job: the trainer's collection and training loops are timed directly, beside a bare env + policy loop.
    cfg = train_config(["algo=grpo", f"env={env_name}"])  # the preset's G, M, n_envs and model
    torch.set_num_threads(cfg.hardware.torch_threads)
    torch.manual_seed(0)
    env = make_vec_env(cfg.env, seed=0, vectorization=cfg.hardware.vec_env, gamma=cfg.algo.gamma)
    trainer = GRPO(cfg.algo, env=env, model=cfg.model, seed=0, device=torch.device("cpu"))
    loops = {"env+policy": env_policy_sps, "collect": collect_sps, "train": train_sps}
    for fn in loops.values():  # warm-up: imports, allocator, first resets
        fn(trainer, min(steps, 2000))
    samples: dict[str, list[float]] = {name: [] for name in loops}
    monitor = LengthMonitor()
    for _ in range(rounds):
        for name, fn in loops.items():
            samples[name].append(train_sps(trainer, steps, monitor) if name == "train" else fn(trainer, steps))
    trainer.close()
    # the training batches' real collection efficiency vs waiting for each group's longest member
    waiting = [wait_for_group_efficiency(lengths, cfg.algo.group_size) for lengths in monitor.lengths]
    median = {name: float(np.median(v)) for name, v in samples.items()}
    return {
        "env": env_name,
        "env_id": cfg.env.id,
        "n_envs": cfg.env.n_envs,
        "group_size": cfg.algo.group_size,
        "n_groups": cfg.algo.n_groups,
        "n_iterations": cfg.algo.n_iterations,
        "hidden_sizes": list(cfg.model.pi_hidden_sizes),
        "steps_per_round": steps,
        "sps_samples": samples,
        "sps_median": median,
        "collect_fraction": median["collect"] / median["env+policy"],
        "train_fraction": median["train"] / median["env+policy"],
        "collect_efficiency_mean": float(np.mean(monitor.efficiency)),
        "wait_for_group_efficiency_mean": float(np.mean(waiting)),
        "n_train_batches": len(monitor.efficiency),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["cartpole", "pendulum", "hopper"])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per loop per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "grpo_speed.json")
    args = parser.parse_args()
    rows = []
    for env_name in args.envs:
        row = measure(env_name, args.steps, args.rounds)
        rows.append(row)
        m = row["sps_median"]
        print(
            f"{env_name:<10} env+policy {m['env+policy']:9,.0f}  collect {m['collect']:9,.0f} "
            f"({row['collect_fraction']:.0%})  train {m['train']:9,.0f} ({row['train_fraction']:.0%})  "
            f"useful steps: refill {row['collect_efficiency_mean']:.0%}, "
            f"wait-for-group {row['wait_for_group_efficiency_mean']:.0%}",
            flush=True,
        )
    meta = {
        "command": "benchmarks/grpo_speed.py " + " ".join(sys.argv[1:]),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
