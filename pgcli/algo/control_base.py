"""What pgcli's own trainers of gymnasium envs share (VPG, TRPO, PPO-Penalty, GRPO), as ``pgcli.algo.lm_base`` does
for the text trainers.

:class:`ControlTrainer` acts, hands out policy snapshots for evaluation, reports each update (the divergence guard,
then the monitor) and checkpoints in one call each way: a subclass names what ``model.pt`` holds
(:meth:`~ControlTrainer._stateful`) and, beyond the env steps, the plain values ``state.json`` holds
(:meth:`~ControlTrainer._counters`, read back by :meth:`~ControlTrainer._restore`). :class:`ActorCriticTrainer` adds
what the trainers with a value network share (VPG, TRPO, PPO-Penalty): the networks and the rollout collector they are
built with, each update's rollout (collect, count, GAE) and the episodes in progress a checkpoint resumes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from pgcli.algo.checkpoint import Restored, Stateful, load_checkpoint, save_checkpoint
from pgcli.algo.guard import check_update
from pgcli.algo.policies import Policy, PolicySnapshot, ValueNetwork, make_actor_critic
from pgcli.algo.rollout import Rollout, RolloutCollector
from pgcli.config import ModelConfig
from pgcli.config.pixels import CNNModelConfig
from pgcli.contracts import Monitor


class RolloutConfig(Protocol):
    """What :class:`ActorCriticTrainer` reads of its config (``VPGConfig``, ``TRPOConfig``, ``PPOKLConfig``)."""

    n_steps: int
    gamma: float
    gae_lambda: float


Cfg = TypeVar("Cfg")
RolloutCfg = TypeVar("RolloutCfg", bound=RolloutConfig)


class ControlTrainer(Generic[Cfg]):
    """The Trainer contract's shared part for a trainer of ours on a gymnasium env (module docstring)."""

    cfg: Cfg
    env: VectorEnv
    device: torch.device
    policy: Policy
    steps: int
    """Env steps taken (continues across a checkpoint)."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.policy.predict(obs, deterministic)

    def snapshot(self) -> PolicySnapshot:
        """A frozen copy of the policy, to evaluate in another process while training goes on."""
        return PolicySnapshot(self.policy)

    def _report(self, monitor: Monitor, stats: dict[str, float], losses: tuple[str, ...], params: Any) -> None:
        """After an update: the divergence guard on ``losses`` of ``stats`` and ``params``, then the update's metrics
        and the monitor's turn (evaluation, checkpoints)."""
        check_update(monitor, self.steps, stats, losses, params=params)
        monitor.log(self.steps, stats)
        monitor.update(self.steps, self)

    def _stateful(self) -> dict[str, Stateful | None]:
        """The networks and optimizers ``model.pt`` holds, by name (None: saved as None)."""
        raise NotImplementedError

    def _counters(self) -> dict[str, Any]:
        """The plain values ``state.json`` holds for the trainer (env steps; a subclass adds its own)."""
        return {"steps": self.steps}

    def _restore(self, restored: Restored) -> None:
        """Read back :meth:`_counters`' values (and what else a subclass takes from a loaded checkpoint)."""
        self.steps = int(restored.values["steps"])

    def save(self, path: Path) -> Path:
        """``path/model.pt`` (:meth:`_stateful`), ``normalizer.npz`` when the env normalises, and ``state.json``
        (:meth:`_counters`, RNG and env states; pgcli.algo.checkpoint)."""
        return save_checkpoint(path, self.env, self._stateful(), self._counters())

    def load(self, path: Path) -> None:
        self._restore(load_checkpoint(path, self.env, self.device, self._stateful()))

    def close(self) -> None:
        self.env.close()


class ActorCriticTrainer(ControlTrainer[RolloutCfg]):
    """A :class:`ControlTrainer` with a value network, learning from the rollouts of ``pgcli.algo.rollout`` (module
    docstring). A subclass builds its optimizers after this constructor (it draws no random numbers of theirs) and
    writes ``_update``, or its own ``learn`` from :meth:`_rollout` and :meth:`_report`."""

    checked_losses: ClassVar[tuple[str, ...]]
    """The update's metrics that must be finite."""
    value: ValueNetwork

    def __init__(
        self, cfg: RolloutCfg, *, env: VectorEnv, model: ModelConfig | CNNModelConfig, seed: int, device: torch.device
    ) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        policy, value = make_actor_critic(env.single_observation_space, env.single_action_space, model)
        self.policy, self.value = policy.to(device), value.to(device)
        self.collector = RolloutCollector(env, n_steps=cfg.n_steps, seed=seed, device=device)
        self.steps = 0

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        while self.steps < total_steps:
            batch, advantages, returns = self._rollout(monitor)
            stats = self._update(batch, advantages, returns)
            self._report(monitor, stats, self.checked_losses, self._checked_parameters())
        return self.steps

    def _rollout(self, monitor: Monitor) -> tuple[Rollout, Tensor, Tensor]:
        """Step 1: a batch of T x N steps from the current policy (counted), its GAE advantages and value targets
        (each flattened to [T * N])."""
        batch = self.collector.collect(self.policy, self.value, monitor, self.steps)
        self.steps += batch.n_samples
        advantages, returns = batch.gae(gamma=self.cfg.gamma, lam=self.cfg.gae_lambda)
        return batch, advantages.flatten(), returns.flatten()

    def _update(self, batch: Rollout, advantages: Tensor, returns: Tensor) -> dict[str, float]:
        """The steps after the rollout; their ``train/*`` metrics."""
        raise NotImplementedError

    def _checked_parameters(self) -> Iterable[Tensor]:
        """The parameters the divergence guard checks after an update: the policy's and the value network's."""
        return [*self.policy.parameters(), *self.value.parameters()]

    def _restore(self, restored: Restored) -> None:
        super()._restore(restored)
        if restored.obs is not None:
            self.collector.last_obs = restored.obs
