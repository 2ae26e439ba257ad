"""Startup latency: `pgcli ui` time to first answer, and `pgcli train` time to its first env step
(docs/benchmarks/overhead.md).

- **ui**: a fresh folder whose outputs/mlflow.db is a store with one finished run (as after a first training).
  `pgcli ui --port <free port>` is spawned and the clock runs until the first HTTP 200 from its ``/health``, polled
  every 50 ms by this script (not pgcli's own "ready" line); then pgcli is stopped with SIGTERM.
- **train**: the default `pgcli train` (PPO on CartPole, embedded SQLite store, a fresh folder) with a tiny budget,
  run through a wrapper that stamps the time of the first ``SyncVectorEnv.step``; the clock runs from the spawn.
- **What dominates**: each Python process on the way is timed on its own (wall time of a process that only imports
  what that process imports), and the train command once more under ``python -X importtime`` for the cumulative
  import time of each top-level package.

    .venv/bin/python benchmarks/startup.py                  # 3 repeats of each
    .venv/bin/python benchmarks/startup.py --repeats 1 --nice -5
    <other venv>/bin/python benchmarks/startup.py --out /tmp/startup_other.json   # the same pgcli, another venv

Writes benchmarks/results/startup.json. Timings move with machine load: the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_store(folder: Path) -> None:
    """outputs/mlflow.db with one finished run, written by pgcli's own tracking code."""
    sys.path.insert(0, str(ROOT))
    from pgcli.tracking.store import RunStore

    store_dir = folder / "outputs"
    store_dir.mkdir(parents=True)
    runs = RunStore(f"sqlite:///{store_dir / 'mlflow.db'}")
    run = runs.create_run("cartpole", run_name="ppo-cartpole-s0", tags={}, artifact_root=store_dir.as_uri())
    runs.log_metrics(run.run_id, {"eval/return_mean": 10.0}, step=0)
    runs.end(run.run_id, "FINISHED")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nice", type=int, default=0, help="niceness of the timed processes (negative needs root)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.json")
    ns = parser.parse_args()

    def preexec() -> None:
        if ns.nice:
            os.nice(ns.nice)

    with tempfile.TemporaryDirectory(prefix="pgcli-bench-") as tmp:
        template = Path(tmp) / "with_run"
        make_store(template)
        store_db = template / "outputs" / "mlflow.db"
        load_before = os.getloadavg()
        ui = [time_ui(template / "outputs", preexec) for _ in range(ns.repeats)]
        train = [time_train(store_db, preexec)[0] for _ in range(ns.repeats)]
        _, log = time_train(store_db, preexec, importtime=True)
        ui_phases = {
            name: median([time_process(code, preexec) for _ in range(ns.repeats)]) for name, code in UI_PHASES.items()
        }
        train_phases = {
            name: median([time_process(code, preexec) for _ in range(ns.repeats)])
            for name, code in TRAIN_PHASES.items()
        }
        load_after = os.getloadavg()

    result = {
        "ui_first_answer_s": {"median": median(ui), "runs": [round(t, 2) for t in ui]},
        "train_first_env_step_s": {"median": median(train), "runs": [round(t, 2) for t in train]},
        "ui_processes_alone_s": ui_phases,
        "train_steps_alone_s": train_phases,
        "train_import_cumulative_s": {k: round(v, 2) for k, v in top_imports(log).items()},
        "load_average_1m": [round(load_before[0], 2), round(load_after[0], 2)],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "repeats": ns.repeats,
        "python_executable": PY,
        "bytecode_cached": any(Path(PY).parents[1].glob("lib/python3*/site-packages/mlflow/__pycache__/*.pyc")),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }
    out = ns.out
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
