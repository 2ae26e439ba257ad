"""Supervised fine-tuning on a text task's demonstrations (``pgcli sft``, ``algo=sft``; docs/lm.md, "Supervised warm
start").

The warm start of RL on text: minimise the negative log-likelihood of the reference completion (answer + EOS) given
the prompt, averaged over completion tokens (the prompt is not a target):

    L(theta) = - sum_{i,t} m_{i,t} log pi_theta(y_{i,t} | x_i, y_{i,<t}) / sum_{i,t} m_{i,t}

on fresh training problems every step (the held-out set is never drawn), with AdamW, a linear learning-rate warm-up
over ``warmup_steps`` demonstrations and a global gradient-norm clip. A "step" is one demonstration, so
``total_steps`` is the number of demonstrations seen. The run's final ``model/policy.pt`` is what ``pgcli train
init=<this run>`` starts from and keeps as its frozen KL reference.

With ``model.micro_batch`` = k > 0 the forward/backward passes take k demonstrations at a time, each pass's loss its
share of the batch's (its rows' summed NLL over the batch's completion tokens), and the gradients accumulate before
the one clip and step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from pgcli.algo.base import Monitor
from pgcli.algo.checkpoint import atomic_dir, read_file, rng_state, set_rng_state
from pgcli.algo.guard import check_update
from pgcli.config import SFTConfig
from pgcli.errors import PgcliError
from pgcli.lm.load import TextModelConfig
from pgcli.lm.model import POLICY_FILE, CausalLM, completion_logprobs, save_policy
from pgcli.lm.tasks import TextTask, encode_completions, encode_prompts
from pgcli.ops.aggregate import batch_totals
from pgcli.ops.lm import masked_mean, micro_batches

OPTIMIZER_FILE = "optimizer.pt"
WEIGHTS_FILE = "weights.pt"
"""The policy module's own state (a LoRA run's adapters apart from the base) for resuming; ``policy.pt`` holds the
weights a fresh model loads (adapters merged)."""
STATE_FILE = "state.json"


class WarmUp(Protocol):
    """The step-size settings of a supervised trainer (``SFTConfig``, ``RMConfig``)."""

    learning_rate: float
    warmup_steps: int
    batch_size: int


def warmup_learning_rate(cfg: WarmUp, steps: int) -> float:
    """The step size after ``steps`` examples: rising linearly over ``warmup_steps`` examples (counting the batch
    about to be trained), then constant."""
    if cfg.warmup_steps == 0:
        return cfg.learning_rate
    return cfg.learning_rate * min(1.0, (steps + cfg.batch_size) / cfg.warmup_steps)


class SFT:
    """Supervised fine-tuning trainer (module docstring); the text-trainer signature of ``pgcli.lm``."""

    def __init__(
        self,
        cfg: SFTConfig,
        *,
        task: TextTask,
        policy: CausalLM,
        reference: CausalLM | None,
        model: TextModelConfig,
        seed: int,
        device: torch.device,
    ) -> None:
        del reference  # SFT has no KL term and samples nothing
        self.cfg, self.task, self.device, self.micro_batch = cfg, task, device, model.micro_batch
        self.policy = policy.to(device).train()
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=cfg.learning_rate,
                                           weight_decay=cfg.weight_decay)  # fmt: skip
        self.rng = np.random.default_rng(seed)
        self.steps = 0

    def learning_rate(self) -> float:
        """The step size at the current step (linear warm-up, then constant)."""
        return warmup_learning_rate(self.cfg, self.steps)

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        while self.steps < total_steps:
            stats = self._step()
            self.steps += self.cfg.batch_size
            check_update(monitor, self.steps, stats, ("train/loss", "train/grad_norm"), params=self.policy.parameters())
            monitor.log(self.steps, stats)
            monitor.update(self.steps, self)
        return self.steps

    def _step(self) -> dict[str, float]:
        """One gradient step on a fresh batch of demonstrations, ``model.micro_batch`` of them per forward/backward
        pass (0: all at once)."""
        problems = self.task.sample(self.rng, self.cfg.batch_size)
        prompts, prompt_mask = encode_prompts(self.task.vocab, problems, self.device)  # [B, P]
        targets = [self.task.demonstration(p) for p in problems]
        completion, completion_mask = encode_completions(self.task.vocab, targets, self.task.max_completion_len,
                                                         self.device)  # fmt: skip  # [B, C]
        weights = completion_mask.float()
        totals = None if self.micro_batch == 0 else batch_totals(weights)  # each pass's loss: its share of the mean
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        exact: list[torch.Tensor] = []  # [B'] per pass: every target token is the argmax
        for rows in micro_batches(torch.arange(len(problems), device=self.device), self.micro_batch):
            logprobs, _ = completion_logprobs(self.policy, prompts[rows], prompt_mask[rows], completion[rows],
                                              completion_mask[rows])  # fmt: skip  # [B', C]
            nll = -masked_mean(logprobs, weights[rows], totals=totals)
            nll.backward()
            loss += float(nll.detach())
            with torch.no_grad():  # teacher-forced exact match
                exact.append(((logprobs > np.log(0.5)) | ~completion_mask[rows]).all(1))  # [B']
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        seq_exact = torch.cat(exact).float().mean()
        return {
            "train/loss": loss,
            "train/grad_norm": float(grad_norm),
            "train/learning_rate": lr,
            "train/teacher_forced_exact": float(seq_exact),
        }

    def save(self, path: Path) -> Path:
        """Atomically write ``policy.pt``, ``weights.pt``, ``optimizer.pt`` and ``state.json`` (steps, problem RNG,
        process RNGs)."""
        with atomic_dir(path) as tmp:
            save_policy(self.policy, tmp)
            torch.save(self.policy.state_dict(), tmp / WEIGHTS_FILE)
            torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            state = {"steps": self.steps, "problem_rng": self.rng.bit_generator.state, "rng": rng_state()}
            (tmp / STATE_FILE).write_text(json.dumps(state))
        return path

    def load(self, path: Path) -> None:
        weights = path / WEIGHTS_FILE
        if not weights.exists():  # a checkpoint written before weights.pt: TinyGPT's policy.pt is its state
            weights = path / POLICY_FILE
        state = read_file(weights, lambda f: torch.load(f, map_location=self.device, weights_only=True))
        self.policy.load_state_dict(state)
        optimizer = read_file(path / OPTIMIZER_FILE, lambda f: torch.load(f, map_location=self.device,
                                                                            weights_only=True))  # fmt: skip
        self.optimizer.load_state_dict(optimizer)
        state = read_file(path / STATE_FILE, lambda f: json.loads(f.read_text()))
        try:
            self.steps = int(state["steps"])
            self.rng.bit_generator.state = state["problem_rng"]
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PgcliError(f"checkpoint file {path / STATE_FILE} does not fit an SFT run ({exc})") from None

    def close(self) -> None:
        """Nothing to release."""
