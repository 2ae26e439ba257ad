"""The ranks other than 0 of a text run on several processes (docs/distributed.md): each builds the same task,
policy and trainer as rank 0 and trains its share of every global batch alongside, while rank 0 alone writes the
run (MLflow, checkpoints, samples, console). A rank here reports to a :class:`QuietMonitor`: it logs nothing, and its
divergence guard stops it at the same update as rank 0's (the metrics it checks are reduced over the ranks first)."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from types import FrameType
from typing import Any

from pgcli.config import TrainConfig
from pgcli.contracts import Agent
from pgcli.errors import DivergenceError
from pgcli.hardware import distributed
from pgcli.training.build import prepare_process, text_trainer
from pgcli.training.text_parts import text_parts


class QuietMonitor:
    """The monitor of a rank other than 0 (:class:`pgcli.contracts.Monitor`): it records nothing."""

    def episodes(self, step: int, info: Mapping[str, Any]) -> None:
        """Nothing: rank 0 records the run."""

    def add_episodes(self, step: int, returns: list[float], lengths: list[int]) -> None:
        """Nothing: rank 0 records the run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Nothing: rank 0 logs the metrics, reduced over the ranks."""

    def update(self, step: int, agent: Agent) -> None:
        """Nothing: rank 0 evaluates and checkpoints."""

    def diverged(self, quantity: str, step: int, value: str) -> DivergenceError:
        return DivergenceError(quantity, step, value)

    def due(self, step: int) -> bool:
        """Never: rank 0's monitor decides (its answer is broadcast)."""
        return False


class StopSignals:
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) on a rank other than 0, held until rank 0 has stopped: rank 0 finishes
    its update, saves a checkpoint and the model, ends the run KILLED and leaves; this rank's next collective then
    breaks, and it exits quietly with the signal's status instead of failing (:func:`follow_text`)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum


def follow_text(cfg: TrainConfig) -> int:
    """Train this rank's share of the text run ``cfg`` (a rank other than 0); returns the steps trained (all ranks')."""
    stops = StopSignals()
    device = prepare_process(cfg)
    try:
        trainer = text_trainer(cfg, text_parts(cfg, device), device)
        try:
            steps: int = trainer.learn(cfg.total_steps, QuietMonitor())
        finally:
            trainer.close()
    except Exception:
        if stops.signum is None:
            raise
        raise SystemExit(128 + stops.signum) from None  # rank 0 stopped the run: nothing to report here
    finally:
        distributed.teardown()
    return steps
