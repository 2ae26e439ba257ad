"""Aggregates of one group's runs: learning curves on a common step grid, bootstrap bands, final mean, std and IQM.

Pure functions (numpy in, numpy out), tested against hand-computed cases:

- learning curve of one metric against env steps. Curves are aligned on a common step grid: the steps logged by any
  run between the latest first step and the earliest last step, each run linearly interpolated there, so every point
  of the mean averages all n runs (no curve extrapolated, none silently dropped from the mean). Runs of one budget
  share their evaluation steps, so the grid is usually exactly those steps. The mean and a 95% percentile-bootstrap
  confidence band of the mean (resampling runs);
- final value (each run's last value): mean +- std (ddof=1), the interquartile mean (IQM: the mean of the middle 50%
  of runs, ``scipy.stats.trim_mean(x, 0.25)``; Agarwal et al., 2021, "Deep RL at the Edge of the Statistical
  Precipice", rliable) and a 95% bootstrap CI of the mean.

A group of one run has no spread: no std, no CI and no band.

Against another metric (``pgcli compare --x``) a run is a path (x_t, y_t) over its evaluation steps t, and runs do
not share x values, so there is no y "at a given x" to bootstrap: :func:`mean_path` averages x and y over the runs at
each common step instead (the mean run's path), with no band.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: drop the lowest and highest ``int(0.25 n)`` values, average the rest (rliable's IQM,
    ``scipy.stats.trim_mean(values, 0.25)``). Robust to one outlier seed, less noisy than the median."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("iqm of no values")
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


def bootstrap_ci(
    samples: np.ndarray, *, confidence: float = 0.95, n_boot: int = 2000, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap confidence interval of the mean over runs.

    Args:
        samples: [n_runs] or [n_runs, n_points]; resampling draws whole runs (rows) with replacement.
        confidence: coverage of the interval.
        n_boot: bootstrap resamples.
        rng: random generator (default: seeded with 0, so a report is reproducible).

    Returns:
        (lo, hi), each shaped like ``samples[0]``. One run gives lo = hi = its values.
    """
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"samples must be [n_runs] or [n_runs, n_points] with n_runs >= 1, got shape {x.shape}")
    rng = rng if rng is not None else np.random.default_rng(0)
    idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))  # [B, n_runs]
    means = x[idx].mean(axis=1)  # [B] or [B, n_points]
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    return lo, hi


def common_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The env steps every curve covers: all logged steps between the latest first step and the earliest last step.

    Curves logged at the same steps (the usual case: one eval cadence) keep exactly those steps.
    """
    if not curves:
        raise ValueError("no curves")
    start = max(float(steps[0]) for steps, _ in curves)
    stop = min(float(steps[-1]) for steps, _ in curves)
    all_steps = np.unique(np.concatenate([np.asarray(steps, dtype=np.float64) for steps, _ in curves]))
    return all_steps[(all_steps >= start) & (all_steps <= stop)]


def curves_on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """Each (steps, values) curve linearly interpolated at ``grid``: [n_runs, len(grid)]."""
    return np.stack(
        [np.interp(grid, np.asarray(s, dtype=np.float64), np.asarray(v, dtype=np.float64)) for s, v in curves]
    )


def mean_path(paths: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean over runs of (steps, xs, ys) paths at their common steps (:func:`common_grid`): (grid, mean x, mean y),
    each [P]; x and y are interpolated at the grid as curves are. Empty arrays when the runs share no steps."""
    grid = common_grid([(steps, ys) for steps, _, ys in paths])
    if not grid.size:
        return grid, grid.copy(), grid.copy()
    xs = curves_on_grid([(steps, xs) for steps, xs, _ in paths], grid)  # [n_runs, P]
    ys = curves_on_grid([(steps, ys) for steps, _, ys in paths], grid)  # [n_runs, P]
    return grid, xs.mean(axis=0), ys.mean(axis=0)


@dataclass
class GroupStats:
    """The aggregate of one group's runs. Spread (std, CI, band) is None for a single run."""

    n_runs: int
    final_mean: float
    final_std: float | None
    final_iqm: float
    final_ci: tuple[float, float] | None
    steps: np.ndarray  # [P] common env-step grid (empty when the runs share no steps)
    curve_mean: np.ndarray  # [P]
    curve_lo: np.ndarray | None  # [P] lower edge of the 95% bootstrap band
    curve_hi: np.ndarray | None  # [P]


def aggregate(
    curves: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    confidence: float = 0.95,
    n_boot: int = 2000,
    rng: np.random.Generator | None = None,
) -> GroupStats:
    """Aggregate one group's learning curves (one (steps, values) pair per run, steps increasing)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    finals = np.array([float(v[-1]) for _, v in curves])
    grid = common_grid(curves)
    on_grid = curves_on_grid(curves, grid) if grid.size else np.zeros((len(curves), 0))  # [n_runs, P]
    spread = len(curves) > 1
    lo = hi = None
    f_ci = None
    if spread:
        if grid.size:
            lo, hi = (np.asarray(a) for a in bootstrap_ci(on_grid, confidence=confidence, n_boot=n_boot, rng=rng))
        f_lo, f_hi = bootstrap_ci(finals, confidence=confidence, n_boot=n_boot, rng=rng)
        f_ci = (float(f_lo), float(f_hi))
    return GroupStats(
        n_runs=len(curves),
        final_mean=float(finals.mean()),
        final_std=float(finals.std(ddof=1)) if spread else None,
        final_iqm=iqm(finals),
        final_ci=f_ci,
        steps=grid,
        curve_mean=on_grid.mean(axis=0),
        curve_lo=lo,
        curve_hi=hi,
    )
