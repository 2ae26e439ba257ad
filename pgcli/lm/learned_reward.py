"""``env.reward=rm:<run id | run dir>``: RL on a learned reward (docs/lm.md, "RL on a learned reward").

The reward of a completion y of prompt x is a reward model's score r_phi(x, y) (``pgcli rm``,
:mod:`pgcli.lm.reward_model`) instead of the task's checker, and the trainers maximise it with their KL term to the
reference (``algo.beta``): the RLHF objective r_phi(x, y) - beta * KL(pi || pi_ref) (Ouyang et al., 2022). The checker
stays the gold: ``eval/accuracy`` and ``rollout/accuracy`` are its verdicts on the same completions, so a rising proxy
reward with a falling gold accuracy shows over-optimisation.

The reward model scores strings: the prompt and the policy's decoded completion, in the reward model's own tokenizer.
A ``model=hf`` reward model thus scores any policy (TinyGPT, or another ``model=hf`` base); a ``model=tiny_gpt`` one
knows its task's characters only, so it scores TinyGPT policies on a task with the same characters whose prompt +
completion fit its ``max_len`` (:func:`check_reward_model`).

This module receives the reward model's directory (an :class:`~pgcli.lm.init.InitSource`); the run is found as
``init=`` finds its run (:func:`pgcli.training.references.learned_reward`): a missing run, one that did not finish or
one that is not a reward model is a one-line ConfigError before anything is created. Scores are computed in batches
on the policy's device, without gradient.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pgcli.config import DatasetEnvConfig, HFModelConfig, TextEnvConfig
from pgcli.config.text import REWARD_MODEL_PREFIX
from pgcli.errors import ConfigError
from pgcli.lm.init import InitSource
from pgcli.lm.load import TextModelConfig

if TYPE_CHECKING:
    import torch

    from pgcli.lm.tasks import LearnedReward

SCORE_BATCH = 512
"""(prompt, completion) rows per forward pass of the reward model."""


def reward_model_ref(reward: Any) -> str | None:
    """The run ``env.reward`` names with ``rm:<run>``; None for the checker or a ``_target_`` function."""
    if isinstance(reward, str) and reward.startswith(REWARD_MODEL_PREFIX):
        return reward.removeprefix(REWARD_MODEL_PREFIX).strip()
    return None


def reward_option(ref: str) -> str:
    """``env.reward=rm:<ref>``: how the errors about the reward model ``ref`` name the option."""
    return f"env.reward={REWARD_MODEL_PREFIX}{ref}"


def check_reward_model(source: InitSource, env: TextEnvConfig, model: TextModelConfig, ref: str) -> None:
    """Raise a one-line ConfigError when the reward model cannot read this run's prompts and completions (module
    docstring: a ``model=tiny_gpt`` reward model reads its task's characters only)."""
    from pgcli.lm.tasks import make_puzzle

    option = reward_option(ref)
    config = source.spec.get("config", {})
    rm_model, rm_env = config.get("model", {}), config.get("env", {}).get("id")
    if "path" in rm_model:  # model=hf: its tokenizer reads any string
        return
    if isinstance(model, HFModelConfig):
        raise ConfigError(
            f"{option}: a model=tiny_gpt reward model reads only its task's characters and a model=hf "
            "policy writes any text; train the reward model with model=hf"
        )
    if isinstance(env, DatasetEnvConfig):
        _check_rows_for_reward_model(source, env, model, option)
        return
    puzzle = make_puzzle(env)
    if source.spec.get("vocab") != puzzle.chars:
        raise ConfigError(
            f"{option}: the reward model was trained on env={rm_env}, whose characters differ from "
            f"env={env.id}'s; train it on env={env.id}"
        )
    need = puzzle.max_prompt_chars + 1 + puzzle.max_answer_chars + 1  # BOS, EOS
    if need > int(rm_model.get("max_len", 0)):
        raise ConfigError(
            f"{option}: env={env.id} needs model.max_len >= {need} and the reward model has "
            f"model.max_len={rm_model.get('max_len')}; train it with model.max_len={need}"
        )


def _check_rows_for_reward_model(
    source: InitSource, env: DatasetEnvConfig, model: TextModelConfig, option: str
) -> None:
    """A ``model=tiny_gpt`` reward model reads the characters of ``env``'s rows, and their prompts plus a completion
    fit its ``max_len``."""
    from pgcli.lm.dataset_task import DatasetTask
    from pgcli.lm.load import make_text_task

    task = make_text_task(env, model)
    assert isinstance(task, DatasetTask)  # env=dataset
    known = str(source.spec.get("vocab") or "")
    outside = "".join(sorted(set(task.chars or "") - set(known)))
    if outside:
        raise ConfigError(
            f"{option}: the rows of env.path={env.path} have {len(outside)} character(s) the reward model never read "
            f"({outside[:10]!r}); train it on these rows, or with model=hf"
        )
    need = task.max_prompt_len + task.max_completion_len
    rm_len = int(source.spec.get("config", {}).get("model", {}).get("max_len", 0))
    if need > rm_len:
        raise ConfigError(
            f"{option}: the rows' prompts and completions need model.max_len >= {need} and the reward model has "
            f"model.max_len={rm_len}; train it with model.max_len={need}"
        )


def load_learned_reward(source: InitSource, device: torch.device) -> LearnedReward:
    """The reward model in ``source`` as a :class:`~pgcli.lm.tasks.LearnedReward` on ``device``: its scores of
    (prompt, completion) strings, :data:`SCORE_BATCH` rows per forward pass, without gradient."""
    from pgcli.config.saved_agent import agent_config
    from pgcli.lm.load import make_text_task
    from pgcli.lm.reward_model import load_reward_model, score_texts

    cfg = agent_config(source.spec)
    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # a text run's agent.json
    # its vocabulary: the reward model's characters (as its agent.json records them) or tokenizer; no rows are read
    rm_task = make_text_task(cfg.env, cfg.model, saved=source.spec, rows=False)
    model = load_reward_model(rm_task, cfg.model, device, source.model_dir).requires_grad_(False)
    return functools.partial(score_texts, model, rm_task.vocab, device=device, batch_size=SCORE_BATCH)
