"""Supervised fine-tuning on a text task's demonstrations (``pgcli sft``, ``algo=sft``; docs/lm.md, "Supervised warm
start").

The warm start of RL on text: minimise the negative log-likelihood of the reference completion (answer + EOS) given
the prompt, averaged over completion tokens (the prompt is not a target):

    L(theta) = - sum_{i,t} m_{i,t} log pi_theta(y_{i,t} | x_i, y_{i,<t}) / sum_{i,t} m_{i,t}

on fresh training problems every step (the held-out set is never drawn), with AdamW, a linear learning-rate warm-up
over ``warmup_steps`` demonstrations and a global gradient-norm clip. A "step" is one demonstration, so
``total_steps`` is the number of demonstrations seen. The run's final ``model/policy.pt`` is what ``pgcli train
init=<this run>`` starts from and keeps as its frozen KL reference.

On your rows (``env=dataset``, :class:`pgcli.lm.dataset_rows.DemoRows`) a batch is the next ``batch_size`` training
rows of a :class:`pgcli.lm.datasets.RowOrder` (seeded epochs, saved with each checkpoint so a resumed run reads the
rows a straight run reads), and the loss is on each row's trained tokens: the completion, or a conversation's
assistant turns (m_{i,t} above; the completion then starts at the first trained token).

With ``model.micro_batch`` = k > 0 the forward/backward passes take k demonstrations at a time, each pass's loss its
share of the batch's (its rows' summed NLL over the batch's completion tokens), and the gradients accumulate before
the one clip and step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pgcli.algo.supervised import WEIGHTS_FILE, SupervisedTrainer
from pgcli.config import SFTConfig
from pgcli.hardware import distributed
from pgcli.lm.dataset_rows import DemoRows
from pgcli.lm.datasets import RowOrder
from pgcli.lm.load import TextModelConfig
from pgcli.lm.model import POLICY_FILE, CausalLM, completion_logprobs, save_policy
from pgcli.lm.rows_eval import sft_batch
from pgcli.lm.tasks import TextTask, encode_completions, encode_prompts
from pgcli.ops.lm import masked_mean, micro_batches


class SFT(SupervisedTrainer[SFTConfig]):
    """Supervised fine-tuning trainer (module docstring), built as every text trainer
    (:class:`pgcli.algo.lm_base.TextTrainerFactory`)."""

    rng_key = "problem_rng"
    run_kind = "an SFT run"

    def __init__(
        self,
        cfg: SFTConfig,
        *,
        task: TextTask | DemoRows,
        policy: CausalLM,
        reference: CausalLM | None,
        model: TextModelConfig,
        seed: int,
        device: torch.device,
    ) -> None:
        del reference  # SFT has no KL term and samples nothing
        self.policy = policy.to(device).train()
        super().__init__(cfg, self.policy, self.policy.parameters(), seed=seed, device=device)
        self.task, self.micro_batch = task, model.micro_batch
        self.order = (
            None if not isinstance(task, DemoRows) else RowOrder(task.n_train, seed=seed, shuffle=task.env.shuffle)
        )

    def _batch(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The next batch: prompts [B, P] with their mask, completions [B, C] with their mask, and the trained tokens
        [B, C] (a task's whole completion; a row's completion or assistant turns)."""
        if isinstance(self.task, DemoRows):
            assert self.order is not None  # __init__: rows have an order
            examples = self.task.train_examples(self.order.take(self._local_batch()))
            prompts, prompt_mask, completion, completion_mask, trained = sft_batch(
                examples, self.task.vocab.pad_id, self.device
            )
            return prompts, prompt_mask, completion, completion_mask, trained
        problems = self.task.sample(self.rng, self._local_batch())
        prompts, prompt_mask = encode_prompts(self.task.vocab, problems, self.device)  # [B, P]
        targets = [self.task.demonstration(p) for p in problems]
        completion, completion_mask = encode_completions(
            self.task.vocab, targets, self.task.max_completion_len, self.device
        )  # [B, C]
        return prompts, prompt_mask, completion, completion_mask, completion_mask

    def _step(self) -> dict[str, float]:
        """One gradient step on the next batch of demonstrations, ``model.micro_batch`` of them per forward/backward
        pass (0: all at once)."""
        prompts, prompt_mask, completion, completion_mask, trained = self._batch()
        weights = trained.float()
        # each pass's loss: its share of the (global) batch's mean
        totals = distributed.minibatch_totals(weights, micro_batch=self.micro_batch)
        lr = self._start_step()
        loss = 0.0
        exact: list[torch.Tensor] = []  # [B'] per pass: every target token is the argmax
        for rows in micro_batches(torch.arange(len(prompts), device=self.device), self.micro_batch):
            logprobs, _ = completion_logprobs(
                self.policy, prompts[rows], prompt_mask[rows], completion[rows], completion_mask[rows]
            )  # [B', C]
            nll = -masked_mean(logprobs, weights[rows], totals=totals)
            nll.backward()
            loss += float(nll.detach())
            with torch.no_grad():  # teacher-forced exact match
                exact.append(((logprobs > np.log(0.5)) | ~trained[rows]).all(1))  # [B']
        shares = {"loss": loss}
        grad_norm = distributed.optimizer_step(self.optimizer, self.policy.parameters(), self.cfg.max_grad_norm, shares)
        seq_exact = torch.cat(exact).float().mean()
        stats = {
            "train/loss": shares["loss"],
            "train/grad_norm": grad_norm,
            "train/learning_rate": lr,
            "train/teacher_forced_exact": float(seq_exact),
        }
        if self.order is not None:
            stats["train/epoch"] = self.order.rows_seen / self.order.n
        return stats

    def _save_model(self, directory: Path) -> None:
        save_policy(self._whole_module(), directory)  # type: ignore[arg-type]  # the policy or its twin

    def _weights_file(self, path: Path) -> Path:
        weights = path / WEIGHTS_FILE
        return weights if weights.exists() else path / POLICY_FILE  # before weights.pt: TinyGPT's policy.pt
