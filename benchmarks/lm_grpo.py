"""GRPO on language tasks: sampling speed during RL, and what RL adds to a supervised warm start
(docs/benchmarks/lm.md).

Two parts, each resumable (one JSON per result in benchmarks/results/lm/; an existing file is reused unless
``--force``):

``speed``: generated tokens per second while GRPO trains against a bare batched key/value-cache generation loop
(``pgcli.lm.model.generate`` on pre-encoded prompts, nothing else) with the same model, prompts per batch and sampling
settings, in one process, interleaved round by round so that load from other processes hits both alike; medians
over rounds. Two RL figures: ``time/tokens_per_s`` (the sampling phase of an update: prompt encoding, generation,
decoding, scoring) and ``time/tokens_per_s_overall`` (generated tokens per second of whole updates, sampling plus
the mu epochs of gradient steps).

``learn``: ``pgcli sft`` on addition (a budget that leaves the model clearly imperfect), then one ``pgcli train``
per algorithm from that SFT run (``init=``, also the KL reference) at the same number of sampled completions
(``total_steps``), each a real CLI subprocess with ``tracking=off`` and 1 torch thread; the held-out greedy
exact-match accuracy (``eval/accuracy``), the per-token k3 KL to the reference (``train/kl_ref``) and the wall time
are read from each run's metrics.csv. ``table`` prints the Markdown table of docs/benchmarks/lm.md from the JSON files.

    .venv/bin/python benchmarks/lm_grpo.py learn --seeds 0 --completions 20000
    .venv/bin/python benchmarks/lm_grpo.py speed --rounds 5
    .venv/bin/python benchmarks/lm_grpo.py table
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "lm"
REPO = Path(__file__).resolve().parents[1]
PGCLI = str(Path(sys.executable).parent / "pgcli")

ALGOS: dict[str, list[str]] = {
    "grpo": ["algo=grpo"],
    "dr_grpo": ["algo=grpo", "preset=grpo_addition_dr"],
    "ppo_lm": ["algo=ppo_lm"],
    "rloo": ["algo=rloo"],
    "reinforce": ["algo=reinforce"],
    "gspo": ["algo=gspo"],
    "reinforce_pp": ["algo=reinforce_pp"],
}
"""Benchmark label -> the algo overrides of its ``pgcli train`` command (presets apply as for any run)."""


def load_average() -> float:
    return os.getloadavg()[0]


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] from a run's metrics.csv."""
    history: dict[str, list[tuple[int, float]]] = {}
    with (run_dir / "metrics.csv").open() as f:
        for row in csv.DictReader(f):
            history.setdefault(row["key"], []).append((int(float(row["step"])), float(row["value"])))
    return history


def run_cli(command: str, args: list[str], run_dir: Path) -> tuple[float, dict[str, list[tuple[int, float]]], str]:
    """Run ``pgcli <command> <args>`` into ``run_dir``; returns (wall seconds, metrics, the command line)."""
    argv = [
        PGCLI,
        command,
        *args,
        "tracking=off",
        "progress=false",
        "hardware.torch_threads=1",
        f"hydra.run.dir={run_dir}",
    ]
    line = shlex.join(["pgcli", *argv[1:]])
    print(f"$ {line}", flush=True)
    start, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(argv, check=True, cwd=REPO)
    CPU_SECONDS[line] = _children_cpu() - cpu
    return time.perf_counter() - start, read_metrics(run_dir), line


CPU_SECONDS: dict[str, float] = {}
"""CPU seconds (user + system) of each finished ``pgcli`` subprocess, by command line: on a shared machine the wall
time mostly measures the other processes."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def last(history: dict[str, list[tuple[int, float]]], key: str) -> float:
    """The last value of ``key``; ``eval/pass_at_k`` stands for the run's ``eval/pass_at_<k>``."""
    if key == "eval/pass_at_k":
        key = next((k for k in history if k.startswith("eval/pass_at_")), key)
    points = history.get(key)
    return points[-1][1] if points else float("nan")


def sft(args: argparse.Namespace, seed: int, results: Path = RESULTS) -> dict[str, Any]:
    """The warm start every RL run of `seed` starts from (one JSON in ``results``; its run directory is kept under
    ``results/runs``)."""
    out = results / f"sft_d{args.n_digits}_s{seed}.json"
    if out.exists() and not args.force:
        kept: dict[str, Any] = json.loads(out.read_text())
        if (Path(kept["run_dir"]) / "model").is_dir():
            return kept  # else the JSON outlived its (gitignored) run directory: train the same command again
    run_dir = results / "runs" / f"sft_d{args.n_digits}_s{seed}"
    overrides = [
        f"env.n_digits={args.n_digits}",
        f"total_steps={args.sft_demos}",
        f"seed={seed}",
        f"eval.every={args.sft_demos}",
        "checkpoint_every=0",
    ]
    load = load_average()
    wall, history, line = run_cli("sft", ["env=addition", *overrides], run_dir)
    cpu = CPU_SECONDS.get(line, float("nan"))
    result = {
        "kind": "sft",
        "seed": seed,
        "command": line,
        "wall_s": wall,
        "cpu_s": cpu,
        "run_dir": str(run_dir),
        "accuracy": last(history, "eval/accuracy"),
        "pass_at_k": last(history, "eval/pass_at_k"),
        "load_before": load,
        "load_after": load_average(),
    }
    out.write_text(json.dumps(result, indent=1))
    return result


def learn(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        warm = sft(args, seed)
        print(f"sft seed {seed}: accuracy {warm['accuracy']:.3f} ({warm['wall_s']:.0f} s)", flush=True)
        for label in args.algos:
            out = RESULTS / f"{label}_d{args.n_digits}_c{args.completions}_s{seed}.json"
            if out.exists() and not args.force:
                continue
            run_dir = RESULTS / "runs" / out.stem
            overrides = [
                *ALGOS[label],
                "env=addition",
                f"env.n_digits={args.n_digits}",
                f"init={warm['run_dir']}",
                f"total_steps={args.completions}",
                f"eval.every={args.completions // args.n_evals}",
                f"seed={seed}",
                "checkpoint_every=0",
            ]
            load = load_average()
            wall, history, line = run_cli("train", overrides, run_dir)
            curve = history.get("eval/accuracy", [])
            kl = [v for _, v in history.get("train/kl_ref", [])]
            result = {
                "kind": "rl",
                "algo": label,
                "seed": seed,
                "n_digits": args.n_digits,
                "completions": args.completions,
                "command": line,
                "wall_s": wall,
                "cpu_s": CPU_SECONDS.get(line, float("nan")),
                "sft_accuracy": warm["accuracy"],
                "accuracy": last(history, "eval/accuracy"),
                "best_accuracy": max((v for _, v in curve), default=float("nan")),
                "pass_at_k": last(history, "eval/pass_at_k"),
                "kl_ref": kl[-1] if kl else float("nan"),
                "kl_ref_last5": sum(kl[-5:]) / len(kl[-5:]) if kl else float("nan"),
                "reward_mean": last(history, "rollout/reward_mean"),
                "tokens_per_s": last(history, "time/tokens_per_s"),
                "accuracy_curve": curve,
                "load_before": load,
                "load_after": load_average(),
            }
            out.write_text(json.dumps(result, indent=1))
            print(
                f"{label} seed {seed}: accuracy {result['accuracy']:.3f} (sft {warm['accuracy']:.3f}), kl "
                f"{result['kl_ref']:.4f}, {wall:.0f} s",
                flush=True,
            )


def speed(args: argparse.Namespace) -> None:
    import statistics

    import numpy as np
    import torch

    from pgcli.algo.lm_base import kl_reference
    from pgcli.algo.lm_grpo import LMGRPO
    from pgcli.lm.model import generate
    from pgcli.lm.tasks import encode_prompts, make_task
    from pgcli.training.checks import train_config

    torch.set_num_threads(1)
    # Not run_job: the trainer's sampling phase is timed beside a bare generation loop on the same policy.
    overrides = ["algo=grpo", "env=addition", f"env.n_digits={args.n_digits}", "total_steps=1000000", "tracking=off"]
    cfg = train_config(overrides + ([f"init={args.init}"] if args.init else []))
    task = make_task(cfg.env)
    policy, reference = _policy(cfg, task)
    algo = cfg.algo
    batch_rows = algo.group_size * algo.n_groups

    class Keep:
        def __init__(self) -> None:
            self.metrics: list[dict[str, float]] = []

        def log(self, step: int, metrics: dict[str, float]) -> None:
            self.metrics.append(dict(metrics))

        def update(self, step: int, agent: object) -> None:
            pass

    trainer = LMGRPO(
        algo,
        task=task,
        policy=policy,
        reference=kl_reference(algo, policy, reference),
        model=cfg.model,
        seed=0,
        device=torch.device("cpu"),
    )
    generator = torch.Generator().manual_seed(1)
    prompt_rng = np.random.default_rng(1)
    bare, sampling, overall = [], [], []
    for round_ in range(args.rounds):
        # bare: generation alone, prompts encoded beforehand
        tokens, seconds = 0, 0.0
        for _ in range(args.updates):
            problems = [p for p in task.sample(prompt_rng, algo.n_groups) for _ in range(algo.group_size)]
            prompt_tokens, prompt_mask = encode_prompts(task.vocab, problems)
            policy.eval()
            start = time.perf_counter()
            out = generate(
                policy,
                prompt_tokens,
                prompt_mask,
                max_new_tokens=task.max_completion_len,
                eos_id=task.vocab.eos_id,
                temperature=cfg.model.temperature,
                top_p=cfg.model.top_p,
                generator=generator,
            )
            seconds += time.perf_counter() - start
            tokens += int(out.mask.sum())
        bare.append(tokens / seconds)
        # RL: the trainer's own sampling phase and whole updates
        keep = Keep()
        trainer.learn(trainer.steps + args.updates * batch_rows, keep)  # type: ignore[arg-type]
        sampling.append(statistics.median(m["time/tokens_per_s"] for m in keep.metrics))
        overall.append(statistics.median(m["time/tokens_per_s_overall"] for m in keep.metrics))
        print(
            f"round {round_}: bare {bare[-1]:.0f} tok/s, RL sampling {sampling[-1]:.0f}, RL overall {overall[-1]:.0f}",
            flush=True,
        )
    result = {
        "kind": "speed",
        "overrides": overrides,
        "init": args.init,
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "completions_per_update": batch_rows,
        "bare_tokens_per_s": statistics.median(bare),
        "rl_sampling_tokens_per_s": statistics.median(sampling),
        "rl_overall_tokens_per_s": statistics.median(overall),
        "ratio_sampling": statistics.median(s / b for s, b in zip(sampling, bare, strict=True)),
        "ratio_overall": statistics.median(o / b for o, b in zip(overall, bare, strict=True)),
        "load": load_average(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": shlex.join(["python", "benchmarks/lm_grpo.py", *sys.argv[1:]]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"speed_d{args.n_digits}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def _policy(cfg: Any, task: Any) -> tuple[Any, Any]:
    """The policy (from ``init`` when given) and its frozen reference, built as ``pgcli train`` builds them."""
    import copy

    import torch

    from pgcli.lm.load import make_text_policy
    from pgcli.lm.model import load_policy
    from pgcli.training.references import locate_init

    policy = make_text_policy(task, cfg.model, torch.device("cpu"))
    if cfg.init is None:
        return policy, None
    load_policy(policy, locate_init(cfg.init, cfg.tracking).model_dir)
    return policy, copy.deepcopy(policy).eval().requires_grad_(False)


def _minutes(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds / 60:.1f} min"


def table(args: argparse.Namespace) -> None:
    import statistics

    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    rl = [r for r in rows if r.get("kind") == "rl" and r["n_digits"] == args.n_digits]
    order = list(ALGOS)
    print(
        "| algorithm | seed | SFT accuracy | final accuracy | best of 5 evals | pass@8 | KL to ref (k3/token) "
        "| wall time | CPU time | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rl, key=lambda r: (order.index(r["algo"]), r["seed"])):
        print(
            f"| {r['algo']} | {r['seed']} | {r['sft_accuracy']:.3f} | {r['accuracy']:.3f} | {r['best_accuracy']:.3f} "
            f"| {r['pass_at_k']:.3f} | {r['kl_ref']:.4f} | {r['wall_s'] / 60:.1f} min "
            f"| {_minutes(r.get('cpu_s', float('nan')))} "
            f"| {r['load_before']:.0f}-{r['load_after']:.0f} |"
        )
    seeds = sorted({r["seed"] for r in rl})
    if len(seeds) > 1:
        print("\n| algorithm | seeds | SFT accuracy | final accuracy | gain over SFT | KL to ref | wall time |")
        print("|---|---|---|---|---|---|---|")
        for algo in order:
            runs = [r for r in rl if r["algo"] == algo]
            if not runs:
                continue

            def mean_sd(key: str, runs: list[dict[str, Any]] = runs) -> str:
                values = [r[key] for r in runs]
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                return f"{statistics.mean(values):.3f} +- {sd:.3f}"

            gains = [r["accuracy"] - r["sft_accuracy"] for r in runs]
            print(
                f"| {algo} | {len(runs)} | {mean_sd('sft_accuracy')} | {mean_sd('accuracy')} "
                f"| {statistics.mean(gains):+.3f} | {mean_sd('kl_ref')} "
                f"| {statistics.mean(r['wall_s'] for r in runs) / 60:.1f} min |"
            )
    for r in rows:
        if r.get("kind") == "speed":
            print(
                f"\nspeed: bare {r['bare_tokens_per_s']:.0f} tok/s; RL sampling {r['rl_sampling_tokens_per_s']:.0f} "
                f"(ratio {r['ratio_sampling']:.2f}); RL overall {r['rl_overall_tokens_per_s']:.0f} "
                f"(ratio {r['ratio_overall']:.2f}); load {r['load']:.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("learn", "speed", "table"):
        p = sub.add_parser(name)
        p.add_argument("--n-digits", type=int, default=2)
        p.add_argument("--force", action="store_true", help="redo results that exist")
        if name == "learn":
            p.add_argument("--seeds", type=int, nargs="+", default=[0])
            p.add_argument("--algos", nargs="+", choices=list(ALGOS), default=list(ALGOS))
            p.add_argument("--completions", type=int, default=20480, help="sampled completions per RL run")
            p.add_argument("--sft-demos", type=int, default=19200, help="demonstrations of the SFT warm start")
            p.add_argument("--n-evals", type=int, default=5, help="evaluations per RL run")
        if name == "speed":
            p.add_argument("--init", default=None, help="an SFT run (dir or id); default: a fresh model")
            p.add_argument("--rounds", type=int, default=5)
            p.add_argument("--updates", type=int, default=3, help="updates (and bare batches) per round")
    args = parser.parse_args()
    {"learn": learn, "speed": speed, "table": table}[args.part](args)


if __name__ == "__main__":
    main()
