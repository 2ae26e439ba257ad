"""TRPO training throughput: ours vs sb3-contrib's, both against what the env and the policy allow
(docs/benchmarks/trpo.md).

Four loops on the same vector env (``pgcli.envs.make.make_vec_env``: 8 sync envs, the env's pgcli config, so Hopper
normalises observations and rewards) with the same 64x64 tanh MLP policy and 1 torch thread, measured in one
process and interleaved round by round, so that load from other processes hits all of them alike:

- ``limit``: ``policy.sample`` + ``env.step`` in a bare loop, no learning: the ceiling of any on-policy trainer;
- ``limit_dist``: the same with a ``torch.distributions`` object built per step (SB3's ``predict`` path; the
  reference figure of ~29k SPS on CartPole was measured this way: docs/benchmarks/trpo.md, "Speed");
- ``ours``: ``pgcli.algo.trpo.TRPO.learn`` (collection + GAE + CG/line search + critic epochs), no logging. The
  same run also times its own acting (``policy.sample``, ``policy.to_env`` and ``env.step`` inside the rollout):
  ``ours_acting`` is the limit on ours' own trajectories, the steps divided by that CPU time (the same clock
  splits each update into acting, policy step and critic). ``limit`` and
  ``limit_dist`` act with an untrained policy whose episodes differ from a learning agent's (length, resets,
  contacts), and env cost follows the episodes: their SPS moved by up to 35% between seeds here. ``ours /
  ours_acting`` (the share of CPU time spent acting) does not depend on that;
- ``sb3``: sb3-contrib's TRPO through ``pgcli.algo.sb3.SB3Trainer`` (``algo=sb3_trpo``), no logging.

Both trainers use the same hyperparameters (sb3-contrib's defaults, which are also ours: n_steps 2048,
10 critic epochs of 128-sample minibatches, 15 CG iterations). SPS = env steps per second of CPU time of this process
(``time.process_time``: robust to other processes sharing the cores); wall-clock SPS is recorded too. Ratios are taken
within each round and the table reports their medians.

    .venv/bin/python benchmarks/trpo_speed.py                          # CartPole-v1 and Hopper-v5, 3 rounds
    .venv/bin/python benchmarks/trpo_speed.py --envs cartpole --rounds 5 --updates 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributions import Categorical, Normal

from pgcli.algo.policies import CategoricalPolicy, DiagGaussianPolicy, obs_tensor
from pgcli.algo.sb3 import SB3Trainer
from pgcli.algo.trpo import TRPO
from pgcli.config import SB3TRPOConfig, TRPOConfig
from pgcli.envs.make import make_vec_env
from pgcli.training.checks import train_config

RESULTS = Path(__file__).resolve().parent / "results"
CONTENDERS = ("limit", "limit_dist", "ours", "sb3")


class NullMonitor:
    """Takes what a trainer reports and does nothing with it (no logging cost in the measurement)."""

    def episodes(self, step: int, info: Any) -> None:
        pass

    def add_episodes(self, step: int, returns: Any, lengths: Any) -> None:
        pass

    def log(self, step: int, metrics: Any) -> None:
        pass

    def update(self, step: int, agent: Any) -> None:
        pass


def clocks(fn: Callable[[], int]) -> tuple[float, float]:
    """(CPU-time SPS, wall SPS) of ``fn``, which returns the env steps it took."""
    cpu, wall = time.process_time(), time.perf_counter()
    steps = fn()
    return steps / (time.process_time() - cpu), steps / (time.perf_counter() - wall)


class PhaseClock:
    """Accumulates the CPU time a trainer spends in each phase of its updates: ``acting`` (its policy's ``sample``
    and ``to_env`` and its env's ``step``), ``policy_step`` (gradient, CG, line search) and ``critic`` (the value
    fit). Instance attributes shadow the methods; the clock reads cost about 1 us per call."""

    def __init__(self, trainer: TRPO) -> None:
        self.cpu_s: dict[str, float] = {"acting": 0.0, "policy_step": 0.0, "critic": 0.0}
        for owner, name, phase in (
            (trainer.policy, "sample", "acting"),
            (trainer.policy, "to_env", "acting"),
            (trainer.env, "step", "acting"),
            (trainer, "_policy_step", "policy_step"),
            (trainer, "_critic_steps", "critic"),
        ):
            object.__setattr__(owner, name, self._timed(getattr(owner, name), phase))

    def _timed(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu_s[phase] += time.process_time() - start

        return timed


PHASES: dict[str, dict[str, float]] = {}
"""env -> CPU seconds per phase of the last ``ours`` run (set by ``run_one``)."""


def limit_loop(env: Any, policy: Any, steps: int, *, dist: bool) -> int:
    """Step ``env`` with actions sampled from ``policy`` for ``steps`` env steps; nothing stored, nothing learnt."""
    obs, _ = env.reset(seed=0)
    n = steps // env.num_envs
    with torch.no_grad():
        for _ in range(n):
            x = obs_tensor(obs, torch.device("cpu"))
            if not dist:
                actions = policy.sample(x)
            elif isinstance(policy, CategoricalPolicy):
                actions = Categorical(logits=policy.net(x)).sample()
            else:
                mean = policy.net(x)
                actions = Normal(mean, policy.log_std.exp().expand_as(mean)).sample()
            obs, *_ = env.step(policy.to_env(actions))
    return n * env.num_envs


def run_one(contender: str, env_name: str, n_steps: int, steps: int, seed: int) -> tuple[float, float]:
    # Not run_job: this times the trainers' own learn loops beside bare acting loops, without the run around them.
    # no preset: the default 64x64 tanh model (conf/model/mlp.yaml) and the env's own config, for every contender
    cfg = train_config(["algo=trpo", f"env={env_name}", "env.n_envs=8", "~preset"])
    torch.manual_seed(seed)
    env = make_vec_env(cfg.env, seed=seed, gamma=0.99)
    device = torch.device("cpu")
    try:
        if contender in ("limit", "limit_dist", "ours"):
            trainer = TRPO(TRPOConfig(n_steps=n_steps), env=env, model=cfg.model, seed=seed, device=device)
            if contender == "ours":
                phases = PhaseClock(trainer)
                cpu_sps, wall_sps = clocks(lambda: trainer.learn(steps, NullMonitor()))  # type: ignore[arg-type]
                PHASES[env_name] = {**phases.cpu_s, "total": steps / cpu_sps}
                return cpu_sps, wall_sps
            policy: CategoricalPolicy | DiagGaussianPolicy = trainer.policy  # type: ignore[assignment]
            return clocks(lambda: limit_loop(env, policy, steps, dist=contender == "limit_dist"))
        sb3 = SB3Trainer(SB3TRPOConfig(n_steps=n_steps), env=env, model=cfg.model, seed=seed, device=device)
        return clocks(lambda: sb3.learn(steps, NullMonitor()))  # type: ignore[arg-type]
    finally:
        env.close()


def median(values: list[float]) -> float:
    return float(np.median(values))


def measure(env_name: str, *, n_steps: int, updates: int, rounds: int) -> dict[str, Any]:
    steps = updates * n_steps * 8
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        row: dict[str, Any] = {"load_before": os.getloadavg()[0]}
        for contender in CONTENDERS:
            cpu_sps, wall_sps = run_one(contender, env_name, n_steps, steps, seed=r)
            row[contender] = {"cpu_sps": cpu_sps, "wall_sps": wall_sps}
            if contender == "ours":
                phases = PHASES[env_name]
                row["ours_acting"] = {"cpu_sps": steps / phases["acting"]}
                row["ours_phases_s_per_update"] = {k: v / updates for k, v in phases.items()}
                split = ", ".join(f"{k} {v / updates:.3f} s" for k, v in phases.items())
                print(
                    f"  {env_name} round {r}: ours acting {steps / phases['acting']:8.0f} SPS (cpu): the limit on "
                    f"ours' own trajectories; per update: {split}",
                    flush=True,
                )
            print(
                f"  {env_name} round {r}: {contender:10s} {cpu_sps:8.0f} SPS (cpu)  {wall_sps:8.0f} SPS (wall)",
                flush=True,
            )
        per_round.append(row)
    summary: dict[str, Any] = {}
    for contender in CONTENDERS:
        for clock in ("cpu_sps", "wall_sps"):
            summary[f"{contender}_{clock}"] = median([row[contender][clock] for row in per_round])
    summary["ours_acting_cpu_sps"] = median([row["ours_acting"]["cpu_sps"] for row in per_round])
    for phase in per_round[0]["ours_phases_s_per_update"]:
        summary[f"ours_{phase}_s_per_update"] = median([row["ours_phases_s_per_update"][phase] for row in per_round])
    for clock in ("cpu_sps", "wall_sps"):
        for num, den in (("ours", "limit"), ("sb3", "limit"), ("ours", "sb3"), ("ours", "limit_dist")):
            summary[f"{num}/{den}_{clock}"] = median([row[num][clock] / row[den][clock] for row in per_round])
    summary["ours/ours_acting_cpu_sps"] = median(
        [row["ours"]["cpu_sps"] / row["ours_acting"]["cpu_sps"] for row in per_round]
    )
    return {"env": env_name, "steps_per_run": steps, "n_steps": n_steps, "rounds": per_round, "median": summary}


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| env | limit SPS | limit (torch.distributions) SPS | ours SPS | sb3-contrib SPS | ours / limit "
        "| ours / limit (torch.distributions) | ours / own acting | sb3-contrib / limit | ours / sb3-contrib |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        m = res["median"]
        lines.append(
            f"| {res['env']} | {m['limit_cpu_sps']:,.0f} | {m['limit_dist_cpu_sps']:,.0f} | {m['ours_cpu_sps']:,.0f} "
            f"| {m['sb3_cpu_sps']:,.0f} | {m['ours/limit_cpu_sps']:.2f} | {m['ours/limit_dist_cpu_sps']:.2f} "
            f"| {m['ours/ours_acting_cpu_sps']:.2f} | {m['sb3/limit_cpu_sps']:.2f} "
            f"| {m['ours/sb3_cpu_sps']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["cartpole", "hopper"], help="pgcli env config names")
    parser.add_argument("--n-steps", type=int, default=2048, help="steps per env per update (both trainers)")
    parser.add_argument("--updates", type=int, default=2, help="updates per measured run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    parser.add_argument("--out", type=Path, default=RESULTS / "trpo_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(e, n_steps=args.n_steps, updates=args.updates, rounds=args.rounds) for e in args.envs]
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(table(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
