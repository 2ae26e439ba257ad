"""Groups of runs that differ only in their seed, so that averaging them means something.

- runs are keyed by algo and env id (tag ``env_id``, else param ``env.id``), any ``--group-by`` keys, and the Optuna
  trial number when runs carry a ``trial`` tag (each trial is its own group);
- within a key, runs with different budgets (``total_steps``; a resumed run's is its tag) are split into one group
  per budget, and runs whose configs differ in anything else than the seed (a grid sweep over
  ``algo.learning_rate``) into one group per setting; the notes say which runs were split and why;
- two runs with the same seed in one group (the same sweep run twice) are never both averaged: the latest run of
  each seed is used and the others are reported as left out;
- each Optuna trial's group carries the values it was run with, as a grid sweep's groups do: the config values that
  differ between the trials of one algo, env and budget (its sampled parameters);
- a reward metric (``eval/return_mean``, any ``*return*`` or ``*reward*`` key) means what the run's reward is: the
  task's reward, a ``pgcli rm`` run's pairwise accuracy, or a reward model's score (``env.reward=rm:<run>``), one
  scale per reward model. When the compared runs' rewards differ, the reward is a key of its own (:func:`reward_of`,
  :func:`mixed_rewards`).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pgcli.errors import ConfigError

BASE_KEYS = ("algo", "env_id")
"""Every group is keyed by these; ``--group-by`` adds keys."""
TRIAL_KEY = "trial"
"""Tag of an Optuna trial's runs (``trial=<n>``): each trial is its own group."""
REWARD_KEY = "reward"
"""What a run's reward is (:func:`reward_of`): a key when the compared runs' rewards differ, or with ``--group-by``."""
TASK_REWARD = "task"
PAIRWISE = "pairwise accuracy"
REWARD_MEANINGS = {TASK_REWARD: "the task's reward", PAIRWISE: "held-out pairs ranked right, pgcli rm"}
"""What a reward metric is, per :func:`reward_of` value; ``rm:<id>``: that reward model's score."""
KEY_SOURCES = {
    "env_id": ("tags.env_id", "params.env.id"),
    "trial": ("tags.trial",),
    "seed": ("tags.seed", "params.seed"),
    "total_steps": ("tags.total_steps", "params.total_steps"),
}
"""Where a key is looked up, first hit wins; any other key: its param (the flattened config), then its tag. A resumed
run's budget is its ``total_steps`` tag: its param keeps the budget it was started with (docs/runs.md, "Resume")."""
NOT_SET = {"trial": "-"}
"""Shown for a run without the key (default '?': a run that should have it but does not)."""
NOT_CONFIG = (
    "seed",
    "run_name",
    "experiment",
    "progress",
    "n_seeds",
    "checkpoint_every",
    "checkpoint_keep",
    "total_steps",
    "planned_steps",
)
NOT_CONFIG_PREFIXES = ("tracking.", "hardware.")
"""Params that do not change what a run learns (or are handled apart, as the budget and ``planned_steps``, the budget
rounded up to whole rollouts): runs differing only in these are repeats of one experiment. A resumed run keeps the
params it started with, these two included."""


@dataclass(frozen=True)
class RunCurve:
    """One run's metric history and the values that decide its group."""

    run_id: str
    params: dict[str, str]
    tags: dict[str, str]
    steps: np.ndarray  # [P_run] env steps, increasing
    values: np.ndarray  # [P_run]
    xs: np.ndarray | None = None  # [P_run] the ``--x`` metric at the same steps; None: the curve is against steps


@dataclass
class Group:
    """Runs of one experiment (same key, budget and config) with distinct seeds."""

    key: tuple[str, ...]
    """Values of the group keys (algo, env_id, --group-by keys, trial)."""
    budget: str
    """``total_steps`` of its runs."""
    setting: dict[str, str] = field(default_factory=dict)
    """Config values that told it apart from other runs of the same key and budget."""
    runs: list[RunCurve] = field(default_factory=list)


def lookup(run: RunCurve, key: str) -> str:
    """A key's value for a run: from its sources in :data:`KEY_SOURCES`, else its param, else its tag, else
    :data:`NOT_SET`'s mark."""
    value = _find(run, key)
    return NOT_SET.get(key, "?") if value is None else value


def _find(run: RunCurve, key: str) -> str | None:
    if key == REWARD_KEY:
        return reward_of(run)
    for source in KEY_SOURCES.get(key, (f"params.{key}", f"tags.{key}")):
        kind, _, name = source.partition(".")
        value = (run.params if kind == "params" else run.tags).get(name)
        if value is not None:
            return value
    return None


def check_keys(runs: Sequence[RunCurve], keys: Sequence[str]) -> None:
    """Refuse a ``--group-by`` key that none of ``runs`` has (a typo would otherwise be a column of '?'): a one-line
    :class:`~pgcli.errors.ConfigError` naming the key, the close matches and the keys the runs have (their params,
    the flattened config, and the keys of :data:`KEY_SOURCES`; a tag of theirs is accepted too)."""
    for key in keys:
        if not any(_find(run, key) is not None for run in runs):
            known = sorted(
                {k for run in runs for k in run.params}
                | {k for k in KEY_SOURCES if any(_find(r, k) is not None for r in runs)}
            )
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"--group-by: no compared run has '{key}'; {hint}keys: {', '.join(known)}")


def reward_of(run: RunCurve) -> str:
    """What ``run``'s reward is: ``pairwise accuracy`` for a reward model (``pgcli rm``, algo ``rm``), ``rm:<id>``
    for RL on a reward model's score (``env.reward=rm:<run>``; the id it recorded, 8 digits, else the reference as
    typed), else ``task`` (the task's or env's own reward)."""
    if _find(run, "algo") == "rm":
        return PAIRWISE
    reward = run.params.get("env.reward", "")
    if not reward.startswith("rm:"):
        return TASK_REWARD
    run_id = run.tags.get("reward_model_run_id") or ""
    return f"rm:{run_id[:8]}" if run_id else f"rm:{reward[3:].rstrip('/').rsplit('/', 1)[-1]}"


def is_reward_metric(metric: str) -> bool:
    """Whether ``metric``'s meaning is the run's reward (``eval/return_mean``, ``rollout/reward_mean``, ...), not a
    checker's verdict as ``eval/accuracy`` is."""
    name = metric.rsplit("/", 1)[-1]
    return "return" in name or "reward" in name


def mixed_rewards(runs: Sequence[RunCurve], metric: str) -> str | None:
    """The note when ``runs``' rewards differ and ``metric`` is a reward (so their values are on different scales):
    which rewards, how many runs each, and how to compare one alone; None when they are alike."""
    counts = Counter(reward_of(run) for run in runs)
    if len(counts) < 2 or not is_reward_metric(metric):
        return None
    kinds = ", ".join(f"{kind} ({reward_meaning(kind)}): {n} run(s)" for kind, n in sorted(counts.items()))
    return (
        f"{metric} is a different score per reward, so each reward has its own rows and panel: {kinds}; to compare "
        "one alone, select it with --parent <its sweep> or --filter (e.g. \"params.algo = 'rm'\", "
        "\"tags.reward_model_run_id = '<id>'\")"
    )


def reward_meaning(kind: str) -> str:
    """What a reward metric is for runs of reward ``kind`` (a :func:`reward_of` value)."""
    return REWARD_MEANINGS.get(kind, "that reward model's score")


def config_of(run: RunCurve) -> dict[str, str]:
    """The params that define what a run learns (its flattened config less seed, budget, tracking, hardware)."""
    return {k: v for k, v in run.params.items() if k not in NOT_CONFIG and not k.startswith(NOT_CONFIG_PREFIXES)}


def describe(key: Sequence[str], budget: str | None = None) -> str:
    """A group for the notes: ``ppo | CartPole-v1 | 5000 steps`` (keys a run does not have are left out)."""
    return " | ".join([*(k for k in key if k != "-"), *([f"{budget} steps"] if budget is not None else [])])


def make_groups(runs: Sequence[RunCurve], keys: Sequence[str]) -> tuple[list[Group], list[str]]:
    """Split ``runs`` (oldest first) into groups of seeds of one experiment; returns the groups and what was done.

    Keyed by ``keys``; within a key, split by budget and then by any config value that differs; within a group,
    the latest run of each seed is kept. Every split and every run left out is described in the returned notes.
    """
    notes: list[str] = []
    by_key: dict[tuple[str, ...], list[RunCurve]] = {}
    for run in runs:
        by_key.setdefault(tuple(lookup(run, k) for k in keys), []).append(run)
    groups: list[Group] = []
    for key, key_runs in sorted(by_key.items(), key=lambda item: _natural(item[0])):
        by_budget: dict[str, list[RunCurve]] = {}
        for run in key_runs:
            by_budget.setdefault(lookup(run, "total_steps"), []).append(run)
        if len(by_budget) > 1:
            counts = ", ".join(f"{len(r)} x {b}" for b, r in sorted(by_budget.items(), key=_budget_order))
            notes.append(f"split {describe(key)}: runs of different budgets ({counts} env steps) are not averaged")
        for budget, budget_runs in sorted(by_budget.items(), key=_budget_order):
            for group in _split_by_config(key, budget, budget_runs, notes):
                groups.append(_one_run_per_seed(group, notes))
    name_trial_params(groups, keys)
    return groups, notes


def _natural(key: tuple[str, ...]) -> tuple[tuple[int, int, str], ...]:
    """Sort order of group keys: numbers by value (trial 2 before trial 10), then the rest as text."""
    return tuple((0, int(v), "") if v.isdigit() else (1, 0, v) for v in key)


def name_trial_params(groups: Sequence[Group], keys: Sequence[str]) -> None:
    """Give each Optuna trial's group the values it was run with (its ``setting``, the table's ``config`` column):
    the config values that differ between the trials of one algo, env and budget, floats to 4 significant digits as
    the sweep's summary shows them. Keys of their own in ``keys`` are left to their column."""
    if TRIAL_KEY not in keys:
        return
    at, base = keys.index(TRIAL_KEY), [keys.index(k) for k in BASE_KEYS if k in keys]
    searches: dict[tuple[str, ...], list[Group]] = {}
    for group in groups:
        if group.key[at] != NOT_SET[TRIAL_KEY]:
            searches.setdefault((*(group.key[i] for i in base), group.budget), []).append(group)
    for trials in searches.values():
        configs = [config_of(g.runs[0]) for g in trials]
        varying = [k for k in sorted({k for c in configs for k in c}) if len({c.get(k, "") for c in configs}) > 1]
        for group, config in zip(trials, configs, strict=True):
            params = {k: _shown(config.get(k, "")) for k in varying if k not in keys}
            group.setting = params | group.setting


def _shown(value: str) -> str:
    """A float with 4 significant digits (``0.000312345678`` -> ``0.0003123``); anything else as it is."""
    if not any(c in value for c in ".eE"):
        return value
    try:
        return f"{float(value):.4g}"
    except ValueError:
        return value


def _budget_order(item: tuple[str, Any]) -> tuple[int, str]:
    budget = item[0]
    return (int(budget), "") if budget.isdigit() else (-1, budget)


def _split_by_config(key: tuple[str, ...], budget: str, runs: list[RunCurve], notes: list[str]) -> list[Group]:
    configs = [config_of(r) for r in runs]
    names = sorted({k for c in configs for k in c})
    varying = [k for k in names if len({c.get(k, "") for c in configs}) > 1]
    if not varying:
        return [Group(key, budget, {}, list(runs))]
    split: dict[tuple[str, ...], Group] = {}
    for run, config in zip(runs, configs, strict=True):
        values = tuple(config.get(k, "") for k in varying)
        group = split.setdefault(values, Group(key, budget, dict(zip(varying, values, strict=True))))
        group.runs.append(run)
    shown = ", ".join(varying[:4]) + (f" and {len(varying) - 4} more" if len(varying) > 4 else "")
    notes.append(
        f"split {describe(key, budget)}: runs differ in {shown}, so they are {len(split)} experiments, not seeds "
        "of one (add the key to --group-by to name it in the table)"
    )
    return [group for _, group in sorted(split.items())]


def _one_run_per_seed(group: Group, notes: list[str]) -> Group:
    latest: dict[str, RunCurve] = {}
    unseeded: list[RunCurve] = []
    for run in group.runs:  # oldest first: a later run of a seed replaces an earlier one
        seed = lookup(run, "seed")
        if seed == "?":
            unseeded.append(run)
        else:
            latest[seed] = run
    kept = [*latest.values(), *unseeded]
    if len(kept) < len(group.runs):
        counts = Counter(lookup(r, "seed") for r in group.runs)
        repeated = ", ".join(f"seed {s} x{n}" for s, n in sorted(counts.items()) if n > 1 and s != "?")
        notes.append(
            f"duplicate seeds in {describe(group.key, group.budget)}{setting_text(group.setting)}: {repeated}; "
            f"used the latest run of each seed, left out {len(group.runs) - len(kept)} older run(s)"
        )
    group.runs = kept
    return group


def setting_text(setting: dict[str, str]) -> str:
    return " (" + ", ".join(f"{k}={v}" for k, v in setting.items()) + ")" if setting else ""
