"""Schemas of language-model training on generated text tasks (docs/lm.md): supervised fine-tuning (``algo=sft``), the
tasks (``env=addition|sort|countdown``, and the multi-turn ``env=countdown_tool``) and the TinyGPT model
(``model=tiny_gpt``). The RL algorithms that train on text only are :mod:`pgcli.config.lm_algos`.

Pure value rules only: whether a task's prompts fit ``model.max_len`` and whether ``env.reward`` names a function (or a
finished reward-model run) are decided after composition, by :mod:`pgcli.training.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from pgcli.config.rules import (
    MAX_SEED,
    MAX_WIDTH,
    _at_most,
    _finite_fields,
    _learning_rate,
    _positive,
    require,
)

# --------------------------------------------------------------------------------------------------------------------
# algo: language-model fine-tuning on text envs (docs/algorithms/lm.md)
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class SFTConfig:
    """Supervised fine-tuning on a text task's demonstrations: the warm start of RL runs (``pgcli sft``, docs/lm.md)."""

    name: ClassVar[str] = "sft"

    learning_rate: float = 1e-3
    """AdamW step size (constant after a linear warm-up of warmup_steps demonstrations)."""
    warmup_steps: int = 2000
    """Demonstrations over which the learning rate rises linearly from 0."""
    batch_size: int = 64
    """Demonstrations per gradient step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 1e-3")
        require(self.warmup_steps >= 0, "algo.warmup_steps", self.warmup_steps, ">= 0")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _at_most("algo.batch_size", self.batch_size, 65536, "typical: 64")
        require(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: SFT runs on text tasks only."""

    def check_text_env(self) -> None:
        """Every SFT option applies to a text task."""


# --------------------------------------------------------------------------------------------------------------------
# env: text tasks (docs/lm.md)
# --------------------------------------------------------------------------------------------------------------------


REWARD_MODEL_PREFIX = "rm:"
"""``env.reward=rm:<run>``: a reward model's score is the reward (docs/lm.md, "RL on a learned reward")."""


@dataclass
class TextEnvConfig:
    """A generated text task (docs/lm.md): character prompts, a verifiable reward and a fixed held-out set."""

    name: ClassVar[str] = "text"

    id: str = MISSING
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_eval: int = 256
    """Held-out problems (never sampled for training) scored at each evaluation."""
    eval_seed: int = 1234
    """Seed of the held-out set: the same set for every run, whatever its seed."""
    reward: Any = field(default_factory=dict)
    """{_target_: module.fn, **kwargs}: fn(problem, completion) -> float replaces the 0/1 checker; rm:<run id or run
    dir>: a reward model's score (pgcli rm; docs/lm.md, "RL on a learned reward"); {}: the checker."""
    format_reward: float = 0.0
    """Added to the reward when the completion is well formed (a number; digits; a parsable expression)."""
    eval_pass_k: int = 8
    """k of eval/pass@k: a held-out problem passes when one of k sampled completions is correct."""
    eval_samples: int = 16
    """Held-out completions written to the samples table (samples/step_<n>.json) at each evaluation."""

    def __post_init__(self) -> None:
        _finite_fields(self, "env")
        require(
            self.id == self.name,
            "env.id",
            self.id,
            f"'{self.name}' for env={self.name}",
            "choose the task with env=addition|sort|countdown|countdown_tool|dataset",
        )
        require(self.n_eval >= 1, "env.n_eval", self.n_eval, ">= 1")
        require(0 <= self.eval_seed <= MAX_SEED, "env.eval_seed", self.eval_seed, f"in [0, {MAX_SEED}]")
        named = isinstance(self.reward, str) and self.reward.startswith(REWARD_MODEL_PREFIX) and self.reward[3:].strip()
        require(
            isinstance(self.reward, Mapping) or bool(named),
            "env.reward",
            self.reward,
            "rm:<run id | run dir> or {_target_: module.function, ...}",
            "rm: names a pgcli rm run",
        )
        require(self.format_reward >= 0, "env.format_reward", self.format_reward, ">= 0", "0 turns it off")
        require(1 <= self.eval_pass_k <= 256, "env.eval_pass_k", self.eval_pass_k, "in [1, 256]", "typical: 8")
        require(self.eval_samples >= 0, "env.eval_samples", self.eval_samples, ">= 0", "0 writes no samples table")


@dataclass
class AdditionEnvConfig(TextEnvConfig):
    """n-digit addition: 'a+b=' -> a + b, operands uniform in [0, 10**n_digits)."""

    name: ClassVar[str] = "addition"

    id: str = "addition"
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_digits: int = 4
    """Digits of each operand (at most)."""

    def __post_init__(self) -> None:
        require(1 <= self.n_digits <= 12, "env.n_digits", self.n_digits, "in [1, 12]", "typical: 4")
        super().__post_init__()


@dataclass
class SortEnvConfig(TextEnvConfig):
    """Sort a digit string: '3912=' -> '1239'."""

    name: ClassVar[str] = "sort"

    id: str = "sort"
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_digits: int = 6
    """Length of the digit string."""

    def __post_init__(self) -> None:
        require(2 <= self.n_digits <= 24, "env.n_digits", self.n_digits, "in [2, 24]", "typical: 6")
        super().__post_init__()


@dataclass
class CountdownEnvConfig(TextEnvConfig):
    """Countdown: reach the target with the given numbers (each at most once) and + - * ('3,5,7>22=' -> '3*5+7')."""

    name: ClassVar[str] = "countdown"

    id: str = "countdown"
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_numbers: int = 3
    """Numbers given per problem (the reference solution uses them all)."""
    max_number: int = 9
    """Numbers are drawn from 1..max_number."""
    max_target: int = 100
    """Targets lie in 0..max_target."""

    def __post_init__(self) -> None:
        require(2 <= self.n_numbers <= 6, "env.n_numbers", self.n_numbers, "in [2, 6]", "typical: 3")
        require(2 <= self.max_number <= 999, "env.max_number", self.max_number, "in [2, 999]", "typical: 9")
        require(1 <= self.max_target <= 10**6, "env.max_target", self.max_target, "in [1, 1e6]", "typical: 100")
        super().__post_init__()


@dataclass
class CountdownToolEnvConfig(TextEnvConfig):
    """Countdown over turns with a calculator (docs/lm.md, "Multi-turn agents"): each turn the policy writes one
    operation on two of the numbers left ('3*5'), the environment replaces them by the result and shows the new state
    ('7,15>22='); solved when a result is the target within max_turns turns."""

    name: ClassVar[str] = "countdown_tool"

    id: str = "countdown_tool"
    """The task; labels the run as a gymnasium id does."""
    n_numbers: int = 3
    """Numbers given per problem (the reference solution uses them all)."""
    max_number: int = 9
    """Numbers are drawn from 1..max_number."""
    max_target: int = 100
    """Targets lie in 0..max_target."""
    max_turns: int = 4
    """Turns (operations, valid or not) before the episode ends unsolved; n_numbers - 1 valid ones can use them all."""

    def __post_init__(self) -> None:
        require(2 <= self.n_numbers <= 6, "env.n_numbers", self.n_numbers, "in [2, 6]", "typical: 3")
        require(2 <= self.max_number <= 99, "env.max_number", self.max_number, "in [2, 99]", "typical: 9")
        require(1 <= self.max_target <= 10**6, "env.max_target", self.max_target, "in [1, 1e6]", "typical: 100")
        require(
            self.n_numbers - 1 <= self.max_turns <= 32,
            "env.max_turns",
            self.max_turns,
            f"in [n_numbers - 1 = {self.n_numbers - 1}, 32]",
            "each turn is one operation",
        )
        require(
            isinstance(self.reward, Mapping) and not self.reward,
            "env.reward",
            self.reward,
            "{} on a multi-turn task",
            "its reward is the final verdict: solved or not",
        )
        require(
            self.format_reward == 0,
            "env.format_reward",
            self.format_reward,
            "0 on a multi-turn task",
            "tool errors are counted, not rewarded",
        )
        super().__post_init__()


DATASET_REWARDS = ("exact", "math", "choice")
"""The built-in verifiers of ``env=dataset`` (``pgcli.lm.verifiers``)."""


@dataclass
class DatasetEnvConfig(TextEnvConfig):
    """Your own rows (docs/lm.md, "Your data"): prompts with answers for RL, prompt/completion or message rows for
    SFT, chosen/rejected pairs for a reward model; read through the ``datasets`` library (memory-mapped Arrow)."""

    name: ClassVar[str] = "dataset"

    id: str = "dataset"
    """The task: dataset (your rows); labels the run as a gymnasium id does."""
    path: str = MISSING
    """A .jsonl, .json, .csv or .parquet file, a directory written by datasets' save_to_disk, or a hub dataset id
    already in the local cache (nothing is downloaded)."""
    split: str = "train"
    """The split to train on (a file has one split: train)."""
    prompt_key: str = "prompt"
    """The prompt column: a string, or a list of {role, content} messages rendered with the model's chat template."""
    answer_key: str = "answer"
    """The reference answer column (what reward=exact|math|choice and eval/accuracy check against)."""
    completion_key: str = "completion"
    """pgcli sft: the demonstration column beside the prompt."""
    messages_key: str = "messages"
    """pgcli sft: a conversation column (a list of {role, content}); the loss is on the assistant turns only."""
    chosen_key: str = "chosen"
    """pgcli rm: the preferred response (or whole conversation) of a preference row."""
    rejected_key: str = "rejected"
    """pgcli rm: the other response of a preference row."""
    system_prompt: str | None = None
    """A system message put before every prompt (rendered with the chat template)."""
    eval_path: str | None = None
    """Held-out rows from a second file or directory (never trained on)."""
    eval_split: str | None = None
    """Held-out rows from another split of env.path (e.g. test)."""
    eval_size: int = 256
    """Without eval_path or eval_split: this many rows taken out of the training rows by a split seeded with
    env.eval_seed, never trained on."""
    # null, not {}: Hydra merges a list or a mapping from the command line onto null, never a list onto a mapping
    reward: Any = None
    """A verifier of env.answer_key (exact, math or choice), rm:<run>, {_target_: module.fn, **kwargs} with
    fn(prompt, completion, **columns) -> float, or a list of them with weights; null: exact (docs/lm.md, "Rewards and
    verifiers for your data")."""
    format_pattern: str | None = None
    """A regular expression the whole completion must match to earn env.format_reward (e.g.
    '<think>.*</think>\\s*<answer>.*</answer>'); logged apart as rollout/reward/format."""
    shuffle: bool = True
    """Visit the training rows in a seeded random order, reshuffled each epoch (false: file order)."""

    def __post_init__(self) -> None:
        self._check_dataset()
        reward, self.reward = self.reward, {}  # the base class knows only {} and rm:
        try:
            super().__post_init__()
        finally:
            self.reward = reward

    def _check_dataset(self) -> None:
        require(
            isinstance(self.path, str) and bool(self.path.strip()),
            "env.path",
            self.path,
            "a file, a directory or a cached hub dataset id",
            "e.g. env.path=data/train.jsonl",
        )
        require(bool(self.split), "env.split", self.split, "a split name", "a file has one split: train")
        for key in ("prompt_key", "answer_key", "completion_key", "messages_key", "chosen_key", "rejected_key"):
            value = getattr(self, key)
            require(isinstance(value, str) and bool(value), f"env.{key}", value, "a column name")
        require(
            self.eval_path is None or self.eval_split is None,
            "env.eval_split",
            self.eval_split,
            "unset when env.eval_path is set",
            "the held-out rows come from one place",
        )
        require(self.eval_size >= 1, "env.eval_size", self.eval_size, ">= 1", "rows held out of training")
        rewards = (
            self.reward if isinstance(self.reward, list | tuple) or _is_list_config(self.reward) else [self.reward]
        )
        for entry in rewards:
            ok = (
                entry is None
                or isinstance(entry, Mapping)
                or (isinstance(entry, str) and (entry in DATASET_REWARDS or entry.startswith(REWARD_MODEL_PREFIX)))
            )
            require(
                ok,
                "env.reward",
                entry,
                f"{'|'.join(DATASET_REWARDS)}, rm:<run>, {{_target_: module.function, ...}} or a list of them",
                'docs/lm.md, "Rewards and verifiers for your data"',
            )


def _is_list_config(value: Any) -> bool:
    """An OmegaConf list (a typed config holds env.reward: [...] as one)."""
    return type(value).__name__ == "ListConfig"


TEXT_ENV_CONFIGS: dict[str, type] = {
    c.name: c for c in (AdditionEnvConfig, SortEnvConfig, CountdownEnvConfig, CountdownToolEnvConfig, DatasetEnvConfig)
}
AGENT_ENV_CONFIGS: tuple[type, ...] = (CountdownToolEnvConfig,)
"""Multi-turn text tasks: the policy acts over turns and the environment answers (``pgcli.lm.agent``)."""


@dataclass
class LMModelConfig:
    """TinyGPT: a small pre-LN causal transformer over characters (docs/lm.md), and how the policy samples."""

    name: ClassVar[str] = "tiny_gpt"

    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads per block (d_model must divide by it)."""
    d_model: int = 128
    """Width of the residual stream (and of the tied token embedding)."""
    d_ff: int = 512
    """Hidden width of each block's MLP."""
    max_len: int = 32
    """Positions the model has: prompt + completion tokens must fit."""
    init_std: float = 0.02
    """Standard deviation of the initial weights (GPT-2)."""
    temperature: float = 1.0
    """Sampling temperature of RL rollouts and of their log-probabilities (greedy decoding scores eval/accuracy)."""
    top_p: float = 1.0
    """Nucleus sampling mass of RL rollouts and eval/pass@k (1.0: the whole distribution)."""
    micro_batch: int = 0
    """Completions (SFT: demonstrations) per forward/backward pass inside a minibatch, gradients accumulated before
    the optimizer step; 0: the whole minibatch at once."""

    def __post_init__(self) -> None:
        _finite_fields(self, "model")
        for key in ("n_layers", "n_heads", "d_model", "d_ff", "max_len"):
            value = getattr(self, key)
            require(1 <= value <= MAX_WIDTH, f"model.{key}", value, f"in [1, {MAX_WIDTH}]")
        require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            self.d_model,
            f"divisible by model.n_heads={self.n_heads}",
        )
        _positive("model.init_std", self.init_std, "typical: 0.02")
        _positive("model.temperature", self.temperature, "typical: 1.0")
        _at_most("model.temperature", self.temperature, 10.0, "typical: 1.0")
        require(0 < self.top_p <= 1, "model.top_p", self.top_p, "in (0, 1]", "1.0 samples the whole distribution")
        require(self.micro_batch >= 0, "model.micro_batch", self.micro_batch, ">= 0", "0: the whole minibatch")
