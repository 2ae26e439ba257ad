"""TRPO Hopper-v5 wall time on two cores: the one-process path against the two-core path, side by side,
with sb3-contrib's TRPO as a reference (docs/benchmarks/trpo.md, "Two cores").

Each run is ``pgcli.training.run_job`` on the overrides of ``pgcli train algo=<a> env=hopper seed=<s>`` (the
preset: 2 envs x 1024 steps, evaluation every 50k env steps, 10 deterministic episodes), in a fresh spawned process,
one at a time, with ``tracking=off`` (metrics.csv only). As ``pgcli train``, a two-core variant that finds no free core
at start runs in one process (a note on stderr; its ``env_wait_frac`` is then None). Variants:

- ``serial``: ``hardware.vec_env=sync hardware.eval_process=false algo.critic_process=false``: everything in one
  process, on one core (the preset's default before the two-core path).
- ``parallel``: ``hardware.vec_env=worker hardware.eval_process=true``: one sub-env steps in a worker process while
  the trainer steps the other, synchronised through a pipe; evaluations run on a policy snapshot in a third
  process, concurrently.
- ``shm``: ``hardware.vec_env=shm hardware.eval_process=true algo.critic_process=false``: the same split,
  synchronised through shared memory with busy-waiting (``pgcli/envs/shm.py``), and the same evaluation process.
- ``shm_inproc``: ``shm`` with evaluation in the trainer process (``hardware.eval_process=false``): the preset from
  2026-11-23's idle measurement (the evaluation process competed with the busy-waiting env worker for the second core).
- ``shm_eval_worker``: ``shm`` whose env worker plays the evaluation episodes while it would idle (during the
  updates; ``hardware.eval_in_worker=true``, the preset since 2026-11-24), with no process of its own.
- ``shm_critic``: ``shm`` plus ``algo.critic_process=true``: the critic is fitted in a process of its own while the
  trainer takes the policy step.
- ``command``: the whole command a user types, ``pgcli train algo=trpo env=hopper seed=<s>`` (the preset's two-core
  path), as a subprocess in an empty directory, so its default embedded MLflow store is created and written too:
  wall time from start to exit, imports and reports included (not a default variant: ``--variants ... command``).
- ``sb3_trpo``: sb3-contrib's TRPO with its zoo preset (``algo=sb3_trpo``), at ``--sb3-steps`` (its wall time is
  also given scaled to ``--steps``), one process.

Per run: wall time of the run (``TrainSummary.wall_time_s``: from the env's start-up to the summary, not the config's
composition nor the CLI's import-time startup), CPU seconds of the trainer process (the whole ``run_job`` call) and of
all processes (its children included), the evaluation curve, the machine's core contention just before and after it
(:func:`core_contention`: how much slower MuJoCo steps when both cores step at once; 1.0 for two independent cores,
about 1.6 when the host runs the machine's two vCPUs on one physical core, which it does at times), and a digest of
the metric history without ``time/*``:
``parallel``, ``shm`` and ``shm_critic`` must learn exactly what ``serial`` learns, so their digests must be the
same. Variants alternate within a round (the order flips every round) so that load from other processes hits them
alike; the load average is recorded. ``--variants`` picks which TRPO variants run (default: all four). Results go to
benchmarks/results/trpo_1m.json (``--out``), rewritten after each run; runs already there (same variant, seed,
steps, round) are skipped, so an interrupted benchmark continues where it stopped.

    .venv/bin/python benchmarks/trpo_1m.py --steps 1000000                # 1 round, ~10 min on an idle machine
    .venv/bin/python benchmarks/trpo_1m.py --steps 100000 --rounds 2 --sb3-steps 0 --out /tmp/trpo_100k.json
    .venv/bin/python benchmarks/trpo_1m.py --steps 1000000 --sb3-steps 0 --variants serial shm shm_critic
    .venv/bin/python benchmarks/trpo_1m.py --report benchmarks/results/trpo_1m.json
    .venv/bin/python benchmarks/trpo_1m.py --probe                        # core contention now, in 5 s
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import multiprocessing as mp
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "serial": ("trpo", ["hardware.vec_env=sync", "hardware.eval_process=false", "algo.critic_process=false"]),
    "parallel": ("trpo", ["hardware.vec_env=worker", "hardware.eval_process=true", "algo.critic_process=false"]),
    "shm": ("trpo", ["hardware.vec_env=shm", "hardware.eval_process=true", "algo.critic_process=false"]),
    "shm_critic": ("trpo", ["hardware.vec_env=shm", "hardware.eval_process=true", "algo.critic_process=true"]),
    "shm_inproc": (
        "trpo",
        [
            "hardware.vec_env=shm",
            "hardware.eval_process=false",
            "algo.critic_process=false",
            "hardware.eval_in_worker=false",
        ],
    ),
    "shm_eval_worker": (
        "trpo",
        [
            "hardware.vec_env=shm",
            "hardware.eval_process=false",
            "algo.critic_process=false",
            "hardware.eval_in_worker=true",
        ],
    ),
    "sb3_trpo": ("sb3_trpo", []),
}
# The whole default command as a user types it, with the preset's own settings (the two-core path) and the default
# embedded MLflow store: imports, config, the store, training, the model and the reports.
COMMAND = "command"
LAST_EVALS = 5


def _hopper_step_time(seconds: float, cpu: int | None, start: Any, out: Any) -> None:
    """Step a Hopper's simulator (4 substeps, as one env step) for ``seconds`` after ``start``; seconds per step."""
    import gymnasium as gym
    import mujoco

    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    env = gym.make("Hopper-v5").unwrapped
    env.reset(seed=0)
    start.wait()
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        mujoco.mj_step(env.model, env.data, nstep=4)
        n += 1
    out.put(elapsed / n)


def core_contention(seconds: float = 1.5) -> float:
    """Seconds per simulator step with both cores stepping at once, over the same alone (each process on its own
    CPU where the OS allows pinning): 1.0 means two independent cores; the two-core path cannot gain more than
    2 / contention over one core."""
    ctx = mp.get_context("spawn")
    cpus = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else [None, None]

    def timed(which: list[Any]) -> list[float]:
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_hopper_step_time, args=(seconds, cpu, start, out)) for cpu in which]
        for p in procs:
            p.start()
        time.sleep(1.0)  # imports done before the clock starts
        start.set()
        times = [out.get() for _ in procs]
        for p in procs:
            p.join()
        return times

    alone = timed(cpus[:1])[0]
    both = timed(cpus[:2] if len(cpus) > 1 else cpus[:1] * 2)
    return float(np.mean(both) / alone)


def run_one(variant: str, seed: int, steps: int) -> dict[str, Any]:
    """One training run in this (fresh) process: wall time, CPU times, curve and metric digest."""
    from pgcli.training import run_job

    algo, extra = VARIANTS[variant]
    overrides = [
        f"algo={algo}",
        "env=hopper",
        f"seed={seed}",
        f"total_steps={steps}",
        "tracking=off",
        "progress=false",
        "eval.every=50000",
        "eval.episodes=10",
        *extra,
    ]
    load_before = os.getloadavg()
    contention_before = core_contention()
    with tempfile.TemporaryDirectory(prefix=f"pgcli_trpo_1m_{variant}_") as tmp:
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu0 = time.process_time()
        summary = run_job(overrides, output_dir=Path(tmp), tracking=False)
        # wall: the run's own clock, from the env's start-up to the summary; CPU: the whole call
        wall, cpu = summary.wall_time_s, time.process_time() - cpu0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with (Path(tmp) / "metrics.csv").open() as f:
            every = list(csv.DictReader(f))
        rows = sorted((r["key"], r["step"], r["value"]) for r in every if not r["key"].startswith("time/"))
        waits = [float(r["value"]) for r in every if r["key"] == "time/env_wait_frac"]
    children_cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    curve = sorted((int(step), float(value)) for key, step, value in rows if key == "eval/return_mean")
    return {
        "variant": variant,
        "algo": algo,
        "seed": seed,
        "steps": summary.steps,
        "overrides": overrides,
        "wall_s": wall,
        "trainer_cpu_s": cpu,
        "all_cpu_s": cpu + children_cpu,
        "env_wait_frac": float(np.mean(waits)) if waits else None,
        "final": summary.final_return,
        "best": max(v for _, v in curve),
        "last5": float(np.mean([v for _, v in curve[-LAST_EVALS:]])),
        "eval_curve": curve,
        "metrics_digest": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
        "n_metric_rows": len(rows),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "contention": [contention_before, core_contention()],
    }


def run_command(seed: int, steps: int) -> dict[str, Any]:
    """``pgcli train algo=trpo env=hopper`` as a subprocess in an empty directory (a first run: the embedded store is
    created too); wall time of the whole command, CPU time of it and its children, the run's curve and digest."""
    overrides = [
        "algo=trpo",
        "env=hopper",
        f"seed={seed}",
        f"total_steps={steps}",
        "progress=false",
        "eval.every=50000",
        "eval.episodes=10",
    ]
    pgcli = Path(sys.executable).with_name("pgcli")
    load_before = os.getloadavg()
    contention_before = core_contention()
    with tempfile.TemporaryDirectory(prefix="pgcli_trpo_1m_command_") as tmp:
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.perf_counter()
        proc = subprocess.run([str(pgcli), "train", *overrides], cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - wall0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"pgcli train failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        (metrics,) = Path(tmp).glob("outputs/runs/*/*/metrics.csv")
        with metrics.open() as f:
            rows = sorted(
                (r["key"], r["step"], r["value"]) for r in csv.DictReader(f) if not r["key"].startswith("time/")
            )
        assert (Path(tmp) / "outputs" / "mlflow.db").is_file(), "the default command logs to the embedded store"
    cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    curve = sorted((int(step), float(value)) for key, step, value in rows if key == "eval/return_mean")
    return {
        "variant": COMMAND,
        "algo": "trpo",
        "seed": seed,
        "steps": max(int(s) for _, s, _ in rows),
        "overrides": overrides,
        "wall_s": wall,
        "trainer_cpu_s": float("nan"),
        "all_cpu_s": cpu,
        "final": curve[-1][1],
        "best": max(v for _, v in curve),
        "last5": float(np.mean([v for _, v in curve[-LAST_EVALS:]])),
        "eval_curve": curve,
        "metrics_digest": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
        "n_metric_rows": len(rows),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "contention": [contention_before, core_contention()],
    }


def _child(conn: Any, variant: str, seed: int, steps: int) -> None:
    conn.send(run_one(variant, seed, steps))


def in_fresh_process(variant: str, seed: int, steps: int) -> dict[str, Any]:
    """``run_one`` in a spawned, non-daemonic process (the parallel path starts processes of its own)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, variant, seed, steps))
    proc.start()
    child.close()
    try:
        result: dict[str, Any] = parent.recv()
    except EOFError:
        raise SystemExit(f"the {variant} run failed (exit code {proc.join() or proc.exitcode})") from None
    proc.join()
    return result


def summary_rows(runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Per variant: medians over runs of wall and CPU time, wall relative to serial in the same round, learning."""
    serial = {(r["seed"], r["round"]): r for r in runs if r["variant"] == "serial"}
    rows = []
    for variant in [*VARIANTS, COMMAND]:
        group = [r for r in runs if r["variant"] == variant]
        if not group:
            continue
        scale = steps / group[0]["steps"]
        paired = [(r, serial[(r["seed"], r["round"])]) for r in group if (r["seed"], r["round"]) in serial]
        ratios = [r["wall_s"] / s["wall_s"] for r, s in paired if r["steps"] == s["steps"]]
        same = [r["metrics_digest"] == s["metrics_digest"] for r, s in paired if r["algo"] == "trpo"]
        rows.append(
            {
                "variant": variant,
                "runs": len(group),
                "steps": group[0]["steps"],
                "wall_s": float(np.median([r["wall_s"] for r in group])),
                "wall_s_at_steps": float(np.median([r["wall_s"] for r in group])) * scale,
                "trainer_cpu_s": float(np.median([r["trainer_cpu_s"] for r in group])),
                "all_cpu_s": float(np.median([r["all_cpu_s"] for r in group])),
                "wall_vs_serial": float(np.median(ratios)) if ratios else None,
                "final": float(np.mean([r["final"] for r in group])),
                "last5": float(np.mean([r["last5"] for r in group])),
                "best": float(np.mean([r["best"] for r in group])),
                "same_metrics_as_serial": all(same) if same else None,
                "loadavg": float(np.mean([r["loadavg_before"][0] for r in group])),
                "contention": float(np.mean([np.mean(r.get("contention", [np.nan])) for r in group])),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], steps: int) -> str:
    header = (
        f"| variant | env steps | wall s | wall s per {steps:,} | wall / serial | trainer CPU s | all CPU s | "
        "final | last-5 | best | same metrics as serial | load avg | core contention |"
    )
    lines = [header, "|---|---:|" + "---:|" * 8 + "---|---:|---:|"]
    for r in rows:
        ratio = "" if r["wall_vs_serial"] is None else f"{r['wall_vs_serial']:.2f}"
        same = {True: "yes", False: "**no**", None: ""}[r["same_metrics_as_serial"]]
        contention = r.get("contention", float("nan"))
        lines.append(
            f"| {r['variant']} | {r['steps']:,} | {r['wall_s']:.1f} | {r['wall_s_at_steps']:.0f} | {ratio} | "
            f"{r['trainer_cpu_s']:.1f} | {r['all_cpu_s']:.1f} | {r['final']:.0f} | {r['last5']:.0f} | "
            f"{r['best']:.0f} | {same} | {r['loadavg']:.1f} | {contention:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps of the TRPO runs")
    parser.add_argument("--sb3-steps", type=int, default=200_000, help="env steps of the sb3-contrib run (0: skip)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=1)
    trpo_variants = [v for v, (algo, _) in VARIANTS.items() if algo == "trpo"] + [COMMAND]
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=trpo_variants,
        default=[v for v in trpo_variants if v != COMMAND],
        help="TRPO variants to run (serial is the reference of the ratios and digests)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "trpo_1m.json")
    parser.add_argument("--report", type=Path, help="print the table of an existing results JSON and exit")
    parser.add_argument("--probe", action="store_true", help="print the machine's core contention and exit")
    args = parser.parse_args()
    if args.probe:
        print(f"core contention {core_contention():.2f} (1.00: two independent cores)")
        return
    if args.report:
        data = json.loads(args.report.read_text())
        print(markdown(data["summary"], data["meta"]["steps"]))
        return
    from pgcli.training.build import cpu_model, git_state

    runs: list[dict[str, Any]] = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    meta = {
        "command": "benchmarks/trpo_1m.py " + " ".join(sys.argv[1:]),
        "steps": args.steps,
        "machine": platform.platform(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **git_state(),
    }
    for rnd in range(args.rounds):
        for seed in args.seeds:
            order = args.variants if rnd % 2 == 0 else args.variants[::-1]
            plan = [(v, args.steps) for v in order] + ([("sb3_trpo", args.sb3_steps)] if args.sb3_steps else [])
            for variant, steps in plan:
                if any(
                    r["variant"] == variant and r["seed"] == seed and r["round"] == rnd and r["steps"] >= steps
                    for r in runs
                ):
                    continue
                result = run_command(seed, steps) if variant == COMMAND else in_fresh_process(variant, seed, steps)
                r = {**result, "round": rnd}
                runs.append(r)
                print(
                    f"round {rnd} seed {seed} {variant:>8}: {r['steps']} steps in {r['wall_s']:.1f} s wall "
                    f"(trainer CPU {r['trainer_cpu_s']:.1f} s, all {r['all_cpu_s']:.1f} s), final {r['final']:.0f}, "
                    f"load {r['loadavg_before'][0]:.1f}, core contention {r['contention'][0]:.2f} / "
                    f"{r['contention'][1]:.2f}, wait share {r.get('env_wait_frac')}",
                    flush=True,
                )
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(
                    json.dumps({"meta": meta, "summary": summary_rows(runs, args.steps), "runs": runs}, indent=1)
                )
    print(markdown(summary_rows(runs, args.steps), args.steps))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
