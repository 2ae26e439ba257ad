"""One text run on two processes (docs/benchmarks/distributed.md, docs/distributed.md): GRPO and SFT completions per
second with 2 processes x 1 torch thread against 1 process x 1 thread and 1 process x 2 threads, side by side in one
run (the three settings of a workload one after another, then the next repeat).

Every run is a real ``pgcli`` subprocess (``tracking=off``, no evaluation before the end, no checkpoints) on the
default TinyGPT of the ``sft_addition`` / ``grpo_addition`` presets; the rate is the run's last ``time/sps``
(completions, or demonstrations, trained per second of training: rank 0's monitor counts every process's), from
the run directory's metrics.csv. Results: one JSON per run in benchmarks/results/distributed/ (run directories
under runs/, ignored by git), the table printed as Markdown.

    nice -n 5 .venv/bin/python benchmarks/distributed.py --repeats 1
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PGCLI = str(Path(sys.executable).parent / "pgcli")
RESULTS = REPO / "benchmarks" / "results" / "distributed"

WORKLOADS = {
    "sft": ["sft", "env=addition", "total_steps=2048", "algo.batch_size=64"],
    "sft_b256": ["sft", "env=addition", "total_steps=8192", "algo.batch_size=256"],
    "grpo": ["train", "algo=grpo", "env=addition", "total_steps=512"],
    "grpo_g64": ["train", "algo=grpo", "env=addition", "total_steps=2048", "algo.n_groups=64", "algo.batch_size=256"],
}
"""Workload -> its command (the presets' model and batch sizes: SFT 64 demonstrations a step, GRPO 16 x 8; and SFT
at 256 a step and GRPO at 64 prompts x 8 an update, where each process's share of a step is large enough for its
per-operator costs not to dominate)."""
SETTINGS = {
    "2 proc x 1 thread": ["hardware.processes=2", "hardware.torch_threads=1"],
    "1 proc x 1 thread": ["hardware.torch_threads=1"],
    "1 proc x 2 threads": ["hardware.torch_threads=2"],
}
BASELINE = "1 proc x 1 thread"


def last_sps(run_dir: Path) -> float:
    """The run's last ``time/sps`` (metrics.csv)."""
    with (run_dir / "metrics.csv").open() as f:
        values = [float(row["value"]) for row in csv.DictReader(f) if row["key"] == "time/sps"]
    return values[-1]


def run_one(workload: str, setting: str, repeat: int) -> dict[str, object]:
    run_dir = RESULTS / "runs" / f"{workload}-{setting.replace(' ', '')}-{repeat}"
    argv = [PGCLI, *WORKLOADS[workload], *SETTINGS[setting], "tracking=off", "progress=false", "eval.every=0"]
    argv += ["checkpoint_every=0", "env.n_eval=16", "env.eval_samples=0", f"hydra.run.dir={run_dir}"]
    print(f"$ {shlex.join(['pgcli', *argv[1:]])}", flush=True)
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    result = {
        "workload": workload,
        "setting": setting,
        "repeat": repeat,
        "sps": last_sps(run_dir),
        "wall_s": time.perf_counter() - start,
        "load_before": os.getloadavg()[0],
    }
    (RESULTS / f"{workload}-{setting.replace(' ', '')}-{repeat}.json").write_text(json.dumps(result))
    return result


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| workload | setting | completions/s (median) | vs 1 proc x 1 thread | runs |",
        "|---|---|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        medians = {}
        for setting in SETTINGS:
            rates = [float(r["sps"]) for r in results if r["workload"] == workload and r["setting"] == setting]  # type: ignore[arg-type]
            if rates:
                medians[setting] = (statistics.median(rates), len(rates))
        base = medians.get(BASELINE, (float("nan"), 0))[0]
        for setting, (rate, n) in medians.items():
            lines.append(f"| {workload} | {setting} | {rate:.1f} | {rate / base:.2f}x | {n} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    results = [
        run_one(workload, setting, repeat)
        for repeat in range(args.repeats)
        for workload in args.workloads
        for setting in SETTINGS
    ]
    print(table(results))


if __name__ == "__main__":
    main()
