"""What pgcli costs on top of Stable-Baselines3: the same PPO trained bare and through pgcli
(docs/benchmarks/overhead.md).

Both sides train SB3 PPO with identical hyperparameters (taken from the composed pgcli config, preset included), the
same seed and one torch thread, in one process, in alternating order (bare/pgcli, pgcli/bare, ...) so that load from
other processes hits both alike:

- ``bare``: SB3 as a user would run it: ``stable_baselines3.common.env_util.make_vec_env`` (DummyVecEnv + Monitor,
  plus SB3's VecNormalize when the env config normalises), ``PPO(...).learn(total_steps)``; no tracking, no progress.
- ``pgcli``: ``pgcli.training.run_job`` (what ``pgcli train`` runs): pgcli's env builder through the SB3VecEnv
  adapter, the training monitor, batched MLflow tracking to a temporary SQLite store, the tqdm progress bar on,
  evaluation only at the end (``eval.every=0``).

SPS = env steps / time spent in ``learn`` (for pgcli: ``SB3Trainer.learn``: SB3's loop plus the adapter, the monitor's
callbacks, metric logging and MLflow flushes). Each pair gives a ratio pgcli/bare, both on wall time and on the
process's CPU time (less sensitive to other processes on a shared machine); the medians over pairs are the result.
The target is >= 0.95.

A last, instrumented pgcli run attributes its CPU time (``time.thread_time``): the share spent in pgcli's own code
during ``learn`` (adapter minus the env it wraps, SB3 callbacks into the monitor, logger writes, progress bar, MLflow
flushes). That share does not depend on load and is the overhead the A/B ratio tries to see through the noise.

    .venv/bin/python benchmarks/sb3_overhead.py                           # ppo_cartpole preset, 20k steps, 6 pairs
    .venv/bin/python benchmarks/sb3_overhead.py --config ppo_hopper --steps 10000 --pairs 4
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import torch

from pgcli.algo import sb3 as pgcli_sb3
from pgcli.envs import normalize as pgcli_normalize
from pgcli.tracking import backend as pgcli_tracking
from pgcli.training import monitor as pgcli_monitor
from pgcli.training import run_job
from pgcli.training.checks import train_config

RESULTS = Path(__file__).resolve().parent / "results"

CONFIGS: dict[str, list[str]] = {
    # what `pgcli train` runs by default: rl-baselines3-zoo's CartPole PPO (32 steps x 8 envs, 20 epochs of 256)
    "ppo_cartpole": ["algo=ppo", "env=cartpole"],
    # SB3's PPO defaults on 8 CartPole envs (2048 steps x 8 envs per rollout, 10 epochs of 64)
    "ppo_cartpole_sb3_defaults": ["algo=ppo", "env=cartpole", "~preset"],
    # MuJoCo, zoo preset: 1 env, 512 steps, obs + reward normalisation, 256x256 networks
    "ppo_hopper": ["algo=ppo", "env=hopper"],
}


def bare_sb3(cfg: Any, seed: int) -> dict[str, float]:
    """SB3 on its own envs: the baseline."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    t0 = time.perf_counter()
    algo_cls, kwargs = pgcli_sb3.SB3_ALGOS[type(cfg.algo)](cfg.algo)  # the same mapping pgcli uses: same values
    env = make_vec_env(cfg.env.id, n_envs=cfg.env.n_envs, seed=seed)
    if cfg.env.normalize_obs or cfg.env.normalize_reward:
        env = VecNormalize(
            env,
            norm_obs=cfg.env.normalize_obs,
            norm_reward=cfg.env.normalize_reward,
            clip_obs=cfg.env.clip_obs,
            clip_reward=cfg.env.clip_reward,
            gamma=cfg.algo.gamma,
        )
    model = algo_cls(
        "MlpPolicy", env, policy_kwargs=pgcli_sb3.policy_kwargs(cfg.model), seed=seed, device="cpu", verbose=0, **kwargs
    )
    t1, c1 = time.perf_counter(), time.process_time()
    model.learn(cfg.total_steps)
    t2, c2 = time.perf_counter(), time.process_time()
    env.close()
    steps = model.num_timesteps
    return {
        "steps": steps,
        "learn_s": t2 - t1,
        "learn_cpu_s": c2 - c1,
        "sps": steps / (t2 - t1),
        "cpu_sps": steps / (c2 - c1),
        "wall_s": t2 - t0,
    }


def through_pgcli(overrides: list[str], seed: int, store_uri: str, out_dir: Path) -> dict[str, float]:
    """``pgcli.training.run_job`` with tracking and progress on; SB3Trainer.learn timed from outside."""
    job = [*overrides, f"seed={seed}", f"tracking.uri={store_uri}", "progress=true", "eval.every=0", "eval.episodes=1"]
    timing: dict[str, float] = {}
    learn = pgcli_sb3.SB3Trainer.learn

    def timed_learn(self: Any, total_steps: int, monitor: Any) -> int:
        t, c = time.perf_counter(), time.process_time()
        steps = learn(self, total_steps, monitor)
        timing["learn_s"], timing["learn_cpu_s"] = time.perf_counter() - t, time.process_time() - c
        timing["steps"] = steps
        return steps

    pgcli_sb3.SB3Trainer.learn = timed_learn  # type: ignore[method-assign]
    try:
        summary = run_job(job, output_dir=out_dir)
    finally:
        pgcli_sb3.SB3Trainer.learn = learn  # type: ignore[method-assign]
    sps, cpu_sps = timing["steps"] / timing["learn_s"], timing["steps"] / timing["learn_cpu_s"]
    # wall: the run's own clock (env start-up to the summary), not the config's composition and checks
    return {**timing, "sps": sps, "cpu_sps": cpu_sps, "wall_s": summary.wall_time_s}


# --------------------------------------------------------------------------------------------------------------------
# attribution: CPU time of pgcli's own code inside learn
# --------------------------------------------------------------------------------------------------------------------

# (owner, method, label). Labels starting with "  " are nested inside an earlier one (reported, not summed).
PROBES: list[tuple[Any, str, str]] = [
    (pgcli_sb3.SB3VecEnv, "step_wait", "adapter.step_wait (with the env)"),
    (gymnasium.vector.SyncVectorEnv, "step", "  env: SyncVectorEnv.step"),
    (pgcli_normalize.VecNormalize, "step", "  env: VecNormalize.step"),
    (pgcli_sb3._MonitorCallback, "_on_step", "callback._on_step (episodes -> logger)"),
    (pgcli_sb3._MonitorCallback, "_on_rollout_start", "callback._on_rollout_start (monitor.update)"),
    (pgcli_sb3._MonitorWriter, "write", "SB3 logger -> pgcli logger"),
    (pgcli_monitor.TrainingMonitor, "_advance_bar", "  progress bar (tqdm)"),
    (pgcli_tracking.MLflowBackend, "flush", "  MLflow log_batch flushes"),
]


def attribute(overrides: list[str], store_uri: str, out_dir: Path) -> dict[str, Any]:
    """One instrumented pgcli run: CPU seconds in each probe during learn, and pgcli's own share of learn."""
    spent: dict[str, float] = {}
    in_learn = [False]  # count only inside learn: not the final evaluation, the last flush or the artifacts
    originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def probe(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if in_learn[0]:
                    spent[label] = spent.get(label, 0.0) + time.thread_time() - t

        return wrapper

    def gate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            in_learn[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                in_learn[0] = False

        return wrapper

    for owner, name, label in PROBES:
        originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, probe(getattr(owner, name), label))
    originals.append((pgcli_sb3.SB3Trainer, "learn", pgcli_sb3.SB3Trainer.learn))
    pgcli_sb3.SB3Trainer.learn = gate(pgcli_sb3.SB3Trainer.learn)  # type: ignore[method-assign]
    try:
        run = through_pgcli(overrides, 0, store_uri, out_dir)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    outer_env = spent.get("  env: VecNormalize.step") or spent.get("  env: SyncVectorEnv.step", 0.0)
    adapter_only = spent.get("adapter.step_wait (with the env)", 0.0) - outer_env
    own = adapter_only + sum(v for k, v in spent.items() if k.startswith("callback") or k.startswith("SB3 logger"))
    return {
        "learn_cpu_s": run["learn_cpu_s"],
        "cpu_s": dict(sorted(spent.items())),
        "adapter_only_cpu_s": adapter_only,
        "pgcli_own_cpu_s": own,
        "pgcli_own_share": own / run["learn_cpu_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="ppo_cartpole")
    parser.add_argument("--steps", type=int, default=20_000, help="total_steps of every run")
    parser.add_argument("--pairs", type=int, default=6, help="bare/pgcli pairs (after one untimed warm-up pair)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: benchmarks/results/...)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # pgcli's hardware=cpu default; the bare side gets the same
    overrides = [*CONFIGS[args.config], f"total_steps={args.steps}"]
    base_cfg = train_config(overrides)
    tmp = Path(tempfile.mkdtemp(prefix="sb3_overhead_"))
    store_uri = f"sqlite:///{tmp / 'mlflow.db'}"

    # warm-up: imports, torch's lazy initialisation, the MLflow store's schema
    warm = [*CONFIGS[args.config], "total_steps=2048"]
    bare_sb3(train_config(warm), seed=0)
    through_pgcli(warm, 0, store_uri, tmp / "warmup")

    pairs = []
    for i in range(args.pairs):
        order = ("bare", "pgcli") if i % 2 == 0 else ("pgcli", "bare")  # alternate: drift in load cancels out
        result: dict[str, Any] = {"order": "/".join(order)}
        for side in order:
            if side == "bare":
                result["bare"] = bare_sb3(base_cfg, seed=i)
            else:
                result["pgcli"] = through_pgcli(overrides, i, store_uri, tmp / f"run{i}")
        bare, ours = result["bare"], result["pgcli"]
        result["ratio"] = ours["sps"] / bare["sps"]
        result["cpu_ratio"] = ours["cpu_sps"] / bare["cpu_sps"]
        pairs.append(result)
        print(
            f"pair {i} ({result['order']}): SPS bare {bare['sps']:,.0f} pgcli {ours['sps']:,.0f} "
            f"ratio {result['ratio']:.3f} | per CPU-second bare {bare['cpu_sps']:,.0f} pgcli {ours['cpu_sps']:,.0f} "
            f"ratio {result['cpu_ratio']:.3f}",
            file=sys.stderr,
            flush=True,
        )

    attribution = attribute(overrides, store_uri, tmp / "attributed")
    ratios, cpu_ratios = [p["ratio"] for p in pairs], [p["cpu_ratio"] for p in pairs]
    summary = {
        "config": args.config,
        "overrides": overrides,
        "steps_per_run": pairs[0]["bare"]["steps"],
        "pairs": args.pairs,
        "bare_sps_median": statistics.median(p["bare"]["sps"] for p in pairs),
        "pgcli_sps_median": statistics.median(p["pgcli"]["sps"] for p in pairs),
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_range": [min(cpu_ratios), max(cpu_ratios)],
        "pgcli_own_cpu_share": attribution["pgcli_own_share"],
        "bare_wall_s_median": statistics.median(p["bare"]["wall_s"] for p in pairs),
        "pgcli_wall_s_median": statistics.median(p["pgcli"]["wall_s"] for p in pairs),
        "target": 0.95,
    }
    record = {
        "summary": summary,
        "pairs": pairs,
        "attribution": attribution,
        "command": " ".join([".venv/bin/python", "benchmarks/sb3_overhead.py", *sys.argv[1:]]),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": _cpus(),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = args.out or RESULTS / f"sb3_overhead_{args.config}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    for label, seconds in attribution["cpu_s"].items():
        print(f"  {label:45s} {seconds:7.3f} CPU s  {100 * seconds / attribution['learn_cpu_s']:5.1f}% of learn")
    print(f"wrote {out}", file=sys.stderr)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


if __name__ == "__main__":
    main()
