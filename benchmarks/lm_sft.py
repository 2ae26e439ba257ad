"""How far supervised fine-tuning gets on held-out addition, per demonstrations seen and CPU time
(docs/benchmarks/lm.md).

Picks the budget of the ``sft_addition`` preset: a warm start that is clearly imperfect (held-out greedy accuracy
between 20% and 60%) after 1-3 minutes of CPU, so that RL has room to improve it. For each (n_digits, seed) the SFT
trainer (``pgcli.algo.sft.SFT``, the ``algo=sft`` defaults, ``model=tiny_gpt``) runs in this process, one torch thread,
and every ``--eval-every`` demonstrations the policy is scored on the task's held-out set with
``pgcli.lm.evaluation.evaluate_text`` (the monitor's evaluation: greedy accuracy, pass@8, ...). CPU time counts the
training steps only (``time.process_time``, evaluations excluded), so it does not move with the machine's load as
wall time does.

    .venv/bin/python benchmarks/lm_sft.py --digits 4 --seeds 0 1 2 --demos 192000
    .venv/bin/python benchmarks/lm_sft.py --table           # print the Markdown table of what is recorded

Resumable: each finished (n_digits, seed) curve is stored in benchmarks/results/lm_sft.json and skipped next time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm_sft.json"


def run_curve(digits: int, seed: int, demos: int, eval_every: int) -> list[dict[str, float]]:
    import torch

    from pgcli.algo.sft import SFT
    from pgcli.lm.evaluation import TextEvalSettings, evaluate_text
    from pgcli.lm.load import make_text_policy
    from pgcli.lm.tasks import make_task
    from pgcli.training.build import seed_everything
    from pgcli.training.checks import train_config

    torch.set_num_threads(1)
    # Not run_job: the SFT trainer is stepped here so that its CPU time leaves out the evaluations between steps.
    cfg = train_config(["algo=sft", "env=addition", f"env.n_digits={digits}", f"seed={seed}", "~preset"])
    seed_everything(seed)
    device = torch.device("cpu")
    task = make_task(cfg.env)
    policy = make_text_policy(task, cfg.model, device)
    sft = SFT(cfg.algo, task=task, policy=policy, reference=None, model=cfg.model, seed=seed, device=device)
    settings = TextEvalSettings(pass_k=cfg.env.eval_pass_k, temperature=cfg.model.temperature, top_p=cfg.model.top_p)
    curve, train_cpu = [], 0.0
    while sft.steps < demos:
        t0 = time.process_time()
        stats = sft._step()
        sft.steps += cfg.algo.batch_size
        train_cpu += time.process_time() - t0
        if sft.steps % eval_every < cfg.algo.batch_size:
            result = evaluate_text(task, policy, task.eval_problems(), settings, seed=seed, device=device)
            point = {"demos": sft.steps, "train_cpu_s": round(train_cpu, 1), "loss": round(stats["train/loss"], 4)}
            point |= {k.removeprefix("eval/"): round(v, 4) for k, v in result.extra.items()}
            print(json.dumps({"digits": digits, "seed": seed, **point}), flush=True)
            curve.append(point)
    return curve


def load() -> dict[str, object]:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"runs": {}}


def table(results: dict[str, object]) -> str:
    """Mean (min-max over seeds) held-out accuracy at each recorded budget, per (n_digits, demos, eval_every)."""
    runs: dict[str, list[dict[str, float]]] = results["runs"]  # type: ignore[assignment]
    by_digits: dict[str, list[list[dict[str, float]]]] = {}
    for key, curve in sorted(runs.items(), key=lambda item: [int(x) for x in item[0].split("-")]):
        digits, _seed, demos, every = key.split("-")
        by_digits.setdefault(f"{digits}-{demos}-{every}", []).append(curve)
    lines = [
        "| n_digits | demonstrations | train CPU s (mean) | held-out accuracy mean (min-max) | pass@8 mean | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for group, curves in by_digits.items():
        digits = group.split("-")[0]
        n = min(len(c) for c in curves)
        for i in range(n):
            acc = [c[i]["accuracy"] for c in curves]
            cpu = sum(c[i]["train_cpu_s"] for c in curves) / len(curves)
            p8 = sum(c[i]["pass_at_8"] for c in curves) / len(curves)
            lines.append(
                f"| {digits} | {curves[0][i]['demos']:,} | {cpu:.0f} | {sum(acc) / len(acc):.3f} "
                f"({min(acc):.3f}-{max(acc):.3f}) | {p8:.3f} | {len(curves)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits", type=int, nargs="+", default=[4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--demos", type=int, default=192_000)
    parser.add_argument("--eval-every", type=int, default=16_000)
    parser.add_argument("--table", action="store_true", help="print the table of recorded results and exit")
    args = parser.parse_args()
    results = load()
    if args.table:
        print(table(results))
        return
    runs: dict[str, object] = results["runs"]  # type: ignore[assignment]
    for digits in args.digits:
        for seed in args.seeds:
            key = f"{digits}-{seed}-{args.demos}-{args.eval_every}"
            if key in runs:
                continue
            curve = run_curve(digits, seed, args.demos, args.eval_every)
            results = load()  # another process may have recorded other curves meanwhile
            results["runs"][key] = curve  # type: ignore[index]
            results["machine"] = {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_avg_at_end": os.getloadavg(),
            }
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
