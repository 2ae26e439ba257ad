"""Several `pgcli train` processes started at once on a SQLite store that does not exist yet (docs/tracking.md,
"Embedded store"): the store is created once, under a lock, and every run lands in it.

Without the lock each process lets MLflow create and migrate the schema itself; they race, some fail, and the store
can be left unusable for every later command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import Store, cli_env, run_pgcli

TINY = ["total_steps=256", "eval.every=0", "eval.episodes=2", "checkpoint_every=0", "progress=false"]


def test_three_runs_create_a_new_store_together(tmp_path: Path, workdir: Path) -> None:
    store = Store(tmp_path / "fresh")  # the folder does not exist yet either
    exe = Path(sys.executable).parent / "pgcli"
    args = ["train", f"tracking.uri={store.uri}", *TINY]
    procs = [
        subprocess.Popen(
            [str(exe), *args, f"seed={seed}"],
            cwd=workdir,
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(3)
    ]
    errors = [proc.communicate(timeout=300)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], "\n---\n".join(e[-2000:] for e in errors)
    assert sorted(r.info.status for r in store.runs("cartpole")) == ["FINISHED"] * 3

    listing = run_pgcli(["runs", f"tracking.uri={store.uri}"], cwd=workdir)
    assert listing.returncode == 0, listing.stderr
    assert len(listing.stdout.splitlines()) == 1 + 3, listing.stdout
    assert not list(store.root.glob(".mlflow.db.tmp-*"))  # no half-made store left beside it
