"""RLHF on a learned reward: gold accuracy and proxy reward against the KL to the SFT model, by beta
(docs/benchmarks/lm.md, "RLHF on a learned reward").

The chain of docs/lm.md, "RL on a learned reward", per seed, each step a real CLI subprocess (``tracking=off``, one
torch thread, one process at a time; run the script under ``nice -n 5``):

1. ``pgcli sft env=addition env.n_digits=2 total_steps=19200``: a deliberately imperfect warm start (the SFT model
   of benchmarks/lm_grpo.py; held-out greedy accuracy 0.57 / 0.49 / 0.13 for seeds 0 / 1 / 2);
2. ``pgcli rm env=addition`` (``rm_addition`` preset: 128,000 pairs of 2-digit addition) with ``--pairs``:
   ``policy`` (default): ``init=<sft> algo.pairs=policy``, the rejected completions the SFT model's own wrong samples
   (``--policy-samples`` k per prompt), the reward model's backbone started from the SFT model; ``checker``: the
   synthetic pairs (reference vs one digit changed, dropped or added) with the overrides in ``RM``, the contrast;
3. ``best_of_n``: how well that reward model ranks the SFT model's own samples, the thing RL on it exploits: on the
   256 held-out prompts, 16 samples each at temperature 1, the gold accuracy of the sample the reward model scores
   highest among the first n (n = 1 ... 16), beside the SFT model's greedy accuracy (in this process);
4. ``pgcli train algo=ppo_lm init=<sft> env.reward=rm:<rm> algo.beta=<beta>`` for each beta, evaluated every
   ``--eval-every`` completions: gold ``eval/accuracy``, proxy ``eval/proxy_reward_mean`` and ``eval/kl_ref``.

Resumable: one JSON per result in benchmarks/results/lm_rlhf/ (an existing one is reused; ``--force`` redoes), named
by the reward model's tag (``checker``: ``rm_s0.json``, ``bon_s0.json``, ``ppo_b0.1_c51200_s0.json``; ``policy``:
``rm_policy_s0.json``, ...); run directories under benchmarks/results/lm_rlhf/runs/ (ignored by git). ``report``
writes the summary JSON (``summary_<tag>.json``), the plot (``rlhf_<tag>.png``) and prints the Markdown tables.

    nice -n 5 .venv/bin/python benchmarks/lm_rlhf.py run --seeds 0 1 2 --betas 0.01 0.1 1.0 --rm-pairs 128000 \
        --tag policy128k
    .venv/bin/python benchmarks/lm_rlhf.py report --tag policy128k
    # the checker-pairs contrast: run/report --pairs checker --completions 51200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_grpo  # the CLI runner and the metrics reader of the text benchmarks

RESULTS = Path(__file__).resolve().parent / "results" / "lm_rlhf"
SFT_DEMOS = 19_200
"""The warm start of benchmarks/lm_grpo.py: 300 AdamW steps, clearly imperfect."""
RM = ["model.d_model=64", "model.d_ff=256"]
"""The checker-pairs reward model (``--pairs checker``) of docs/benchmarks/lm.md, "Reward models on addition", without
label noise: the ``rm_addition`` preset (128,000 checker pairs) with a TinyGPT of d_model 64, held-out pairwise
accuracy 0.92. Neither 3x the pairs
(384,000: 0.918 on seed 0) nor a backbone from an SFT model at 0.98 greedy accuracy ranked the SFT model's own samples
better (docs/benchmarks/lm.md, "RLHF on a learned reward")."""
EVAL_KEYS = ("eval/accuracy", "eval/proxy_reward_mean", "eval/proxy_reward_sampled_mean", "eval/kl_ref",
             "eval/pass_at_8", "rollout/accuracy", "rollout/reward_mean")  # fmt: skip
"""Kept per PPO run: the held-out evaluations and, per update, the gold accuracy and proxy reward of the samples."""


def sft(seed: int, force: bool) -> dict[str, Any]:
    out = RESULTS / f"sft_s{seed}.json"
    if out.exists() and not force and (Path(json.loads(out.read_text())["run_dir"]) / "model").is_dir():
        return json.loads(out.read_text())
    run_dir = RESULTS / "runs" / out.stem
    overrides = [
        "env=addition",
        "env.n_digits=2",
        f"total_steps={SFT_DEMOS}",
        f"eval.every={SFT_DEMOS}",
        f"seed={seed}",
        "checkpoint_every=0",
    ]
    wall, history, line = lm_grpo.run_cli("sft", overrides, run_dir)
    result = {
        "seed": seed,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line),
        "run_dir": str(run_dir),
        "accuracy": lm_grpo.last(history, "eval/accuracy"),
    }
    out.write_text(json.dumps(result, indent=1))
    return result


def _name(kind: str, tag: str, rest: str) -> str:
    """A result's file stem: ``rm_s0`` for the checker reward model, ``rm_<tag>_s0`` for the others."""
    return f"{kind}_{rest}" if tag == "checker" else f"{kind}_{tag}_{rest}"


def rm_overrides(warm: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The reward model's overrides beside ``env=addition`` (module docstring, step 2)."""
    if args.pairs == "checker":
        return list(RM)
    steps = [] if args.rm_pairs is None else [f"total_steps={args.rm_pairs}", f"eval.every={args.rm_pairs // 4}"]
    return [
        f"init={warm['run_dir']}",
        "algo.pairs=policy",
        f"algo.policy_samples={args.policy_samples}",
        *steps,
        *args.rm_override,
    ]


def reward_model(seed: int, warm: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    out = RESULTS / f"{_name('rm', args.tag, f's{seed}')}.json"
    if out.exists() and not args.force and (Path(json.loads(out.read_text())["run_dir"]) / "model").is_dir():
        return json.loads(out.read_text())
    run_dir = RESULTS / "runs" / out.stem
    overrides = ["env=addition", *rm_overrides(warm, args), f"seed={seed}", "checkpoint_every=0"]
    wall, history, line = lm_grpo.run_cli("rm", overrides, run_dir)
    result = {
        "seed": seed,
        "pairs": args.pairs,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line),
        "run_dir": str(run_dir),
        "pairwise_accuracy": lm_grpo.last(history, "eval/pairwise_accuracy"),
        "fallback_frac": lm_grpo.last(history, "eval/policy_pair_fallback_frac"),
        "curve": history.get("eval/pairwise_accuracy", []),
    }
    out.write_text(json.dumps(result, indent=1))
    return result


def best_of_n(
    seed: int, warm: dict[str, Any], rm: dict[str, Any], args: argparse.Namespace, k: int = 16
) -> dict[str, Any]:
    """Gold accuracy of the reward model's favourite among the SFT model's first n samples (module docstring)."""
    out = RESULTS / f"{_name('bon', args.tag, f's{seed}')}.json"
    if out.exists() and not args.force:
        return json.loads(out.read_text())
    import numpy as np
    import torch

    from pgcli.config.saved_agent import agent_config
    from pgcli.lm.init import InitSource
    from pgcli.lm.learned_reward import load_learned_reward
    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.lm.model import generate
    from pgcli.lm.tasks import decode_completions, encode_prompts

    torch.set_num_threads(1)
    sft_dir, rm_dir = Path(warm["run_dir"]) / "model", Path(rm["run_dir"]) / "model"
    cfg = agent_config(json.loads((sft_dir / "agent.json").read_text()))
    task = make_text_task(cfg.env, cfg.model)
    policy = make_text_policy(task, cfg.model, torch.device("cpu"), sft_dir).eval()
    score = load_learned_reward(
        InitSource(rm_dir, json.loads((rm_dir / "agent.json").read_text()), None), torch.device("cpu")
    )
    problems = task.eval_problems()
    repeated = [p for p in problems for _ in range(k)]
    tokens, mask = encode_prompts(task.vocab, repeated, torch.device("cpu"))
    with torch.no_grad():
        gen = generate(
            policy,
            tokens,
            mask,
            max_new_tokens=task.max_completion_len,
            eos_id=task.vocab.stop_ids,
            temperature=1.0,
            top_p=1.0,
            generator=torch.Generator().manual_seed(seed),
            pad_id=task.vocab.pad_id,
        )
    texts = decode_completions(task.vocab, gen.tokens)
    rewards = np.array(list(score([p.prompt for p in repeated], texts))).reshape(len(problems), k)  # [P, k]
    correct = np.array([task.correct(p, t) for p, t in zip(repeated, texts, strict=True)]).reshape(len(problems), k)
    rows = np.arange(len(problems))
    result = {
        "seed": seed,
        "k": k,
        "sft_greedy_accuracy": warm["accuracy"],
        "sample_accuracy": float(correct.mean()),
        "any_correct": float(correct.any(1).mean()),
        "best_of_n": {n: float(correct[rows, rewards[:, :n].argmax(1)].mean()) for n in (1, 2, 4, 8, 16)},
        "oracle_best_of_n": {n: float(correct[:, :n].any(1).mean()) for n in (1, 2, 4, 8, 16)},
    }
    out.write_text(json.dumps(result, indent=1))
    return result


def ppo(seed: int, beta: float, warm: dict[str, Any], rm: dict[str, Any], args: argparse.Namespace) -> None:
    out = RESULTS / f"{_name('ppo', args.tag, f'b{beta}_c{args.completions}_s{seed}')}.json"
    if out.exists() and not args.force:
        return
    run_dir = RESULTS / "runs" / out.stem
    overrides = [
        "algo=ppo_lm",
        "env=addition",
        f"init={warm['run_dir']}",
        f"env.reward=rm:{rm['run_dir']}",
        f"algo.beta={beta}",
        f"total_steps={args.completions}",
        f"eval.every={args.eval_every}",
        f"seed={seed}",
        "checkpoint_every=0",
    ]
    load = lm_grpo.load_average()
    wall, history, line = lm_grpo.run_cli("train", overrides, run_dir)
    result = {
        "seed": seed,
        "beta": beta,
        "completions": args.completions,
        "command": line,
        "wall_s": wall,
        "cpu_s": lm_grpo.CPU_SECONDS.get(line),
        "load_before": load,
        "load_after": lm_grpo.load_average(),
        "curves": {key: history.get(key, []) for key in EVAL_KEYS},
    }
    out.write_text(json.dumps(result, indent=1))
    gold = result["curves"]["eval/accuracy"]
    print(
        f"beta {beta} seed {seed}: gold {gold[0][1]:.3f} -> peak {max(v for _, v in gold):.3f} -> final "
        f"{gold[-1][1]:.3f}; kl {lm_grpo.last(history, 'eval/kl_ref'):.2f} ({wall:.0f} s)",
        flush=True,
    )


def run(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        warm = sft(seed, args.force)
        rm = reward_model(seed, warm, args)
        bon = best_of_n(seed, warm, rm, args)
        print(
            f"seed {seed}: sft greedy {warm['accuracy']:.3f}, rm pairwise {rm['pairwise_accuracy']:.3f}, "
            f"rm best-of-n {bon['best_of_n']}",
            flush=True,
        )
        for beta in args.betas:
            ppo(seed, beta, warm, rm, args)


def _runs(completions: int, tag: str) -> list[dict[str, Any]]:
    """The recorded PPO runs; a key of :data:`EVAL_KEYS` a JSON lacks is read from its run directory if kept."""
    runs = []
    for path in sorted(RESULTS.glob(f"{_name('ppo', tag, f'b*_c{completions}_s*')}.json")):
        run = json.loads(path.read_text())
        run_dir = RESULTS / "runs" / path.stem
        if any(key not in run["curves"] for key in EVAL_KEYS) and (run_dir / "metrics.csv").is_file():
            history = lm_grpo.read_metrics(run_dir)
            run["curves"] |= {k: history.get(k, []) for k in EVAL_KEYS if k not in run["curves"]}
        runs.append(run)
    return runs


def summarise(run: dict[str, Any]) -> dict[str, float]:
    """One run's SFT start, peak gold (and its KL and step), final gold, last-5 mean, proxy and KL at the end."""
    curves = {k: dict(v) for k, v in run["curves"].items()}
    steps = sorted(curves["eval/accuracy"])
    gold = [curves["eval/accuracy"][s] for s in steps]
    peak = max(range(len(steps)), key=lambda i: gold[i])
    kl = curves["eval/kl_ref"]
    proxy = curves["eval/proxy_reward_mean"]
    return {
        "start": gold[0],
        "peak": gold[peak],
        "peak_gain": gold[peak] - gold[0],
        "peak_step": steps[peak],
        "peak_kl": kl.get(steps[peak], float("nan")),
        "final": gold[-1],
        "last5": statistics.mean(gold[-5:]),
        "proxy_start": proxy[steps[0]],
        "proxy_end": proxy[steps[-1]],
        "kl_end": kl.get(steps[-1], float("nan")),
        **_sampled_gold(run["curves"].get("rollout/accuracy", [])),
    }


def _sampled_gold(points: list[list[float]]) -> dict[str, float]:
    """The checker's accuracy of the sampled training completions: mean of the first 5 updates, its best 5-update
    mean, and the mean of the last 20 updates (NaN when not recorded)."""
    values = [v for _, v in points]
    if len(values) < 20:
        return {"sampled_first5": float("nan"), "sampled_best5": float("nan"), "sampled_last20": float("nan")}
    windows = [statistics.mean(values[i : i + 5]) for i in range(len(values) - 4)]
    return {
        "sampled_first5": windows[0],
        "sampled_best5": max(windows),
        "sampled_last20": statistics.mean(values[-20:]),
    }


def report(args: argparse.Namespace) -> None:
    runs = _runs(args.completions, args.tag)
    if not runs:
        raise SystemExit(f"no results for {args.completions} completions in {RESULTS}")
    by_beta: dict[float, list[dict[str, Any]]] = {}
    for r in runs:
        by_beta.setdefault(r["beta"], []).append(r)
    machine = {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    summary: dict[str, Any] = {
        "completions": args.completions,
        "machine": machine,
        "measured": time.strftime("%Y-%m-%d"),
        "betas": {},
    }
    summary["sft"] = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("sft_s*.json"))]
    for name in ("rm", "bon"):
        summary[name] = [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"{_name(name, args.tag, 's*')}.json"))]
    print(
        "| seed | SFT greedy | RM pairwise acc | fallback | sample acc | RM best-of-n: n = 1 / 2 / 4 / 8 / 16 "
        "| oracle best-of-n |"
    )
    print("|---|---|---|---|---|---|---|")
    for rm, bon in zip(summary["rm"], summary["bon"], strict=False):
        picks = " / ".join(f"{v:.3f}" for v in bon["best_of_n"].values())
        oracle = " / ".join(f"{v:.3f}" for v in bon["oracle_best_of_n"].values())
        print(
            f"| {bon['seed']} | {bon['sft_greedy_accuracy']:.3f} | {rm['pairwise_accuracy']:.3f} "
            f"| {rm.get('fallback_frac', float('nan')):.3f} | {bon['sample_accuracy']:.3f} | {picks} | {oracle} |"
        )
    print()
    keys = (
        "start",
        "peak",
        "peak_gain",
        "peak_kl",
        "peak_step",
        "final",
        "last5",
        "proxy_start",
        "proxy_end",
        "kl_end",
        "sampled_first5",
        "sampled_best5",
        "sampled_last20",
    )
    print(
        "| beta | seeds | SFT start (gold) | peak gold | gain at peak | KL at peak | step of peak | final gold "
        "| last 5 evals | proxy: start -> end | KL at end | sampled gold: first 5 / best 5 / last 20 updates "
        "| CPU min / run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for beta in sorted(by_beta):
        rows = sorted(by_beta[beta], key=lambda r: r["seed"])
        per_run = [summarise(r) for r in rows]
        stats = {k: (statistics.mean(s[k] for s in per_run), statistics.pstdev(s[k] for s in per_run)) for k in keys}
        summary["betas"][str(beta)] = {"seeds": [r["seed"] for r in rows], "per_run": per_run, "mean_std": stats}

        def ms(key: str, d: int = 3, stats: dict[str, tuple[float, float]] = stats) -> str:
            return f"{stats[key][0]:.{d}f} ± {stats[key][1]:.{d}f}"

        cpu = statistics.mean(r["cpu_s"] or float("nan") for r in rows) / 60
        print(
            f"| {beta} | {len(rows)} | {ms('start')} | {ms('peak')} | {ms('peak_gain', 3)} | {ms('peak_kl', 2)} "
            f"| {ms('peak_step', 0)} | {ms('final')} | {ms('last5')} | {ms('proxy_start', 2)} -> "
            f"{ms('proxy_end', 2)} | {ms('kl_end', 2)} | {stats['sampled_first5'][0]:.3f} / "
            f"{stats['sampled_best5'][0]:.3f} / {stats['sampled_last20'][0]:.3f} | {cpu:.1f} |"
        )
    suffix = f"_{args.tag}"
    (RESULTS / f"summary{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(by_beta, RESULTS / f"rlhf{suffix}.png", args.tag)
    print(f"wrote {RESULTS / f'summary{suffix}.json'} and {RESULTS / f'rlhf{suffix}.png'}")


def plot(by_beta: dict[float, list[dict[str, Any]]], path: Path, tag: str) -> None:
    """Gold accuracy and proxy reward against the KL to the reference: per beta, the mean over seeds at each
    evaluation step (x and y averaged, as ``pgcli compare --x`` does) and each seed thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), dpi=100)
    for beta in sorted(by_beta):
        runs = by_beta[beta]
        per_key = {}
        for key in ("eval/kl_ref", "eval/accuracy", "eval/proxy_reward_mean"):
            n = min(len(r["curves"][key]) for r in runs)
            per_key[key] = np.array([[v for _, v in r["curves"][key][:n]] for r in runs])  # [seeds, evals]
        n = min(a.shape[1] for a in per_key.values())
        kl = per_key["eval/kl_ref"][:, :n]
        for ax, key in zip(axes, ("eval/accuracy", "eval/proxy_reward_mean"), strict=True):
            values = per_key[key][:, :n]
            (line,) = ax.plot(kl.mean(0), values.mean(0), lw=2, marker="o", ms=3, label=f"beta {beta} (n={len(runs)})")
            for seed_kl, seed_values in zip(kl, values, strict=True):
                ax.plot(seed_kl, seed_values, lw=0.6, alpha=0.35, color=line.get_color())
    for ax, title in zip(
        axes,
        ("gold: held-out greedy accuracy (checker)", "proxy: reward model's score of the greedy completions"),
        strict=True,
    ):
        ax.set_xlabel("eval/kl_ref: KL(pi || pi_SFT) per completion, nats")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("eval/accuracy")
    axes[1].set_ylabel("eval/proxy_reward_mean")
    fig.suptitle(
        f"PPO on a learned reward ({tag} pairs), 2-digit addition: thick = mean over seeds at each "
        "evaluation, thin = seeds",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--completions", type=int, default=25_600, help="sampled completions per PPO run")
        p.add_argument("--pairs", choices=("policy", "checker"), default="policy", help="the reward model's pairs")
        p.add_argument("--tag", help="name of the reward model's results (default: --pairs)")
        if name == "run":
            p.add_argument("--policy-samples", type=int, default=4, help="k of algo.policy_samples")
            p.add_argument("--rm-pairs", type=int, help="the reward model's total_steps (default: the preset's)")
            p.add_argument("--rm-override", nargs="*", default=[], help="more pgcli rm overrides (policy pairs)")
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
            p.add_argument("--betas", type=float, nargs="+", default=[0.01, 0.1, 1.0])
            p.add_argument("--eval-every", type=int, default=1_280)
            p.add_argument("--force", action="store_true")
    args = parser.parse_args()
    args.tag = args.tag or args.pairs
    {"run": run, "report": report}[args.part](args)


if __name__ == "__main__":
    main()
