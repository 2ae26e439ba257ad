"""What an Optuna search leaves when it ends: ``optimization_results.yaml``, two plots, and the best trial's re-run
command (docs/sweeps.md, "Hyperparameter search with Optuna").

- ``optimization_results.yaml``: the study's best trial over all its sweeps (they share one budget), counts of
  complete, pruned, failed and duplicate trials, the command that re-runs the best trial, the parameter importances
  and the plots drawn.
- ``optuna_history.png``: each trial's objective by trial number, the best value so far as a line, pruned trials
  marked at the last evaluation they reported.
- ``optuna_importance.png``: Optuna's fANOVA importance of each searched parameter, drawn once the study has
  :data:`MIN_TRIALS_FOR_IMPORTANCE` complete trials (a random forest over fewer points says nothing); otherwise the
  results name the reason instead.
- The re-run command is ``pgcli train`` with the base overrides of the trial's sweep (recorded on each trial as user
  attr :data:`BASE_ATTR`) and its sampled values: the trial's job, outside a sweep, all ``n_seeds`` seeds.

The sweeper writes these; the sweep's parent run logs the plots and prints :func:`search_summary` at the end
(:mod:`pgcli.sweeps.tree`). Optuna and matplotlib are imported inside the functions that draw.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pgcli.redact import redact_text

RESULTS_FILE = "optimization_results.yaml"
HISTORY_PNG = "optuna_history.png"
IMPORTANCE_PNG = "optuna_importance.png"
MIN_TRIALS_FOR_IMPORTANCE = 5
"""Complete trials before fANOVA's importances are drawn: its random forest needs points to split."""
BASE_ATTR = "base_overrides"
"""Trial user attr: the overrides of its sweep that are not search dimensions (what a re-run needs besides them)."""
DUPLICATE_ATTR = "duplicate_of"
"""Trial user attr of a sample that repeated an earlier trial: recorded, never run."""
OBJECTIVE = "objective (mean final eval return)"


@dataclass(frozen=True)
class TrialPoint:
    """One trial on the history plot."""

    number: int
    value: float
    pruned: bool
    """A pruned trial has no objective: ``value`` is the last evaluation it reported."""


def best_so_far(values: Sequence[float], *, maximize: bool) -> list[float]:
    """The running best of ``values`` (max or min), one entry per value."""
    best: list[float] = []
    for v in values:
        best.append(v if not best else (max if maximize else min)(best[-1], v))
    return best


def trial_points(trials: Sequence[Any]) -> list[TrialPoint]:
    """The complete trials and the pruned ones that reported an evaluation (duplicates, failed and running trials
    have no value), by trial number."""
    points = []
    for t in sorted(trials, key=lambda t: t.number):
        if DUPLICATE_ATTR in t.user_attrs:
            continue
        if t.state.name == "COMPLETE" and t.value is not None:
            points.append(TrialPoint(t.number, float(t.value), pruned=False))
        elif t.state.name == "PRUNED" and t.intermediate_values:
            last = max(t.intermediate_values)
            points.append(TrialPoint(t.number, float(t.intermediate_values[last]), pruned=True))
    return points


def rerun_command(overrides: Sequence[str]) -> str:
    """One ``pgcli train`` command line, shell-quoted, URI credentials and secrets masked."""
    return redact_text(shlex.join(["pgcli", "train", *overrides]))


def best_overrides(best: Any, fixed: Sequence[str]) -> list[str]:
    """The best trial's job overrides: its sweep's base overrides (``fixed``, this sweep's, for a trial recorded
    before they were), then its sampled values, as :meth:`pgcli.sweeps.study.SearchSpace.trial_overrides` orders
    them."""
    base = best.user_attrs.get(BASE_ATTR, list(fixed))
    return [*base, *(f"{key}={value}" for key, value in best.params.items())]


# --------------------------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def history_figure(points: Sequence[TrialPoint], *, maximize: bool, title: str) -> Any:
    """Objective per trial (complete: dots; pruned: crosses at their last evaluation) and the best value so far."""
    fig, ax = _pyplot().subplots(figsize=(7, 4), dpi=100)
    complete = [p for p in points if not p.pruned]
    pruned = [p for p in points if p.pruned]
    if complete:
        numbers, values = [p.number for p in complete], [p.value for p in complete]
        ax.plot(numbers, values, "o", color="tab:blue", label="complete trial")
        best = best_so_far(values, maximize=maximize)
        ax.step(
            [*numbers, max(p.number for p in points)],
            [*best, best[-1]],
            where="post",
            color="tab:red",
            label=f"best so far ({'max' if maximize else 'min'})",
        )
    if pruned:
        ax.plot(
            [p.number for p in pruned],
            [p.value for p in pruned],
            "x",
            color="tab:gray",
            markersize=8,
            label="pruned (last evaluation reported)",
        )
    ax.set_xlabel("trial")
    ax.set_ylabel(OBJECTIVE)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    ax.set_title("optimization history")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def importance_figure(importances: Mapping[str, float], *, n_complete: int, title: str) -> Any:
    """Horizontal bars, the most important parameter on top, each labelled with its share."""
    names = list(importances)[::-1]  # barh draws bottom-up
    fig, ax = _pyplot().subplots(figsize=(7, 1.6 + 0.45 * len(names)), dpi=100)
    bars = ax.barh(names, [importances[n] for n in names], color="tab:blue")
    ax.bar_label(bars, labels=[f"{importances[n]:.2f}" for n in names], padding=3, fontsize="small")
    ax.set_xlim(0, max(1.0, *importances.values()) * 1.1)
    ax.set_xlabel("importance (share of the objective's variance)")
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"parameter importance (fANOVA over {n_complete} complete trials)")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def importances(study: Any, n_complete: int) -> tuple[dict[str, float] | None, str]:
    """fANOVA importances of the searched parameters (most important first), or None and why there are none."""
    if n_complete < MIN_TRIALS_FOR_IMPORTANCE:
        return None, f"fANOVA needs {MIN_TRIALS_FOR_IMPORTANCE} complete trials, the study has {n_complete}"
    import optuna

    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ImportError, ValueError, RuntimeError) as exc:  # no scikit-learn; parameters no trial shares
        return None, f"fANOVA failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not found:
        return None, "the complete trials share no searched parameter"
    return {str(k): float(v) for k, v in found.items()}, ""


def _save(fig: Any, path: Path) -> str:
    fig.savefig(path)
    _pyplot().close(fig)
    return path.name


# --------------------------------------------------------------------------------------------------------------------
# The results file and the summary
# --------------------------------------------------------------------------------------------------------------------


def save_results(study: Any, fixed: Sequence[str], out: Path) -> dict[str, Any]:
    """Write ``optimization_results.yaml`` and the plots into ``out`` (the sweep directory); returns the results."""
    trials = study.get_trials(deepcopy=False)
    ran = [t.state.name for t in trials if DUPLICATE_ATTR not in t.user_attrs]
    results: dict[str, Any] = {
        "name": "optuna",
        "study_name": study.study_name,
        "direction": study.direction.name.lower(),
        "n_trials": len(ran),
        "n_complete": ran.count("COMPLETE"),
        "n_pruned": ran.count("PRUNED"),
        "n_failed": ran.count("FAIL"),
        "n_duplicates": len(trials) - len(ran),
    }
    if results["n_complete"]:
        best = study.best_trial
        results |= {"best_trial": best.number, "best_params": dict(best.params), "best_value": best.value}
        results["rerun"] = rerun_command(best_overrides(best, fixed))
    out.mkdir(parents=True, exist_ok=True)
    results |= _draw(study, trials, results, out)
    OmegaConf.save(OmegaConf.create(results), out / RESULTS_FILE)
    return results


def _draw(study: Any, trials: Sequence[Any], results: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The plots (their file names under ``plots``), the importances, or the reason there are none."""
    title = f"Optuna study '{study.study_name}': {results['n_trials']} trials ({results['n_complete']} complete, "
    title += f"{results['n_pruned']} pruned, {results['n_failed']} failed), objective {results['direction']}d"
    drawn: dict[str, Any] = {"plots": []}
    points = trial_points(trials)
    if points:
        fig = history_figure(points, maximize=results["direction"] == "maximize", title=title)
        drawn["plots"].append(_save(fig, out / HISTORY_PNG))
    found, reason = importances(study, results["n_complete"])
    if found is None:
        drawn["importance_missing"] = reason
    else:
        drawn["importance"] = found
        fig = importance_figure(found, n_complete=results["n_complete"], title=title)
        drawn["plots"].append(_save(fig, out / IMPORTANCE_PNG))
    return drawn


def read_results(sweep_dir: Path | None) -> dict[str, Any] | None:
    """The results an Optuna search left in ``sweep_dir`` (None: another sweeper, or a search that was stopped)."""
    path = None if sweep_dir is None else sweep_dir / RESULTS_FILE
    if path is None or not path.is_file():
        return None
    results = OmegaConf.to_container(OmegaConf.load(path))
    return {str(k): v for k, v in results.items()} if isinstance(results, dict) else None


def search_summary(sweep_dir: Path | None) -> list[str]:
    """The lines an Optuna search's summary ends with: the best trial, the command that re-runs it, the plots (none
    for another sweeper)."""
    results = read_results(sweep_dir)
    if results is None or sweep_dir is None:
        return []
    return summary_lines(results, sweep_dir)


def summary_lines(results: Mapping[str, Any], sweep_dir: Path) -> list[str]:
    """:func:`search_summary` from the results."""
    study = results["study_name"]
    if "best_params" in results:
        shown = " ".join(f"{k}={_rounded(v)}" for k, v in results["best_params"].items())
        value = _rounded(float(results["best_value"]), "{:.2f}")
        lines = [f"pgcli: best trial {results['best_trial']} of study '{study}': value {value} with {shown}"]
        lines.append(f"pgcli: re-run the best trial: {results['rerun']}")
    else:
        lines = [f"pgcli: no trial of study '{study}' completed: no best trial to re-run"]
    plots = list(results.get("plots", []))
    if plots:
        lines.append(f"pgcli: Optuna plots: {sweep_dir / plots[0]}" + "".join(f", {p}" for p in plots[1:]))
    if "importance_missing" in results:
        lines.append(f"pgcli: no importance plot: {results['importance_missing']}")
    return lines


def _rounded(value: Any, big: str = "{:.4g}") -> Any:
    """A float for the terminal: ``big`` when |value| >= 1, else 4 significant digits (a rate of 0.0003)."""
    if not isinstance(value, float):
        return value
    return big.format(value) if abs(value) >= 1 else f"{value:.4g}"
