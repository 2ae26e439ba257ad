"""Schemas of language-model training on generated text tasks (docs/algorithms/lm.md): the algorithms that train on
text only (``algo=sft|rloo|reinforce|gspo|reinforce_pp|ppo_lm``), the tasks (``env=addition|sort|countdown``) and the
TinyGPT model (``model=tiny_gpt``).

Pure value rules only: whether a task's prompts fit ``model.max_len`` and whether ``env.reward`` names a function (or a
finished reward-model run) are decided after composition, by :mod:`pgcli.training.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from pgcli.config.rules import (
    MAX_EPOCHS,
    MAX_N_ENVS,
    MAX_SEED,
    MAX_WIDTH,
    _at_most,
    _choice,
    _finite_fields,
    _gamma,
    _lambda,
    _learning_rate,
    _positive,
    _unit_open,
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


KL_ESTIMATORS = ("k1", "k2", "k3")
"""Values of ``algo.kl_estimator`` (``pgcli.ops.grpo.KL_ESTIMATORS``)."""


def _clipped_lm_rules(algo: Any, min_group: int) -> None:
    """Rules shared by the clipped policy-gradient configs of text envs (RLOO, REINFORCE, GSPO, REINFORCE++, PPO with
    a value head)."""
    _finite_fields(algo, "algo")
    require(algo.group_size >= min_group, "algo.group_size", algo.group_size, f">= {min_group}",
             "completions sampled per prompt")  # fmt: skip
    _at_most("algo.group_size", algo.group_size, MAX_N_ENVS, "typical: 8")
    require(algo.n_groups >= 1, "algo.n_groups", algo.n_groups, ">= 1")
    _at_most("algo.n_groups", algo.n_groups, MAX_N_ENVS, "typical: 16")
    _unit_open("algo.epsilon", algo.epsilon, "typical: 0.2")
    if algo.epsilon_high is not None:
        _positive("algo.epsilon_high", algo.epsilon_high, "DAPO recommends 0.28")
    _choice("algo.loss_agg", algo.loss_agg, ("seq_mean", "token_mean", "constant"))
    require(algo.n_iterations >= 1, "algo.n_iterations", algo.n_iterations, ">= 1")
    _at_most("algo.n_iterations", algo.n_iterations, MAX_EPOCHS, "typical: 1 to 4")
    n_completions = algo.group_size * algo.n_groups
    require(1 <= algo.batch_size <= n_completions, "algo.batch_size", algo.batch_size,
             f"in [1, group_size * n_groups = {n_completions}]", "it counts completions per minibatch")  # fmt: skip
    _learning_rate("algo.learning_rate", algo.learning_rate, "typical: 3e-5")
    _positive("algo.max_grad_norm", algo.max_grad_norm)
    require(algo.beta >= 0, "algo.beta", algo.beta, ">= 0", "0 disables the KL term")
    require(algo.ent_coef >= 0, "algo.ent_coef", algo.ent_coef, ">= 0")


@dataclass
class RLOOConfig:
    """REINFORCE leave-one-out (Ahmadian et al., 2024; TRL's RLOOTrainer): the sequence KL to the reference is folded
    into each completion's reward, whose baseline is the mean shaped reward of the other G - 1 completions of its
    prompt; PPO-clip token loss with no KL term, text envs only."""

    name: ClassVar[str] = "rloo"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2: the baseline leaves one out)."""
    n_groups: int = 16
    """M: prompts per update; a batch is M * G completions."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same task reward out of the update (only the KL tells them apart)."""
    epsilon: float = 0.2
    """Lower clip: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (DAPO clip-higher, 0.28; None: epsilon)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (per-completion mean, then mean), 'token_mean' (DAPO) or 'constant' (Dr. GRPO)."""
    n_iterations: int = 1
    """mu: epochs of policy updates over each batch."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    beta: float = 0.04
    """Reward R - beta * sum_t log(pi_old / pi_ref) over the completion (0: no KL, no reference forward pass)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baselines)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=2)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


@dataclass
class REINFORCEConfig:
    """REINFORCE with a batch-mean baseline (Williams, 1992): A = R - mean of the batch's rewards; the same
    clipped token loss and k3 KL as GRPO, text envs only."""

    name: ClassVar[str] = "reinforce"

    group_size: int = 8
    """G: completions sampled per prompt (the baseline is the batch mean, so 1 works too)."""
    n_groups: int = 16
    """M: prompts per update; a batch is M * G completions."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same reward out of the update."""
    epsilon: float = 0.2
    """Lower clip: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (None: epsilon)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (per-completion mean, then mean), 'token_mean' (DAPO) or 'constant' (Dr. GRPO)."""
    n_iterations: int = 1
    """mu: epochs of policy updates over each batch (1 with one minibatch: the plain REINFORCE gradient)."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    beta: float = 0.04
    """KL-penalty coefficient to the reference (SFT) policy (0: disabled, no reference forward pass)."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' or 'k3' (Schulman, 2020)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baseline)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


@dataclass
class GSPOConfig:
    """Group Sequence Policy Optimization (Zheng et al., 2025): GRPO's group-normalised advantages with one
    length-normalised importance ratio per completion, clipped at the sequence level; text envs only."""

    name: ClassVar[str] = "gspo"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2: the advantage is relative to the group)."""
    n_groups: int = 16
    """M: prompts per update; a batch is M * G completions."""
    scale_rewards: str = "group"
    """'group' (divide by group std), 'batch' (batch std) or 'none' (centre only)."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same reward out of the update (their advantages are 0)."""
    epsilon: float = 3e-4
    """Lower clip of the sequence ratio: s >= 1 - epsilon (the paper: 3e-4)."""
    epsilon_high: float | None = 4e-4
    """Upper clip of the sequence ratio: s <= 1 + epsilon_high (the paper: 4e-4; None: epsilon)."""
    loss_agg: str = "seq_mean"
    """'seq_mean' (the paper: mean over completions), 'token_mean' or 'constant'."""
    n_iterations: int = 1
    """mu: epochs of policy updates over each batch."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    beta: float = 0.04
    """KL-penalty coefficient to the reference (SFT) policy (0, the paper's objective: no reference forward pass)."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' or 'k3' (Schulman, 2020)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baselines)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=2)
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


@dataclass
class ReinforcePPConfig:
    """REINFORCE++ (Hu et al., 2025): the per-token k1 KL to the reference folded into the token rewards, advantages
    the return-to-go whitened over the batch's tokens (with ``baseline: group`` the group mean reward subtracted
    first: REINFORCE++-baseline), PPO-clip token loss; text envs only."""

    name: ClassVar[str] = "reinforce_pp"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2 with baseline=group)."""
    n_groups: int = 16
    """M: prompts per update; a batch is M * G completions."""
    baseline: str = "none"
    """'none' (REINFORCE++) or 'group' (REINFORCE++-baseline: R - mean reward of the prompt's group)."""
    gamma: float = 1.0
    """Discount of the token returns (1.0: the paper's undiscounted sum)."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same reward out of the update."""
    epsilon: float = 0.2
    """Lower clip: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (None: epsilon)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (per-completion mean, then mean), 'token_mean' or 'constant'."""
    n_iterations: int = 1
    """mu: epochs of policy updates over each batch."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    beta: float = 0.04
    """Token reward -beta * log(pi_old / pi_ref), plus the task reward on the last token (0: no reference pass)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the whitening)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _choice("algo.baseline", self.baseline, ("none", "group"))
        require(self.baseline == "none" or self.group_size >= 2, "algo.group_size", self.group_size,
                 ">= 2 with algo.baseline=group", "a group of one is its own baseline")  # fmt: skip
        _gamma("algo.gamma", self.gamma)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


@dataclass
class PPOLMConfig:
    """PPO with a value head for language models (Ouyang et al., 2022): per-token reward -beta * log(pi / pi_ref)
    plus the task score on the last token, token-level GAE, clipped policy and value losses; text envs only."""

    name: ClassVar[str] = "ppo_lm"

    group_size: int = 8
    """Completions sampled per prompt (PPO needs no group; 8 matches GRPO's sample count per prompt)."""
    n_groups: int = 16
    """Prompts per update; a batch is n_groups * group_size completions."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same score out of the update."""
    epsilon: float = 0.2
    """Lower clip: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (None: epsilon)."""
    loss_agg: str = "token_mean"
    """Aggregation of the policy loss: 'seq_mean', 'token_mean' or 'constant'."""
    n_iterations: int = 1
    """Epochs of minibatch updates over each batch."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size of the policy."""
    vf_learning_rate: float = 1e-4
    """Adam step size of the value network (a copy of the initial policy's trunk with a scalar head)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (policy and value network each)."""
    beta: float = 0.04
    """KL-penalty coefficient inside the per-token reward (0: the score alone)."""
    gamma: float = 1.0
    """Discount over the tokens of a completion."""
    gae_lambda: float = 0.95
    """GAE lambda over the tokens."""
    clip_range_vf: float | None = 0.2
    """Clip the new value to old value +- this (None: unclipped value loss)."""
    normalize_advantage: bool = True
    """Standardise the token advantages over the batch (TRL's whitening)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _learning_rate("algo.vf_learning_rate", self.vf_learning_rate, "typical: 3e-4")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        if self.clip_range_vf is not None:
            _positive("algo.clip_range_vf", self.clip_range_vf, "typical: 0.2; null turns value clipping off")

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env; SB3's PPO is algo=ppo)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


TEXT_RL_ALGOS: tuple[Any, ...] = (RLOOConfig, REINFORCEConfig, GSPOConfig, ReinforcePPConfig, PPOLMConfig)
"""The language-model RL algorithms that train on text tasks only (docs/algorithms/lm.md)."""

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
        require(self.id == self.name, "env.id", self.id, f"'{self.name}' for env={self.name}",
                 "choose the task with env=addition|sort|countdown")  # fmt: skip
        require(self.n_eval >= 1, "env.n_eval", self.n_eval, ">= 1")
        require(0 <= self.eval_seed <= MAX_SEED, "env.eval_seed", self.eval_seed, f"in [0, {MAX_SEED}]")
        named = isinstance(self.reward, str) and self.reward.startswith(REWARD_MODEL_PREFIX) and self.reward[3:].strip()
        require(isinstance(self.reward, Mapping) or bool(named), "env.reward", self.reward,
                "rm:<run id | run dir> or {_target_: module.function, ...}", "rm: names a pgcli rm run")  # fmt: skip
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


TEXT_ENV_CONFIGS: dict[str, type] = {c.name: c for c in (AdditionEnvConfig, SortEnvConfig, CountdownEnvConfig)}


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
        require(self.d_model % self.n_heads == 0, "model.d_model", self.d_model,
                 f"divisible by model.n_heads={self.n_heads}")  # fmt: skip
        _positive("model.init_std", self.init_std, "typical: 0.02")
        _positive("model.temperature", self.temperature, "typical: 1.0")
        _at_most("model.temperature", self.temperature, 10.0, "typical: 1.0")
        require(0 < self.top_p <= 1, "model.top_p", self.top_p, "in (0, 1]", "1.0 samples the whole distribution")
        require(self.micro_batch >= 0, "model.micro_batch", self.micro_batch, ">= 0", "0: the whole minibatch")
