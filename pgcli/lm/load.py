"""Build the task and the policy of a text run from its config: TinyGPT over the task's characters (``model=tiny_gpt``)
or a Hugging Face causal LM over its own tokenizer (``model=hf``, :mod:`pgcli.lm.hf`).

The task comes first because the vocabulary is the model's choice: a Hugging Face model brings its tokenizer, TinyGPT
takes the task's characters. Weights of an earlier run (``policy.pt``: ``init=``, ``pgcli eval``, the MLflow Model)
are loaded here too, so every caller gets the same policy from the same directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import CountdownToolEnvConfig, DatasetEnvConfig, HFModelConfig, LMModelConfig, TextEnvConfig

if TYPE_CHECKING:
    import torch

    from pgcli.lm.dataset_task import DatasetTask
    from pgcli.lm.model import CausalLM
    from pgcli.lm.tasks import Task, TextTask

TextModelConfig = LMModelConfig | HFModelConfig


def make_text_task(
    env: TextEnvConfig,
    model: TextModelConfig,
    *,
    seed: int = 0,
    saved: Mapping[str, Any] | None = None,
    rows: bool = True,
) -> Task | DatasetTask:
    """The task of ``env`` in the vocabulary of ``model`` (its tokenizer for ``model=hf``); a multi-turn one
    (``env=countdown_tool``) is an :class:`pgcli.lm.agent.AgentTask`, your rows (``env=dataset``) a
    :class:`pgcli.lm.dataset_task.DatasetTask` whose row order is seeded by ``seed``.

    ``saved`` is the ``agent.json`` of the model directory whose weights the task will drive (``pgcli eval``,
    ``init=``, the MLflow Model, a reward model): a dataset task takes TinyGPT's characters from it. ``rows=False``
    reads no rows (a dataset task that renders and encodes prompts only, from what ``saved`` records)."""
    from pgcli.lm.agent import CountdownCalculator
    from pgcli.lm.tasks import make_task

    vocab, max_new_tokens = None, None
    if isinstance(model, HFModelConfig):
        from pgcli.lm.hf import load_tokenizer

        # a dataset task renders its prompts itself (chat template included): the tokenizer encodes them as they are
        chat = model.chat_template and not isinstance(env, DatasetEnvConfig)
        vocab, max_new_tokens = load_tokenizer(replace(model, chat_template=chat)), model.max_new_tokens
    if isinstance(env, DatasetEnvConfig):
        from pgcli.lm.dataset_task import Recorded, make_dataset_task

        return make_dataset_task(env, model, vocab, seed=seed, recorded=Recorded.of(saved), rows=rows)
    if isinstance(env, CountdownToolEnvConfig):
        return CountdownCalculator(env, vocab, max_new_tokens)
    return make_task(env, vocab, max_new_tokens)


def make_text_policy(
    task: TextTask, model: TextModelConfig, device: torch.device, weights: Path | None = None
) -> CausalLM:
    """The policy of ``model`` on ``device``: fresh (TinyGPT) or the pretrained weights (``model=hf``), then the
    weights in ``weights/policy.pt`` when given (an earlier run's final model)."""
    from pgcli.lm.model import POLICY_FILE, TinyGPT, TinyGPTSizes, load_policy, read_policy

    if isinstance(model, HFModelConfig):
        from pgcli.lm.hf import load_hf_policy

        if weights is None:
            return load_hf_policy(model, device)
        return load_hf_policy(model, device, read_policy(weights, device), weights / POLICY_FILE)
    # TinyGPTSizes is the model config's architecture: every field but the task's vocabulary is the config's own
    architecture = {f.name: getattr(model, f.name) for f in fields(TinyGPTSizes) if f.name != "vocab_size"}
    policy = TinyGPT(TinyGPTSizes(vocab_size=task.vocab.size, **architecture)).to(device)
    return policy if weights is None else load_policy(policy, weights)
