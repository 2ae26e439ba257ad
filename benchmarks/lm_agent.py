"""Multi-turn agents on countdown with a calculator: Flow-GRPO against whole-trajectory GRPO at the same number of
sampled turns (docs/benchmarks/lm.md, "Multi-turn agents: Flow-GRPO and whole-trajectory GRPO").

Per seed: one ``pgcli sft env=countdown_tool`` (preset ``sft_countdown_tool``: single-turn demonstrations), then from
it ``pgcli train algo=flow_grpo`` and ``pgcli train algo=grpo preset=grpo_countdown_tool`` (GRPO with Flow-GRPO's
settings, so only the advantage differs), each for ``--turns`` sampled turns. Each run is a real CLI subprocess with
``tracking=off`` and 1 torch thread; the held-out metrics come from its metrics.csv, the generated tokens from its
``rollout/completion_len`` per update. Resumable: one JSON per run in benchmarks/results/lm_agent/ (``--force``
redoes); ``table`` prints the markdown table and draws ``curves.png``.

    .venv/bin/python benchmarks/lm_agent.py run --seeds 0 1 2
    .venv/bin/python benchmarks/lm_agent.py table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_grpo  # the CLI runner and the metrics reader of the text benchmarks

RESULTS = Path(__file__).resolve().parent / "results" / "lm_agent"
ALGOS = {"flow_grpo": ["algo=flow_grpo"], "grpo": ["algo=grpo", "preset=grpo_countdown_tool"]}
LAST = 5


def sft(seed: int, force: bool) -> Path:
    """The warm start of ``seed``'s RL runs (its run directory)."""
    run_dir = RESULTS / "runs" / f"sft_s{seed}"
    out = RESULTS / f"sft_s{seed}.json"
    if out.exists() and (run_dir / "model").is_dir() and not force:
        return run_dir
    wall, history, line = lm_grpo.run_cli(
        "sft", ["env=countdown_tool", "preset=sft_countdown_tool", f"seed={seed}"], run_dir
    )
    result = {
        "seed": seed,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line),
        **{
            key: lm_grpo.last(history, f"eval/{key}")
            for key in ("accuracy", "pass_at_k", "turns_mean", "tool_error_rate")
        },
    }
    out.write_text(json.dumps(result, indent=1))
    return run_dir


def generated_tokens(history: dict[str, list[tuple[int, float]]]) -> float:
    """Tokens generated in training: per update, its turns (the step's increase) times its mean turn length."""
    total, before = 0.0, 0
    for step, length in history.get("rollout/completion_len", []):
        total += (step - before) * length
        before = step
    return total


def one(algo: str, seed: int, turns: int, force: bool) -> None:
    out = RESULTS / f"{algo}_{turns // 1000}k_s{seed}.json"
    if out.exists() and not force:
        return
    start = sft(seed, force=False)
    overrides = [
        *ALGOS[algo],
        "env=countdown_tool",
        f"init={start}",
        f"total_steps={turns}",
        f"eval.every={turns // 10}",
        f"seed={seed}",
        "checkpoint_every=0",
    ]
    wall, history, line = lm_grpo.run_cli("train", overrides, RESULTS / "runs" / out.stem)
    curve = history.get("eval/accuracy", [])
    result = {
        "algo": algo,
        "seed": seed,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line),
        "start": curve[0][1] if curve else float("nan"),
        "final": curve[-1][1] if curve else float("nan"),
        "last_mean": statistics.mean(v for _, v in curve[-LAST:]) if curve else float("nan"),
        "best": max((v for _, v in curve), default=float("nan")),
        "curve": curve,
        **{
            key: lm_grpo.last(history, f"eval/{key}")
            for key in ("pass_at_k", "turns_mean", "tool_error_rate", "kl_ref")
        },
        "turns": history["rollout/turns_mean"][-1][0],
        "tokens": generated_tokens(history),
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"{algo} seed {seed}: solved {result['start']:.3f} -> {result['final']:.3f} ({wall:.0f} s)", flush=True)


def run(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:  # one process at a time: the machine is shared
        for algo in args.algos:
            one(algo, seed, args.turns, args.force)


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.pstdev(values):.3f}" if values else "n/a"


def table(args: argparse.Namespace) -> None:
    sfts = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("sft_s*.json"))]
    print(
        f"SFT start (greedy solved): {_mean_std([r['accuracy'] for r in sfts])}, pass@8 "
        f"{_mean_std([r['pass_at_k'] for r in sfts])}, tool errors {_mean_std([r['tool_error_rate'] for r in sfts])}"
    )
    print()
    print(
        "| algo | seeds | solved at start | final | mean of the last 5 evals | best | pass@8 | turns | tool errors "
        "| sampled turns | generated tokens | wall s | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    runs: dict[str, list[dict[str, Any]]] = {}
    budgets = sorted({int(p.stem.split("_")[-2].removesuffix("k")) for p in RESULTS.glob("*grpo_*k_s*.json")})
    for budget, algo in ((b, a) for b in budgets for a in ALGOS):
        rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"{algo}_{budget}k_s*.json"))]
        if not rows:
            continue
        runs[f"{algo}, {budget}k turns"] = rows
        cells = [
            _mean_std([r[k] for r in rows])
            for k in ("start", "final", "last_mean", "best", "pass_at_k", "turns_mean", "tool_error_rate")
        ]
        sizes = [f"{statistics.mean(r[k] for r in rows):,.0f}" for k in ("turns", "tokens", "wall_s")]
        cpu = [r["cpu_s"] for r in rows if r.get("cpu_s")]
        sizes.append(f"{statistics.mean(cpu):,.0f}" if cpu else "n/a")
        print(f"| {algo}, {budget}k turns | {len(rows)} | " + " | ".join(cells + sizes) + " |")
    if budgets:  # the longest budget's curves (a shorter run of a seed repeats the start of the longer one)
        plot({k: v for k, v in runs.items() if k.endswith(f" {budgets[-1]}k turns")}, RESULTS / "curves.png")


def plot(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Held-out solved share against sampled turns: each seed thin, the mean over seeds thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (algo, rows), colour in zip(runs.items(), ("tab:blue", "tab:orange"), strict=False):
        for r in rows:
            ax.plot(*zip(*r["curve"], strict=True), color=colour, alpha=0.3, linewidth=1)
        if rows and len({len(r["curve"]) for r in rows}) == 1:
            steps = [s for s, _ in rows[0]["curve"]]
            mean = [statistics.mean(r["curve"][i][1] for r in rows) for i in range(len(steps))]
            ax.plot(steps, mean, color=colour, linewidth=2.5, label=f"{algo} (mean of {len(rows)} seeds)")
    ax.set(
        xlabel="sampled turns",
        ylabel="held-out questions solved (greedy)",
        ylim=(0, 1),
        title="countdown with a calculator: Flow-GRPO vs whole-trajectory GRPO",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\n{path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    p.add_argument("--turns", type=int, default=20_000, help="sampled turns per RL run")
    p.add_argument("--force", action="store_true")
    sub.add_parser("table")
    args = parser.parse_args()
    {"run": run, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
