"""GRPO on language tasks: sampling speed during RL, and what RL adds to a supervised warm start
(docs/benchmarks/lm.md).

Two parts, each resumable (one JSON per result in benchmarks/results/lm/; an existing file is reused unless
``--force``):

``speed``: generated tokens per second of whole GRPO updates (sampling, pi_old and pi_ref log-probs, the minibatch
steps, the diagnostics) against a bare batched key/value-cache generation loop (``pgcli.lm.model.generate`` on
pre-encoded prompts, nothing else) with the same model, prompts per batch and sampling settings. Each round is a
fresh worker process (``speed-worker``) that interleaves bare batches and updates one by one; with ``--base REF`` the
same worker also runs on that commit's package (a temporary git worktree on ``PYTHONPATH``), the two alternating
round by round, so "before" and "after" come from one run under the same load. Reported: medians over rounds of the
wall-clock tokens/s (``time/tokens_per_s`` of the sampling phase, ``time/tokens_per_s_overall`` of whole updates), the
ratio of whole updates to the bare loop by wall clock and by CPU time of the thread (robust to other processes),
and the CPU milliseconds of an update by phase (``PHASES``), and the positions a log-prob pass runs in the
whole-sequence and shared-prompt layouts with their padding.

``learn``: ``pgcli sft`` on addition (a budget that leaves the model clearly imperfect), then one ``pgcli train``
per algorithm from that SFT run (``init=``, also the KL reference) at the same number of sampled completions
(``total_steps``), each a real CLI subprocess with ``tracking=off`` and 1 torch thread; the held-out greedy
exact-match accuracy (``eval/accuracy``), the per-token k3 KL to the reference (``train/kl_ref``) and the wall time
are read from each run's metrics.csv. ``table`` prints the Markdown table of docs/benchmarks/lm.md from the JSON files.

    .venv/bin/python benchmarks/lm_grpo.py learn --seeds 0 --completions 20000
    .venv/bin/python benchmarks/lm_grpo.py speed --init benchmarks/results/lm/runs/sft_d2_s0 --rounds 7 --base main
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


PHASES = ("sampling", "old_ref_logprobs", "steps", "diagnostics", "other")
"""Where an update's time goes: the sampling phase (``_sample``); the no-grad log-prob passes before the first
minibatch step (pi_old, pi_ref); the minibatch steps (forward, loss, backward, clip, Adam: ``_policy_step``); the
passes after the steps (the diagnostic KL(old || new)); the rest of ``_update`` and ``learn`` (advantages, metrics, the
divergence guard)."""


KEPT = ("cpu_ms", "layout", "torch", "package")
"""The speed worker's results that are not medians over rounds."""


def speed(args: argparse.Namespace) -> None:
    """Whole updates against the bare generation loop, in a fresh worker process per round and tree (this checkout,
    and ``--base`` in a temporary git worktree when given), the trees alternating; medians over rounds."""
    import statistics
    import tempfile

    trees: dict[str, Path | None] = {"this": None}
    with tempfile.TemporaryDirectory(prefix="pgcli-speed-") as tmp:
        base_sha = None
        if args.base:
            sha = subprocess.run(["git", "rev-parse", args.base], cwd=REPO, capture_output=True, text=True, check=True)
            base_sha = sha.stdout.strip()
            trees = {"base": Path(tmp) / "base", "this": None}
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(trees["base"]), base_sha], cwd=REPO, check=True
            )
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        load_before = load_average()
        try:
            for round_ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(_speed_round(args, tree, seed=round_))
                    r = runs[name][-1]
                    print(
                        f"round {round_} {name}: bare {r['bare_tokens_per_s']:.0f} tok/s, RL sampling "
                        f"{r['rl_sampling_tokens_per_s']:.0f}, overall {r['rl_overall_tokens_per_s']:.0f} "
                        f"(ratio {r['ratio_overall']:.2f}; CPU {r['cpu_ratio_overall']:.2f})",
                        flush=True,
                    )
        finally:
            if base_sha:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees["base"])], cwd=REPO, check=False)
    result: dict[str, Any] = {
        "kind": "speed",
        "init": args.init,
        "base_commit": base_sha,
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "load_before": load_before,
        "load_after": load_average(),
        "python": platform.python_version(),
        "command": shlex.join(["python", "benchmarks/lm_grpo.py", *sys.argv[1:]]),
    }
    for name, rounds in runs.items():
        med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0] if key not in KEPT}
        med["cpu_ms"] = {phase: statistics.median(r["cpu_ms"][phase] for r in rounds) for phase in PHASES}
        med |= {key: rounds[0][key] for key in KEPT if key != "cpu_ms"}
        result[name] = med
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"speed_d{args.n_digits}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    _speed_table(result)


def _speed_round(args: argparse.Namespace, tree: Path | None, seed: int) -> dict[str, Any]:
    """One ``speed-worker`` process with ``tree``'s package (None: this checkout); its JSON result."""
    argv = [sys.executable, __file__, "speed-worker", f"--n-digits={args.n_digits}", f"--updates={args.updates}"]
    argv += [f"--seed={seed}"] + ([f"--init={Path(args.init).resolve()}"] if args.init else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | ({"PYTHONPATH": str(tree)} if tree else {})
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def speed_worker(args: argparse.Namespace) -> None:
    """One round in this process: `--updates` bare generation batches and GRPO updates, interleaved one by one;
    prints one JSON line (wall-clock tokens/s medians, CPU milliseconds per update by phase)."""
    import statistics

    import numpy as np
    import torch

    import pgcli
    from pgcli.algo.lm_base import kl_reference
    from pgcli.algo.lm_grpo import LMGRPO
    from pgcli.lm.model import generate
    from pgcli.lm.tasks import encode_prompts, make_task
    from pgcli.training.checks import train_config

    torch.set_num_threads(1)
    # Not run_job: the trainer's updates are timed beside a bare generation loop on the same policy.
    overrides = ["algo=grpo", "env=addition", f"env.n_digits={args.n_digits}", "total_steps=1000000", "tracking=off"]
    cfg = train_config(overrides + ([f"init={args.init}"] if args.init else []))
    task = make_task(cfg.env)
    policy, reference = _policy(cfg, task)
    algo = cfg.algo
    batch_rows = algo.group_size * algo.n_groups
    trainer = LMGRPO(
        algo,
        task=task,
        policy=policy,
        reference=kl_reference(algo, policy, reference),
        model=cfg.model,
        seed=args.seed,
        device=torch.device("cpu"),
    )
    clock = _PhaseClock(trainer)
    generator = torch.Generator().manual_seed(args.seed + 1000)
    prompt_rng = np.random.default_rng(args.seed + 1000)
    trainer.learn(batch_rows, clock)  # warm-up, not timed
    clock.reset()
    bare, bare_cpu, sampling, overall = [], [], [], []
    for _ in range(args.updates):
        problems = [p for p in task.sample(prompt_rng, algo.n_groups) for _ in range(algo.group_size)]
        prompt_tokens, prompt_mask = encode_prompts(task.vocab, problems)
        policy.eval()
        start, cpu = time.perf_counter(), time.thread_time()
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
        bare.append(int(out.mask.sum()) / (time.perf_counter() - start))
        bare_cpu.append(int(out.mask.sum()) / (time.thread_time() - cpu))
        trainer.learn(trainer.steps + batch_rows, clock)
        sampling.append(clock.metrics[-1]["time/tokens_per_s"])
        overall.append(clock.metrics[-1]["time/tokens_per_s_overall"])
    cpu_ms = {phase: 1000 * seconds / args.updates for phase, seconds in clock.cpu.items()}
    tokens = statistics.mean(m["rollout/completion_len"] for m in clock.metrics) * batch_rows
    cpu_overall = tokens / (sum(cpu_ms.values()) / 1000)
    result = {
        "bare_tokens_per_s": statistics.median(bare),
        "rl_sampling_tokens_per_s": statistics.median(sampling),
        "rl_overall_tokens_per_s": statistics.median(overall),
        "ratio_sampling": statistics.median(sampling) / statistics.median(bare),
        "ratio_overall": statistics.median(overall) / statistics.median(bare),
        "cpu_ratio_overall": cpu_overall / statistics.median(bare_cpu),
        "cpu_ms": cpu_ms,
        "layout": _layout(clock.last_batch),
        "torch": torch.__version__,
        "package": str(Path(pgcli.__file__).parent),
    }
    print(json.dumps(result))


class _PhaseClock:
    """The monitor of the speed worker, which also wraps the trainer's phases (the method names of the GRPO family's
    update, in both trees) with CPU clocks of this thread."""

    def __init__(self, trainer: Any) -> None:
        self.metrics: list[dict[str, float]] = []
        self.last_batch: Any = None
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self._stepped = False
        self._wrap(trainer, "_sample", lambda: "sampling", keep_batch=True)
        self._wrap(trainer, "_batch_logprobs", lambda: "diagnostics" if self._stepped else "old_ref_logprobs")
        self._wrap(trainer, "_policy_step", lambda: "steps")
        learn = trainer.learn

        def timed_learn(total_steps: int, monitor: Any) -> int:
            start = time.thread_time()
            steps: int = learn(total_steps, monitor)
            self.cpu["other"] += time.thread_time() - start
            return steps

        trainer.learn = timed_learn

    def _wrap(self, trainer: Any, name: str, phase: Any, keep_batch: bool = False) -> None:
        method = getattr(trainer, name)

        def timed(*a: Any, **kw: Any) -> Any:
            start = time.thread_time()
            out = method(*a, **kw)
            seconds = time.thread_time() - start
            label = phase()
            self.cpu[label] += seconds
            self.cpu["other"] -= seconds  # counted in learn's total
            if name == "_policy_step":
                self._stepped = True
            if keep_batch:
                self.last_batch, self._stepped = out[0], False
            return out

        setattr(trainer, name, timed)

    def reset(self) -> None:
        self.metrics.clear()
        self.cpu = dict.fromkeys(PHASES, 0.0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics.append(dict(metrics))

    def update(self, step: int, agent: object) -> None:
        pass


def _layout(batch: Any) -> dict[str, float]:
    """Positions one no-grad log-prob pass runs over a sampled batch, and the share of them that no log-prob needs
    (padding, and each completion's last token, which predicts nothing): every row's prompt and completion (the
    whole-sequence layout), or each distinct prompt once and each completion but its last column (the shared-prompt
    layout of ``CausalLM.completion_hidden``)."""
    b, p = batch.prompt_tokens.shape
    c = batch.tokens.shape[1]
    first = batch.group_ids.diff(prepend=batch.group_ids[:1] - 1) != 0  # the first row of each group
    needed = float(batch.mask.sum()) - b  # each completion's last token predicts nothing
    return {
        "rows": b,
        "distinct_prompts": int(first.sum()),
        "prompt_width": p,
        "completion_width": c,
        "whole_positions": b * (p + c),
        "whole_padding": 1 - (float(batch.prompt_mask.sum()) + needed) / (b * (p + c)),
        "shared_positions": int(first.sum()) * p + b * (c - 1),
        "shared_padding": 1 - (float(batch.prompt_mask[first].sum()) + needed) / (int(first.sum()) * p + b * (c - 1)),
    }


def _speed_table(result: dict[str, Any]) -> None:
    """The Markdown tables of docs/benchmarks/lm.md's speed section."""
    names = [n for n in ("base", "this") if n in result]
    label = {"base": f"before ({(result.get('base_commit') or '')[:7]})", "this": "after"}
    print("\n| | " + " | ".join(label[n] for n in names) + " |")
    print("|---|" + "---|" * len(names))
    rows = [
        ("bare generation loop, tokens/s", "bare_tokens_per_s", "{:,.0f}"),
        ("GRPO sampling phase, tokens/s", "rl_sampling_tokens_per_s", "{:,.0f}"),
        ("GRPO whole updates, tokens/s", "rl_overall_tokens_per_s", "{:,.0f}"),
        ("**whole updates / bare** (wall clock)", "ratio_overall", "**{:.2f}**"),
        ("whole updates / bare (CPU time of the thread)", "cpu_ratio_overall", "{:.2f}"),
    ]
    for title, key, fmt in rows:
        print(f"| {title} | " + " | ".join(fmt.format(result[n][key]) for n in names) + " |")
    for phase in PHASES:
        values = [result[n]["cpu_ms"][phase] for n in names]
        totals = [sum(result[n]["cpu_ms"].values()) for n in names]
        cells = [f"{v:.1f} ms ({v / t:.0%})" for v, t in zip(values, totals, strict=True)]
        print(f"| CPU per update: {phase} | " + " | ".join(cells) + " |")
    totals = [sum(result[n]["cpu_ms"].values()) for n in names]
    print("| CPU per update: total | " + " | ".join(f"{t:.1f} ms" for t in totals) + " |")
    lay = result["this"]["layout"]
    print(
        f"\nlayout: {lay['rows']} rows, {lay['distinct_prompts']} distinct prompts, prompt width "
        f"{lay['prompt_width']}, completion width {lay['completion_width']}; positions per no-grad pass: whole "
        f"sequences {lay['whole_positions']} ({lay['whole_padding']:.0%} padding), shared prompts "
        f"{lay['shared_positions']} ({lay['shared_padding']:.0%} padding); "
        f"load {result['load_before']:.1f} -> {result['load_after']:.1f}"
    )


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
        if r.get("kind") == "speed" and "this" in r:
            _speed_table(r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("learn", "speed", "speed-worker", "table"):
        p = sub.add_parser(name)
        p.add_argument("--n-digits", type=int, default=2)
        p.add_argument("--force", action="store_true", help="redo results that exist")
        if name == "learn":
            p.add_argument("--seeds", type=int, nargs="+", default=[0])
            p.add_argument("--algos", nargs="+", choices=list(ALGOS), default=list(ALGOS))
            p.add_argument("--completions", type=int, default=20480, help="sampled completions per RL run")
            p.add_argument("--sft-demos", type=int, default=19200, help="demonstrations of the SFT warm start")
            p.add_argument("--n-evals", type=int, default=5, help="evaluations per RL run")
        if name in ("speed", "speed-worker"):
            p.add_argument("--init", default=None, help="an SFT run (dir or id); default: a fresh model")
            p.add_argument("--updates", type=int, default=3, help="updates (and bare batches) per round")
        if name == "speed":
            p.add_argument("--rounds", type=int, default=5, help="worker processes per tree")
            p.add_argument("--base", default=None, help="also time this commit (any git ref), round by round")
        if name == "speed-worker":
            p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    parts = {"learn": learn, "speed": speed, "speed-worker": speed_worker, "table": table}
    parts[args.part](args)


if __name__ == "__main__":
    main()
