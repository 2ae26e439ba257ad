"""The trainer contract: what every trainer is (:class:`Trainer`, :class:`Learner`) and the one thing it reports to
(:class:`Monitor`).

Trainers depend on these protocols only, never on the monitor's implementation (``pgcli.training.monitor``), the
tracking package or the run's lifecycle; ``tests/unit/test_layering.py`` keeps it so. A new algorithm is one module
in ``pgcli/algo/`` whose class has ``learn(total_steps, monitor)``, ``act``, ``save``, ``load`` and ``close``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pgcli.errors import DivergenceError


@runtime_checkable
class Actor(Protocol):
    """What evaluation on a gymnasium env needs: actions for a batch of observations."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray: ...


class Monitor(Protocol):
    """What a trainer reports to while it learns (``pgcli.training.monitor.TrainingMonitor`` is the one in use).

    ``step`` is always environment steps (sampled completions on text tasks).
    """

    def episodes(self, step: int, info: Mapping[str, Any]) -> None:
        """After each vector step: record the episodes that ended (``info["final_info"]``, raw returns)."""
        ...

    def add_episodes(self, step: int, returns: list[float], lengths: list[int]) -> None:
        """Record finished episodes' raw returns and lengths directly (trainers that collect whole episodes)."""
        ...

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the trainer's diagnostics (``train/*``) at ``step``."""
        ...

    def update(self, step: int, agent: Agent) -> None:
        """After each update: rollout statistics and progress; evaluates or checkpoints ``agent`` when due."""
        ...

    def diverged(self, quantity: str, step: int, value: str) -> DivergenceError:
        """The error that stops a run whose ``quantity`` became non-finite (``pgcli.algo.guard`` raises it)."""
        ...

    def due(self, step: int) -> bool:
        """Whether :meth:`update` at ``step`` will read the agent (an evaluation or a checkpoint is due, or a stop was
        asked for): a trainer whose agent is costly to put together first (a sharded model) does it only then."""
        ...


class Agent(Protocol):
    """What the monitor needs from a trainer: save for checkpoints (its evaluator knows how to score it)."""

    def save(self, path: Path) -> Path: ...


class Learner(Agent, Protocol):
    """A training algorithm: gymnasium trainers (:class:`Trainer`) and text trainers (``pgcli.lm``) alike."""

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        """Train until at least ``total_steps`` steps (env steps; sampled completions on text tasks); returns the
        steps actually taken."""
        ...

    def load(self, path: Path) -> None:
        """Restore a ``save`` directory: networks, optimizers, counters, normalisation statistics, RNG states and,
        when the env has as many sub-envs as the saved one, its episodes in progress (docs/checkpoints.md)."""
        ...

    def close(self) -> None: ...


class Trainer(Learner, Actor, Protocol):
    """A gymnasium training algorithm, built by ``pgcli.training.build`` as ``Trainer(algo_cfg, env=, model=, seed=,
    device=)``; it acts for evaluation episodes."""


@dataclass
class EvalResult:
    """One evaluation: episodes on a gymnasium env, or the held-out problems of a text task."""

    returns: np.ndarray
    """Per evaluated episode (on text tasks: per held-out problem, the reward of the greedy completion)."""
    lengths: np.ndarray
    """Episode lengths (completion lengths in tokens, EOS included)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Further ``eval/*`` metrics of this evaluation (text tasks: ``eval/accuracy``, ``eval/pass@k``, ...)."""
    samples: list[dict[str, Any]] | None = None
    """Rows of a samples table (text tasks: prompt, reference, completions), logged as ``samples/step_<n>.json``."""

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())
