"""Hugging Face models as text policies (``model=hf``) against TinyGPT (docs/benchmarks/lm_hf.md).

Three parts, each resumable (one JSON per result in benchmarks/results/lm_hf/; an existing file is reused unless
``--force``):

``speed``: sampling tokens per second of the ``model=hf`` path against TinyGPT's bare key/value-cache loop at the
same size and weights: a TinyGPT addition model and its ``pgcli export`` (a GPT-2 with the same logits), the same
prompts per batch (16 prompts x 8 completions) and sampling settings, in one process, interleaved round by round so
that load from other processes hits both alike; medians over rounds. The HF figure is the RL trainer's sampling
phase (``pgcli.algo.lm_rollout.sample_completions``: prompt encoding in the model's tokenizer, generation, decoding,
scoring), the TinyGPT figure generation alone.

``learn``: per seed, the SFT warm start of docs/benchmarks/lm.md (``pgcli sft env=addition env.n_digits=2
total_steps=19200``, through benchmarks/lm_grpo.py's ``sft``), exported with ``pgcli export``, then GRPO on the
export through ``model=hf`` at the same 25,600 sampled completions as the TinyGPT table: a full fine-tune (the same
algorithm as the TinyGPT runs, which it should match within +-0.05) and LoRA r=8 (alpha 16) at 10x the learning rate
(LoRA's usual step size; at the full fine-tune's 3e-5 its zero-initialised adapters barely move). Each run is a real
CLI subprocess with ``tracking=off`` and 1 torch thread; accuracy, KL and wall time come from its metrics.csv.

``table`` prints the Markdown tables of docs/benchmarks/lm_hf.md from the JSON files.

    .venv/bin/python benchmarks/lm_hf.py speed --rounds 5
    .venv/bin/python benchmarks/lm_hf.py learn --seeds 0 1 2
    .venv/bin/python benchmarks/lm_hf.py table
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_grpo  # the SFT warm starts, the CLI runner and the metrics reader of the TinyGPT table

RESULTS = Path(__file__).resolve().parent / "results" / "lm_hf"
RUNS = RESULTS / "runs"  # gitignored
VARIANTS: dict[str, list[str]] = {
    "full": ["model.lora.r=0"],
    "lora_r8": ["model.lora.r=8", "model.lora.alpha=16", "algo.learning_rate=3e-4"],
    "lora_r8_lr3e-5": ["model.lora.r=8", "model.lora.alpha=16"],
}
"""Label -> the model overrides of a GRPO run on the exported SFT model (the grpo_addition preset applies)."""


def export(sft_run_dir: str, seed: int) -> Path:
    """``pgcli export`` of an SFT run (kept; reused when it is there)."""
    out = RUNS / f"export_d2_s{seed}"
    if not (out / "config.json").is_file():
        subprocess.run([lm_grpo.PGCLI, "export", sft_run_dir, "--out", str(out)], check=True, cwd=lm_grpo.REPO)
    return out


def learn(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    sft_args = argparse.Namespace(n_digits=2, sft_demos=19200, force=False)
    for seed in args.seeds:
        warm = lm_grpo.sft(sft_args, seed, RESULTS)  # the TinyGPT table's command, run again here: its run dir
        model = export(warm["run_dir"], seed)
        for label in args.variants:
            out = RESULTS / f"grpo_{label}_d2_c{args.completions}_s{seed}.json"
            if out.exists() and not args.force:
                continue
            overrides = [
                "algo=grpo",
                "env=addition",
                "env.n_digits=2",
                "model=hf",
                f"model.path={model}",
                *VARIANTS[label],
                f"total_steps={args.completions}",
                f"eval.every={args.completions // 5}",
                f"seed={seed}",
                "checkpoint_every=0",
            ]
            load = lm_grpo.load_average()
            wall, history, line = lm_grpo.run_cli("train", overrides, RUNS / out.stem)
            curve = history.get("eval/accuracy", [])
            kl = [v for _, v in history.get("train/kl_ref", [])]
            result = {
                "kind": "rl",
                "variant": label,
                "seed": seed,
                "completions": args.completions,
                "command": line,
                "wall_s": wall,
                "cpu_s": lm_grpo.CPU_SECONDS.get(line, float("nan")),
                "sft_accuracy": warm["accuracy"],
                "accuracy": lm_grpo.last(history, "eval/accuracy"),
                "last5_accuracy": statistics.mean(v for _, v in curve[-5:]) if curve else float("nan"),
                "best_accuracy": max((v for _, v in curve), default=float("nan")),
                "kl_ref": kl[-1] if kl else float("nan"),
                "accuracy_curve": curve,
                "tokens_per_s": lm_grpo.last(history, "time/tokens_per_s"),
                "load_before": load,
                "load_after": lm_grpo.load_average(),
            }
            out.write_text(json.dumps(result, indent=1))
            print(
                f"{label} seed {seed}: accuracy {result['accuracy']:.3f} (sft {warm['accuracy']:.3f}), kl "
                f"{result['kl_ref']:.4f}, {wall:.0f} s",
                flush=True,
            )


def speed(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from pgcli.algo.lm_rollout import sample_completions
    from pgcli.lm.export import export_tiny_gpt
    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.lm.model import generate
    from pgcli.lm.tasks import encode_prompts
    from pgcli.training.checks import train_config

    torch.set_num_threads(1)
    base = ["algo=grpo", "env=addition", "env.n_digits=2", "tracking=off"]
    tiny_cfg = train_config(base)
    tiny_task = make_text_task(tiny_cfg.env, tiny_cfg.model)
    torch.manual_seed(0)
    tiny = make_text_policy(tiny_task, tiny_cfg.model, torch.device("cpu")).eval()
    exported = RESULTS / "speed_model"  # the seeded model, written again on each run (save_pretrained overwrites)
    export_tiny_gpt(tiny, tiny_task.vocab, exported)  # type: ignore[arg-type]  # TinyGPT's CharVocab
    hf_cfg = train_config([*base, "model=hf", f"model.path={exported}", "model.lora.r=0"])
    hf_task = make_text_task(hf_cfg.env, hf_cfg.model)
    hf = make_text_policy(hf_task, hf_cfg.model, torch.device("cpu")).eval()
    algo = tiny_cfg.algo
    rng = np.random.default_rng(1)
    bare, hf_rate = [], []
    for round_ in range(args.rounds):
        tokens, seconds = 0, 0.0
        for _ in range(args.updates):
            problems = [p for p in tiny_task.sample(rng, algo.n_groups) for _ in range(algo.group_size)]
            prompt_tokens, prompt_mask = encode_prompts(tiny_task.vocab, problems)
            start = time.perf_counter()
            out = generate(
                tiny,
                prompt_tokens,
                prompt_mask,
                max_new_tokens=tiny_task.max_completion_len,
                eos_id=tiny_task.vocab.eos_id,
                generator=torch.Generator().manual_seed(round_),
            )
            seconds += time.perf_counter() - start
            tokens += int(out.mask.sum())
        bare.append(tokens / seconds)
        tokens, seconds = 0, 0.0
        for _ in range(args.updates):
            problems = hf_task.sample(rng, algo.n_groups)
            batch = sample_completions(
                hf_task,
                hf,
                problems,
                group_size=algo.group_size,
                temperature=1.0,
                top_p=1.0,
                generator=torch.Generator().manual_seed(round_),
                device=torch.device("cpu"),
            )
            seconds += batch.sample_seconds
            tokens += batch.n_tokens
        hf_rate.append(tokens / seconds)
        print(f"round {round_}: TinyGPT bare {bare[-1]:.0f} tok/s, model=hf sampling {hf_rate[-1]:.0f}", flush=True)
    result = {
        "kind": "speed",
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "completions_per_batch": algo.n_groups * algo.group_size,
        "parameters": sum(p.numel() for p in tiny.parameters()),
        "tiny_bare_tokens_per_s": statistics.median(bare),
        "hf_sampling_tokens_per_s": statistics.median(hf_rate),
        "ratio": statistics.median(h / b for h, b in zip(hf_rate, bare, strict=True)),
        "load": lm_grpo.load_average(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": shlex.join(["python", "benchmarks/lm_hf.py", *sys.argv[1:]]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def table(args: argparse.Namespace) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    tiny = {r["seed"]: r for r in (json.loads(p.read_text()) for p in lm_grpo.RESULTS.glob("grpo_d2_c25600_s*.json"))}
    rl = [r for r in rows if r.get("kind") == "rl"]
    print(
        "| variant | seed | SFT accuracy | final accuracy | last-5 mean | best eval | TinyGPT final | gain over SFT "
        "| KL to ref | wall time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rl, key=lambda r: (list(VARIANTS).index(r["variant"]), r["seed"])):
        ref = tiny.get(r["seed"], {}).get("accuracy", float("nan"))
        print(
            f"| {r['variant']} | {r['seed']} | {r['sft_accuracy']:.3f} | {r['accuracy']:.3f} "
            f"| {r['last5_accuracy']:.3f} | {r['best_accuracy']:.3f} | {ref:.3f} "
            f"| {r['accuracy'] - r['sft_accuracy']:+.3f} | {r['kl_ref']:.4f} "
            f"| {r['wall_s'] / 60:.1f} min |"
        )
    for variant in VARIANTS:
        runs = [r for r in rl if r["variant"] == variant]
        if len(runs) > 1:
            gains = [r["accuracy"] - r["sft_accuracy"] for r in runs]
            diffs = [r["accuracy"] - tiny[r["seed"]]["accuracy"] for r in runs if r["seed"] in tiny]
            vs_tiny = f", final - TinyGPT final {statistics.mean(diffs):+.3f}" if diffs else ""
            print(
                f"\n{variant}: {len(runs)} seeds, final {statistics.mean(r['accuracy'] for r in runs):.3f}, gain "
                f"over SFT {statistics.mean(gains):+.3f}{vs_tiny}"
            )
    for r in rows:
        if r.get("kind") == "speed":
            print(
                f"\nspeed: TinyGPT bare {r['tiny_bare_tokens_per_s']:.0f} tok/s, model=hf sampling "
                f"{r['hf_sampling_tokens_per_s']:.0f} tok/s, ratio {r['ratio']:.2f}; "
                f"load {r['load']:.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("learn", "speed", "table"):
        p = sub.add_parser(name)
        p.add_argument("--force", action="store_true", help="redo results that exist")
        if name == "learn":
            p.add_argument("--seeds", type=int, nargs="+", default=[0])
            p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["full", "lora_r8"])
            p.add_argument("--completions", type=int, default=25600, help="sampled completions per RL run")
        if name == "speed":
            p.add_argument("--rounds", type=int, default=5)
            p.add_argument("--updates", type=int, default=3, help="batches per round and side")
    args = parser.parse_args()
    {"learn": learn, "speed": speed, "table": table}[args.part](args)


if __name__ == "__main__":
    main()
