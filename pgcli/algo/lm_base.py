"""The contract every trainer of a text task is built by, and the base of the RL ones (docs/lm.md, "Writing a text
trainer"; docs/algorithms/lm.md).

:class:`TextTrainerFactory` is the one statement of how ``pgcli.training.build`` builds a text trainer (SFT, the reward
model's, the RL trainers). :class:`TextRLTrainer` holds what the RL trainers share, as SB3's ``OnPolicyAlgorithm``
does for its subclasses: the constructor (policy, optimizer, reference, the prompt and sampling generators, counters),
the ``learn`` loop (sample, update, check, log), the log-probabilities of the sampled tokens by micro-batches (each
distinct prompt run once where rows share it), and the checkpoint. GRPO's family (`pgcli.algo.lm_grpo`), PPO with a
value network (`pgcli.algo.lm_ppo`) and the multi-turn trainer (`pgcli.algo.lm_agent`) write their update top to
bottom (`_update`) and, where it differs, their sampling (`_sample`). The frozen reference pi_ref is built once, by
the caller (:func:`kl_reference`), and passed in.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from pgcli.algo.checkpoint import Stateful
from pgcli.algo.guard import check_update
from pgcli.algo.lm_rollout import (
    CompletionBatch,
    SamplingSettings,
    batch_prompts,
    generator_state,
    load_task_state,
    load_text_trainer,
    rollout_stats,
    sample_completions,
    save_text_trainer,
    set_generator_state,
    task_state,
    task_stats,
)
from pgcli.config import (
    FlowGRPOConfig,
    GRPOConfig,
    GSPOConfig,
    PPOLMConfig,
    REINFORCEConfig,
    ReinforcePPConfig,
    RLOOConfig,
)
from pgcli.contracts import Learner, Monitor
from pgcli.hardware import distributed, sharding
from pgcli.lm.model import CausalLM, completion_logprobs
from pgcli.lm.tasks import TextTask
from pgcli.ops.lm import micro_batches

if TYPE_CHECKING:
    from pgcli.lm.load import TextModelConfig

CriticFreeConfig = GRPOConfig | RLOOConfig | REINFORCEConfig | GSPOConfig | ReinforcePPConfig | FlowGRPOConfig
TextRLConfig = CriticFreeConfig | PPOLMConfig
"""The configs of the RL trainers of text tasks: each has a KL coefficient ``beta`` to a frozen reference."""
Cfg = TypeVar("Cfg", bound=TextRLConfig)


class TextTrainerFactory(Protocol):
    """A text trainer class, as ``pgcli.training.build`` builds it (its algorithm's row of ``pgcli.config.algos.ALGOS``
    names it for the kind ``text``, or ``multi-turn``)::

        Trainer(algo_cfg, *, task: TextTask, policy: CausalLM, reference: CausalLM | None,
                model: LMModelConfig | HFModelConfig, seed: int, device: torch.device)

    ``policy`` is on ``device``, initialised from ``init=<run>`` when given (else fresh, or the pretrained weights).
    ``reference`` is what :func:`kl_reference` gives for the config: for an RL config with a KL term, the frozen pi_ref
    (``requires_grad`` off, eval mode: a copy of the ``init`` weights or of the starting policy, or the policy with its
    LoRA adapters off with ``model=hf``), else None; for SFT and the reward model, the frozen ``init`` model or None
    (the reward model samples it for ``algo.pairs=policy``). ``model`` is the validated model config: its
    ``temperature`` and ``top_p`` are the rollouts' sampling settings (and the temperature of ``completion_logprobs``),
    its ``micro_batch`` the rows per forward/backward pass.

    A "step" is one sampled completion (SFT: one demonstration; the reward model: one pair):
    ``learn(total_steps, monitor)`` trains that many, calling ``monitor.log(step, {"train/...": ...})`` and
    ``monitor.update(step, agent=self)`` after each update; the monitor's text evaluator reads ``self.policy`` for
    ``eval/accuracy`` etc. ``save(dir)`` must write the weights with ``pgcli.lm.model.save_policy(self.policy, dir)``
    (plus optimiser/RNG state for checkpoints) so that ``pgcli eval`` and ``init=<run>`` find ``dir/policy.pt``.
    """

    def __call__(
        self,
        cfg: Any,
        *,
        task: TextTask,
        policy: CausalLM,
        reference: CausalLM | None,
        model: TextModelConfig,
        seed: int,
        device: torch.device,
    ) -> Learner: ...


def kl_reference(cfg: object, policy: CausalLM, init_reference: CausalLM | None) -> CausalLM | None:
    """The ``reference`` a text trainer of ``cfg`` is built with (:class:`TextTrainerFactory`), given the frozen
    ``init_reference`` of ``pgcli.lm.init.start_from_init``. An RL config with a KL term (``beta`` > 0): that reference
    or, without one, a frozen copy of ``policy`` as the run starts (DeepSeekMath: pi_ref is the model RL starts from);
    one with ``beta`` = 0: None (no reference pass); SFT and the reward model: ``init_reference`` as it is."""
    if not isinstance(cfg, TextRLConfig):
        return init_reference
    if not cfg.beta > 0:
        return None
    return copy.deepcopy(policy).eval().requires_grad_(False) if init_reference is None else init_reference


class TextRLTrainer(Generic[Cfg]):
    """The shared part of an RL trainer of a text task (module docstring), built as :class:`TextTrainerFactory` says.

    One iteration of ``learn``: ``_sample`` (1. G completions of each of M training prompts from the old policy, scored
    by the task), then the subclass's ``_update`` (2. advantages, 3. epochs of minibatch steps; its ``train/*``
    metrics), the divergence guard on ``checked_losses`` and the trained parameters, then the monitor.
    """

    checked_losses: ClassVar[tuple[str, ...]]
    """The update's metrics that must be finite (checked when the update ran: it logged ``train/grad_norm``)."""

    def __init__(
        self,
        cfg: Cfg,
        *,
        task: TextTask,
        policy: CausalLM,
        reference: CausalLM | None,
        model: SamplingSettings,
        seed: int,
        device: torch.device,
    ) -> None:
        if (reference is not None) != (cfg.beta > 0):
            raise ValueError(
                f"algo.beta={cfg.beta} takes {'a' if cfg.beta > 0 else 'no'} reference policy: pass "
                "kl_reference(cfg, policy, init_reference)"
            )
        self.cfg, self.task, self.device = cfg, task, device
        self.temperature, self.top_p, self.micro_batch = model.temperature, model.top_p, model.micro_batch
        self.policy = policy.to(device)
        # foreach: the per-tensor loop's arithmetic in one call (the CUDA default; on CPU fewer Python calls)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate, foreach=True)
        # pi_ref: the model the run starts from (kl_reference), None without a KL term
        self.reference = None if reference is None else reference.to(device).eval().requires_grad_(False)
        self.seed = seed  # on rank r of several processes: pgcli.hardware.distributed.rank_seed(run seed, r)
        self.prompt_rng = np.random.default_rng(seed)  # training prompts
        self.generator = torch.Generator(device=device).manual_seed(seed)  # token sampling
        self.steps = 0
        self.n_updates = 0
        self.world = distributed.world_size() if distributed.active() else 1
        self.gathered: sharding.Gathered | None = None
        """With ``hardware.shard=params``: rank 0's whole copies of the sharded policy and reference (set by the
        builder)."""

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        self._start_ranks()
        while self.steps < total_steps:
            start = time.perf_counter()
            batch, stats = self._sample()
            self.steps += self._sampled_steps(batch)
            stats |= self._update(batch)
            stats["time/update_s"] = time.perf_counter() - start
            stats["time/tokens_per_s_overall"] = batch.n_tokens / stats["time/update_s"]  # sampling + update
            stats = distributed.mean_stats(stats, self._stat_weights(batch))  # over every completion of the batch
            losses = self.checked_losses if "train/grad_norm" in stats else ()
            params = sharding.local_tensors(self._trained_parameters())
            check_update(monitor, self.steps, stats, losses, params=params)
            monitor.log(self.steps, stats)
            if self.gathered is not None:  # rank 0's monitor reads the whole model when it evaluates or saves
                self.gathered.sync(self.steps >= total_steps or monitor.due(self.steps))
            monitor.update(self.steps, agent=self)
        return self.steps

    def _start_ranks(self) -> None:
        """On several processes: rank 0's networks, optimiser state and counters on every rank (a resumed run's
        checkpoint is rank 0's), and the other ranks' generators seeded afresh where a resumed run continues."""
        if not distributed.active():
            return
        counters = {"steps": self.steps, "n_updates": self.n_updates}
        if self.gathered is not None:  # every rank built the same shards; a resumed run loads rank 0's checkpoint
            values = distributed.broadcast_state({}, counters)
            self.gathered.start(resumed=values["steps"] > 0)
        else:
            values = distributed.broadcast_state(self._modules(), counters)
        self.steps, self.n_updates = values["steps"], values["n_updates"]
        if self.steps and not distributed.is_main():
            seed = distributed.resumed_seed(self.seed, self.steps)
            self.prompt_rng = np.random.default_rng(seed)
            self.generator.manual_seed(seed)

    def _sampled_steps(self, batch: CompletionBatch) -> int:
        """The steps (completions) of the global batch this rank's ``batch`` is a share of: every rank samples an
        equal share."""
        return len(batch.rewards) * self.world

    def _stat_weights(self, batch: CompletionBatch) -> dict[str, float]:
        """The weight of this rank's value of a metric in its mean over the ranks
        (:func:`pgcli.hardware.distributed.mean_stats`), where the ranks' shares differ; none: equal shares."""
        return {}

    def _minibatch_rows(self) -> int:
        """The rows of this rank's share of a minibatch (``algo.batch_size`` over the processes)."""
        return distributed.local_size(self.cfg.batch_size, "algo.batch_size")

    def _sample(self) -> tuple[CompletionBatch, dict[str, float]]:
        """1. G completions of each of M prompts from the old policy, scored by the task; their ``rollout/*``
        metrics (on several processes, this rank's share of the M prompts)."""
        problems = self.task.sample(self.prompt_rng, distributed.local_size(self.cfg.n_groups, "algo.n_groups"))
        batch = sample_completions(
            self.task,
            self.policy,
            problems,
            group_size=self.cfg.group_size,
            temperature=self.temperature,
            top_p=self.top_p,
            generator=self.generator,
            device=self.device,
        )
        return batch, task_stats(self.task, rollout_stats(batch))

    def _update(self, batch: CompletionBatch) -> dict[str, float]:
        """2. and 3.: one update on ``batch``; its ``train/*`` metrics."""
        raise NotImplementedError

    def _step_means(self, totals: dict[str, float], n_minibatches: int) -> dict[str, float]:
        """The update's per-step metrics, ``totals`` over its ``n_minibatches`` steps, as ``train/<name>`` (no
        ``train/kl_ref`` without a reference)."""
        means = {f"train/{key}": value / n_minibatches for key, value in totals.items()}
        if self.reference is None:
            del means["train/kl_ref"]
        return means

    def _trained_parameters(self) -> Iterable[Tensor]:
        """Every parameter an update trains, for the divergence guard."""
        return self.policy.parameters()

    def _logprobs(
        self, model: CausalLM, batch: CompletionBatch, rows: Tensor, width: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Log-probabilities and entropies [B', C'] of the sampled tokens of `rows` in the first `width` columns
        (all) under `model` at the sampling temperature."""
        cols = slice(None) if width is None else slice(0, width)
        prompt_tokens, prompt_mask, prompt_index = batch_prompts(batch, rows)
        return completion_logprobs(
            model,
            prompt_tokens,
            prompt_mask,
            batch.tokens[rows, cols],
            batch.mask[rows, cols].bool(),
            temperature=self.temperature,
            prompt_index=prompt_index,
        )

    def _by_rows(self, batch: CompletionBatch, score: Callable[[Tensor], Tensor], rows: Tensor | None = None) -> Tensor:
        """`score(chunk)` [B', C] for completions `rows` [R] of `batch` (None: all), `model.micro_batch` rows at a
        time (0: all at once), concatenated: [R, C]."""
        if rows is None:
            rows = torch.arange(len(batch.rewards), device=self.device)
        return torch.cat([score(chunk) for chunk in micro_batches(rows, self.micro_batch)])

    def _batch_logprobs(self, model: CausalLM, batch: CompletionBatch, rows: Tensor | None = None) -> Tensor:
        """log pi(o_t | q, o_<t) [R, C] of the sampled tokens of completions `rows` [R] (None: all) under `model`, by
        micro-batches."""
        return self._by_rows(batch, lambda chunk: self._logprobs(model, batch, chunk)[0], rows)

    def _old_logprobs(self, batch: CompletionBatch, own: Tensor) -> Tensor:
        """log pi_old [B, C] of every sampled token by one no-grad pass over every completion but `own` [R] (those
        whose first step reads pi_old from its own forward pass: 0.0 until it does)."""
        old = torch.zeros_like(batch.mask)
        rest = torch.arange(len(batch.rewards), device=self.device)
        rest = rest[~torch.isin(rest, own)]
        if len(rest):
            old[rest] = self._batch_logprobs(self.policy, batch, rest)
        return old

    def save(self, path: Path) -> Path:
        """``model.pt`` (`_modules`: the networks and optimizers), ``policy.pt`` and ``state.json`` (completions so
        far, updates, the prompt and sampling generators, the process RNGs); see `pgcli.algo.lm_rollout`."""
        values = {
            "steps": self.steps,
            "n_updates": self.n_updates,
            "prompt_rng": self.prompt_rng.bit_generator.state,
            "generator": generator_state(self.generator),
        }
        policy, modules = self._whole_modules()
        return save_text_trainer(path, policy, modules, values | task_state(self.task))

    def load(self, path: Path) -> None:
        _, modules = self._whole_modules()
        values = load_text_trainer(path, self.device, modules)
        if self.gathered is not None:  # into every rank's shards as training starts (_start_ranks)
            loaded: dict[str, Any] = {name: obj.state_dict() for name, obj in modules.items() if obj is not None}
            self.gathered.pending = (loaded["policy"], loaded["optimizer"])
            self.gathered.pending_others = {name: loaded[name] for name in self.gathered.others}
        self.steps, self.n_updates = int(values["steps"]), int(values["n_updates"])
        self.prompt_rng.bit_generator.state = values["prompt_rng"]
        set_generator_state(self.generator, values["generator"])
        load_task_state(self.task, values)

    def _modules(self) -> dict[str, Stateful | None]:
        """The state dicts of ``model.pt``, by name."""
        return {"policy": self.policy, "optimizer": self.optimizer, "reference": self.reference}

    def _whole_modules(self) -> tuple[CausalLM, dict[str, Stateful | None]]:
        """The policy and ``model.pt``'s state dicts as one process holds them: with a sharded policy
        (``hardware.shard=params``), rank 0's whole twin and the state last gathered (:class:`WholeState`)."""
        gathered = self.gathered
        if gathered is None or gathered.twin is None:
            return self.policy, self._modules()
        modules: dict[str, Stateful | None] = dict(self._modules())
        modules["policy"] = gathered.twin
        modules["optimizer"] = WholeState(gathered.optimizer_state)
        for name in gathered.others:
            modules[name] = WholeState(gathered.states.get(name, {}))
        return gathered.twin, modules  # type: ignore[return-value]  # the policy's twin: a CausalLM

    def close(self) -> None:
        """Nothing to release: a text task holds no env."""


class WholeState:
    """A state dict gathered on rank 0 (a sharded run's optimiser or reference, :class:`pgcli.hardware.sharding.
    Gathered`) as a checkpoint saves and loads it."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state
