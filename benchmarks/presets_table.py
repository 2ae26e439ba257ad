"""One results table for every shipped preset, as rl-baselines3-zoo's benchmark page (docs/benchmarks/presets.md).

For each ``conf/preset/<algo>_<env>.yaml`` this script trains the preset at its own budget on several seeds with
``pgcli train -m`` (the product measuring itself, into its own MLflow store) and aggregates the runs it finds there:
final, last-5-evaluations and best-evaluation means with their std over seeds, wall time and SPS, date and commit.

It is resumable: a (preset, seed) already FINISHED in the store, or already recorded in the results JSON (committed,
so later sessions continue where this one stopped), is not trained again. ``--max-runs`` bounds one invocation.

    python benchmarks/presets_table.py --presets ppo_cartpole a2c_cartpole --seeds 0 1 2     # train what is missing
    python benchmarks/presets_table.py --report                                              # table only
    python benchmarks/presets_table.py --max-runs 6 --jobs 2                                 # a slice of everything

Results: ``benchmarks/results/presets.json`` and the table between the ``presets-table`` markers of
``docs/benchmarks/presets.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "presets.json"
DOC = REPO / "docs" / "benchmarks" / "presets.md"
DEFAULT_STORE = REPO / "outputs" / "presets" / "mlflow.db"
EXPERIMENT = "presets"
LAST = 5
MARK_START, MARK_END = "<!-- presets-table:start -->", "<!-- presets-table:end -->"


@dataclass(frozen=True)
class RunResult:
    """One finished benchmark run, as the table needs it (plain values: it is stored in the results JSON)."""

    run_id: str
    algo: str
    env_id: str
    preset: str
    seed: int
    budget: int
    steps: int
    final: float
    last5: float
    best: float
    wall_s: float
    sps: float
    date: str
    commit: str
    cpu: str = ""
    """The CPU's model name (the run's ``cpu`` tag; empty for runs from before it was logged)."""


def run_result(record: Any, evals: Sequence[tuple[int, float]], sps_points: Sequence[tuple[int, float]]) -> RunResult:
    """A :class:`RunResult` from a stored run (``pgcli.tracking.store.RunRecord``) and its metric histories."""
    values = [v for _, v in sorted(evals)]
    start = record.start_time / 1000
    end = record.end_time / 1000 or start
    commit = record.tags.get("git_commit", "")[:7] + ("+dirty" if record.tags.get("git_dirty") == "true" else "")
    return RunResult(
        run_id=record.run_id,
        algo=record.tags.get("algo", record.params.get("algo", "?")),
        env_id=record.tags.get("env_id", "?"),
        preset=record.tags.get("preset") or f"{record.params.get('algo', '?')}_{record.params.get('env', '?')}",
        seed=int(record.tags.get("seed", record.params.get("seed", -1))),
        budget=int(record.params.get("total_steps", 0)),
        steps=max((s for s, _ in evals), default=0),
        final=values[-1] if values else float("nan"),
        last5=float(np.mean(values[-LAST:])) if values else float("nan"),
        best=max(values) if values else float("nan"),
        wall_s=max(end - start, 0.0),
        sps=sps_points[-1][1] if sps_points else float("nan"),
        date=time.strftime("%Y-%m-%d", time.gmtime(start)),
        commit=commit,
        cpu=record.tags.get("cpu", ""),
    )


def summarise(results: Iterable[RunResult]) -> list[dict[str, Any]]:
    """One row per (preset, env id, budget): means and stds over seeds. A seed measured twice counts once (the later
    run), so a re-run never weighs double; different budgets never share a row."""
    latest: dict[tuple[str, str, int, int], RunResult] = {}
    for r in sorted(results, key=lambda r: r.date):
        latest[(r.preset, r.env_id, r.budget, r.seed)] = r
    groups: dict[tuple[str, str, int], list[RunResult]] = {}
    for (preset, env_id, budget, _), r in sorted(latest.items()):
        groups.setdefault((preset, env_id, budget), []).append(r)
    rows = []
    for (preset, env_id, budget), runs in sorted(groups.items()):

        def stat(name: str, runs: list[RunResult] = runs) -> tuple[float, float]:
            x = np.array([getattr(r, name) for r in runs], dtype=float)
            return float(x.mean()), float(x.std())

        rows.append(
            {
                "preset": preset,
                "algo": runs[0].algo,
                "env_id": env_id,
                "budget": budget,
                "n": len(runs),
                "seeds": sorted(r.seed for r in runs),
                "final": stat("final"),
                "last5": stat("last5"),
                "best": stat("best"),
                "wall_s": stat("wall_s")[0],
                "sps": stat("sps")[0],
                "date": max(r.date for r in runs),
                "commits": sorted({r.commit for r in runs}),
                "cpus": sorted({r.cpu for r in runs if r.cpu}),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table users read (docs/benchmarks/presets.md)."""
    lines = [
        "| preset | env | budget | seeds | final | last 5 evals | best eval | wall min/run | train SPS | date | "
        "commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        few = " (n < 3)" if r["n"] < 3 else ""

        # returns at 1 decimal; scores below 10 in magnitude (a text task's accuracy) at 3, not rounded to 0.0
        d = 1 if max(abs(r[k][0]) for k in ("final", "last5", "best")) >= 10 else 3

        def pm(pair: tuple[float, float], n: int = r["n"], d: int = d) -> str:
            return f"{pair[0]:.{d}f}" if n == 1 else f"{pair[0]:.{d}f} ± {pair[1]:.{d}f}"

        lines.append(
            f"| {r['preset']} | {r['env_id']} | {r['budget']:,} | {r['n']}{few} | {pm(r['final'])} | "
            f"{pm(r['last5'])} | {pm(r['best'])} | {r['wall_s'] / 60:.1f} | {r['sps']:,.0f} | {r['date']} | "
            f"{', '.join(r['commits'])} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# the store, the presets, the runs
# --------------------------------------------------------------------------------------------------------------------


def stored_results(uri: str) -> list[RunResult]:
    """Every FINISHED run of the benchmark experiment in the store at ``uri``."""
    from pgcli.tracking.store import RunStore

    store = RunStore(uri)
    ids = store.experiment_ids([EXPERIMENT])
    if not ids:
        return []
    out = []
    for rec in store.search(ids, "attributes.status = 'FINISHED'"):
        if rec.tags.get("pgcli_role") == "sweep":
            continue
        out.append(
            run_result(
                rec, store.metric_history(rec.run_id, "eval/return_mean"), store.metric_history(rec.run_id, "time/sps")
            )
        )
    return out


def shipped_presets() -> list[str]:
    """``<algo>_<env>`` presets of conf/preset whose algo and env are options of their groups, without RL on text
    tasks: those start from a supervised run (``init=``), so a preset alone is not a run; benchmarks/lm_grpo.py
    measures them from their SFT warm start."""
    algos = {p.stem for p in (REPO / "conf" / "algo").glob("*.yaml")}
    envs = {p.stem for p in (REPO / "conf" / "env").glob("*.yaml")}
    names = []
    for path in sorted((REPO / "conf" / "preset").glob("*.yaml")):
        pair = split_preset(path.stem, algos, envs)
        if pair is not None and (pair[0] == "sft" or not is_text_env(pair[1])):
            names.append(path.stem)
    return names


def is_text_env(env: str) -> bool:
    """A text task's env option (its yaml selects a text schema, as conf/env/addition.yaml does)."""
    from pgcli.config import TEXT_ENV_CONFIGS

    return env in TEXT_ENV_CONFIGS


def split_preset(name: str, algos: set[str], envs: set[str]) -> tuple[str, str] | None:
    """``sb3_trpo_hopper`` -> (``sb3_trpo``, ``hopper``); None for a name that is not ``<algo>_<env>``."""
    for algo in sorted(algos, key=len, reverse=True):
        if name.startswith(algo + "_") and name[len(algo) + 1 :] in envs:
            return algo, name[len(algo) + 1 :]
    return None


def pgcli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("pgcli")
    proc = subprocess.run([str(exe), *args], cwd=REPO, text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"pgcli {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def preset_budget(algo: str, env: str) -> tuple[str, int]:
    """The env id and total_steps ``pgcli train algo=<algo> env=<env>`` composes to."""
    import yaml

    cfg = yaml.safe_load(pgcli("train", "--cfg", "job", f"algo={algo}", f"env={env}").stdout)
    return cfg["env"]["id"], int(cfg["total_steps"])


def train_missing(preset: str, seeds: list[int], uri: str, jobs: int) -> None:
    """``pgcli train -m`` the given seeds of one preset into the benchmark store (joblib when jobs > 1)."""
    algos = {p.stem for p in (REPO / "conf" / "algo").glob("*.yaml")}
    envs = {p.stem for p in (REPO / "conf" / "env").glob("*.yaml")}
    algo, env = split_preset(preset, algos, envs) or (None, None)
    assert algo is not None and env is not None
    launcher = ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"] if jobs > 1 and len(seeds) > 1 else []
    args = [
        "train",
        "-m",
        f"algo={algo}",
        f"env={env}",
        "seed=" + ",".join(map(str, seeds)),
        f"tracking.uri={uri}",
        f"experiment={EXPERIMENT}",
        "progress=false",
        *launcher,
    ]
    print(f"[{time.strftime('%H:%M:%S')}] pgcli {' '.join(args)}", flush=True)
    start = time.perf_counter()
    proc = pgcli(*args, check=False)
    print(f"  exit {proc.returncode} in {time.perf_counter() - start:.0f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr.strip()[-1500:], flush=True)


def load_json(path: Path) -> list[RunResult]:
    return [RunResult(**r) for r in json.loads(path.read_text())["runs"]] if path.is_file() else []


def write_outputs(results: list[RunResult], path: Path, doc: Path) -> str:
    """Rewrite the results JSON and the docs table; returns the table."""
    unique = {r.run_id: r for r in results}
    rows = summarise(unique.values())
    table = markdown(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": rows, "runs": [asdict(r) for r in unique.values()]}, indent=1))
    text = doc.read_text()
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        doc.write_text(head + MARK_START + "\n" + table + "\n" + MARK_END + rest.split(MARK_END, 1)[1])
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="*", help="presets to measure (default: every shipped one)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help="the benchmark's MLflow SQLite file")
    parser.add_argument("--jobs", type=int, default=1, help="seeds of one preset in parallel (joblib launcher)")
    parser.add_argument("--max-runs", type=int, default=None, help="train at most this many runs, then stop")
    parser.add_argument("--max-budget", type=int, default=None, help="skip presets whose budget is larger")
    parser.add_argument("--report", action="store_true", help="only aggregate what is stored; train nothing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.store.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{args.store.resolve()}"
    shipped = set(shipped_presets())

    def measured(runs: list[RunResult]) -> list[RunResult]:
        return [r for r in runs if r.preset in shipped]  # e.g. not a text task's RL preset (see shipped_presets)

    results = measured(load_json(args.out) + (stored_results(uri) if args.store.is_file() else []))
    left = args.max_runs
    for preset in args.presets or shipped_presets():
        if args.report or (left is not None and left <= 0):
            break
        algos = {p.stem for p in (REPO / "conf" / "algo").glob("*.yaml")}
        envs = {p.stem for p in (REPO / "conf" / "env").glob("*.yaml")}
        algo, env = split_preset(preset, algos, envs) or (None, None)
        if algo is None or env is None:
            raise SystemExit(f"unknown preset {preset!r} (shipped: {', '.join(shipped_presets())})")
        env_id, budget = preset_budget(algo, env)
        if args.max_budget is not None and budget > args.max_budget:
            continue
        done = {r.seed for r in results if r.preset == preset and r.env_id == env_id and r.budget == budget}
        missing = [s for s in args.seeds if s not in done]
        if left is not None:
            missing = missing[:left]
            left -= len(missing)
        if missing:
            train_missing(preset, missing, uri, args.jobs)
            results = measured(load_json(args.out) + stored_results(uri))
            write_outputs(results, args.out, DOC)
    print(write_outputs(results, args.out, DOC))
    print(f"wrote {args.out} and the table in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
