"""What a user reads in the terminal at the end of a run."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from pgcli.build import TrainSummary
from pgcli.redact import redact_text


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def print_summary(summary: TrainSummary, *, algo: str, env: str, seed: int) -> None:
    """A short end-of-run report: final evaluation, run id, output dir, and how to look at it."""
    lines = [f"\n{algo} on {env} (seed {seed}): {summary.steps:,} env steps in {summary.wall_time_s:.1f} s"]
    if not math.isnan(summary.final_return):
        solved = ""
        if summary.reward_threshold is not None:
            mark = "solved" if summary.final_return >= summary.reward_threshold else "not solved"
            solved = f"  [{mark}: threshold {summary.reward_threshold:g}]"
        lines.append(f"  final eval return  {summary.final_return:.1f} ± {summary.final_return_std:.1f}{solved}")
    if summary.best_step is not None and summary.best_return > summary.final_return:
        saved = summary.output_dir / "best_model"
        where = f" ({_relative(saved)})" if saved.is_dir() else ""  # eval.save_best=false saves none
        lines.append(f"  best eval return   {summary.best_return:.1f} at step {summary.best_step:,}{where}")
    if summary.run_id:
        lines.append(f"  MLflow run         {summary.run_id}  ({redact_text(summary.tracking_uri or '')})")
    lines.append(f"  output dir         {_relative(summary.output_dir)}")
    if summary.run_id:
        lines.append("  compare in the UI  pgcli ui")
    print("\n".join(lines), file=sys.stdout, flush=True)
