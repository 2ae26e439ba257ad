"""Your own data (docs/benchmarks/lm_dataset.md): does the dataset path add or lose anything, does GRPO with a math
verifier improve on SFT on word problems, and how fast are rows read.

Three parts, each resumable (one JSON per result in benchmarks/results/lm_dataset/, reused unless ``--force``; run
directories under benchmarks/results/lm_dataset/runs/, ignored by git), every step a real ``pgcli`` subprocess
(``tracking=off``, one torch thread):

- ``fidelity``: per seed, the built-in chain of benchmarks/lm_grpo.py (``pgcli sft env=addition env.n_digits=2
  total_steps=19200`` then ``pgcli train algo=grpo init=<sft> total_steps=25600``) against the same chain on rows
  written by ``pgcli data export env=addition env.n_digits=2`` (``env=dataset env.path=train.jsonl
  env.eval_path=eval.jsonl``: the same held-out problems). Pass: mean held-out accuracy within +-0.03. With
  ``--same-init``: GRPO on the rows from each seed's built-in SFT model (the same weights and token ids), the RL path
  alone.
- ``words``: two-step arithmetic word problems in GSM8K's format (:func:`word_problems`, a few thousand rows): SFT on
  the worked solutions, then ``algo=grpo env.reward=math`` from the SFT model; the held-out accuracy gain over SFT
  (target >= +0.10), final / last-5 / best.
- ``loading``: rows/s and peak RSS of reading a jsonl of N rows through ``pgcli.lm.datasets`` (load, the held-out
  split, a shuffled epoch of ``RowOrder`` batches of 256) against ``datasets`` alone (load, the same split, the same
  permutation in batches of 256), each in a fresh process with an empty Arrow cache, side by side in one run, at two
  sizes (RSS flat in the row count: memory-mapped Arrow).

    nice -n 5 .venv/bin/python benchmarks/lm_dataset.py loading --rows 100000 1000000
    nice -n 5 .venv/bin/python benchmarks/lm_dataset.py fidelity --seeds 0 1 2
    nice -n 5 .venv/bin/python benchmarks/lm_dataset.py words --seeds 0 1 2
    .venv/bin/python benchmarks/lm_dataset.py report
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_grpo  # the CLI runner and the metrics reader of the text benchmarks

RESULTS = Path(__file__).resolve().parent / "results" / "lm_dataset"
SFT_DEMOS, GRPO_COMPLETIONS, N_EVALS = 19_200, 25_600, 5
"""The built-in chain of docs/benchmarks/lm.md, "GRPO on language tasks" (2-digit addition)."""
WORDS_MODEL = ["model.max_len=96", "model.d_model=128", "model.n_layers=4"]
"""TinyGPT for word problems: prompts of 40-70 characters and worked solutions of 10-20."""


# ---------------------------------------------------------------------------------------------------------------------
# fidelity
# ---------------------------------------------------------------------------------------------------------------------


def _cached(out: Path, force: bool) -> dict[str, Any] | None:
    if out.exists() and not force:
        kept: dict[str, Any] = json.loads(out.read_text())
        if "run_dir" not in kept or (Path(kept["run_dir"]) / "model").is_dir():
            return kept
    return None


def _run(name: str, command: str, overrides: list[str], force: bool, **extra: Any) -> dict[str, Any]:
    """One ``pgcli`` run into ``runs/<name>``, its held-out accuracy curve in ``<name>.json``."""
    out = RESULTS / f"{name}.json"
    kept = _cached(out, force)
    if kept is not None:
        return kept
    run_dir = RESULTS / "runs" / name
    wall, history, line = lm_grpo.run_cli(command, overrides, run_dir)
    curve = history.get("eval/accuracy", [])
    values = [v for _, v in curve]
    result = {
        "name": name,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line, float("nan")),
        "run_dir": str(run_dir),
        "accuracy": values[-1] if values else float("nan"),
        "last5": statistics.fmean(values[-5:]) if values else float("nan"),
        "best": max(values, default=float("nan")),
        "curve": curve,
        **extra,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"{name}: accuracy {result['accuracy']:.3f} (best {result['best']:.3f}), {wall:.0f} s", flush=True)
    return result


def _export(force: bool) -> Path:
    """The 2-digit addition rows: SFT_DEMOS training rows and the task's own held-out set."""
    rows = RESULTS / "addition_rows"
    if force and rows.exists():
        for f in rows.iterdir():
            f.unlink()
    if not (rows / "train.jsonl").exists():
        exe = str(Path(sys.executable).parent / "pgcli")
        argv = [exe, "data", "export", "env=addition", "env.n_digits=2", "--rows", str(SFT_DEMOS), "--out", str(rows)]
        subprocess.run(argv, check=True)
    return rows


def fidelity(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = _export(args.force)
    data = ["env=dataset", f"env.path={rows / 'train.jsonl'}", f"env.eval_path={rows / 'eval.jsonl'}"]
    every = f"eval.every={GRPO_COMPLETIONS // N_EVALS}"
    for seed in args.seeds:
        common = [f"seed={seed}", "checkpoint_every=0"]
        budget = [f"total_steps={GRPO_COMPLETIONS}", every]
        if args.same_init:  # GRPO on the rows from the built-in SFT model: the RL path alone, the same weights and ids
            sft = json.loads((RESULTS / f"fidelity_builtin_sft_s{seed}.json").read_text())
            _run(
                f"fidelity_sameinit_grpo_s{seed}",
                "train",
                ["algo=grpo", *data, "env.reward=exact", f"init={sft['run_dir']}", *budget, *common],
                args.force,
                seed=seed,
                path="dataset rows, built-in SFT model",
                sft_accuracy=sft["accuracy"],
            )
            continue
        for label, task in (("builtin", ["env=addition", "env.n_digits=2"]), ("dataset", [*data, "env.reward=exact"])):
            sft = _run(
                f"fidelity_{label}_sft_s{seed}",
                "sft",
                [*task, f"total_steps={SFT_DEMOS}", f"eval.every={SFT_DEMOS}", *common],
                args.force,
                seed=seed,
                path=label,
            )
            _run(
                f"fidelity_{label}_grpo_s{seed}",
                "train",
                ["algo=grpo", *task, f"init={sft['run_dir']}", f"total_steps={GRPO_COMPLETIONS}", every, *common],
                args.force,
                seed=seed,
                path=label,
                sft_accuracy=sft["accuracy"],
            )


# ---------------------------------------------------------------------------------------------------------------------
# word problems
# ---------------------------------------------------------------------------------------------------------------------

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eva", "Fin", "Gus", "Ivy", "Jo", "Kai")
THINGS = ("pens", "cups", "eggs", "cats", "maps", "nuts", "hats", "toys")


def word_problems(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` distinct two-step word problems in GSM8K's format: ``question`` and ``answer`` (a worked solution ending
    in ``#### <number>``), e.g. "Ann has 3 pens. She gets 4 more, then gives away 2. How many pens now?" ->
    "3+4=7 7-2=5 #### 5"."""
    rng = random.Random(seed)
    seen: dict[str, dict[str, str]] = {}
    while len(seen) < n:
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        if rng.random() < 0.5:
            c = rng.randint(1, a + b - 1)
            question = f"{name} has {a} {thing}, gets {b} more, then gives away {c}. How many {thing}?"
            first, total = f"{a}+{b}={a + b}", a + b - c
            answer = f"{first} {a + b}-{c}={total} #### {total}"
        else:
            c = rng.randint(2, 5)
            question = f"{name} has {a} {thing} and gets {b} more. Each is worth {c}. Total worth?"
            total = (a + b) * c
            answer = f"{a}+{b}={a + b} {a + b}*{c}={total} #### {total}"
        seen.setdefault(question, {"question": question, "answer": answer})
    return list(seen.values())


def words(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = RESULTS / "word_rows"
    rows.mkdir(exist_ok=True)
    problems = word_problems(args.n_rows + 256, seed=0)
    for name, part in (("train.jsonl", problems[256:]), ("eval.jsonl", problems[:256])):
        if not (rows / name).exists():
            (rows / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    data = ["env=dataset", f"env.path={rows / 'train.jsonl'}", f"env.eval_path={rows / 'eval.jsonl'}"]
    data += ["env.prompt_key=question", "env.completion_key=answer", "env.reward=math", *WORDS_MODEL]
    for seed in args.seeds:
        common = [f"seed={seed}", "checkpoint_every=0"]
        sft = _run(
            f"words_sft_s{seed}",
            "sft",
            [*data, f"total_steps={args.sft_demos}", f"eval.every={args.sft_demos}", *common],
            args.force,
            seed=seed,
        )
        _run(
            f"words_grpo_s{seed}",
            "train",
            [
                "algo=grpo",
                *data,
                f"init={sft['run_dir']}",
                f"total_steps={args.completions}",
                f"eval.every={args.completions // N_EVALS}",
                *common,
            ],
            args.force,
            seed=seed,
            sft_accuracy=sft["accuracy"],
        )


# ---------------------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------------------

READ_PGCLI = """
import resource, sys, time
import datasets  # imported before the clock starts, as in READ_DATASETS
from pgcli.config import DatasetEnvConfig
from pgcli.lm.datasets import RowOrder, load_splits
start = time.perf_counter()
splits = load_splits(DatasetEnvConfig(path=sys.argv[1], eval_size=256))
order = RowOrder(len(splits.train), seed=0)
n = 0
while order.epoch == 0 and order.position < order.n:
    batch = splits.train[order.take(min(256, order.n - order.position))]
    n += len(batch["prompt"])
print(n, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
READ_DATASETS = """
import resource, sys, time
import datasets
import numpy as np
datasets.disable_progress_bars()
start = time.perf_counter()
rows = datasets.load_dataset("json", data_files=sys.argv[1], split="train")
parts = rows.train_test_split(test_size=256, seed=1234)
train = parts["train"]
order = np.random.default_rng([0, 0]).permutation(len(train)).tolist()  # a shuffled epoch, as training reads one
n = 0
for i in range(0, len(order), 256):
    n += len(train[order[i : i + 256]]["prompt"])
print(n, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _read(script: str, path: Path, cache: Path) -> tuple[int, float, float]:
    """Rows read, seconds and peak RSS (MiB) of ``script`` on ``path`` in a fresh process with an empty Arrow cache."""
    env = {"HF_DATASETS_CACHE": str(cache), "HOME": str(cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env, check=True)
    n, seconds, rss_kib = out.stdout.split()
    return int(n), float(seconds), int(rss_kib) / 1024


def loading(args: argparse.Namespace) -> None:
    import shutil
    import tempfile

    RESULTS.mkdir(parents=True, exist_ok=True)
    results = []
    for n_rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "rows.jsonl"
            with path.open("w") as f:
                for i in range(n_rows):
                    f.write(json.dumps({"prompt": f"What is {i} plus {i % 97}?", "answer": str(i + i % 97)}) + "\n")
            for rnd in range(args.rounds):
                pair = [("pgcli", READ_PGCLI), ("datasets", READ_DATASETS)]
                for label, script in pair if rnd % 2 == 0 else pair[::-1]:  # alternate who goes first
                    cache = Path(tmp) / f"cache_{label}_{rnd}"
                    n, seconds, rss = _read(script, path, cache)
                    shutil.rmtree(cache, ignore_errors=True)
                    row = {"rows": n_rows, "round": rnd, "reader": label, "read": n, "seconds": seconds, "rss_mib": rss}
                    results.append(row)
                    print(json.dumps(row), flush=True)
    (RESULTS / "loading.json").write_text(json.dumps(results, indent=1))


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------


def report(args: argparse.Namespace) -> None:
    del args
    loads = RESULTS / "loading.json"
    if loads.exists():
        rows = json.loads(loads.read_text())
        print(
            "| rows | pgcli rows/s | datasets rows/s | ratio (median per round) | pgcli peak RSS | datasets peak RSS |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for n in sorted({r["rows"] for r in rows}):
            pg = [r for r in rows if r["rows"] == n and r["reader"] == "pgcli"]
            ds = [r for r in rows if r["rows"] == n and r["reader"] == "datasets"]
            speed = {k: statistics.median(r["read"] / r["seconds"] for r in v) for k, v in (("pg", pg), ("ds", ds))}
            ratio = statistics.median(d["seconds"] / p["seconds"] for p, d in zip(pg, ds, strict=True))  # per round
            print(
                f"| {n:,} | {speed['pg']:,.0f} | {speed['ds']:,.0f} | {ratio:.2f} | "
                f"{max(r['rss_mib'] for r in pg):.0f} MiB | {max(r['rss_mib'] for r in ds):.0f} MiB |"
            )
    for prefix in ("fidelity_builtin", "fidelity_dataset", "fidelity_sameinit", "words"):
        runs = sorted(RESULTS.glob(f"{prefix}_*grpo_s*.json"))
        if not runs:
            continue
        # "at step 0": the SFT model under the RL run's own evaluation (sampled, pass@k), the baseline of its gain
        print(f"\n{prefix}: | seed | SFT accuracy | GRPO at step 0 | final | last-5 evals | best eval | wall |")
        for path in runs:
            r = json.loads(path.read_text())
            start = next((v for step, v in r.get("curve", []) if step == 0), float("nan"))
            print(
                f"| {r['seed']} | {r['sft_accuracy']:.3f} | {start:.3f} | {r['accuracy']:.3f} | {r['last5']:.3f} "
                f"| {r['best']:.3f} | {r['wall_s'] / 60:.1f} min |"
            )
        finals = [json.loads(p.read_text())["accuracy"] for p in runs]
        print(f"mean final accuracy {statistics.fmean(finals):.3f} over {len(finals)} seeds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("fidelity", "words"):
        p = sub.add_parser(name)
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        p.add_argument("--force", action="store_true")
        if name == "fidelity":
            p.add_argument("--same-init", action="store_true", help="GRPO on the rows from the built-in SFT runs")
        if name == "words":
            p.add_argument("--n-rows", type=int, default=4000)
            p.add_argument("--sft-demos", type=int, default=32_000)
            p.add_argument("--completions", type=int, default=25_600)
    p = sub.add_parser("loading")
    p.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--rounds", type=int, default=2)
    sub.add_parser("report")
    args = parser.parse_args()
    {"fidelity": fidelity, "words": words, "loading": loading, "report": report}[args.part](args)


if __name__ == "__main__":
    main()
