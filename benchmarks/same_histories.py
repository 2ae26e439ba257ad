"""Does this checkout train exactly what another commit trains? A few `pgcli train` commands run in both, side by
side, and their metric histories, MLflow params and tags, and artifact lists are compared (docs/benchmarks/README.md,
"Same runs across a refactor").

The other commit is checked out into a temporary git worktree and run with the same venv, its package first on
``PYTHONPATH``. Wall-clock metrics (``time/*``) and the tags that name the process, the commit or the time are left
out of the comparison; everything else must be equal. The base's params are compared under this checkout's key names
(a key renamed since, as TRPO's ``algo.cg_iters`` now ``algo.cg_max_steps``: :mod:`pgcli.config.renames`);
``--exact-params`` compares them as logged.

    .venv/bin/python benchmarks/same_histories.py --base fa853a7

Writes benchmarks/results/same_histories.json; exits 1 when any command differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PGCLI = str(Path(sys.executable).with_name("pgcli"))
COMMON = ["progress=false", "hardware=cpu"]
RUNS = {
    "trpo_hopper": ["algo=trpo", "env=hopper", "total_steps=8192", "algo.n_steps=1024", "env.n_envs=2",
                    "eval.every=4096", "eval.episodes=2", "seed=3"],
    "trpo_hopper_shm": ["algo=trpo", "env=hopper", "total_steps=8192", "algo.n_steps=1024", "env.n_envs=2",
                        "eval.every=4096", "eval.episodes=2", "seed=3", "hardware.vec_env=shm",
                        "hardware.busy_fallback=false"],
    "ppo_cartpole": ["algo=ppo", "env=cartpole", "total_steps=4096", "eval.every=2048", "eval.episodes=2", "seed=2"],
    "grpo_cartpole": ["algo=grpo", "env=cartpole", "total_steps=3000", "eval.every=1500", "eval.episodes=2",
                      "seed=1"],
    "grpo_addition": ["algo=grpo", "env=addition", "total_steps=2000", "eval.every=1000", "seed=1"],
    "sft_addition": ["sft", "env=addition", "total_steps=256", "eval.every=128", "algo.batch_size=16", "seed=1"],
    "rm_addition": ["rm", "env=addition", "total_steps=128", "eval.every=64", "seed=1"],
    "ppo_lm_addition": ["algo=ppo_lm", "env=addition", "total_steps=64", "eval.every=32", "algo.group_size=4",
                        "algo.n_groups=4", "algo.batch_size=8", "seed=1"],
    "flow_grpo_countdown": ["algo=flow_grpo", "env=countdown_tool", "total_steps=48", "eval.every=24",
                            "algo.group_size=4", "algo.n_groups=2", "algo.batch_size=8", "seed=1"],
    "grpo_hf": ["algo=grpo", "env=addition", "model=hf", "model.path={hf_model}", "model.lora.r=4", "total_steps=32",
                "eval.every=16", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8", "env.n_digits=2",
                "env.n_eval=16", "seed=1"],
}  # fmt: skip
"""A run's command line after ``pgcli``: ``train`` unless it starts with another command (``sft``, ``rm``);
``{hf_model}`` is a random Llama written once offline (``pgcli.lm.random_hf``), the same files for both trees."""
COMMANDS = ("sft", "rm")
VOLATILE_TAGS = {"mlflow.source.name", "mlflow.runName", "mlflow.user", "git_commit", "git_dirty", "output_dir",
                 "pid", "pid_start", "host", "cpu", "tracking_uri", "mlflow.log-model.history"}  # fmt: skip


def run(args: list[str], tree: Path | None, work: Path, hf_model: Path) -> dict[str, object]:
    """Train ``args`` in a fresh folder with ``tree``'s package (None: this checkout); what must not change."""
    work.mkdir(parents=True)
    command, args = (args[0], args[1:]) if args[0] in COMMANDS else ("train", args)
    args = [a.format(hf_model=hf_model) for a in args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | ({"PYTHONPATH": str(tree)} if tree else {})
    env.setdefault("MUJOCO_GL", "egl")
    store = work / "mlflow.db"
    cmd = [PGCLI, command, *args, *COMMON, "tracking.uri=sqlite:///mlflow.db"]  # relative: the same param in both
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr[-2000:]}
    (metrics,) = work.glob("outputs/runs/*/*/metrics.csv")
    with metrics.open() as f:
        history = [[r["key"], r["step"], r["value"]] for r in csv.DictReader(f) if not r["key"].startswith("time/")]
    with sqlite3.connect(store) as db:
        params = sorted(db.execute("select key, value from params").fetchall())
        tags = sorted(t for t in db.execute("select key, value from tags").fetchall() if t[0] not in VOLATILE_TAGS)
    # mlartifacts/<experiment>/<run id>/artifacts/<path>: the paths inside the run's artifacts
    files = (p.relative_to(work / "mlartifacts").parts for p in (work / "mlartifacts").rglob("*") if p.is_file())
    artifacts = sorted("/".join(parts[3:]) for parts in files)
    return {"exit": 0, "history": history, "params": params, "tags": tags, "artifacts": artifacts}


def current_names(params: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A run's params with the keys renamed since it was logged under their names now (pgcli.config.renames)."""
    import contextlib
    import io

    from pgcli.config.renames import renamed_params

    with contextlib.redirect_stderr(io.StringIO()):  # the rename's note
        return sorted(renamed_params(dict(params)).items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (any git ref)")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "same_histories.json")
    parser.add_argument(
        "--exact-params", action="store_true", help="compare the base's params as logged, not under renamed keys' names"
    )
    args = parser.parse_args()
    sha = subprocess.run(["git", "rev-parse", args.base], cwd=ROOT, capture_output=True, text=True, check=True)
    base_sha = sha.stdout.strip()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="pgcli-same-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), base_sha], cwd=ROOT, check=True)
        hf_model = Path(tmp) / "tiny-llama"
        if any("{hf_model}" in a for name in args.runs for a in RUNS[name]):
            from pgcli.lm.random_hf import write_random_model

            write_random_model(hf_model)
        try:
            for name in args.runs:
                this = run(RUNS[name], None, Path(tmp) / "this" / name, hf_model)
                other = run(RUNS[name], base, Path(tmp) / "base_runs" / name, hf_model)
                if "params" in other and not args.exact_params:
                    other["params"] = current_names(other["params"])  # type: ignore[arg-type]
                same = {
                    key: this.get(key) == other.get(key) for key in ("exit", "history", "params", "tags", "artifacts")
                }
                n = len(this.get("history", []))  # type: ignore[arg-type]
                for key in ("params", "tags"):
                    if not same[key]:
                        a, b = set(map(tuple, this.get(key, []))), set(map(tuple, other.get(key, [])))  # type: ignore[call-overload]
                        print(f"  {key} only here: {sorted(a - b)[:5]}  only in the base: {sorted(b - a)[:5]}")
                results[name] = {
                    "same": same,
                    "metric_points": n,
                    "this_exit": this["exit"],
                    "base_exit": other["exit"],
                }
                print(
                    f"{name:18s} {n:5d} metric points  "
                    + "  ".join(f"{k} {'=' if v else 'DIFFERS'}" for k, v in same.items())
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    all_same = all(all(r["same"].values()) for r in results.values())  # type: ignore[union-attr]
    args.out.write_text(json.dumps({"base": base_sha, "all_same": all_same, "runs": results}, indent=2) + "\n")
    print(f"{'all the same' if all_same else 'SOME DIFFER'} -> {args.out}")
    sys.exit(0 if all_same else 1)


if __name__ == "__main__":
    main()
