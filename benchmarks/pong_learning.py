"""PPO on Pong to a score of 18: long runs that survive being stopped (docs/benchmarks/pixels.md, "Pong").

Each seed is one real ``pgcli train algo=ppo env=pong seed=<s>`` subprocess (preset ``ppo_pong``: CleanRL's and
rl-baselines3-zoo's Atari PPO, 8 envs; SB3's PPO with pgcli's Nature CNN), ``tracking=off``, ``--threads`` torch
threads (default 1), in a run directory of its own: ``benchmarks/results/pong/runs/s<seed>`` (gitignored). The
budget is ``--steps`` env steps (default 3M, 12M frames; the preset's linear learning-rate and clip schedules anneal
over it, as CleanRL's do over its budget). Every 250k env steps, 10 deterministic episodes on the evaluation env
(raw game scores: -21 to 21).

``run`` is resumable at any point: stop it (Ctrl-C, a kill, the end of a session) and run the same command again. A
run directory with a checkpoint of an unfinished run is continued with ``pgcli train resume=<dir>`` (exact for the
gymnasium path: the ALE states, RNGs and frame stacks are in the checkpoint; docs/checkpoints.md); one that stopped
before its first checkpoint starts again. Every stretch of a run is appended to ``segments.json`` (env steps, wall
seconds, the machine's load), so the training speed is reported per stretch, not over the gaps between them.

    nice -n 5 .venv/bin/python benchmarks/pong_learning.py run --seeds 0        # hours on 2 CPUs: run it in background
    .venv/bin/python benchmarks/pong_learning.py report [--doc]                 # results.json, curves.png, the table
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "pong"
PGCLI = str(Path(sys.executable).with_name("pgcli"))
STEPS = 3_001_344
"""3M env steps, rounded up to whole rollouts of the preset (8 envs x 128 steps)."""
EVAL_EVERY = 250_000
EVAL_EPISODES = 10
THRESHOLD = 18.0
"""The target score: trained PPO agents score 18 to 21 (conf/env/pong.yaml's reward_threshold)."""
LAST = 5
PUBLISHED = {"CleanRL ppo_atari.py": 20.36, "openai/baselines PPO (Huang et al., 2022)": 20.51}
"""PongNoFrameskip-v4 after 10M env steps (40M frames), the mean episodic return over seeds, as CleanRL's docs table
them ("ppo_atari.py": 20.36 +- 0.20 against baselines' 20.512 +- 0.50). Both anneal over 10M steps; the runs here
anneal over their own, shorter budget."""


def run_dir(seed: int) -> Path:
    return RESULTS / "runs" / f"s{seed}"


def status(directory: Path) -> str | None:
    """The run's status from its ``run.json`` (None: never started, or stopped before writing it)."""
    path = directory / "run.json"
    return json.loads(path.read_text()).get("status") if path.is_file() else None


def has_checkpoint(directory: Path) -> bool:
    return any((directory / "checkpoints").glob("*")) if (directory / "checkpoints").is_dir() else False


def last_step(directory: Path) -> int:
    """The largest env step in the run's metrics.csv (0 when it has none)."""
    history = read_metrics(directory / "metrics.csv")
    return max((step for points in history.values() for step, _ in points), default=0)


def command(seed: int, steps: int, directory: Path, threads: int = 1) -> list[str]:
    """Start ``seed`` afresh or continue it from its newest checkpoint."""
    common = ["progress=false", f"hardware.torch_threads={threads}"]  # what a resume may set (tracking may not)
    if has_checkpoint(directory) and status(directory) != "FINISHED":
        return [PGCLI, "train", f"resume={directory}", *common]
    if directory.exists():  # stopped before its first checkpoint: nothing to continue
        shutil.rmtree(directory)
    return [
        PGCLI,
        "train",
        "algo=ppo",
        "env=pong",
        f"seed={seed}",
        f"total_steps={steps}",
        f"eval.every={EVAL_EVERY}",
        f"eval.episodes={EVAL_EPISODES}",
        "eval.deterministic=true",
        "tracking=off",
        *common,
        f"hydra.run.dir={directory}",
    ]


def run(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        directory = run_dir(seed)
        if status(directory) == "FINISHED":
            print(f"seed {seed}: finished ({directory})", flush=True)
            continue
        argv = command(seed, args.steps, directory, args.threads)
        print("$ " + shlex.join(["pgcli", *argv[1:]]), flush=True)
        start_step, start, load = last_step(directory), time.perf_counter(), os.getloadavg()[0]
        code = subprocess.run(argv, cwd=REPO).returncode
        segment = {
            "seed": seed,
            "from_step": start_step,
            "to_step": last_step(directory),
            "wall_s": time.perf_counter() - start,
            "load_before": load,
            "load_after": os.getloadavg()[0],
            "exit_code": code,
            "command": shlex.join(["pgcli", *argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        segments = RESULTS / "segments.json"
        kept = json.loads(segments.read_text()) if segments.is_file() else []
        segments.write_text(json.dumps([*kept, segment], indent=1))
        if code != 0:
            sys.exit(code)


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a run's metrics.csv as sorted (step, value) pairs (a resumed run's repeated steps: the last)."""
    if not path.is_file():
        return {}
    points: dict[str, dict[int, float]] = {}
    for line in path.read_text().splitlines()[1:]:
        key, step, value = line.rsplit(",", 2)
        points.setdefault(key, {})[int(step)] = float(value)
    return {key: sorted(values.items()) for key, values in points.items()}


def summarise(seed: int) -> dict[str, Any] | None:
    history = read_metrics(run_dir(seed) / "metrics.csv")
    curve = history.get("eval/return_mean", [])
    if not curve:
        return None
    segments = RESULTS / "segments.json"
    stretches = [s for s in (json.loads(segments.read_text()) if segments.is_file() else []) if s["seed"] == seed]
    trained = [(s["to_step"] - s["from_step"], s["wall_s"]) for s in stretches if s["to_step"] > s["from_step"]]
    reached = [step for step, value in curve if value >= THRESHOLD]
    return {
        "seed": seed,
        "status": status(run_dir(seed)),
        "steps": max(step for points in history.values() for step, _ in points),
        "eval_step": curve[-1][0],
        "final_eval": curve[-1][1],
        "last_evals": float(np.mean([v for _, v in curve[-LAST:]])),
        "best_eval": max(v for _, v in curve),
        "steps_to_threshold": reached[0] if reached else None,
        "train_return_last": float(
            np.mean([v for _, v in history.get("rollout/ep_return_mean", [])[-LAST:]] or [np.nan])
        ),
        "sps": sum(n for n, _ in trained) / sum(w for _, w in trained) if trained else float("nan"),
        "eval_curve": curve,
        "train_return_curve": history.get("rollout/ep_return_mean", []),
        "stretches": len([s for s in stretches if s["to_step"] > s["from_step"]]),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"| seed | status | env steps | last eval at | final eval | last {LAST} evals | best eval | first eval >= "
        f"{THRESHOLD:g} at | training return (last {LAST} logged) | env steps/s | stretches |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        to = "-" if r["steps_to_threshold"] is None else f"{r['steps_to_threshold']:,}"
        lines.append(
            f"| {r['seed']} | {r['status'] or 'stopped'} | {r['steps']:,} | {r['eval_step']:,} | "
            f"{r['final_eval']:.1f} | "
            f"{r['last_evals']:.1f} | {r['best_eval']:.1f} | {to} | {r['train_return_last']:.1f} | "
            f"{r['sps']:.0f} | {r['stretches']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, r in enumerate(rows):
        ax.plot(*zip(*r["eval_curve"], strict=True), marker="o", color=f"C{i}", label=f"seed {r['seed']}: evaluation")
        if r["train_return_curve"]:
            ax.plot(
                *zip(*r["train_return_curve"], strict=True),
                color=f"C{i}",
                alpha=0.3,
                label=f"seed {r['seed']}: training episodes",
            )
    ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1, label=f"target {THRESHOLD:g}")
    ax.set(title="PPO on Pong (ppo_pong preset), CPU", xlabel="env steps (4 frames each)", ylabel="game score")
    ax.set_ylim(-21.5, 21.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DOC = REPO / "docs" / "benchmarks" / "pixels.md"
START, END = "<!-- pong-learning:start -->", "<!-- pong-learning:end -->"


def report(args: argparse.Namespace) -> None:
    rows = [r for r in (summarise(seed) for seed in args.seeds) if r is not None]
    if not rows:
        sys.exit("no evaluations yet: run `benchmarks/pong_learning.py run` first")
    text = table(rows)
    print(text)
    (RESULTS / "results.json").write_text(
        json.dumps({"threshold": THRESHOLD, "published": PUBLISHED, "runs": rows}, indent=1)
    )
    plot(rows, RESULTS / "curves.png")
    print(f"wrote {RESULTS / 'results.json'} and {RESULTS / 'curves.png'}")
    if args.doc:
        head, rest = DOC.read_text().split(START, 1)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--seeds", nargs="+", type=int, default=[0])
    sub.choices["run"].add_argument("--steps", type=int, default=STEPS, help="env steps per run (a new run only)")
    sub.choices["run"].add_argument(
        "--threads", type=int, default=1, help="torch threads (2 on an otherwise idle machine)"
    )
    sub.choices["report"].add_argument("--doc", action="store_true", help="also write the table into the docs page")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (run if args.what == "run" else report)(args)


if __name__ == "__main__":
    main()
