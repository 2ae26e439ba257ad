"""Startup of this checkout against another commit, side by side: `pgcli --help`, `pgcli train --help`, and a tiny
`pgcli train` from spawn to exit (docs/benchmarks/overhead.md, "Startup against another commit").

The other commit is checked out into a temporary git worktree and run with the same venv, its package first on
``PYTHONPATH`` (the venv's editable install of this checkout comes after it); the two are timed in alternation, so
machine load hits both alike, and the result is a ratio per command (this checkout / the base).

    .venv/bin/python benchmarks/startup_ab.py --base HEAD~1                 # 7 alternating rounds
    .venv/bin/python benchmarks/startup_ab.py --base fa853a7 --rounds 11

Writes benchmarks/results/startup_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgcli.training.build import cpu_model

ROOT = Path(__file__).resolve().parents[1]
PGCLI = str(Path(sys.executable).with_name("pgcli"))
COMMANDS = {
    "pgcli --help": ["--help"],
    "pgcli train --help": ["train", "--help"],
    "pgcli train (256 steps, tracking=off)": ["train", "total_steps=256", "eval.every=0", "progress=false",
                                              "tracking=off", "checkpoint_every=0"],
}  # fmt: skip


def timed(args: list[str], tree: Path | None, cwd: Path) -> float:
    """Wall seconds of one ``pgcli <args>`` run in ``cwd``, with ``tree``'s package first on the path (None: this
    checkout)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    subprocess.run([PGCLI, *args], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def which_package(tree: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | ({"PYTHONPATH": str(tree)} if tree else {})
    code = "import pgcli; print(pgcli.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (any git ref)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds per command")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup_ab.json")
    args = parser.parse_args()
    base_sha = subprocess.run(["git", "rev-parse", args.base], cwd=ROOT, capture_output=True, text=True, check=True)
    head_sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(prefix="pgcli-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), base_sha.stdout.strip()], cwd=ROOT, check=True
        )
        try:
            assert which_package(base).startswith(str(base)), "the base checkout is not the one imported"
            assert which_package(None).startswith(str(ROOT)), "this checkout is not the one imported"
            results = {}
            for name, cmd in COMMANDS.items():
                work = Path(tmp) / "work"
                work.mkdir(exist_ok=True)
                timed(cmd, None, work), timed(cmd, base, work)  # warm the file cache and the bytecode of both
                this, other = [], []
                for _ in range(args.rounds):
                    this.append(timed(cmd, None, work))
                    other.append(timed(cmd, base, work))
                ratio = statistics.median(this) / statistics.median(other)
                results[name] = {
                    "this_s": this,
                    "base_s": other,
                    "this_median_s": statistics.median(this),
                    "base_median_s": statistics.median(other),
                    "ratio": ratio,
                }
                print(
                    f"{name:40s} this {statistics.median(this):6.3f} s   base {statistics.median(other):6.3f} s"
                    f"   ratio {ratio:.2f}"
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    meta = {
        "base": base_sha.stdout.strip(),
        "this": head_sha.stdout.strip(),
        "rounds": args.rounds,
        "load_avg": os.getloadavg(),
        "cpu": cpu_model(),
        "python": sys.version,
    }
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
