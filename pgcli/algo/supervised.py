"""What pgcli's two supervised text trainers share: the SFT trainer (:mod:`pgcli.algo.sft`) and the reward model's
(:mod:`pgcli.algo.reward_model`).

Both take one AdamW step per batch of ``algo.batch_size`` freshly drawn examples (demonstrations, preference pairs),
count a step as one example, warm the learning rate up linearly over ``algo.warmup_steps`` examples, check every
update with the divergence guard, and checkpoint the same way: the model's own files, then ``weights.pt`` (the trained
module's state: a LoRA run's adapters apart from the base), ``optimizer.pt`` and ``state.json`` (steps, the example
RNG, the process RNGs; on your rows, where the row order stands), so a resumed run draws the examples an uninterrupted
one would have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from pgcli.algo.checkpoint import atomic_dir, read_file, rng_state, set_rng_state
from pgcli.algo.guard import check_update
from pgcli.contracts import Monitor
from pgcli.errors import PgcliError
from pgcli.hardware import distributed, sharding
from pgcli.lm.datasets import RowOrder

OPTIMIZER_FILE = "optimizer.pt"
WEIGHTS_FILE = "weights.pt"
"""The trained module's own state (a LoRA run's adapters apart from the base) for resuming; ``policy.pt`` holds the
weights a fresh model loads (adapters merged)."""
STATE_FILE = "state.json"


class WarmUp(Protocol):
    """The step-size settings of a supervised trainer (``SFTConfig``, ``RMConfig``)."""

    learning_rate: float
    warmup_steps: int
    batch_size: int


class SupervisedConfig(WarmUp, Protocol):
    """What :class:`SupervisedTrainer` reads of its config."""

    weight_decay: float
    max_grad_norm: float


Cfg = TypeVar("Cfg", bound=SupervisedConfig)


def warmup_learning_rate(cfg: WarmUp, steps: int) -> float:
    """The step size after ``steps`` examples: rising linearly over ``warmup_steps`` examples (counting the batch
    about to be trained), then constant."""
    if cfg.warmup_steps == 0:
        return cfg.learning_rate
    return cfg.learning_rate * min(1.0, (steps + cfg.batch_size) / cfg.warmup_steps)


class SupervisedTrainer(Generic[Cfg]):
    """The training loop, step size and checkpoint of a supervised text trainer (module docstring).

    A subclass trains ``module`` (the optimizer takes ``params``: all of its parameters, or a LoRA run's trainable
    ones) and defines :meth:`_step` (one update on a fresh batch drawn from ``self.rng``; its metrics) and
    :meth:`_save_model` (the files a fresh model loads: ``policy.pt``, a reward model's head).
    """

    rng_key: ClassVar[str]
    """The example RNG's key in ``state.json`` (``problem_rng``, ``pair_rng``)."""
    run_kind: ClassVar[str]
    """What a checkpoint belongs to, for its one-line error (``an SFT run``)."""

    def __init__(self, cfg: Cfg, module: nn.Module, params: Any, *, seed: int, device: torch.device) -> None:
        self.cfg, self.module, self.device = cfg, module, device
        self.optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.seed = seed  # on rank r of several processes: pgcli.hardware.distributed.rank_seed(run seed, r)
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.world = distributed.world_size() if distributed.active() else 1
        self.order: RowOrder | None = None
        """On your rows, the order they are read in (saved with each checkpoint); set by the subclass."""
        self.gathered: sharding.Gathered | None = None
        """With ``hardware.shard=params``: rank 0's whole copy of the sharded module (set by the builder)."""

    def learning_rate(self) -> float:
        """The step size at the current step (linear warm-up, then constant)."""
        return warmup_learning_rate(self.cfg, self.steps)

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        self._start_ranks()
        while self.steps < total_steps:
            stats = distributed.mean_stats(self._step())  # over every example of the global batch
            self.steps += self.cfg.batch_size
            params = sharding.local_tensors(self.module.parameters())
            check_update(monitor, self.steps, stats, ("train/loss", "train/grad_norm"), params=params)
            monitor.log(self.steps, stats)
            if self.gathered is not None:  # rank 0's monitor reads the whole model when it evaluates or saves
                self.gathered.sync(self.steps >= total_steps or monitor.due(self.steps))
            monitor.update(self.steps, self)
        return self.steps

    def _step(self) -> dict[str, float]:
        raise NotImplementedError

    def _start_ranks(self) -> None:
        """On several processes: rank 0's model, optimiser state and step count on every rank (a resumed run's
        checkpoint is rank 0's), and the other ranks' example generator seeded afresh where a resumed run continues."""
        if not distributed.active():
            return
        if self.gathered is not None:  # every rank built the same shards; a resumed run loads rank 0's checkpoint
            self.steps = distributed.broadcast_state({}, {"steps": self.steps})["steps"]
            self.gathered.start(resumed=self.steps > 0)
        else:
            modules = {"module": self.module, "optimizer": self.optimizer}
            self.steps = distributed.broadcast_state(modules, {"steps": self.steps})["steps"]
        if self.steps and not distributed.is_main():
            self.rng = np.random.default_rng(distributed.resumed_seed(self.seed, self.steps))

    def _local_batch(self) -> int:
        """This process's share of ``algo.batch_size`` (all of it in one process)."""
        return distributed.local_size(self.cfg.batch_size, "algo.batch_size")

    def _start_step(self) -> float:
        """Before a step's passes: the step size set for this step (returned) and the gradients cleared."""
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def _save_model(self, directory: Path) -> None:
        raise NotImplementedError

    def _whole_module(self) -> nn.Module:
        """The module as one process holds it: rank 0's gathered twin of a sharded one (hardware.shard=params)."""
        if self.gathered is not None and self.gathered.twin is not None:
            return self.gathered.twin
        return self.module

    def _weights_file(self, path: Path) -> Path:
        """The module state to resume from in checkpoint ``path``."""
        return path / WEIGHTS_FILE

    def save(self, path: Path) -> Path:
        """Atomically write the model's files, ``weights.pt``, ``optimizer.pt`` and ``state.json``."""
        with atomic_dir(path) as tmp:
            self._save_model(tmp)
            torch.save(self._whole_module().state_dict(), tmp / WEIGHTS_FILE)
            optimizer = self.gathered.optimizer_state if self.gathered is not None else self.optimizer.state_dict()
            torch.save(optimizer, tmp / OPTIMIZER_FILE)
            state = {"steps": self.steps, self.rng_key: self.rng.bit_generator.state, "rng": rng_state()}
            if self.order is not None:
                state["row_order"] = self.order.state_dict()
            (tmp / STATE_FILE).write_text(json.dumps(state))
        return path

    def load(self, path: Path) -> None:
        def torch_file(f: Path) -> Any:
            return torch.load(f, map_location=self.device, weights_only=True)

        weights = read_file(self._weights_file(path), torch_file)
        optimizer = read_file(path / OPTIMIZER_FILE, torch_file)
        if self.gathered is not None:  # into every rank's shards as training starts (_start_ranks)
            self._whole_module().load_state_dict(weights)
            self.gathered.pending = (weights, optimizer)
        else:
            self.module.load_state_dict(weights)
            self.optimizer.load_state_dict(optimizer)
        state = read_file(path / STATE_FILE, lambda f: json.loads(f.read_text()))
        try:
            self.steps = int(state["steps"])
            self.rng.bit_generator.state = state[self.rng_key]
            set_rng_state(state["rng"])
            if self.order is not None:
                self.order.load_state_dict(state["row_order"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PgcliError(f"checkpoint file {path / STATE_FILE} does not fit {self.run_kind} ({exc})") from None

    def close(self) -> None:
        """Nothing to release."""
