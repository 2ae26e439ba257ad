"""Two `pgcli train` commands started one after the other on a 2-core machine: does the
first run's two-core path survive the second one?

The scene: a user starts ``pgcli train algo=trpo env=hopper seed=0`` (the preset's two-core path: half the sub-envs
step in a busy-waiting worker process), then, ``--delay`` seconds later, ``seed=1`` in another terminal. The second
run finds no free core and runs in one process (``hardware.busy_fallback``). The first run's worker now shares a
core with it, and every vector step of the first run waits for the worker. Cases, each one pair of runs:

- ``watch`` (the default): the first run sees two updates in a row spend > 25% of their time
  waiting for its worker, moves the worker's sub-envs into its own process and goes on there
  (``pgcli.envs.shm_watch.WorkerWatch``).
- ``keep``: the first run with ``hardware.busy_fallback=false``: its worker stays, sharing a core to the end.
- ``sync``: both runs in one process each from the start (``hardware.vec_env=sync``), what a user who knew would
  type: the reference.

Per case: each run's wall time (the whole command, imports included), the pair's makespan, the first run's mean
``time/env_wait_frac``, whether it printed the note, and the digest of its metric history without ``time/*``, which
must be the same in every case (where the work runs changes nothing that is learned). Each run logs to
``tracking=off`` in its own temporary directory. The cases run one after another; the order flips with ``--rounds``.

    .venv/bin/python benchmarks/busy_neighbour.py                       # 3 cases x 1 round, ~6 min
    .venv/bin/python benchmarks/busy_neighbour.py --report benchmarks/results/busy_neighbour.json

Results: benchmarks/results/busy_neighbour.json (``--out``) and the table printed;
docs/benchmarks/trpo.md, "Two commands side by side", quotes it.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {
    "watch": [],
    "keep": ["hardware.busy_fallback=false"],
    "sync": ["hardware.vec_env=sync"],
}
"""The first run's extra overrides per case (the second run gets ``hardware.vec_env=sync`` in ``sync``)."""


def start(overrides: list[str], workdir: Path) -> tuple[subprocess.Popen[str], float]:
    pgcli = Path(sys.executable).with_name("pgcli")
    proc = subprocess.Popen(
        [str(pgcli), "train", *overrides, f"hydra.run.dir={workdir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, time.perf_counter()


def finish(proc: subprocess.Popen[str], started: float) -> tuple[float, str]:
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"pgcli train failed ({proc.returncode}): {err.strip()[-500:]}")
    return wall, err


def history(run_dir: Path) -> tuple[str, list[float], float]:
    """The digest of the metric history without ``time/*``, the ``time/env_wait_frac`` points, the final eval."""
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    kept = sorted((r["key"], r["step"], r["value"]) for r in rows if not r["key"].startswith("time/"))
    waits = [float(r["value"]) for r in rows if r["key"] == "time/env_wait_frac"]
    evals = sorted((int(r["step"]), float(r["value"])) for r in rows if r["key"] == "eval/return_mean")
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:8], waits, evals[-1][1] if evals else float("nan")


def run_case(case: str, steps: int, delay: float) -> dict[str, Any]:
    common = [
        "algo=trpo",
        "env=hopper",
        f"total_steps={steps}",
        "tracking=off",
        "progress=false",
        "eval.every=50000",
        "checkpoint_every=0",
    ]
    second_extra = ["hardware.vec_env=sync"] if case == "sync" else []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix=f"pgcli_neighbour_{case}_") as tmp:
        first_dir, second_dir = Path(tmp) / "first", Path(tmp) / "second"
        first = start([*common, "seed=0", *CASES[case]], first_dir)
        time.sleep(delay)
        second = start([*common, "seed=1", *second_extra], second_dir)
        first_wall, first_err = finish(*first)
        second_wall, second_err = finish(*second)
        makespan = time.perf_counter() - first[1]
        digest, waits, final = history(first_dir)
    return {
        "case": case,
        "steps": steps,
        "delay_s": delay,
        "first_wall_s": first_wall,
        "second_wall_s": second_wall,
        "makespan_s": makespan,
        "first_wait_frac_mean": sum(waits) / len(waits) if waits else 0.0,
        "first_moved_home": "another process is using this run's cores" in first_err,
        "first_fell_back_at_start": "no free core" in first_err,
        "second_fell_back_at_start": "no free core" in second_err,
        "first_digest": digest,
        "first_final": final,
        "loadavg_before": load_before,
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| case | first run wall s | second run wall s | makespan s | first / sync | first's mean wait share | "
        "moved home | digest | final |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    ref = {r["round"]: r["first_wall_s"] for r in runs if r["case"] == "sync"}
    for r in runs:
        ratio = r["first_wall_s"] / ref[r["round"]] if r["round"] in ref else float("nan")
        lines.append(
            f"| {r['case']} | {r['first_wall_s']:.1f} | {r['second_wall_s']:.1f} | {r['makespan_s']:.1f} | "
            f"{ratio:.2f} | {r['first_wait_frac_mean']:.0%} | {'yes' if r['first_moved_home'] else 'no'} | "
            f"{r['first_digest']} | {r['first_final']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps of each run")
    parser.add_argument("--delay", type=float, default=15.0, help="seconds between the two commands")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--out", type=Path, default=RESULTS / "busy_neighbour.json")
    parser.add_argument("--report", type=Path, help="print the table of an existing results JSON and exit")
    args = parser.parse_args()
    if args.report:
        print(markdown(json.loads(args.report.read_text())["runs"]))
        return
    from pgcli.training.build import cpu_model, git_state

    meta = {
        "command": "benchmarks/busy_neighbour.py " + " ".join(sys.argv[1:]),
        "machine": platform.platform(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **git_state(),
    }
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for case in args.cases if rnd % 2 == 0 else args.cases[::-1]:
            result = run_case(case, args.steps, args.delay) | {"round": rnd}
            runs.append(result)
            print(
                f"round {rnd} {case}: first {result['first_wall_s']:.1f} s, second {result['second_wall_s']:.1f} s, "
                f"wait share {result['first_wait_frac_mean']:.0%}, moved home {result['first_moved_home']}, "
                f"digest {result['first_digest']}",
                flush=True,
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    print(markdown(runs))
    digests = {r["first_digest"] for r in runs}
    print("same metric history in every case" if len(digests) == 1 else f"DIFFERENT histories: {sorted(digests)}")


if __name__ == "__main__":
    main()
