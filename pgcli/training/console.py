"""What a user reads in the terminal at the end of a run, and the command that continues an interrupted one.

A job of a parallel sweep (joblib, Ray) shares the terminal with the other jobs: its summary names the job and is
written as one block, and the launchers' lines about their own machinery stay off the terminal (docs/sweeps.md,
"Launchers"; the progress display is :mod:`pgcli.training.progress`).
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import sys
from pathlib import Path

from pgcli.config import GRPOConfig, TextEnvConfig, TrainConfig
from pgcli.config.overrides import override_key, plain_override, split_override
from pgcli.redact import redact_text
from pgcli.training.checkpoints import checkpoints_dir, latest_checkpoint
from pgcli.training.progress import number, parallel_job, write_line
from pgcli.training.run import RUN_FILE
from pgcli.training.summary import TrainSummary

log = logging.getLogger("pgcli")


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def print_summary(summary: TrainSummary, *, algo: str, env: str, seed: int) -> None:
    """A short end-of-run report: final evaluation, run id, output dir, and how to look at it; written at once, so
    that the jobs of a parallel sweep print whole blocks, each naming its job. A text run reports its held-out metrics
    by name (:func:`text_rows`), not as an episode return."""
    job = parallel_job()
    which = f"seed {seed}" if job is None else f"seed {seed}, job {job}"
    head = f"\n{algo} on {env} ({which}): {summary.steps:,} {summary.step_unit} in {summary.wall_time_s:.1f} s"
    rows: list[tuple[str, str]] = []
    if summary.text:
        rows += text_rows(summary)
    elif not math.isnan(summary.final_return):
        solved = ""
        if summary.reward_threshold is not None:
            mark = "solved" if summary.final_return >= summary.reward_threshold else "not solved"
            solved = f"  [{mark}: threshold {summary.reward_threshold:g}]"
        rows.append(("final eval return", f"{summary.final_return:.1f} ± {summary.final_return_std:.1f}{solved}"))
        rows += [(key.removeprefix("eval/"), number(value)) for key, value in summary.final_metrics.items()]
    if summary.best_step is not None and summary.best_return > summary.final_return:
        saved = summary.output_dir / "best_model"
        where = f" ({_relative(saved)})" if saved.is_dir() else ""  # eval.save_best=false saves none
        label, value = _best(summary)
        rows.append((label, f"{value} at step {summary.best_step:,}{where}"))
    if summary.compute:
        rows.append(("device", summary.compute))
    if summary.run_id:
        rows.append(("MLflow run", f"{summary.run_id}  ({redact_text(summary.tracking_uri or '')})"))
    rows.append(("output dir", _relative(summary.output_dir)))
    if summary.run_id:
        rows.append(("compare in the UI", "pgcli ui"))
    width = max([SUMMARY_KEY_WIDTH, *(len(label) + 1 for label, _ in rows)])  # two spaces at least
    lines = [head, *(f"  {label:<{width}} {value}" for label, value in rows)]
    write_line(sys.stdout, "\n".join(lines))
    for line in lines:
        log.info(line.strip())


SUMMARY_KEY_WIDTH = 18
"""The summary's label column (a longer label widens it for every row, keeping two spaces before the values)."""
GOLD, PROXY = "eval/accuracy", "eval/proxy_reward_mean"
"""A run on a learned reward (``env.reward=rm:<run>``): the task checker's accuracy is the gold, the reward model's
score the proxy it optimised (docs/lm.md, "RL on a learned reward")."""


def text_rows(summary: TrainSummary) -> list[tuple[str, str]]:
    """A text run's final evaluation, by name: on how many held-out problems (pairs), then each ``eval/*`` metric,
    from its step-0 value where the run evaluated its starting model; on a learned reward the gold (the task checker)
    and the proxy (the reward model) first, named as such."""
    metrics, start = summary.final_metrics, summary.start_metrics
    if not metrics:
        return []
    pairs = "eval/pairwise_accuracy" in metrics
    rows = [("final evaluation", f"{summary.final_n} held-out {'pairs' if pairs else 'problems'}")]
    named = {GOLD: "gold (task checker)", PROXY: "proxy (reward model)"} if PROXY in metrics else {}
    for key in [*named, *(k for k in metrics if k not in named)]:
        value = number(metrics[key]) if key not in start else f"{number(start[key])} -> {number(metrics[key])}"
        rows.append((named.get(key, key.removeprefix("eval/")), value))
    return rows


def _best(summary: TrainSummary) -> tuple[str, str]:
    """The best evaluation's label and value: an episode return, or what a text run chose its best model by."""
    if not summary.text:
        return "best eval return", f"{summary.best_return:.1f}"
    metrics = summary.final_metrics
    by = (
        "pairwise accuracy"
        if "eval/pairwise_accuracy" in metrics
        else "proxy reward"
        if PROXY in metrics
        else "greedy reward"
    )
    return "best eval", f"{number(summary.best_return)} ({by})"


BUDGET_KEYS = ("total_steps", "algo.n_steps", "env.n_envs", "algo.n_groups", "algo.group_size")
"""The options that set how far past ``total_steps`` a run goes (:func:`print_budget_note`)."""


def print_budget_note(cfg: TrainConfig, overrides: list[str]) -> None:
    """Say up front when training will run past ``total_steps``, and which option avoids it: on-policy trainers stop
    at the next whole rollout, GRPO on a control task after the update that reaches it (an update plays whole
    episodes).

    Only when the command line sets one of :data:`BUDGET_KEYS`: a preset's budget (``total_steps=100000`` from
    rl-baselines3-zoo) overshoots as the zoo's own runs do, and the summary names the steps trained."""
    if not any(override_key(o) in BUDGET_KEYS for o in overrides):
        return
    planned, per = cfg.planned_steps, cfg.steps_per_rollout
    if isinstance(cfg.algo, GRPOConfig) and not isinstance(cfg.env, TextEnvConfig):
        episodes = f"algo.n_groups {cfg.algo.n_groups} x algo.group_size {cfg.algo.group_size}"
        note = (
            f"pgcli: note: algo=grpo updates on whole episodes ({episodes} per update), so training runs past "
            f"total_steps={cfg.total_steps} to the end of the update that reaches it; fewer episodes per update "
            "(smaller algo.n_groups or algo.group_size) overshoot less"
        )
    elif planned is None or per is None or planned == cfg.total_steps:
        return
    else:
        rollout = f"algo.n_steps {getattr(cfg.algo, 'n_steps', 0)} x env.n_envs {cfg.env.n_envs} = {per}"
        multiples = " or ".join(str(n) for n in (planned - per, planned) if n > 0)
        note = (
            f"pgcli: note: total_steps={cfg.total_steps} is not a whole number of rollouts ({rollout}): training "
            f"stops at {planned:,} env steps; set total_steps to a multiple of {per} "
            f"(e.g. total_steps={multiples}) to train exactly that many"
        )
    write_line(sys.stderr, note)
    log.info(note.removeprefix("pgcli: "))


LAUNCHER_INTERNALS = ("Joblib.Parallel(",)
"""How the launcher lines that describe the launcher's machinery, not the sweep, start (joblib's
``Joblib.Parallel(n_jobs=2,backend=loky,prefer=processes,...) is launching 4 jobs``)."""


class HideLauncherInternals(logging.Filter):
    """Keeps the :data:`LAUNCHER_INTERNALS` lines off the terminal (``conf/hydra/hydra_logging/pgcli.yaml``); the
    lines that say which job runs which overrides stay, written as a user types them (``env.reward=rm:<run>``, not
    Hydra's ``rm\\:<run>``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(LAUNCHER_INTERNALS):
            return False
        job, sep, overrides = message.partition(" : ")
        if sep and job.strip().startswith("#") and not record.args:  # "\t#3 : algo=grpo env.reward=rm\:..."
            record.msg = f"{job}{sep}{plain_override(overrides)}"
        return True


LOOKUP_KEYS = ("tracking.uri", "tracking.store_dir")
"""Overrides that say which store a run id is in: a resume command needs them as the run's command line had them."""


def lookup_overrides(overrides: list[str]) -> list[str]:
    """The :data:`LOOKUP_KEYS` overrides among a command line's ``overrides``."""
    lookup = []
    for override in overrides:
        prefix, key, _ = split_override(override)
        if key in LOOKUP_KEYS and "~" not in prefix:  # ~tracking.uri deletes the setting, it names no store
            lookup.append(override)
    return lookup


def resume_command(run_id: str | None, run_dir: Path | None, lookup: list[str]) -> str:
    """``pgcli train resume=<run id> [tracking.uri=...]``, or ``resume=<run dir>`` for a run without a run id
    (``tracking=off``); credentials masked (docs/tracking.md, "Credentials and secrets")."""
    if run_id is not None:
        return redact_text(shlex.join(["pgcli", "train", f"resume={run_id}", *lookup]))
    assert run_dir is not None
    return redact_text(shlex.join(["pgcli", "train", f"resume={_relative(run_dir)}"]))


def interrupted_line(run_dir: Path | None, lookup: list[str]) -> str:
    """The line an interrupted ``pgcli train`` ends with: how its run continues (docs/runs.md, "Signals: a clean
    stop"), or that it stopped before its first checkpoint. ``run_dir`` is the run the process was training (None:
    it was stopped before any), ``lookup`` the command line's :data:`LOOKUP_KEYS` overrides."""
    if run_dir is None:
        return "pgcli: interrupted"
    try:
        run_id = json.loads((run_dir / RUN_FILE).read_text()).get("run_id")
    except (OSError, ValueError):
        return "pgcli: interrupted before the run started: nothing to resume"
    if latest_checkpoint(checkpoints_dir(run_dir)) is None:
        which = f" (run {run_id} ended KILLED)" if run_id else ""
        return f"pgcli: interrupted before the run's first checkpoint: nothing to resume{which}; start it again"
    return f"pgcli: interrupted; continue the run with: {resume_command(run_id, run_dir, lookup)}"
