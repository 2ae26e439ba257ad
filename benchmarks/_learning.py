"""What the learning benchmarks share: one run as ``pgcli train`` runs it, its evaluation curve, the loop over runs.

``benchmarks/trpo_learning.py`` and ``benchmarks/grpo_learning.py`` differ only in their algorithms, envs, budgets and
thresholds. Every run is ``pgcli.training.run_job`` on the overrides of ``pgcli train algo=<a> env=<e> seed=<s>`` (each
algorithm gets its preset, the same env builder, wrappers and seeds), with one evaluation protocol: every ``eval_every``
env steps, ``eval_episodes`` deterministic episodes on the separate evaluation env (frozen normalisation statistics).
Runs go to throw-away directories with ``tracking=off`` and run one per process (spawned, 1 torch thread), ``jobs`` at a
time.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
LAST_EVALS = 5
"""The summary's "last evals" column: the mean of each run's last LAST_EVALS evaluations, a steadier figure than
the single final one where returns swing from one evaluation to the next (Hopper)."""


@dataclass(frozen=True)
class Job:
    """One training run of a benchmark."""

    algo: str
    env: str
    seed: int
    eval_every: int
    eval_episodes: int
    threshold: float | None
    steps: int | None = None
    """env steps (None: the preset's total_steps)."""
    extra: Sequence[str] = field(default_factory=tuple)
    """more Hydra overrides, e.g. ``algo.n_groups=2``."""
    variant: str = ""
    """a name for ``extra`` (an ablation's row label; runs group by algo, env and variant)."""

    def overrides(self) -> list[str]:
        """The Hydra overrides of this run, as ``pgcli train`` would take them."""
        return [
            f"algo={self.algo}",
            f"env={self.env}",
            f"seed={self.seed}",
            "tracking=off",
            "progress=false",
            f"eval.every={self.eval_every}",
            f"eval.episodes={self.eval_episodes}",
            "eval.deterministic=true",
            *([f"total_steps={self.steps}"] if self.steps else []),
            *self.extra,
        ]


def run_one(job: Job) -> dict[str, Any]:
    """Train ``job`` as ``pgcli train`` would (``pgcli.training.run_job``); return its evaluation curve and summary."""
    from pgcli.config.compose import compose_train_config
    from pgcli.training import run_job

    overrides = job.overrides()
    env_id = compose_train_config(overrides).env.id  # for the result only
    with tempfile.TemporaryDirectory(prefix=f"pgcli_bench_{job.algo}_{job.env}_") as tmp:
        # One process per run: these runs often share the cores (--jobs, or two benchmarks at once), and the learning
        # is the same either way (a preset's two-core options change the wall time only).
        summary = run_job(overrides, output_dir=Path(tmp), tracking=False, one_process=True)
        curve, train_sps = read_curve(Path(tmp) / "metrics.csv")
        eval_len_curve = read_metric(Path(tmp) / "metrics.csv", "eval/ep_len_mean")
        train_return_curve = read_metric(Path(tmp) / "metrics.csv", "rollout/ep_return_mean")
    reached = [step for step, value in curve if job.threshold is not None and value >= job.threshold]
    return {
        "algo": job.algo,
        "variant": job.variant,
        "env": job.env,
        "env_id": env_id,
        "seed": job.seed,
        "overrides": overrides,
        "steps": summary.steps,
        "final_eval_return": summary.final_return,
        "final_eval_std": summary.final_return_std,
        "best_eval_return": max((v for _, v in curve), default=float("nan")),
        "threshold": job.threshold,
        "steps_to_threshold": reached[0] if reached else None,
        "eval_curve": curve,
        "eval_len_curve": eval_len_curve,
        "train_return_curve": train_return_curve,
        "wall_time_s": summary.wall_time_s,  # the run's own clock: env start-up, training, the last evaluation
        "train_sps": train_sps,
    }


def read_curve(csv_path: Path) -> tuple[list[tuple[int, float]], float]:
    """(step, eval/return_mean) pairs and the last time/sps from a run's metrics.csv."""
    curve, sps = [], float("nan")
    for line in csv_path.read_text().splitlines()[1:]:
        key, step, value = line.rsplit(",", 2)
        if key == "eval/return_mean":
            curve.append((int(step), float(value)))
        elif key == "time/sps":
            sps = float(value)
    return sorted(curve), sps


def read_metric(csv_path: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric from a run's metrics.csv."""
    rows = (line.rsplit(",", 2) for line in csv_path.read_text().splitlines()[1:])
    return sorted((int(step), float(value)) for name, step, value in rows if name == key)


def eval_at(curve: list[tuple[int, float]], budget: int) -> float:
    """The last evaluation return at or before ``budget`` env steps (nan if none)."""
    before = [value for step, value in curve if step <= budget]
    return before[-1] if before else float("nan")


def last_evals_mean(curve: list[tuple[int, float]], k: int = LAST_EVALS) -> float:
    """Mean of the last ``k`` evaluation returns of a curve (nan if it has none)."""
    return float(np.mean([v for _, v in curve[-k:]])) if curve else float("nan")


def late_evals(curve: list[tuple[int, float]], late_from: int) -> list[float]:
    """The evaluation returns of a curve at or after ``late_from`` env steps."""
    return [value for step, value in curve if step >= late_from]


def variant_label(run: dict[str, Any]) -> str:
    """A run's row label: its algo, and its variant in brackets when it has one."""
    return f"{run['algo']} [{run['variant']}]" if run.get("variant") else str(run["algo"])


def summarise(
    runs: list[dict[str, Any]], checkpoints: Sequence[int] = (), late_from: int | None = None
) -> list[dict[str, Any]]:
    """Per (env, algo, variant), over seeds: final-eval mean/std/min/max, best-eval mean/std, last-evals mean/std,
    the mean return at each budget in ``checkpoints``, seeds reaching the threshold and their median steps to it,
    SPS and wall time; with ``late_from``, also the mean of every evaluation from that step on ("late mean") and
    the mean over seeds of each run's std across those evaluations ("late swing", how much a run falls back)."""
    rows = []
    for env, label in sorted({(r["env"], variant_label(r)) for r in runs}):
        group = [r for r in runs if r["env"] == env and variant_label(r) == label]
        final = np.array([r["final_eval_return"] for r in group])
        best = np.array([r["best_eval_return"] for r in group])
        last = np.array([last_evals_mean(r["eval_curve"]) for r in group])
        reached = [r["steps_to_threshold"] for r in group if r["steps_to_threshold"] is not None]
        late = [late_evals(r["eval_curve"], late_from) for r in group] if late_from is not None else []
        rows.append(
            {
                "env": env,
                "algo": label,
                "n_seeds": len(group),
                "steps": int(np.mean([r["steps"] for r in group])),
                "final_mean": float(final.mean()),
                "final_std": float(final.std()),
                "final_min": float(final.min()),
                "final_max": float(final.max()),
                "best_mean": float(best.mean()),
                "best_std": float(best.std()),
                "last_evals_mean": float(last.mean()),
                "last_evals_std": float(last.std()),
                **(
                    {
                        "late_from": late_from,
                        "late_mean": float(np.mean([np.mean(v) for v in late if v])) if any(late) else float("nan"),
                        "late_swing": float(np.mean([np.std(v) for v in late if v])) if any(late) else float("nan"),
                    }
                    if late_from is not None
                    else {}
                ),
                **{
                    f"eval_at_{b // 1000}k_mean": float(np.mean([eval_at(r["eval_curve"], b) for r in group]))
                    for b in checkpoints
                },
                "threshold": group[0]["threshold"],
                "seeds_reaching": len(reached),
                "median_steps_to_threshold": float(np.median(reached)) if reached else None,
                "train_sps_mean": float(np.mean([r["train_sps"] for r in group])),
                "wall_time_s_mean": float(np.mean([r["wall_time_s"] for r in group])),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], checkpoints: Sequence[int] = ()) -> str:
    """The summary as a Markdown table (with the late-evaluation columns when the rows have them)."""
    at = "".join(f" eval at {b // 1000}k |" for b in checkpoints)
    late_from = next((r["late_from"] for r in rows if "late_from" in r), None)
    late = "" if late_from is None else f" evals from {late_from:,}: mean | swing (std) |"
    header = (
        f"| env | algo | seeds | steps |{at} final eval mean ± std (min..max) | last {LAST_EVALS} evals | "
        f"best eval |{late} threshold | seeds reaching it | median steps to it | train SPS | "
        "wall s/run |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        steps_to = "-" if r["median_steps_to_threshold"] is None else f"{r['median_steps_to_threshold']:,.0f}"
        at_values = "".join(f" {r.get(f'eval_at_{b // 1000}k_mean', float('nan')):.1f} |" for b in checkpoints)
        late_values = (
            ""
            if late_from is None
            else (f" {r.get('late_mean', float('nan')):.1f} | {r.get('late_swing', float('nan')):.1f} |")
        )
        lines.append(
            f"| {r['env']} | {r['algo']} | {r['n_seeds']} | {r['steps']:,} |{at_values} "
            f"{r['final_mean']:.1f} ± {r['final_std']:.1f} ({r['final_min']:.1f}..{r['final_max']:.1f}) | "
            f"{r.get('last_evals_mean', float('nan')):.1f} ± {r.get('last_evals_std', float('nan')):.1f} | "
            f"{r['best_mean']:.1f} ± {r.get('best_std', float('nan')):.1f} |{late_values} {r['threshold']} | "
            f"{r['seeds_reaching']}/{r['n_seeds']} | {steps_to} | {r['train_sps_mean']:,.0f} | "
            f"{r['wall_time_s_mean']:.0f} |"
        )
    return "\n".join(lines)


def markdown_per_run(runs: list[dict[str, Any]], late_from: int | None = None) -> str:
    """One row per run (env, variant, seed): final, last-evals mean, best evaluation, and with ``late_from`` the mean
    and std of its evaluations from that step on."""
    late = "" if late_from is None else f" evals from {late_from:,}: mean | swing (std) |"
    header = f"| env | algo | seed | steps | final eval | last {LAST_EVALS} evals | best eval |{late}"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in sorted(runs, key=lambda r: (r["env"], variant_label(r), r["seed"])):
        late_values = late_evals(r["eval_curve"], late_from) if late_from is not None else []
        values = "" if late_from is None else " - | - |"
        if late_values:
            values = f" {np.mean(late_values):.1f} | {np.std(late_values):.1f} |"
        lines.append(
            f"| {r['env']} | {variant_label(r)} | {r['seed']} | {r['steps']:,} | "
            f"{r['final_eval_return']:.1f} | {last_evals_mean(r['eval_curve']):.1f} | "
            f"{r['best_eval_return']:.1f} |{values}"
        )
    return "\n".join(lines)


def plot_curves(runs: list[dict[str, Any]], path: Path) -> Path:
    """Evaluation curves, one panel per env: per row label (algorithm [variant]) the mean over seeds (line) and each
    seed (thin lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r["env"] for r in runs})
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for i, label in enumerate(sorted({variant_label(r) for r in runs if r["env"] == env})):
            group = [r for r in runs if r["env"] == env and variant_label(r) == label and r["eval_curve"]]
            if not group:
                continue
            steps = np.array([s for s, _ in group[0]["eval_curve"]], dtype=float)
            curves = np.array([np.interp(steps, *np.array(r["eval_curve"], dtype=float).T) for r in group])
            color = f"C{i}"
            for curve in curves:
                ax.plot(steps, curve, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, curves.mean(0), color=color, linewidth=2, label=f"{label} (mean of {len(group)} seeds)")
        threshold = next((r["threshold"] for r in runs if r["env"] == env and r["threshold"] is not None), None)
        if threshold is not None:
            ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel("deterministic eval return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_all(
    jobs: list[Job],
    *,
    n_jobs: int,
    out: Path,
    script: str,
    checkpoints: Sequence[int] = (),
    previous: list[dict[str, Any]] | None = None,
    late_from: int | None = None,
) -> list[dict[str, Any]]:
    """Run ``jobs`` (``n_jobs`` processes at a time), rewriting ``out`` after each so an interrupted benchmark keeps
    what it measured; print one line per run and the table at the end. ``previous`` runs are kept in ``out``, and a
    job whose overrides one of them already ran is skipped (so an interrupted benchmark resumes where it stopped)."""
    from pgcli.training.build import cpu_model, git_state

    runs: list[dict[str, Any]] = list(previous or [])
    done = {tuple(r["overrides"]) for r in runs}
    todo = [j for j in jobs if tuple(j.overrides()) not in done]
    if len(todo) < len(jobs):
        print(f"skipping {len(jobs) - len(todo)} run(s) already in {out}", flush=True)
    meta = {
        "command": f"{script} " + " ".join(sys.argv[1:]),
        "machine": platform.platform(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "jobs": n_jobs,
        "eval": {
            "every": {j.env: j.eval_every for j in jobs},
            "episodes": jobs[0].eval_episodes if jobs else 0,
            "deterministic": True,
        },
        **git_state(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    if todo:
        with mp.get_context("spawn").Pool(n_jobs, maxtasksperchild=1) as pool:
            for r in pool.imap(run_one, todo):
                r["git_commit"] = meta.get("git_commit")
                runs.append(r)
                print(
                    f"{variant_label(r):>8} {r['env']:<9} seed {r['seed']}: final {r['final_eval_return']:8.1f}  "
                    f"last {last_evals_mean(r['eval_curve']):8.1f}  best {r['best_eval_return']:8.1f}  "
                    f"to-threshold {r['steps_to_threshold']}  {r['wall_time_s']:.0f} s",
                    flush=True,
                )
                rows = summarise(runs, checkpoints, late_from)
                out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1))
    print(markdown(summarise(runs, checkpoints, late_from), checkpoints))
    if runs:
        print(f"wrote {out} and {plot_curves(runs, out.with_suffix('.png'))}")
    return runs


def truncate(run: dict[str, Any], budget: int) -> dict[str, Any]:
    """``run`` as if it had stopped at ``budget`` env steps: its curve cut there, its final and best evaluation the
    cut curve's. Exact for a run whose updates do not depend on its total budget (no schedule): the same updates and
    evaluations, in the same order, up to the cut."""
    curve = [(step, value) for step, value in run["eval_curve"] if step <= budget]
    if not curve or len(curve) == len(run["eval_curve"]):
        return run
    reached = [step for step, value in curve if run["threshold"] is not None and value >= run["threshold"]]
    return run | {
        "eval_curve": curve,
        "steps": curve[-1][0],
        "final_eval_return": curve[-1][1],
        "best_eval_return": max(v for _, v in curve),
        "steps_to_threshold": reached[0] if reached else None,
        "variant": f"{run.get('variant') or 'preset'}, first {budget // 1000}k of {run['steps'] // 1000}k",
    }


def report(
    paths: Sequence[Path],
    checkpoints: Sequence[int] = (),
    plot: Path | None = None,
    late_from: int | None = None,
    truncate_at: int | None = None,
    per_run: bool = False,
    only: Sequence[str] = (),
) -> str:
    """The table of the runs in one or more results JSON files (e.g. ours and the reference's), and their curves
    in ``plot`` when given; with ``truncate_at``, every run cut at that many env steps (``truncate``); with
    ``per_run``, one row per run instead of one per (env, algo, variant); with ``only``, just the runs whose
    variant is listed (``preset`` names the runs without one)."""
    runs = [r for path in paths for r in json.loads(path.read_text())["runs"]]
    if only:
        runs = [r for r in runs if (r.get("variant") or "preset") in only]
    if truncate_at is not None:
        runs = [truncate(r, truncate_at) for r in runs]
    if per_run:
        return markdown_per_run(runs, late_from)
    if plot is not None:
        plot_curves(runs, plot)
    return markdown(summarise(runs, checkpoints, late_from), checkpoints)


def add_common_arguments(parser: Any, *, out: Path) -> None:
    """--seeds, --steps, --set, --variant, --jobs, --out, --report, --plot, --append, --late-from."""
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: per env)")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run, e.g. algo.n_groups=2")
    parser.add_argument("--variant", default="", help="a name for these runs' --set overrides (their row label)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (one process each)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--report", type=Path, nargs="+", help="print the table of existing results JSON(s), exit")
    parser.add_argument("--plot", type=Path, help="with --report: also write the evaluation curves to this PNG")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the runs already in --out and skip the jobs they already ran (resume)",
    )
    parser.add_argument(
        "--late-from",
        type=int,
        default=None,
        help="also report the mean and the swing (std) of every evaluation from this env step on",
    )
    parser.add_argument("--per-run", action="store_true", help="with --report: one row per run (seed)")
    parser.add_argument("--only", nargs="+", default=(), help="with --report: only these variants ('preset': none)")
    parser.add_argument(
        "--truncate",
        type=int,
        default=None,
        help="with --report: cut every run at this many env steps (unscheduled runs only)",
    )


def previous_runs(path: Path, append: bool) -> list[dict[str, Any]]:
    """The runs already in ``path`` when ``append`` (empty otherwise)."""
    return json.loads(path.read_text())["runs"] if append and path.is_file() else []


def main_for(
    build_jobs: Callable[[Any], list[Job]], parser: Any, *, script: str, checkpoints: Sequence[int] = ()
) -> None:
    """Parse the command line and run the benchmark (or print --report)."""
    args = parser.parse_args()
    if args.report:
        print(report(args.report, checkpoints, args.plot, args.late_from, args.truncate, args.per_run, args.only))
        return
    run_all(
        build_jobs(args),
        n_jobs=args.jobs,
        out=args.out,
        script=script,
        checkpoints=checkpoints,
        previous=previous_runs(args.out, args.append),
        late_from=args.late_from,
    )
