"""`pgcli eval` of a reward model trained with `pgcli rm env=dataset` on preference rows the test writes: the run's
own held-out pairwise evaluation repeated (the same pairs, accuracy, margin and loss as the run logged), its samples
table the held-out rows, whether the run held out rows of its file or read a file of its own (``env.eval_path``),
and whether the rows file is still where the run read it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli
from tests.integration.conftest import assert_rm_eval_repeats_the_run

TINY = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_layers=1",
    "env.eval_size=32",
    "env.n_eval=32",
    "env.eval_samples=4",
    "algo.batch_size=32",
    "algo.warmup_steps=64",
    "algo.learning_rate=3e-3",
    "total_steps=256",
    "eval.every=128",
    "progress=false",
]
"""A tiny TinyGPT reward model, 32 held-out pairs."""


def pairs(n: int, seed: int) -> list[dict]:
    """A learnable toy preference: the chosen answer ends in '+', the rejected one in '-'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 5)))
        rows.append({"prompt": f"{digits}=", "chosen": digits + "+", "rejected": digits + "-"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train_rm(tmp_path: Path, workdir: Path, rows: Path, extra: list[str]) -> tuple[Store, str]:
    store = Store(tmp_path / "store")
    args = ["rm", "env=dataset", f"env.path={rows}", f"tracking.uri={store.uri}", *TINY, *extra]
    proc = run_pgcli(args, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("dataset")
    assert run.info.status == "FINISHED"
    return store, run.info.run_id


def check_eval(store: Store, run_id: str, workdir: Path, run_dir: Path, n_pairs: int, held_out: list[dict]) -> None:
    proc = run_pgcli(["eval", run_id, f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"pgcli: evaluating {n_pairs} held-out preference pairs of dataset, final model..." in proc.stderr
    assert_rm_eval_repeats_the_run(proc.stdout, store, "dataset", run_id)
    table = Path(next(line for line in proc.stdout.splitlines() if "samples table" in line).split()[2])
    rows = json.loads((table if table.is_absolute() else workdir / table).read_text())
    logged = json.loads(next(run_dir.rglob("samples/step_256.json")).read_text())
    logged = logged if isinstance(logged, list) else logged["rows"]
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in rows] == [
        (r["prompt"], r["chosen"], r["rejected"]) for r in logged
    ]  # the run's own held-out pairs, in its order
    assert [r["reward_chosen"] for r in rows] == pytest.approx([r["reward_chosen"] for r in logged], abs=1e-5)
    texts = {(r["prompt"], r["chosen"], r["rejected"]) for r in held_out}
    assert len(rows) == 4 and all((r["prompt"], r["chosen"], r["rejected"]) in texts for r in rows), rows[0]


def test_eval_of_an_rm_on_rows_held_out_from_its_file(tmp_path: Path, workdir: Path):
    rows = pairs(200, 0)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    store, run_id = train_rm(tmp_path, workdir, data, [])
    check_eval(store, run_id, workdir, workdir / "outputs", 32, rows)


def test_eval_of_an_rm_with_a_held_out_file_typed_relative_from_another_directory(tmp_path: Path, workdir: Path):
    """``env.path`` and ``env.eval_path`` typed relative to where the run started; evaluated from elsewhere."""
    held = pairs(40, 1)
    write_jsonl(workdir / "pairs.jsonl", pairs(200, 0))
    write_jsonl(workdir / "held.jsonl", held)
    store, run_id = train_rm(tmp_path, workdir, Path("pairs.jsonl"), ["env.eval_path=held.jsonl"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check_eval(store, run_id, elsewhere, workdir / "outputs", 32, held)
