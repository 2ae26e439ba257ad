"""Startup latency: `pgcli ui` time to first answer, `pgcli train` time to its first env step, and the light
commands against their budgets (docs/benchmarks/overhead.md).

- **ui**: a fresh folder whose outputs/mlflow.db is a store with one finished run (as after a first training).
  `pgcli ui --port <free port>` is spawned and the clock runs until the first HTTP 200 from its ``/health``, polled
  every 50 ms by this script (not pgcli's own "ready" line); then pgcli is stopped with SIGTERM.
- **train**: the default `pgcli train` (PPO on CartPole, embedded SQLite store, a fresh folder) with a tiny budget,
  run through a wrapper that stamps the time of the first ``SyncVectorEnv.step``; the clock runs from the spawn.
- **light commands**: commands that read a store or refuse their arguments, each timed from spawn to exit in a folder
  whose outputs/mlflow.db holds one finished run, its CPU seconds against a budget (:data:`BUDGETS_S`; the wall time
  is recorded beside them, and grows with the machine's load): they must answer before any
  heavy import (torch, MLflow's server-side store) they do not need. ``--check`` exits 1 when one is over budget.
  A text `pgcli eval` is timed on a tiny TinyGPT run trained once beforehand (tracking=off).
- **What dominates**: each Python process on the way is timed on its own (wall time of a process that only imports
  what that process imports), and the train command once more under ``python -X importtime`` for the cumulative
  import time of each top-level package.

    .venv/bin/python benchmarks/startup.py                  # 3 repeats of each
    .venv/bin/python benchmarks/startup.py --repeats 1 --nice -5
    .venv/bin/python benchmarks/startup.py --light-only --check     # the budgets alone; exit 1 when one is over
    <other venv>/bin/python benchmarks/startup.py --out /tmp/startup_other.json   # the same pgcli, another venv

Writes benchmarks/results/startup.json. Timings move with machine load: the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PGCLI = str(Path(PY).with_name("pgcli"))
TRAIN_ARGS = ["train", "total_steps=256", "eval.every=0", "progress=false"]
FIRST_STEP = "FIRST_ENV_STEP"
# `pgcli train` with a stamp at the first vector-env step (gymnasium.vector is imported a little earlier than pgcli
# would import it; the total import work is the same).
TRAIN_PROBE = f"""
import sys, time
import gymnasium.vector
_step = gymnasium.vector.SyncVectorEnv.step
def step(self, actions):
    if not getattr(step, "seen", False):
        step.seen = True
        print(f"{FIRST_STEP} {{time.time():.6f}}", file=sys.stderr, flush=True)
    return _step(self, actions)
gymnasium.vector.SyncVectorEnv.step = step
from pgcli.cli import main
sys.exit(main(sys.argv[1:]))
"""
# What each process on the way to a first answer imports or does before it can go on.
UI_PHASES = {
    "pgcli process: compose + validate the config, check the store": (
        "from pgcli.training.checks import train_config; from pgcli.tracking.checks import check_readable_store; "
        "train_config([]); import pgcli.commands.ui"
    ),
    "`python -m mlflow ui` process: import mlflow's CLI": "import mlflow.cli",
    "uvicorn process: import mlflow.server.fastapi_app (the app)": "import mlflow.server.fastapi_app",
}
TRAIN_PHASES = {
    "interpreter + pgcli.cli": "import pgcli.cli",
    "compose + validate the config (Hydra)": "from pgcli.training.checks import train_config; train_config([])",
    "import torch": "import torch",
    "import stable_baselines3": "import stable_baselines3",
    "import mlflow (client)": "from mlflow.tracking import MlflowClient",
    "import gymnasium + make CartPole-v1": "import gymnasium; gymnasium.make('CartPole-v1')",
}

LIGHT_COMMANDS: dict[str, list[str]] = {
    "pgcli --help": ["--help"],
    "pgcli runs": ["runs"],
    "pgcli runs --experiment <missing> (refused)": ["runs", "--experiment", "nope"],
    "pgcli export <run> --out <non-empty dir> (refused)": ["export", "RUN_ID", "--out", "full"],
    "pgcli train <bad value> (refused)": ["train", "algo.n_steps=-1"],
    "pgcli compare --experiment cartpole": ["compare", "--experiment", "cartpole"],
    "pgcli eval <unknown run id> (refused)": ["eval", "0123abcd"],
    "pgcli eval <TinyGPT run dir> --no-log": ["eval", "TEXT_RUN", "--no-log", "--out", "evaluated"],
    "pgcli eval <TinyGPT run dir>": ["eval", "TEXT_RUN", "--out", "evaluated"],
}
"""Each light command's arguments (RUN_ID: the store's run; TEXT_RUN: the directory of a tiny TinyGPT SFT run,
trained once with tracking=off), run in the folder that holds the store."""
BUDGETS_S = {
    "pgcli --help": 1.0,
    "pgcli runs": 3.0,
    "pgcli runs --experiment <missing> (refused)": 3.0,
    "pgcli export <run> --out <non-empty dir> (refused)": 3.0,
    "pgcli train <bad value> (refused)": 3.0,
    "pgcli compare --experiment cartpole": 5.0,
    "pgcli eval <unknown run id> (refused)": 3.0,
    "pgcli eval <TinyGPT run dir> --no-log": 5.0,
    "pgcli eval <TinyGPT run dir>": 11.5,
}
"""CPU seconds (user + system) from spawn to exit, about the wall time on an idle machine (issue 34, item 10); compare
draws its plot (matplotlib). A text `pgcli eval` imports torch (about 3.5 s of CPU) and evaluates 32 held-out problems
(0.1 s); logging the evaluation imports MLflow's SQL store (about 5 s more)."""
TEXT_RUN_ARGS = [
    "sft",
    "env=addition",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_layers=1",
    "env.n_digits=2",
    "env.n_eval=32",
    "env.eval_samples=4",
    "algo.batch_size=32",
    "total_steps=64",
    "eval.every=0",
    "tracking=off",
    "progress=false",
]
"""The text run `pgcli eval` evaluates (TEXT_RUN): a tiny TinyGPT, 32 held-out problems."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_store(folder: Path) -> str:
    """outputs/mlflow.db with one finished run, written by pgcli's own tracking code; its run id."""
    sys.path.insert(0, str(ROOT))
    from pgcli.tracking.store import RunStore

    store_dir = folder / "outputs"
    store_dir.mkdir(parents=True)
    runs = RunStore(f"sqlite:///{store_dir / 'mlflow.db'}")
    run = runs.create_run("cartpole", run_name="ppo-cartpole-s0", tags={}, artifact_root=store_dir.as_uri())
    runs.log_metrics(run.run_id, {"eval/return_mean": 10.0}, step=0)
    runs.end(run.run_id, "FINISHED")
    return run.run_id


def make_text_run(folder: Path) -> Path:
    """The run directory of a tiny TinyGPT SFT run (:data:`TEXT_RUN_ARGS`), trained in ``folder``."""
    run_dir = folder / "text_run"
    subprocess.run([PGCLI, *TEXT_RUN_ARGS, f"hydra.run.dir={run_dir}"], cwd=folder, check=True, capture_output=True)
    return run_dir


def time_ui(store_template: Path, preexec: object) -> float:
    with tempfile.TemporaryDirectory(prefix="pgcli-bench-ui-") as tmp:
        work = Path(tmp)
        shutil.copytree(store_template, work / "outputs")
        port = free_port()
        start = time.perf_counter()
        proc = subprocess.Popen(
            [PGCLI, "ui", "--port", str(port)],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec,  # type: ignore[arg-type]
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"pgcli ui exited {proc.returncode}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                        if response.status == 200:
                            return time.perf_counter() - start
                except OSError:
                    time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def time_train(store_db: Path, preexec: object, importtime: bool = False) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="pgcli-bench-train-") as tmp:
        work = Path(tmp)
        (work / "outputs").mkdir()
        shutil.copyfile(store_db, work / "outputs" / "mlflow.db")  # a store in use, as after a first run
        cmd = [PY, *(["-X", "importtime"] if importtime else []), "-c", TRAIN_PROBE, *TRAIN_ARGS]
        start = time.time()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, preexec_fn=preexec)  # type: ignore[arg-type]
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        stamp = next(line for line in proc.stderr.splitlines() if line.startswith(FIRST_STEP))
        return float(stamp.split()[1]) - start, proc.stderr


def time_light(template: Path, refs: dict[str, str], argv: list[str], preexec: object) -> tuple[float, float]:
    """Seconds from spawn to exit of ``pgcli <argv>`` in a copy of the folder with one run, and the CPU seconds (user +
    system) the process used."""
    with tempfile.TemporaryDirectory(prefix="pgcli-bench-light-") as tmp:
        work = Path(tmp)
        shutil.copytree(template / "outputs", work / "outputs")
        (work / "full").mkdir()
        (work / "full" / "keep.txt").write_text("not empty\n")
        args = [refs.get(a, a) for a in argv]
        cpu, start = cpu_of_children(), time.perf_counter()
        subprocess.run([PGCLI, *args], cwd=work, capture_output=True, preexec_fn=preexec)  # type: ignore[arg-type]
        return time.perf_counter() - start, cpu_of_children() - cpu


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def light_commands(template: Path, refs: dict[str, str], repeats: int, preexec: object) -> dict[str, dict[str, object]]:
    """Median wall and CPU seconds of each light command, the CPU seconds against its budget (on a busy machine the
    wall time grows with the load; on an idle one it is about the CPU time)."""
    out: dict[str, dict[str, object]] = {}
    for name, argv in LIGHT_COMMANDS.items():
        times = [time_light(template, refs, argv, preexec) for _ in range(repeats)]
        cpu = median([c for _, c in times])
        out[name] = {"wall": median([w for w, _ in times]), "cpu": cpu, "budget": BUDGETS_S[name]}
        out[name]["ok"] = cpu <= BUDGETS_S[name]
    return out


def time_process(code: str, preexec: object) -> float:
    start = time.perf_counter()
    subprocess.run([PY, "-c", code], check=True, capture_output=True, cwd=tempfile.gettempdir(), preexec_fn=preexec)  # type: ignore[arg-type]
    return time.perf_counter() - start


def top_imports(importtime_log: str, n: int = 8) -> dict[str, float]:
    """Cumulative seconds of the top-level imports in a ``-X importtime`` log, largest first."""
    totals: dict[str, float] = {}
    for line in importtime_log.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        if not cumulative.isdigit() or line.split("|")[2].startswith("  "):  # the header, or a nested import
            continue
        top = name.split(".")[0]
        totals[top] = totals.get(top, 0.0) + int(cumulative) / 1e6
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])[:n])


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def heavy_results(template: Path, repeats: int, preexec: object) -> dict[str, object]:
    """`pgcli ui` to its first answer, `pgcli train` to its first env step, and the processes on their way."""
    store_db = template / "outputs" / "mlflow.db"
    ui = [time_ui(template / "outputs", preexec) for _ in range(repeats)]
    train = [time_train(store_db, preexec)[0] for _ in range(repeats)]
    _, log = time_train(store_db, preexec, importtime=True)
    ui_phases = {
        name: median([time_process(code, preexec) for _ in range(repeats)]) for name, code in UI_PHASES.items()
    }
    train_phases = {
        name: median([time_process(code, preexec) for _ in range(repeats)]) for name, code in TRAIN_PHASES.items()
    }
    return {
        "ui_first_answer_s": {"median": median(ui), "runs": [round(t, 2) for t in ui]},
        "train_first_env_step_s": {"median": median(train), "runs": [round(t, 2) for t in train]},
        "ui_processes_alone_s": ui_phases,
        "train_steps_alone_s": train_phases,
        "train_import_cumulative_s": {k: round(v, 2) for k, v in top_imports(log).items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nice", type=int, default=0, help="niceness of the timed processes (negative needs root)")
    parser.add_argument("--light-only", action="store_true", help="only the light commands and their budgets")
    parser.add_argument("--check", action="store_true", help="exit 1 when a light command is over its budget")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/startup.json (startup_light.json)")
    ns = parser.parse_args()

    def preexec() -> None:
        if ns.nice:
            os.nice(ns.nice)

    with tempfile.TemporaryDirectory(prefix="pgcli-bench-") as tmp:
        template = Path(tmp) / "with_run"
        run_id = make_store(template)
        load_before = os.getloadavg()
        result = {} if ns.light_only else heavy_results(template, ns.repeats, preexec)
        refs = {"RUN_ID": run_id, "TEXT_RUN": str(make_text_run(Path(tmp)))}
        result["light_commands_s"] = light_commands(template, refs, ns.repeats, preexec)
        load_after = os.getloadavg()

    result |= {
        "load_average_1m": [round(load_before[0], 2), round(load_after[0], 2)],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "repeats": ns.repeats,
        "python_executable": PY,
        "bytecode_cached": any(Path(PY).parents[1].glob("lib/python3*/site-packages/mlflow/__pycache__/*.pyc")),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }
    out = ns.out or ROOT / "benchmarks" / "results" / ("startup_light.json" if ns.light_only else "startup.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    over = [name for name, r in result["light_commands_s"].items() if not r["ok"]]
    for name in over:
        print(f"over budget: {name}", file=sys.stderr)
    return 1 if ns.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
