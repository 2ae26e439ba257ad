"""PPO on Atari frames: env steps per second and peak memory of pgcli against SB3's own Atari stack, and of
``hardware.vec_env=envpool`` against the gymnasium path (docs/benchmarks/pixels.md).

Breakout, 8 envs, CleanRL's ``ppo_atari`` settings (128 steps per env per update, minibatches of 256, 4 epochs, Adam
2.5e-4 annealed, clip 0.1, entropy 0.01), one torch thread, CPU. Each run is a process of its own, started by this
script; the sides of a round run one after another and the order turns every round, so load from other processes
hits every side alike:

- ``sb3``: SB3 as its docs run Atari: ``make_atari_env("BreakoutNoFrameskip-v4", n_envs=8)`` (DummyVecEnv, SB3's
  AtariWrapper: OpenCV resize) + ``VecFrameStack(n_stack=4)``, ``PPO("CnnPolicy", ...)`` with the same
  hyperparameters (taken from the composed pgcli config), no tracking;
- ``pgcli``: ``pgcli.training.run_job`` (what ``pgcli train algo=ppo env=breakout`` runs), gymnasium path
  (``hardware.vec_env=sync``), MLflow tracking to a temporary SQLite store, evaluation only at the end;
- ``pgcli_envpool``: the same with ``hardware.vec_env=envpool`` (EnvPool's threads, one per usable CPU);
- ``env_sync`` / ``env_envpool``: the two vector envs alone, random actions, no policy: what the env side can give.

SPS = env steps / seconds in ``learn`` (SB3's loop, pgcli's adapter and monitor included; not the start-up nor the
final evaluation). Peak memory: the run process's ``ru_maxrss`` and the peak sum of the resident sets of its process
tree (children included), sampled every 0.2 s. Results are appended run by run to
``benchmarks/results/pixels_speed/results.json`` (``--resume`` skips the runs already there); the table goes to
``table.md`` beside it.

Needs ``pip install 'pgcli[pixels]' opencv-python-headless`` (SB3's AtariWrapper uses OpenCV; pgcli does not).

    nice -n 5 .venv/bin/python benchmarks/pixels_speed.py --steps 16384 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "pixels_speed"
GAME = "BreakoutNoFrameskip-v4"
CLEANRL = ["algo=ppo", "env=breakout", "env.n_envs=8", "algo.n_steps=128", "algo.batch_size=256", "algo.n_epochs=4",
           "algo.learning_rate=2.5e-4", "algo.lr_schedule=linear", "algo.clip_range=0.1", "algo.ent_coef=0.01",
           "hardware.torch_threads=1"]  # fmt: skip
SIDES = ("sb3", "pgcli", "pgcli_envpool", "env_sync", "env_envpool")
RATIOS = {"pgcli / sb3": ("pgcli", "sb3"), "envpool / gymnasium (PPO)": ("pgcli_envpool", "pgcli"),
          "envpool / gymnasium (env only)": ("env_envpool", "env_sync")}  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# one run (a child process)
# --------------------------------------------------------------------------------------------------------------------


def run_sb3(steps: int, seed: int) -> dict[str, float]:
    import torch
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from pgcli.algo.sb3 import SB3_ALGOS
    from pgcli.training.checks import train_config

    torch.set_num_threads(1)
    cfg = train_config([*CLEANRL, f"total_steps={steps}"])
    algo_cls, kwargs = SB3_ALGOS[type(cfg.algo)](cfg.algo)  # the values pgcli gives SB3: the same hyperparameters
    env = VecFrameStack(make_atari_env(GAME, n_envs=8, seed=seed), n_stack=4)
    model = algo_cls("CnnPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    start = time.perf_counter()
    model.learn(steps)
    learn_s = time.perf_counter() - start
    env.close()
    return {"steps": model.num_timesteps, "learn_s": learn_s}


def run_pgcli(steps: int, seed: int, vec_env: str) -> dict[str, float]:
    from pgcli.algo import sb3 as pgcli_sb3
    from pgcli.training import run_job

    timing: dict[str, float] = {}
    learn = pgcli_sb3.SB3Trainer.learn

    def timed_learn(self: Any, total_steps: int, monitor: Any) -> int:
        start = time.perf_counter()
        timing["steps"] = learn(self, total_steps, monitor)
        timing["learn_s"] = time.perf_counter() - start
        return int(timing["steps"])

    pgcli_sb3.SB3Trainer.learn = timed_learn  # type: ignore[method-assign]
    tmp = Path(tempfile.mkdtemp(prefix="pixels_speed_"))
    # the final evaluation plays one game, sampling actions: a deterministic untrained policy may never FIRE
    run_job(
        [
            *CLEANRL,
            f"total_steps={steps}",
            f"seed={seed}",
            f"hardware.vec_env={vec_env}",
            "eval.every=0",
            "eval.episodes=1",
            "eval.deterministic=false",
            "progress=false",
            "checkpoint_every=0",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
        ],
        output_dir=tmp / "run",
    )
    return timing


def run_env(steps: int, seed: int, vec_env: str) -> dict[str, float]:
    import numpy as np

    from pgcli.envs.make import make_vec_env
    from pgcli.training.checks import train_config

    cfg = train_config([*CLEANRL, f"hardware.vec_env={vec_env}"])
    env = make_vec_env(cfg.env, seed=seed, vectorization=vec_env)
    actions = np.random.default_rng(seed).integers(0, 4, size=(steps // 8, 8))
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    learn_s = time.perf_counter() - start
    env.close()
    return {"steps": len(actions) * 8, "learn_s": learn_s}


def child(side: str, steps: int, seed: int) -> None:
    if side == "sb3":
        result = run_sb3(steps, seed)
    elif side.startswith("pgcli"):
        result = run_pgcli(steps, seed, "envpool" if side == "pgcli_envpool" else "sync")
    else:
        result = run_env(steps, seed, side.removeprefix("env_"))
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------------------------
# the rounds (the parent process)
# --------------------------------------------------------------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # a child that ended between the listing and the reading
            total += proc.memory_info().rss
    return total


def measure(side: str, steps: int, seed: int) -> dict[str, Any]:
    """One run in a child process: its result, its ru_maxrss and the peak resident set of its process tree."""
    cmd = [sys.executable, __file__, "--child", side, "--steps", str(steps), "--seed", str(seed)]
    load_before = os.getloadavg()[0]  # the machine's 1-minute load: how many others wanted the cores
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, started = 0, time.perf_counter()
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side} failed (exit {proc.returncode}):\n{err[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    return {
        "side": side,
        **result,
        "sps": result["steps"] / result["learn_s"],
        "process_s": time.perf_counter() - started,
        "maxrss_mb": usage.ru_maxrss / 1024,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "peak_tree_rss_mb": peak / 2**20,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_side = {side: [r for r in runs if r["side"] == side] for side in SIDES}
    sides = {
        side: {
            "sps_median": statistics.median(r["sps"] for r in rs),
            "sps": [round(r["sps"], 1) for r in rs],
            "peak_tree_rss_mb_max": max(r["peak_tree_rss_mb"] for r in rs),
            "maxrss_mb_max": max(r["maxrss_mb"] for r in rs),
        }
        for side, rs in by_side.items()
        if rs
    }
    ratios = {}
    for name, (num, den) in RATIOS.items():
        per_round = [n["sps"] / d["sps"] for n in by_side[num] for d in by_side[den] if n["round"] == d["round"]]
        if per_round:
            ratios[name] = {"median": statistics.median(per_round), "per_round": [round(x, 3) for x in per_round]}
    return {"sides": sides, "ratios": ratios}


def table(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    names = {
        "sb3": "SB3 PPO, make_atari_env + VecFrameStack",
        "pgcli": "pgcli train (hardware.vec_env=sync)",
        "pgcli_envpool": "pgcli train hardware.vec_env=envpool",
        "env_sync": "env only: gymnasium path (sync)",
        "env_envpool": "env only: EnvPool",
    }
    rows = [
        "| side | env steps/s (median) | per round | peak RSS, tree (MB) | ru_maxrss (MB) |",
        "|---|---|---|---|---|",
    ]
    for side, s in summary["sides"].items():
        rows.append(
            f"| {names[side]} | {s['sps_median']:.0f} | {', '.join(f'{x:.0f}' for x in s['sps'])} | "
            f"{s['peak_tree_rss_mb_max']:.0f} | {s['maxrss_mb_max']:.0f} |"
        )
    rows += ["", "| ratio | median | per round |", "|---|---|---|"]
    for name, r in summary["ratios"].items():
        rows.append(f"| {name} | {r['median']:.2f} | {', '.join(f'{x:.2f}' for x in r['per_round'])} |")
    rows += [
        "",
        f"{meta['steps']} env steps per PPO run, {meta['rounds']} rounds, {meta['cpus']} CPUs, "
        f"envpool {meta['envpool']}, torch {meta['torch']}, SB3 {meta['sb3']}.",
    ]
    return "\n".join(rows) + "\n"


def versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return {
        "envpool": v("envpool"),
        "torch": v("torch"),
        "sb3": v("stable_baselines3"),
        "ale_py": v("ale-py"),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16_384, help="env steps of each PPO run (env-only runs: 2x)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="keep the runs already in results.json")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.seed)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "results.json"
    meta = {"steps": args.steps, "rounds": args.rounds, **versions()}
    runs: list[dict[str, Any]] = json.loads(path.read_text())["runs"] if args.resume and path.exists() else []
    for rnd in range(args.rounds):
        order = SIDES if rnd % 2 == 0 else SIDES[::-1]  # turn the order: drift in load cancels out
        for side in order:
            if any(r["round"] == rnd and r["side"] == side for r in runs):
                continue
            steps = args.steps * 2 if side.startswith("env_") else args.steps
            run = {"round": rnd, **measure(side, steps, seed=rnd)}
            runs.append(run)
            print(
                f"round {rnd} {side}: {run['sps']:.0f} steps/s, peak tree RSS {run['peak_tree_rss_mb']:.0f} MB",
                flush=True,
            )
            summary = summarize(runs)
            path.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=2))
    (RESULTS / "table.md").write_text(table(summarize(runs), meta))
    print(table(summarize(runs), meta))


if __name__ == "__main__":
    main()
