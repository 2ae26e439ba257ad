"""Build the task and the policy of a text run from its config: TinyGPT over the task's characters (``model=tiny_gpt``)
or a Hugging Face causal LM over its own tokenizer (``model=hf``, :mod:`pgcli.lm.hf`).

The task comes first because the vocabulary is the model's choice: a Hugging Face model brings its tokenizer, TinyGPT
takes the task's characters. Weights of an earlier run (``policy.pt``: ``init=``, ``pgcli eval``, the MLflow Model)
are loaded here too, so every caller gets the same policy from the same directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pgcli.config import CountdownToolEnvConfig, HFModelConfig, LMModelConfig, TextEnvConfig

if TYPE_CHECKING:
    import torch

    from pgcli.lm.model import CausalLM
    from pgcli.lm.tasks import Task, TextTask

TextModelConfig = LMModelConfig | HFModelConfig


def make_text_task(env: TextEnvConfig, model: TextModelConfig) -> Task:
    """The task of ``env`` in the vocabulary of ``model`` (its tokenizer for ``model=hf``); a multi-turn one
    (``env=countdown_tool``) is an :class:`pgcli.lm.agent.AgentTask`."""
    from pgcli.lm.agent import CountdownCalculator
    from pgcli.lm.tasks import make_task

    vocab, max_new_tokens = None, None
    if isinstance(model, HFModelConfig):
        from pgcli.lm.hf import load_tokenizer

        vocab, max_new_tokens = load_tokenizer(model), model.max_new_tokens
    if isinstance(env, CountdownToolEnvConfig):
        return CountdownCalculator(env, vocab, max_new_tokens)
    return make_task(env, vocab, max_new_tokens)


def make_text_policy(
    task: TextTask, model: TextModelConfig, device: torch.device, weights: Path | None = None
) -> CausalLM:
    """The policy of ``model`` on ``device``: fresh (TinyGPT) or the pretrained weights (``model=hf``), then the
    weights in ``weights/policy.pt`` when given (an earlier run's final model)."""
    from pgcli.lm.model import TinyGPT, TinyGPTSizes, load_policy, read_policy

    if isinstance(model, HFModelConfig):
        from pgcli.lm.hf import load_hf_policy

        return load_hf_policy(model, device, None if weights is None else read_policy(weights, device))
    sizes = TinyGPTSizes(
        vocab_size=task.vocab.size,
        max_len=model.max_len,
        n_layers=model.n_layers,
        n_heads=model.n_heads,
        d_model=model.d_model,
        d_ff=model.d_ff,
        init_std=model.init_std,
    )
    policy = TinyGPT(sizes).to(device)
    return policy if weights is None else load_policy(policy, weights)
