"""The reward model's trainer (``pgcli rm``, ``algo=rm``; docs/lm.md, "Reward models: `pgcli rm`"): a
:class:`pgcli.lm.reward_model.RewardModel` trained on preference pairs (x, y_c, y_r), y_c preferred
(:mod:`pgcli.lm.pairs`), with the Bradley-Terry loss (:mod:`pgcli.ops.preference`)

    L(phi) = - mean_pairs log sigmoid(r_phi(x, y_c) - r_phi(x, y_r))

with AdamW, a linear learning-rate warm-up over ``warmup_steps`` pairs and a global gradient-norm clip
(:mod:`pgcli.algo.supervised`); a "step" is one pair. The head starts at zero, so the loss starts at log 2. The saved
model directory holds ``policy.pt`` (the backbone) and ``reward_head.pt``, what
:func:`pgcli.lm.reward_model.load_reward_model` reads.

On your rows (``env=dataset``, :class:`pgcli.lm.dataset_rows.PreferenceRows`) a batch is the next ``batch_size``
pairs of a :class:`pgcli.lm.datasets.RowOrder` over the rows whose chosen differs from rejected (saved with each
checkpoint), each label flipped with probability ``label_noise`` as for generated pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from pgcli.algo.supervised import SupervisedTrainer
from pgcli.config import RMConfig
from pgcli.hardware import distributed
from pgcli.lm.dataset_rows import PreferenceRows
from pgcli.lm.datasets import RowOrder
from pgcli.lm.load import TextModelConfig
from pgcli.lm.model import CausalLM, save_policy
from pgcli.lm.pairs import Pair, fallback_frac
from pgcli.lm.reward_model import REWARD_HEAD_FILE, RewardModel, encode_texts, pair_generator
from pgcli.lm.rows_eval import pair_batch
from pgcli.lm.tasks import Task
from pgcli.ops.lm import micro_batches
from pgcli.ops.preference import bradley_terry_loss


class RewardModelTrainer(SupervisedTrainer[RMConfig]):
    """Bradley-Terry training of a :class:`RewardModel` on generated pairs (module docstring), built as every text
    trainer (:class:`pgcli.algo.lm_base.TextTrainerFactory`). ``policy`` is the backbone (fresh, or ``init=<SFT
    run>``); ``reference``, the frozen init model, is sampled for ``algo.pairs=policy`` only (no KL term: the reward
    model does not generate)."""

    rng_key = "pair_rng"
    run_kind = "a reward-model run"

    def __init__(
        self,
        cfg: RMConfig,
        *,
        task: Task | PreferenceRows,
        policy: CausalLM,
        reference: CausalLM | None,
        model: TextModelConfig,
        seed: int,
        device: torch.device,
    ) -> None:
        self.reward_model = RewardModel(policy).to(device).train()
        params = [p for p in self.reward_model.parameters() if p.requires_grad]  # LoRA: the adapters and the head
        super().__init__(cfg, self.reward_model, params, seed=seed, device=device)
        self.task, self.micro_batch = task, model.micro_batch
        self.rows, self.order = None, None
        if isinstance(task, PreferenceRows):
            self.rows, self.order = task, RowOrder(task.n_train, seed=seed, shuffle=task.env.shuffle)
        else:
            self.pairs = pair_generator(cfg, task, reference, model, device)

    def _step(self) -> dict[str, float]:
        if self.rows is None:
            return self._train_on(self.pairs.sample(self.rng, self._local_batch()))
        assert self.order is not None  # __init__: rows have an order
        pairs = self.rows.train_pairs(self.order.take(self._local_batch()))
        flips = self.rng.random(len(pairs)) < self.cfg.label_noise
        pairs = [
            replace(p, chosen=p.rejected, rejected=p.chosen) if f else p for p, f in zip(pairs, flips, strict=True)
        ]
        tokens, mask = pair_batch(pairs, self.rows.vocab.pad_id, self.device)  # [2N, T]: chosen rows, then rejected
        stats = self._fit(len(pairs), lambda rows: self.reward_model(tokens[rows], mask[rows]))
        stats["train/epoch"] = self.order.rows_seen / self.order.n
        return stats

    def _train_on(self, pairs: list[Pair]) -> dict[str, float]:
        """One gradient step on generated ``pairs``."""
        texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        prompts, prompt_mask, completions, completion_mask = encode_texts(
            self.task.vocab, [p.problem.prompt for p in pairs] * 2, texts, self.device
        )  # [2N, P], [2N, C]: the chosen rows, then the rejected rows
        stats = self._fit(
            len(pairs),
            lambda rows: self.reward_model.score(
                prompts[rows], prompt_mask[rows], completions[rows], completion_mask[rows]
            ),
        )
        if self.cfg.pairs == "policy":
            stats["train/policy_pair_fallback_frac"] = fallback_frac(pairs)
        return stats

    def _fit(self, n: int, score: Callable[[Tensor], Tensor]) -> dict[str, float]:
        """One gradient step on N pairs whose rewards ``score(rows)`` gives for rows of the [2N] batch (the chosen
        sides, then the rejected), ``model.micro_batch`` pairs per forward/backward pass (0: all at once); each
        pass's loss is its share of the batch mean."""
        lr = self._start_step()
        margins: list[Tensor] = []  # [N'] per pass
        for rows in micro_batches(torch.arange(n, device=self.device), self.micro_batch):
            rewards = score(torch.cat([rows, rows + n]))  # [2N']
            r_chosen, r_rejected = rewards.split(len(rows))
            # its share of the (global) batch's mean: the ranks' shares' gradients sum to the batch's
            loss = bradley_terry_loss(r_chosen, r_rejected) * (len(rows) / (n * self.world))
            loss.backward()
            margins.append((r_chosen - r_rejected).detach())
        grad_norm = distributed.optimizer_step(
            self.optimizer, self.reward_model.parameters(), self.cfg.max_grad_norm, {}
        )
        margin = torch.cat(margins)  # [N]
        return {
            "train/loss": float(-F.logsigmoid(margin).mean()),
            "train/pairwise_accuracy": float((margin > 0).float().mean()),
            "train/reward_margin": float(margin.mean()),
            "train/grad_norm": float(grad_norm),
            "train/learning_rate": lr,
        }

    def _save_model(self, directory: Path) -> None:
        """``policy.pt`` (the backbone) and ``reward_head.pt``: what :func:`load_reward_model` reads."""
        save_policy(self.reward_model.backbone, directory)
        torch.save(self.reward_model.head.state_dict(), directory / REWARD_HEAD_FILE)
