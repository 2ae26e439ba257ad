"""What a finished training run reports back: :class:`TrainSummary`, printed by ``pgcli train``
(``pgcli.training.console.print_summary``) and returned to sweepers and scripts (``pgcli.training.run_job``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgcli.config import TrackingConfig
    from pgcli.contracts import EvalResult
    from pgcli.training.monitor import TrainingMonitor
    from pgcli.training.run import Run


@dataclass
class TrainSummary:
    """What a finished run reports back (printed by the CLI, returned to sweepers)."""

    run_id: str | None
    steps: int
    final_return: float
    final_return_std: float
    wall_time_s: float
    output_dir: Path
    tracking_uri: str | None
    reward_threshold: float | None
    best_return: float = float("nan")
    """The best evaluation's mean return (nan without evaluation)."""
    best_step: int | None = None
    """Env steps at the best evaluation; its agent is in ``output_dir/best_model`` when ``eval.save_best``."""
    final_metrics: dict[str, float] = field(default_factory=dict)
    """The final evaluation's further ``eval/*`` metrics (text tasks: ``eval/accuracy``, ...)."""
    step_unit: str = "env steps"
    """What a step counts: env steps, or on text tasks sampled completions (RL) or demonstrations (SFT)."""
    compute: str = ""
    """Where and in what precision the run computed: ``cpu, float32`` (``pgcli.hardware.placement.compute_of``)."""
    start_metrics: dict[str, float] = field(default_factory=dict)
    """The step-0 evaluation's ``eval/*`` metrics (a run from ``init=``: the model it started from); empty without
    one."""
    final_n: int = 0
    """Episodes (held-out problems, pairs) the final evaluation scored."""

    @property
    def text(self) -> bool:
        """A text run: its evaluation is an accuracy on held-out problems (or pairs), not an episode return."""
        return self.step_unit != "env steps"


def summarize(
    run: Run,
    monitor: TrainingMonitor,
    tracking: TrackingConfig,
    steps: int,
    final: EvalResult | None,
    start: float,
    *,
    threshold: float | None,
    step_unit: str = "env steps",
) -> TrainSummary:
    """The :class:`TrainSummary` of a run that has ended: ``steps`` taken, the ``final`` evaluation, the best one
    (from ``monitor``), and the wall time since ``start`` (a :func:`time.perf_counter` reading)."""
    from pgcli.tracking.uri import resolve_tracking_target

    history = run.logger.history
    extra = dict(final.extra) if final else {}
    start_metrics = {key: history[key][0][1] for key in extra if history.get(key) and history[key][0][0] == 0}
    return TrainSummary(
        run_id=run.logger.run_id,
        steps=steps,
        final_return=final.mean if final else float("nan"),
        final_return_std=final.std if final else float("nan"),
        wall_time_s=time.perf_counter() - start,
        output_dir=run.output_dir,
        tracking_uri=resolve_tracking_target(tracking).uri if tracking.backend == "mlflow" else None,
        reward_threshold=threshold,
        best_return=monitor.best_eval.mean if monitor.best_eval else float("nan"),
        best_step=monitor.best_step,
        final_metrics=extra,
        step_unit=step_unit,
        start_metrics=start_metrics,
        final_n=len(final.returns) if final else 0,
    )
