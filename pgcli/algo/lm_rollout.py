"""The shared core of the language-model trainers (docs/algorithms/lm.md): sample G completions per prompt, score them,
and save or restore a text trainer's state.

`sample_completions` is the text counterpart of `pgcli.algo.rollout`: M training prompts from the task, each
repeated G times, one batched key/value-cache generation (`pgcli.lm.model.generate`) with the sampling settings, the
task's reward per completion (with `env.reward=rm:<run>` a reward model's score, the checker's verdict kept beside it
as `correct`: docs/lm.md, "RL on a learned reward"). Row b of the batch answers prompt b // G (its group). A "step"
of a text run is one sampled completion, so every algorithm compares at the same number of sampled completions.

A text trainer's checkpoint directory holds ``model.pt`` (its networks and optimizers as state dicts, as every
trainer of ours), ``policy.pt`` (the policy alone, what ``init=<run>`` and ``pgcli eval`` load) and ``state.json``
(counters, the prompt and sampling generators, the process RNGs, and a task's own state where it has one: a dataset
task's row order, `task_state`); written atomically (`pgcli.algo.checkpoint`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from pgcli.algo.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    STATE_FORMAT,
    Stateful,
    atomic_dir,
    load_state_dicts,
    read_file,
    rng_state,
    set_rng_state,
)
from pgcli.errors import PgcliError
from pgcli.lm.model import CausalLM, save_policy
from pgcli.lm.tasks import Problem, TextTask, decode_completions, generate_for_task


class SamplingSettings(Protocol):
    """Where a text trainer reads its sampling settings and micro-batch size (``pgcli.config.LMModelConfig``,
    ``HFModelConfig``)."""

    temperature: float
    top_p: float
    micro_batch: int


class CompletionBatch(NamedTuple):
    """B = M * G sampled completions of M prompts; row b answers prompt b // G."""

    prompt_tokens: Tensor
    """[B, P] long, left-padded prompts (BOS first)."""
    prompt_mask: Tensor
    """[B, P] bool, True on real prompt tokens."""
    tokens: Tensor
    """[B, C] long sampled tokens, PAD after EOS."""
    mask: Tensor
    """[B, C] float prefix mask: 1.0 on sampled tokens up to and including EOS."""
    rewards: Tensor
    """[B] float task reward of each completion (the reward being optimised: a reward model's score with
    ``env.reward=rm:``)."""
    correct: Tensor
    """[B] bool: the completion is correct (exact match / verified): the gold checker, whatever the reward."""
    group_ids: Tensor
    """[B] long, 0..M-1."""
    sample_seconds: float
    """Wall time of the sampling phase: prompt encoding, the batched generation, decoding and scoring."""
    trajectory: Tensor | None = None
    """[B] long, on a multi-turn task: the trajectory (0..T-1) each row, a turn, belongs to; its reward and group are
    the trajectory's. None: each row is a whole completion."""
    reward_parts: Mapping[str, Tensor] = MappingProxyType({})
    """Each term of a reward of several (``TextTask.score``): [B] float unweighted values by name; empty for one."""
    logprobs: Tensor | None = None
    """[B, C] log pi_old of the sampled tokens as the sampler computed them, where that is the forward pass's function
    (``CausalLM.sampler_logprobs``); else None."""
    prompt_ids: Tensor | None = None
    """[B] long: rows with the same id have the same prompt (`sample_completions`: the group), so a forward pass may
    run it once (`batch_prompts`). None: no prompt is known to be shared."""

    @property
    def n_tokens(self) -> int:
        """Generated tokens (EOS included)."""
        return int(self.mask.sum())


@torch.no_grad()
def sample_completions(
    task: TextTask,
    policy: CausalLM,
    problems: list[Problem],
    *,
    group_size: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    device: torch.device,
) -> CompletionBatch:
    """Sample `group_size` completions of each of `problems` with the policy and score them with the task.

    Args:
        task: the text task (vocabulary, lengths, reward, checker).
        policy: the sampling policy (put in eval mode for the generation, restored after).
        problems: the M prompts of this batch.
        group_size: G completions per prompt.
        temperature: sampling temperature (> 0 for RL: greedy completions of one prompt are identical).
        top_p: nucleus mass.
        generator: the sampling RNG, on `device`.
        device: where the tensors live.

    Returns:
        `CompletionBatch`.
    """
    start = time.perf_counter()
    repeated = [p for p in problems for _ in range(group_size)]  # row b answers problem b // G
    training = policy.training
    policy.eval()
    prompt_tokens, prompt_mask, out = generate_for_task(
        task, policy, repeated, device, temperature=temperature, top_p=top_p, generator=generator
    )
    policy.train(training)
    texts = decode_completions(task.vocab, out.tokens)  # synchronises with the device
    rewards, parts = task.score(repeated, texts)  # env.reward=rm:<run>: the reward model's scores, one batched pass
    correct = [task.correct(p, text) for p, text in zip(repeated, texts, strict=True)]
    seconds = time.perf_counter() - start
    group_ids = torch.arange(len(problems), device=device).repeat_interleave(group_size)
    return CompletionBatch(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        tokens=out.tokens,
        mask=out.mask.float(),
        rewards=torch.tensor(rewards, dtype=torch.float32, device=device),
        correct=torch.tensor(correct, dtype=torch.bool, device=device),
        group_ids=group_ids,
        sample_seconds=seconds,
        reward_parts={name: torch.tensor(v, dtype=torch.float32, device=device) for name, v in parts.items()},
        logprobs=out.logprobs if policy.sampler_logprobs else None,
        prompt_ids=group_ids,
    )


def batch_prompts(batch: CompletionBatch, rows: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """The prompts of completions `rows` [B'] of `batch`, as `pgcli.lm.model.completion_logprobs` takes them: with
    shared prompts (`CompletionBatch.prompt_ids`) the U distinct ones [U, P], their mask and each row's index among
    them [B']; else the rows' own [B', P], their mask and None."""
    if batch.prompt_ids is None:
        return batch.prompt_tokens[rows], batch.prompt_mask[rows], None
    ids, index = torch.unique(batch.prompt_ids[rows], return_inverse=True)
    holder = rows.new_empty(len(ids)).scatter_(0, index, rows)  # a row of each distinct prompt (all alike)
    return batch.prompt_tokens[holder], batch.prompt_mask[holder], index


def rollout_stats(batch: CompletionBatch) -> dict[str, float]:
    """The sampled batch's `rollout/*` metrics and `time/tokens_per_s`: generated tokens per second of the sampling
    phase (encoding, generation, decoding, scoring; benchmarks/lm_grpo.py compares it with a bare generation loop),
    and with a reward of several terms each term's mean as `rollout/reward/<name>`."""
    return {
        "rollout/reward_mean": float(batch.rewards.mean()),
        "rollout/accuracy": float(batch.correct.float().mean()),
        "rollout/completion_len": float(batch.mask.sum(1).mean()),
        "time/tokens_per_s": batch.n_tokens / max(batch.sample_seconds, 1e-9),
    } | {f"rollout/reward/{name}": float(values.mean()) for name, values in batch.reward_parts.items()}


def generator_state(generator: torch.Generator) -> list[int]:
    """A torch generator's state as plain ints (JSON)."""
    return generator.get_state().tolist()


def set_generator_state(generator: torch.Generator, state: list[int]) -> None:
    generator.set_state(torch.tensor(state, dtype=torch.uint8))


TASK_STATE = "task"
"""The key of a task's own state (:func:`task_state`) among a text trainer's saved values."""


def task_state(task: object) -> dict[str, Any]:
    """``{"task": state}`` for a task that keeps a state of its own (``state_dict``: a dataset task's row order), to
    save with a trainer's values; nothing for a puzzle (its problems are drawn from the trainer's generator)."""
    state = getattr(task, "state_dict", None)
    return {} if state is None else {TASK_STATE: state()}


def load_task_state(task: object, values: Mapping[str, Any]) -> None:
    """Restore what :func:`task_state` saved into ``task`` (a checkpoint without it leaves the task as it is)."""
    load = getattr(task, "load_state_dict", None)
    if load is not None and values.get(TASK_STATE) is not None:
        load(values[TASK_STATE])


def task_stats(task: object, stats: dict[str, float]) -> dict[str, float]:
    """``stats`` with the task's own metrics (``data/epoch`` and ``data/rows_seen`` of a dataset task) and, for a task
    without a verifier (``has_checker`` false), no ``rollout/accuracy``: there is none to report."""
    own = getattr(task, "data_stats", None)
    stats = stats | ({} if own is None else own())
    if not getattr(task, "has_checker", True):
        stats.pop("rollout/accuracy", None)
    return stats


def save_text_trainer(
    path: Path, policy: CausalLM, modules: Mapping[str, Stateful | None], values: Mapping[str, Any]
) -> Path:
    """Atomically write ``model.pt`` (``modules`` as state dicts), ``policy.pt`` and ``state.json`` (``values`` and
    the process RNGs) into ``path``; returns ``path``."""
    payload = {name: None if obj is None else obj.state_dict() for name, obj in modules.items()}
    with atomic_dir(path) as tmp:
        torch.save(payload, tmp / MODEL_FILE)
        save_policy(policy, tmp)
        state = {"format": STATE_FORMAT, "trainer": dict(values), "rng": rng_state()}
        (tmp / STATE_FILE).write_text(json.dumps(state))
    return path


def load_text_trainer(path: Path, device: torch.device, modules: Mapping[str, Stateful | None]) -> dict[str, Any]:
    """Load :func:`save_text_trainer`'s directory into ``modules`` and the process RNGs; returns the saved values."""
    load_state_dicts(path, device, modules, detail_line=-1)
    state = read_file(path / STATE_FILE, lambda f: json.loads(f.read_text()))
    try:
        set_rng_state(state["rng"])
        return dict(state["trainer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PgcliError(
            f"checkpoint file {path / STATE_FILE} does not fit this run ({type(exc).__name__}: {exc})"
        ) from exc
