"""What checkpointing costs: Hopper-v5 trained with checkpoints at an interval vs with them off
(docs/benchmarks/overhead.md).

For each algorithm (pgcli's TRPO and SB3 PPO, their Hopper presets) the script runs ``pgcli.training.run_job`` (what
``pgcli train`` runs, MLflow tracking to a temporary SQLite store, so each checkpoint is also copied into the run's
artifacts) in pairs, checkpointing on and off, alternating which goes first so that load from other processes hits
both alike. One torch thread, the same seed, evaluation only at the end. As with ``pgcli train``, TRPO's two-core
preset runs in one process when it finds no free core at start (a note on stderr).

Measured per run: the time spent in the trainer's ``learn`` (wall and process CPU) and, inside it, the time spent
writing checkpoints (``trainer.save`` plus the artifact copy). Reported per algorithm:

- ``ratio_wall`` / ``ratio_cpu``: median over pairs of learn time on / off (the A/B reading; noisy on a shared
  machine);
- ``checkpoint_share``: checkpoint seconds / learn seconds of the runs with checkpoints (the direct reading);
- ``projected_share_at_default``: the mean cost of one checkpoint times the number a run of the same length makes at
  the default ``checkpoint_every``, over the learn time of the runs without checkpoints. With ``--checkpoint-every``
  below the default (more checkpoints, so a short budget still writes several) this projects the default's cost.

The target is <= 2% at the default interval.

    nice -n 19 .venv/bin/python benchmarks/checkpoint_overhead.py                          # 2 x default interval
    nice -n 19 .venv/bin/python benchmarks/checkpoint_overhead.py --total-steps 20000 --checkpoint-every 4096
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pgcli.config import TrainConfig
from pgcli.config.compose import compose_train_config
from pgcli.tracking import logger as pgcli_tracking
from pgcli.training import run_job
from pgcli.training.build import trainer_class

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS: dict[str, list[str]] = {"trpo": ["algo=trpo", "env=hopper"], "ppo": ["algo=ppo", "env=hopper"]}
DEFAULT_EVERY = TrainConfig.checkpoint_every


def one_run(overrides: list[str], checkpoint_every: int, store_uri: str, out_dir: Path) -> dict[str, float]:
    """``pgcli.training.run_job`` with ``learn``, ``save`` and the artifact copies timed from outside."""
    job = [
        *overrides,
        f"checkpoint_every={checkpoint_every}",
        f"tracking.uri={store_uri}",
        "progress=false",
        "eval.every=0",
        "eval.episodes=1",
    ]
    cls = trainer_class(compose_train_config(job).algo)  # the class whose learn and save are timed
    timing = {"learn_s": 0.0, "learn_cpu_s": 0.0, "checkpoint_s": 0.0, "n_checkpoints": 0.0, "steps": 0.0}
    in_learn = [False]
    originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def timed_learn(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(self: Any, total_steps: int, monitor: Any) -> int:
            t, c = time.perf_counter(), time.process_time()
            in_learn[0] = True
            try:
                steps = fn(self, total_steps, monitor)
            finally:
                in_learn[0] = False
            timing["learn_s"], timing["learn_cpu_s"] = time.perf_counter() - t, time.process_time() - c
            timing["steps"] = float(steps)
            return steps

        return wrapper

    def timed_checkpoint(fn: Callable[..., Any], counts: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if in_learn[0]:  # checkpoints, not the final model or the reports after learn
                    timing["checkpoint_s"] += time.perf_counter() - t
                    timing["n_checkpoints"] += counts

        return wrapper

    probes: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        (cls, "learn", timed_learn),
        (cls, "save", lambda f: timed_checkpoint(f, True)),
        (pgcli_tracking.RunLogger, "log_artifact", lambda f: timed_checkpoint(f, False)),
    ]
    for owner, name, wrap in probes:
        originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrap(getattr(owner, name)))
    try:
        run_job(job, output_dir=out_dir)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=sorted(CONFIGS), default=["trpo", "ppo"])
    parser.add_argument("--total-steps", type=int, default=2 * DEFAULT_EVERY)
    parser.add_argument("--checkpoint-every", type=int, default=DEFAULT_EVERY)
    parser.add_argument("--pairs", type=int, default=2, help="on/off pairs per algorithm")
    parser.add_argument("--out", type=Path, default=RESULTS / "checkpoint_overhead.json")
    args = parser.parse_args()

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="checkpoint_overhead_"))
    store_uri = f"sqlite:///{tmp / 'mlflow.db'}"
    results: dict[str, Any] = {}
    for algo in args.algos:
        overrides = [*CONFIGS[algo], f"total_steps={args.total_steps}"]
        one_run([*CONFIGS[algo], "total_steps=2048"], 0, store_uri, tmp / f"{algo}_warmup")  # imports, store schema
        pairs = []
        for i in range(args.pairs):
            order = [args.checkpoint_every, 0] if i % 2 == 0 else [0, args.checkpoint_every]
            pair = {every: one_run(overrides, every, store_uri, tmp / f"{algo}_{i}_{every}") for every in order}
            on, off = pair[args.checkpoint_every], pair[0]
            pairs.append({"on": on, "off": off})
            print(
                f"{algo} pair {i}: learn on {on['learn_s']:.1f} s ({on['n_checkpoints']:.0f} checkpoints, "
                f"{on['checkpoint_s']:.3f} s in them), off {off['learn_s']:.1f} s",
                flush=True,
            )
        on_runs, off_runs = [p["on"] for p in pairs], [p["off"] for p in pairs]
        per_checkpoint = sum(r["checkpoint_s"] for r in on_runs) / max(1.0, sum(r["n_checkpoints"] for r in on_runs))
        off_sps = statistics.mean(r["steps"] / r["learn_s"] for r in off_runs)
        results[algo] = {
            "pairs": pairs,
            "ratio_wall": statistics.median(p["on"]["learn_s"] / p["off"]["learn_s"] for p in pairs),
            "ratio_cpu": statistics.median(p["on"]["learn_cpu_s"] / p["off"]["learn_cpu_s"] for p in pairs),
            "seconds_per_checkpoint": per_checkpoint,
            "checkpoint_share": sum(r["checkpoint_s"] for r in on_runs) / sum(r["learn_s"] for r in on_runs),
            # one checkpoint per DEFAULT_EVERY steps, each taking DEFAULT_EVERY / off_sps seconds to train
            "projected_share_at_default": per_checkpoint * off_sps / DEFAULT_EVERY,
        }
        r = results[algo]
        print(
            f"{algo}: on/off wall {r['ratio_wall']:.3f}, cpu {r['ratio_cpu']:.3f}; {per_checkpoint * 1000:.1f} ms "
            f"per checkpoint = {100 * r['checkpoint_share']:.2f}% of learn at every {args.checkpoint_every}, "
            f"{100 * r['projected_share_at_default']:.3f}% at the default {DEFAULT_EVERY}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "command": "benchmarks/checkpoint_overhead.py "
                + " ".join(
                    f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
                    for k, v in vars(args).items()
                    if k != "out"
                ),
                "machine": {
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "cpu": platform.processor(),
                },
                "default_checkpoint_every": DEFAULT_EVERY,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
