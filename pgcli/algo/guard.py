"""Divergence guard: stop training at the first non-finite observation, loss, gradient or parameter
(docs/checkpoints.md, "Divergence guard").

The checks run once per update on whole tensors (one ``torch.isfinite(...).all()`` each), before the monitor can
evaluate or checkpoint the agent, so a diverged state never reaches a checkpoint: the last one on disk is the last
good one. The error (:class:`~pgcli.errors.DivergenceError`, built by ``TrainingMonitor.diverged``) names the
quantity, the env step and the value, and ends the run FAILED.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from pgcli.contracts import Monitor


def describe(values: Tensor) -> str:
    """'nan', 'inf' or '-inf': the first kind of non-finite value in ``values``."""
    if bool(values.isnan().any()):
        return "nan"
    return "inf" if bool((values == math.inf).any()) else "-inf"


def check_steps(monitor: Monitor, name: str, values: Tensor, *, first_step: int) -> None:
    """Raise if per-step values [T, N, ...] hold a non-finite value; row t was returned at env step
    ``first_step + t * N``, and the error names the step of the first bad row."""
    if not bool(torch.isfinite(values).all()):
        bad_row = int((~torch.isfinite(values)).flatten(1).any(1).nonzero()[0, 0])
        raise monitor.diverged(name, first_step + bad_row * values.shape[1], describe(values))


def check_finite(monitor: Monitor, step: int, **values: Tensor) -> None:
    """Raise if a tensor (``observation=...``) of the batch collected by env step ``step`` is non-finite."""
    for name, tensor in values.items():
        if not bool(torch.isfinite(tensor).all()):
            raise monitor.diverged(name, step, describe(tensor))


def check_update(
    monitor: Monitor,
    step: int,
    stats: Mapping[str, float],
    keys: Iterable[str],
    *,
    params: Iterable[Tensor],
) -> None:
    """Raise if a loss, gradient norm or parameter of the update that ended at env step ``step`` is non-finite.

    Args:
        monitor: builds the error (it knows the last good checkpoint).
        step: env steps so far.
        stats: the update's metrics.
        keys: the metrics that must be finite (losses, gradient norms; not diagnostics that may be nan by design).
        params: every trained parameter.
    """
    for key in keys:
        if not math.isfinite(stats[key]):
            raise monitor.diverged(key, step, str(stats[key]))
    tensors = [p.detach().reshape(-1) for p in params]
    if not tensors:
        return
    flat = torch.cat(tensors)  # [P]
    if not bool(torch.isfinite(flat).all()):
        raise monitor.diverged("parameter", step, describe(flat))
