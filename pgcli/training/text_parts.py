"""What every rank of a text run builds alike from its config: the task, the policy (from ``init`` when given) and the
tags they add (:func:`text_parts`); ``pgcli.training.build`` builds the run around them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgcli.config import SFTConfig, TextEnvConfig, TrainConfig
from pgcli.hardware import distributed
from pgcli.lm.init import start_from_init
from pgcli.lm.load import TextModelConfig

if TYPE_CHECKING:
    import torch

    from pgcli.lm.model import CausalLM


@dataclass
class TextParts:
    """What every rank of a text run builds alike (:func:`text_parts`)."""

    task: Any
    """The run's task (the evaluator's)."""
    trainer_task: Any
    """What the trainer trains on (a multi-turn task's turns for SFT)."""
    vocab: Any
    """The characters recorded with the model (TinyGPT's), where there are."""
    policy: CausalLM
    reference: CausalLM | None
    """The frozen ``init`` model (None without ``init``)."""
    tags: dict[str, str]
    multi_turn: bool


def text_parts(cfg: TrainConfig, device: torch.device) -> TextParts:
    """The task, the TinyGPT or Hugging Face policy (from ``init`` when given, which is also the frozen reference) and
    what their tags say; on several processes each rank's task rows come in the order of its own seed."""
    from pgcli.lm.agent import AgentTask
    from pgcli.lm.dataset_rows import on_rows, supervised_rows
    from pgcli.lm.dataset_task import recorded_vocab
    from pgcli.lm.init import source_chars
    from pgcli.lm.load import make_text_task
    from pgcli.training.references import init_source, learned_reward

    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # TrainConfig's rules
    source = init_source(cfg)
    task: Any
    if on_rows(cfg.env, cfg.algo):  # pgcli sft|rm env=dataset: rows, not an RL task (pgcli.lm.dataset_rows)
        task = supervised_rows(cfg.env, cfg.model, cfg.algo, recorded=None if source is None else source_chars(source))
        if distributed.is_main():
            print(f"pgcli: note: {task.describe()}", file=sys.stderr, flush=True)
    else:
        # a dataset task in TinyGPT's characters takes the init model's (its ids); its rows come in the run's seeded
        # order
        seed = distributed.rank_seed(cfg.seed, distributed.rank())
        task = make_text_task(cfg.env, cfg.model, seed=seed, saved=None if source is None else source.spec)
    # TinyGPT's characters when they are the rows' (env=dataset), recorded with the model
    vocab = getattr(task.vocab, "chars", "") if on_rows(cfg.env, cfg.algo) else recorded_vocab(task)
    reward_model, reward_tags = learned_reward(cfg.env, cfg.model, cfg.tracking, device)  # env.reward=rm:<run>
    if reward_model is not None:
        task = task.with_learned_reward(reward_model)
    policy, reference, init_tags = start_from_init(cfg, task, device, source)
    multi_turn = isinstance(task, AgentTask)
    trainer_task = task.turn_task() if isinstance(task, AgentTask) and isinstance(cfg.algo, SFTConfig) else task
    return TextParts(task, trainer_task, vocab, policy, reference, init_tags | reward_tags, multi_turn)
