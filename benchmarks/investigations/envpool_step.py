"""EnvPool against pgcli's vector envs on TRPO Hopper's settings: is EnvPool worth a ``hardware.vec_env=envpool``
backend? (No: docs/benchmarks/trpo.md, "Ablations of the two-core path".)

One vector step of Hopper-v5 with 2 sub-envs (the ``trpo_hopper`` preset), random actions in [-1, 1], auto-reset
included, no normalisation, no policy: what each backend adds to the trainer's critical path per vector step.

- ``sync``: gymnasium's ``SyncVectorEnv`` over pgcli's sub-env stack (``hardware.vec_env=sync``), one process;
- ``shm``: ``pgcli.envs.shm.SharedMemoryVectorEnv`` (``hardware.vec_env=shm``, the preset): one sub-env in a worker
  process, busy-waiting on shared memory;
- ``envpool_1`` / ``envpool_2``: ``envpool.make("Hopper-v5", env_type="gymnasium", num_envs=2, batch_size=2,
  num_threads=1|2)``: EnvPool's C++ pool, stepped synchronously (its MuJoCo tasks are its own ports, not
  gymnasium's v5 code, so they would need learning rows of their own).

Rounds alternate the backends (the order flips every round), so load hits them alike; the machine's core contention
(``benchmarks/trpo_1m.py --probe``) is recorded before and after. EnvPool is not a pgcli dependency: install it into
the venv first (``uv pip install --python .venv/bin/python envpool``).

    .venv/bin/python benchmarks/investigations/envpool_step.py --steps 20000 --rounds 3   # -> results/envpool_step.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: trpo_1m
from trpo_1m import core_contention

RESULTS = Path(__file__).resolve().parents[1] / "results"


def backends() -> dict[str, Callable[[], Any]]:
    import envpool

    from pgcli.envs.make import make_vec_env
    from pgcli.training.checks import train_config

    env_cfg = train_config(["algo=trpo", "env=hopper"]).env
    raw = dataclasses.replace(env_cfg, normalize_obs=False, normalize_reward=False)

    def pool(threads: int) -> Callable[[], Any]:
        return lambda: envpool.make(
            "Hopper-v5", env_type="gymnasium", num_envs=2, batch_size=2, num_threads=threads, seed=0
        )

    return {
        "sync": lambda: make_vec_env(raw, seed=0, vectorization="sync"),
        "shm": lambda: make_vec_env(raw, seed=0, vectorization="shm"),
        "envpool_1": pool(1),
        "envpool_2": pool(2),
    }


def time_steps(env: Any, actions: np.ndarray) -> float:
    """Microseconds per vector step over ``actions`` [n, 2, 3]."""
    env.reset()
    for a in actions[:200]:  # warm-up
        env.step(a)
    start = time.perf_counter()
    for a in actions:
        env.step(a)
    return (time.perf_counter() - start) / len(actions) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="vector steps per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "envpool_step.json")
    args = parser.parse_args()
    try:
        import envpool
    except ImportError:
        raise SystemExit("envpool is not installed: uv pip install --python .venv/bin/python envpool") from None
    makers = backends()
    envs = {name: make() for name, make in makers.items()}
    actions = np.random.default_rng(0).uniform(-1, 1, (args.steps, 2, 3)).astype(np.float32)
    contention = [core_contention()]
    times: dict[str, list[float]] = {name: [] for name in envs}
    for rnd in range(args.rounds):
        order = list(envs) if rnd % 2 == 0 else list(envs)[::-1]
        for name in order:
            times[name].append(time_steps(envs[name], actions))
        print(f"round {rnd}: " + ", ".join(f"{n} {times[n][-1]:.1f} us" for n in envs), flush=True)
    contention.append(core_contention())
    for env in envs.values():
        env.close()
    sync = statistics.median(times["sync"])
    rows = [
        {"backend": n, "us_per_vector_step": statistics.median(t), "vs_sync": statistics.median(t) / sync, "rounds": t}
        for n, t in times.items()
    ]
    meta = {
        "command": "benchmarks/envpool_step.py " + " ".join(sys.argv[1:]),
        "envpool": envpool.__version__,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "core_contention": contention,
        "loadavg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| backend | us per vector step (median) | / sync |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['us_per_vector_step']:.1f} | {r['vs_sync']:.2f} |")
    print(f"core contention {contention[0]:.2f} / {contention[1]:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
