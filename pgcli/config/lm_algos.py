"""Schemas of the language-model RL algorithms that train on text tasks only (docs/algorithms/lm.md):
``algo=rloo|reinforce|gspo|reinforce_pp|ppo_lm`` and, on a multi-turn task, ``algo=flow_grpo``. (GRPO's schema is
shared with control tasks: :mod:`pgcli.config.control`.) Pure value rules, as every schema.

The seven clipped policy-gradient schemas (these six and GRPO's) extend :class:`ClippedPolicyOptions`, the options they
share with their defaults and docs, and keep only what differs; :func:`clipped_schema` keeps each one's field order."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pgcli.config.rules import (
    MAX_EPOCHS,
    MAX_N_ENVS,
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

T = TypeVar("T")

KL_ESTIMATORS = ("k1", "k2", "k3")
"""Values of ``algo.kl_estimator`` (``pgcli.ops.grpo.KL_ESTIMATORS``)."""


class ClippedPolicyOptions:
    """The options every clipped policy-gradient schema of text tasks shares (GRPO's, RLOO's, REINFORCE's, GSPO's,
    REINFORCE++'s, PPO with a value head's, Flow-GRPO's): the text defaults and one-line docs, which a schema
    redeclares where its own differ. Not a dataclass itself: :func:`clipped_schema` makes each schema one, with these
    fields placed among its own."""

    group_size: int = 8
    """G: completions sampled per prompt."""
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
    """mu: epochs of policy updates over each batch."""
    batch_size: int = 64
    """Completions per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-5
    """Adam step size."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    beta: float = 0.04
    """KL-penalty coefficient to the reference (SFT) policy (0: disabled, no reference forward pass)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env)."""

    def check_text_env(self) -> None:
        """Rules for a text env: none beyond the field rules."""


SHARED_OPTIONS = tuple(ClippedPolicyOptions.__annotations__)
"""The shared fields, in the order every schema keeps them."""


def clipped_schema(**after: str) -> Callable[[type[T]], type[T]]:
    """Make a :class:`ClippedPolicyOptions` schema a dataclass whose fields are in the order users see them (``pgcli
    train --help``, ``--cfg job``, docs/configuration.md): the shared fields in their order, each of the class's own
    fields right after the field ``after`` names for it (its own fields in class-body order: a chain may name an own
    field placed before it), the others at the end."""

    def build(cls: type[T]) -> type[T]:
        body: dict[str, Any] = inspect.get_annotations(cls)
        order = list(SHARED_OPTIONS)
        for name, kind in body.items():
            if name in order or "ClassVar" in str(kind):
                continue
            if name in after:
                order.insert(order.index(after.pop(name)) + 1, name)
            else:
                order.append(name)
        if after:
            raise TypeError(f"{cls.__name__}: after= names no field of its own: {sorted(after)}")
        shared = ClippedPolicyOptions.__annotations__
        class_vars = {name: kind for name, kind in body.items() if "ClassVar" in str(kind)}
        cls.__annotations__ = class_vars | {name: body.get(name, shared.get(name)) for name in order}
        return dataclass(cls)  # defaults a schema leaves out: the class attributes of ClippedPolicyOptions

    return build


def _clipped_lm_rules(algo: Any, min_group: int, *, turns: bool = False) -> None:
    """Rules shared by the clipped policy-gradient configs of text envs (RLOO, REINFORCE, GSPO, REINFORCE++, PPO with
    a value head, Flow-GRPO); ``turns``: a multi-turn trainer's, whose groups are trajectories and whose minibatches
    count turns (any number of them)."""
    _finite_fields(algo, "algo")
    sampled = "trajectories sampled per question" if turns else "completions sampled per prompt"
    require(algo.group_size >= min_group, "algo.group_size", algo.group_size, f">= {min_group}", sampled)
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
    if turns:
        require(algo.batch_size >= 1, "algo.batch_size", algo.batch_size, ">= 1", "it counts turns per minibatch")
    else:
        require(
            1 <= algo.batch_size <= n_completions,
            "algo.batch_size",
            algo.batch_size,
            f"in [1, group_size * n_groups = {n_completions}]",
            "it counts completions per minibatch",
        )
    _learning_rate("algo.learning_rate", algo.learning_rate, "typical: 3e-5")
    _positive("algo.max_grad_norm", algo.max_grad_norm)
    require(algo.beta >= 0, "algo.beta", algo.beta, ">= 0", "0 disables the KL term")
    require(algo.ent_coef >= 0, "algo.ent_coef", algo.ent_coef, ">= 0")


@clipped_schema()
class RLOOConfig(ClippedPolicyOptions):
    """REINFORCE leave-one-out (Ahmadian et al., 2024; TRL's RLOOTrainer): the sequence KL to the reference is folded
    into each completion's reward, whose baseline is the mean shaped reward of the other G - 1 completions of its
    prompt; PPO-clip token loss with no KL term, text envs only."""

    name: ClassVar[str] = "rloo"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2: the baseline leaves one out)."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same task reward out of the update (only the KL tells them apart)."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (DAPO clip-higher, 0.28; None: epsilon)."""
    beta: float = 0.04
    """Reward R - beta * sum_t log(pi_old / pi_ref) over the completion (0: no KL, no reference forward pass)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baselines)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=2)


@clipped_schema(kl_estimator="beta")
class REINFORCEConfig(ClippedPolicyOptions):
    """REINFORCE with a batch-mean baseline (Williams, 1992): A = R - mean of the batch's rewards; the same
    clipped token loss and k3 KL as GRPO, text envs only."""

    name: ClassVar[str] = "reinforce"

    group_size: int = 8
    """G: completions sampled per prompt (the baseline is the batch mean, so 1 works too)."""
    n_iterations: int = 1
    """mu: epochs of policy updates over each batch (1 with one minibatch: the plain REINFORCE gradient)."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' or 'k3' (Schulman, 2020)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baseline)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)


@clipped_schema(scale_rewards="n_groups", kl_estimator="beta")
class GSPOConfig(ClippedPolicyOptions):
    """Group Sequence Policy Optimization (Zheng et al., 2025): GRPO's group-normalised advantages with one
    length-normalised importance ratio per completion, clipped at the sequence level; text envs only."""

    name: ClassVar[str] = "gspo"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2: the advantage is relative to the group)."""
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
    beta: float = 0.04
    """KL-penalty coefficient to the reference (SFT) policy (0, the paper's objective: no reference forward pass)."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' or 'k3' (Schulman, 2020)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the baselines)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=2)
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)


@clipped_schema(baseline="n_groups", gamma="baseline")
class ReinforcePPConfig(ClippedPolicyOptions):
    """REINFORCE++ (Hu et al., 2025): the per-token k1 KL to the reference folded into the token rewards, advantages
    the return-to-go whitened over the batch's tokens (with ``baseline: group`` the group mean reward subtracted
    first: REINFORCE++-baseline), PPO-clip token loss; text envs only."""

    name: ClassVar[str] = "reinforce_pp"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2 with baseline=group)."""
    baseline: str = "none"
    """'none' (REINFORCE++) or 'group' (REINFORCE++-baseline: R - mean reward of the prompt's group)."""
    gamma: float = 1.0
    """Discount of the token returns (1.0: the paper's undiscounted sum)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (per-completion mean, then mean), 'token_mean' or 'constant'."""
    beta: float = 0.04
    """Token reward -beta * log(pi_old / pi_ref), plus the task reward on the last token (0: no reference pass)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (they still count in the whitening)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _choice("algo.baseline", self.baseline, ("none", "group"))
        require(
            self.baseline == "none" or self.group_size >= 2,
            "algo.group_size",
            self.group_size,
            ">= 2 with algo.baseline=group",
            "a group of one is its own baseline",
        )
        _gamma("algo.gamma", self.gamma)


@clipped_schema(
    vf_learning_rate="learning_rate",
    gamma="beta",
    gae_lambda="gamma",
    clip_range_vf="gae_lambda",
    normalize_advantage="clip_range_vf",
)
class PPOLMConfig(ClippedPolicyOptions):
    """PPO with a value head for language models (Ouyang et al., 2022): per-token reward -beta * log(pi / pi_ref)
    plus the task score on the last token, token-level GAE, clipped policy and value losses; text envs only."""

    name: ClassVar[str] = "ppo_lm"

    group_size: int = 8
    """Completions sampled per prompt (PPO needs no group; 8 matches GRPO's sample count per prompt)."""
    n_groups: int = 16
    """Prompts per update; a batch is n_groups * group_size completions."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same score out of the update."""
    loss_agg: str = "token_mean"
    """Aggregation of the policy loss: 'seq_mean', 'token_mean' or 'constant'."""
    n_iterations: int = 1
    """Epochs of minibatch updates over each batch."""
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

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)
        _learning_rate("algo.vf_learning_rate", self.vf_learning_rate, "typical: 3e-4")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        if self.clip_range_vf is not None:
            _positive("algo.clip_range_vf", self.clip_range_vf, "typical: 0.2; null turns value clipping off")

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: text tasks only (TrainConfig refuses a gymnasium env; SB3's PPO is algo=ppo)."""


@clipped_schema(scale_rewards="n_groups", kl_estimator="beta")
class FlowGRPOConfig(ClippedPolicyOptions):
    """Flow-GRPO (AgentFlow; Li et al., 2025) on a multi-turn text task: every turn of each of the G trajectories of a
    question is one sample carrying the trajectory's final reward, advantages normalised over all the turns of the
    question's group, then GRPO's clipped token loss and KL term (docs/algorithms/lm.md, "Multi-turn agents")."""

    name: ClassVar[str] = "flow_grpo"

    group_size: int = 8
    """G: trajectories sampled per question (>= 2: the advantage is relative to the group)."""
    n_groups: int = 16
    """M: questions per update; a batch is the turns of M * G trajectories."""
    scale_rewards: str = "group"
    """'group' (divide by the std over the group's turns), 'batch' (over the batch's turns) or 'none' (centre only)."""
    drop_degenerate_groups: bool = False
    """Leave questions whose trajectories all got the same reward out of the update (their advantages are 0)."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (DAPO clip-higher: 0.28; None: epsilon)."""
    loss_agg: str = "token_mean"
    """'token_mean' (every action token weighs the same), 'seq_mean' (each turn's mean, then the mean over turns) or
    'constant'."""
    batch_size: int = 64
    """Turns per minibatch."""
    beta: float = 0.04
    """KL term to the reference (SFT) policy in the loss (AgentFlow: 0.001); 0 = off and no reference forward pass."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' or 'k3' (Schulman, 2020)."""
    mask_truncated_completions: bool = False
    """Leave turns cut at the token limit without EOS out of the loss (they still count in the baselines)."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=2, turns=True)
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)

    def check_text_env(self) -> None:
        """Rules for a text env: that it is a multi-turn one is TrainConfig's rule."""
