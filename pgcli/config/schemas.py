"""Typed configuration schemas: one dataclass per config-group option.

The YAML files under ``conf/`` only set values; these dataclasses define the keys, their types and the rules a value
must follow. Each is registered in Hydra's ConfigStore under ``schema/<group>/<option>`` and extended by its YAML file,
so a typo'd key or a wrong type fails at composition. Range and cross-field rules live in ``__post_init__`` and run
once, when :func:`to_train_config` turns the composed ``DictConfig`` into these objects.

This module must stay light (no torch, SB3 or MLflow imports): ``pgcli --help`` and config validation use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from omegaconf import MISSING

from pgcli.errors import ConfigError

ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "leaky_relu")
SCHEDULES = ("constant", "linear")
# Sane bounds (issue 10): values past these are typos (1e300, an extra zero) that would otherwise run for ever, exhaust
# memory or diverge at once; each error names the bound and a typical value.
MAX_LEARNING_RATE = 1.0
MAX_TOTAL_STEPS = 10**12
MAX_N_ENVS = 1024
MAX_ROLLOUT = 10**7
"""n_steps * n_envs: one rollout of more steps than this does not fit in memory with its tensors."""
MAX_EPOCHS = 1000
MAX_WIDTH = 16384
MAX_SEED = 2**32 - 1
"""numpy's legacy seeding (SB3, np.random.seed) takes seeds below 2**32."""
MAX_CG_RESIDUAL_TOL = 1e-6


def _require(ok: bool, key: str, value: object, rule: str, hint: str = "") -> None:
    """Raise a one-line :class:`ConfigError` naming the key, the value and the rule when ``ok`` is false."""
    if not ok:
        raise ConfigError(f"{key} must be {rule} (got {value!r})" + (f"; {hint}" if hint else ""))


def _positive(key: str, value: float, hint: str = "") -> None:
    _require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key, value, "> 0", hint)


def _finite_fields(obj: Any, prefix: str) -> None:
    """Reject nan and inf in every float field of ``obj``: nan fails every comparison and inf passes ``>= 0``, so
    range rules alone let them through to the optimiser (issue 10)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}.{f.name} must be a finite number (got {value})")


def _learning_rate(key: str, value: float, hint: str) -> None:
    _positive(key, value, hint)
    _require(
        value <= MAX_LEARNING_RATE, key, value, f"<= {MAX_LEARNING_RATE:g}", f"a step size above 1 diverges; {hint}"
    )


def _at_most(key: str, value: float, bound: float, hint: str = "") -> None:
    _require(value <= bound, key, value, f"<= {bound:g}", hint)


def _trust_region(key: str, value: float) -> None:
    """A mean-KL radius: > 0, and at most 1 nat (past that the "trust region" no longer restrains the step)."""
    _positive(key, value, "typical: 0.01")
    _at_most(key, value, 1.0, "a KL radius above 1 nat no longer restrains the policy step; typical: 0.01")


def _sde_sample_freq(value: int) -> None:
    _require(value >= -1, "algo.sde_sample_freq", value, ">= -1", "-1 or 0: sample the gSDE noise once per rollout")


def _rollout_rules(
    algo: Any,
    n_envs: int,
    *,
    minibatch: bool = True,
    needs_two_samples: bool = False,
    sub_sampling: tuple[str, int] | None = None,
) -> None:
    """Cross-group rules on the rollout ``algo.n_steps * env.n_envs`` (called from :class:`TrainConfig`).

    Args:
        algo: an algo config with ``n_steps`` (and ``batch_size`` when ``minibatch``).
        n_envs: ``env.n_envs``.
        minibatch: whether ``algo.batch_size`` counts samples of the rollout (it must then fit in it).
        needs_two_samples: SB3 standardises advantages over the rollout and asserts ``n_steps * n_envs > 1``.
        sub_sampling: (key, k) of a Fisher sub-sampling factor: every k-th sample of a shorter rollout is one sample.
    """
    rollout = algo.n_steps * n_envs
    size = f"algo.n_steps * env.n_envs = {algo.n_steps} * {n_envs} = {rollout}"
    hint = "a rollout this large does not fit in memory; typical: 2048 * 8"
    _require(rollout <= MAX_ROLLOUT, "algo.n_steps * env.n_envs", rollout, f"<= {MAX_ROLLOUT:g}", hint)
    if needs_two_samples:
        hint = "one sample has no standard deviation (SB3 asserts this); raise algo.n_steps or env.n_envs"
        _require(rollout > 1, "algo.n_steps * env.n_envs", rollout, "> 1 with algo.normalize_advantage=true", hint)
    if minibatch:
        hint = "a minibatch cannot be larger than the rollout; lower algo.batch_size or raise algo.n_steps"
        _require(algo.batch_size <= rollout, "algo.batch_size", algo.batch_size, f"<= {size}", hint)
    if sub_sampling is not None:
        key, k = sub_sampling
        _require(k <= rollout, key, k, f"<= {size}", "every k-th sample of a shorter rollout is a single sample")


def _unit_open(key: str, value: float, hint: str = "") -> None:
    _require(0 < value < 1, key, value, "in (0, 1)", hint)


def _gamma(key: str, value: float) -> None:
    _require(0 < value <= 1, key, value, "in (0, 1]", "typical: 0.99")


def _lambda(key: str, value: float) -> None:
    _require(0 <= value <= 1, key, value, "in [0, 1]", "typical: 0.95")


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    _require(value in options, key, value, f"one of {', '.join(options)}")


# --------------------------------------------------------------------------------------------------------------------
# algo: SB3-backed baselines
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class PPOConfig:
    """Stable-Baselines3 PPO (Schulman et al., 2017), clipped surrogate objective."""

    name: ClassVar[str] = "ppo"

    learning_rate: float = 3e-4
    """Adam step size (initial value when lr_schedule=linear)."""
    lr_schedule: str = "constant"
    """'constant' or 'linear' (decay to 0 over training, rl-baselines3-zoo's lin_X)."""
    n_steps: int = 2048
    """Environment steps per env per rollout."""
    batch_size: int = 64
    """Minibatch size for the gradient epochs."""
    n_epochs: int = 10
    """Passes over each rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """Clipping epsilon of the probability ratio."""
    clip_range_schedule: str = "constant"
    """'constant' or 'linear' decay of clip_range."""
    normalize_advantage: bool = True
    """Standardise advantages per minibatch."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value-loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Early-stop the epochs when approx KL exceeds this (None: never)."""
    use_sde: bool = False
    """Generalised state-dependent exploration (continuous actions only)."""
    sde_sample_freq: int = -1
    """Resample the gSDE noise every n steps (-1: once per rollout)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        if self.normalize_advantage:  # SB3 asserts it (DLR-RM/stable-baselines3#440): a minibatch of 1 has no std
            _require(self.batch_size > 1, "algo.batch_size", self.batch_size, "> 1 with algo.normalize_advantage=true",
                     "a one-sample minibatch has no standard deviation")  # fmt: skip
        _require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _at_most("algo.n_epochs", self.n_epochs, MAX_EPOCHS, "typical: 10")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _unit_open("algo.clip_range", self.clip_range, "typical: 0.2")
        _choice("algo.clip_range_schedule", self.clip_range_schedule, SCHEDULES)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        if self.target_kl is not None:
            _positive("algo.target_kl", self.target_kl)
        _sde_sample_freq(self.sde_sample_freq)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs`` (the rollout is n_steps * n_envs samples)."""
        _rollout_rules(self, n_envs, needs_two_samples=self.normalize_advantage)


@dataclass
class A2CConfig:
    """Stable-Baselines3 A2C (Mnih et al., 2016), synchronous advantage actor-critic."""

    name: ClassVar[str] = "a2c"

    learning_rate: float = 7e-4
    """Optimizer step size (initial value when lr_schedule=linear)."""
    lr_schedule: str = "constant"
    """'constant' or 'linear'."""
    n_steps: int = 5
    """Environment steps per env per update."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0: plain n-step returns, SB3's default)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value-loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    use_rms_prop: bool = True
    """RMSprop (as in the A2C paper) instead of Adam."""
    rms_prop_eps: float = 1e-5
    """RMSprop epsilon."""
    normalize_advantage: bool = False
    """Standardise advantages per update."""
    use_sde: bool = False
    """Generalised state-dependent exploration (continuous actions only)."""
    sde_sample_freq: int = -1
    """Resample the gSDE noise every n steps (-1: once per rollout)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 7e-4")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _positive("algo.rms_prop_eps", self.rms_prop_eps)
        _sde_sample_freq(self.sde_sample_freq)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: A2C standardises advantages over the whole rollout."""
        _rollout_rules(self, n_envs, minibatch=False, needs_two_samples=self.normalize_advantage)


@dataclass
class SB3TRPOConfig:
    """sb3-contrib TRPO: the reference implementation our own TRPO is measured against."""

    name: ClassVar[str] = "sb3_trpo"

    learning_rate: float = 1e-3
    """Adam step size of the value function."""
    n_steps: int = 2048
    """Environment steps per env per update."""
    batch_size: int = 128
    """Minibatch size of the critic updates."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    cg_max_steps: int = 15
    """Conjugate-gradient iterations."""
    cg_damping: float = 0.1
    """Damping added to the Fisher-vector product."""
    line_search_shrinking_factor: float = 0.8
    """Backtracking coefficient."""
    line_search_max_iter: int = 10
    """Maximum backtracking steps."""
    n_critic_updates: int = 10
    """Critic epochs per update."""
    normalize_advantage: bool = True
    """Standardise advantages."""
    target_kl: float = 0.01
    """Trust-region radius (mean KL)."""
    sub_sampling_factor: int = 1
    """Use every k-th sample for the Fisher-vector products."""
    use_sde: bool = False
    """Generalised state-dependent exploration (continuous actions only)."""
    sde_sample_freq: int = -1
    """Resample the gSDE noise every n steps (-1: once per rollout)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 1e-3")
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _require(self.cg_max_steps >= 1, "algo.cg_max_steps", self.cg_max_steps, ">= 1")
        _at_most("algo.cg_max_steps", self.cg_max_steps, MAX_EPOCHS, "typical: 15")
        _require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0")
        _unit_open("algo.line_search_shrinking_factor", self.line_search_shrinking_factor)
        _require(self.line_search_max_iter >= 1, "algo.line_search_max_iter", self.line_search_max_iter, ">= 1")
        _at_most("algo.line_search_max_iter", self.line_search_max_iter, MAX_EPOCHS, "typical: 10")
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        _trust_region("algo.target_kl", self.target_kl)
        _require(self.sub_sampling_factor >= 1, "algo.sub_sampling_factor", self.sub_sampling_factor, ">= 1")
        _sde_sample_freq(self.sde_sample_freq)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs`` (sb3-contrib asserts a rollout of more than one sample)."""
        _rollout_rules(
            self, n_envs, needs_two_samples=True, sub_sampling=("algo.sub_sampling_factor", self.sub_sampling_factor)
        )


# --------------------------------------------------------------------------------------------------------------------
# algo: our own PyTorch trainers (pgcli/algo/<name>.py)
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TRPOConfig:
    """Trust Region Policy Optimization (Schulman et al., 2015): natural gradient + KL line search."""

    name: ClassVar[str] = "trpo"

    n_steps: int = 2048
    """Environment steps per env per update."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    normalize_advantage: bool = True
    """Standardise advantages over the batch."""
    target_kl: float = 0.01
    """Trust-region radius delta: maximum mean KL(old || new) per update (initial value when scheduled)."""
    target_kl_schedule: str = "constant"
    """'constant' or 'linear' (delta shrinks linearly from target_kl to target_kl_final over total_steps)."""
    target_kl_final: float = 0.001
    """Trust-region radius at the end of training with target_kl_schedule=linear."""
    cg_iters: int = 15
    """Conjugate-gradient iterations for the natural-gradient direction."""
    cg_residual_tol: float = 1e-10
    """Stop CG early when the squared residual falls below this."""
    cg_damping: float = 0.1
    """Damping added to the Fisher-vector product (F + damping * I)."""
    fvp_sub_sampling: int = 1
    """Compute Fisher-vector products on every k-th sample (openai/baselines uses 5)."""
    backtrack_coeff: float = 0.8
    """Line-search step shrink factor."""
    backtrack_iters: int = 10
    """Maximum line-search backtracking steps."""
    npg: bool = False
    """Natural policy gradient: take the trust-region step without the line search."""
    vf_learning_rate: float = 1e-3
    """Adam step size of the value network (initial value when vf_lr_schedule=linear)."""
    vf_lr_schedule: str = "constant"
    """'constant' or 'linear' (the critic's step size decays to 0 over total_steps)."""
    critic_process: bool = False
    """Fit the value network in a second process while the policy step runs (same numbers; CPU, >= 2 CPUs only)."""
    n_critic_updates: int = 10
    """Epochs of value-network minibatch updates per batch."""
    batch_size: int = 128
    """Minibatch size of the value-network updates."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _trust_region("algo.target_kl", self.target_kl)
        _choice("algo.target_kl_schedule", self.target_kl_schedule, SCHEDULES)
        _trust_region("algo.target_kl_final", self.target_kl_final)
        _require(self.cg_iters >= 1, "algo.cg_iters", self.cg_iters, ">= 1")
        _at_most("algo.cg_iters", self.cg_iters, MAX_EPOCHS, "typical: 15")
        # CG stops before its first iteration when the squared gradient norm (~1e-2 on CartPole) is below the
        # tolerance: the direction is zero, the line search finds no improvement, and every update silently keeps
        # the old policy (measured: line_search_success 0 on every update at 1.0; issue 10).
        _require(0 <= self.cg_residual_tol <= MAX_CG_RESIDUAL_TOL, "algo.cg_residual_tol", self.cg_residual_tol,
                 f"in [0, {MAX_CG_RESIDUAL_TOL:g}]", "a larger tolerance can stop CG before its first step, making "
                 "every update a no-op; typical: 1e-10")  # fmt: skip
        _require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0", "typical: 0.1")
        _require(self.fvp_sub_sampling >= 1, "algo.fvp_sub_sampling", self.fvp_sub_sampling, ">= 1")
        _unit_open("algo.backtrack_coeff", self.backtrack_coeff, "typical: 0.8")
        _require(self.backtrack_iters >= 1, "algo.backtrack_iters", self.backtrack_iters, ">= 1")
        _at_most("algo.backtrack_iters", self.backtrack_iters, MAX_EPOCHS, "typical: 10")
        _learning_rate("algo.vf_learning_rate", self.vf_learning_rate, "typical: 1e-3")
        _choice("algo.vf_lr_schedule", self.vf_lr_schedule, SCHEDULES)
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: the critic's minibatches and the Fisher sub-sampling."""
        _rollout_rules(self, n_envs, sub_sampling=("algo.fvp_sub_sampling", self.fvp_sub_sampling))


@dataclass
class VPGConfig:
    """Vanilla policy gradient (REINFORCE with a learned baseline; Williams, 1992)."""

    name: ClassVar[str] = "vpg"

    n_steps: int = 2048
    """Environment steps per env per update."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.97
    """GAE lambda of the advantages; 1.0 is the reward-to-go minus the baseline, G_t - V(s_t) (plain REINFORCE)."""
    normalize_advantage: bool = True
    """Standardise advantages over the batch."""
    learning_rate: float = 3e-4
    """Adam step size of the policy (one step per batch)."""
    vf_learning_rate: float = 1e-3
    """Adam step size of the value network."""
    n_critic_updates: int = 10
    """Epochs of value-network minibatch updates per batch."""
    batch_size: int = 128
    """Minibatch size of the value-network updates."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip of the policy step."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _learning_rate("algo.vf_learning_rate", self.vf_learning_rate, "typical: 1e-3")
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: the critic's minibatches."""
        _rollout_rules(self, n_envs)


@dataclass
class PPOKLConfig:
    """PPO-Penalty (Schulman et al., 2017, section 4): surrogate minus an adaptive KL penalty beta * KL."""

    name: ClassVar[str] = "ppo_kl"

    learning_rate: float = 3e-4
    """Adam step size."""
    n_steps: int = 2048
    """Environment steps per env per update."""
    batch_size: int = 64
    """Minibatch size."""
    n_epochs: int = 10
    """Passes over each batch."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    normalize_advantage: bool = True
    """Standardise advantages over the batch."""
    kl_target: float = 0.01
    """d_target of the adaptive rule: beta halves below d/1.5 and doubles above 1.5 d."""
    beta_init: float = 1.0
    """Initial KL-penalty coefficient."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value-loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _at_most("algo.n_epochs", self.n_epochs, MAX_EPOCHS, "typical: 10")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _trust_region("algo.kl_target", self.kl_target)
        _positive("algo.beta_init", self.beta_init)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: the minibatches."""
        _rollout_rules(self, n_envs)


@dataclass
class GRPOConfig:
    """Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath) for control tasks: no critic.

    A group is G episodes from one initial state (the same reset seed); one update uses M groups. See
    docs/algorithms/grpo.md for the objective as implemented and how it differs from the LLM original.
    """

    name: ClassVar[str] = "grpo"

    group_size: int = 8
    """G: episodes per group; the members of a group start from the same initial state (TRL num_generations)."""
    n_groups: int = 4
    """M: groups (initial states) per update; a batch is M * G complete episodes."""
    advantage: str = "outcome"
    """'outcome' (episode return), 'process' (per-step rewards) or 'step_baseline' (return-to-go vs group mean)."""
    scale_rewards: str = "group"
    """'group' (divide by group std), 'batch' (batch std) or 'none' (Dr. GRPO: centre only)."""
    drop_degenerate_groups: bool = False
    """Leave groups whose advantages are all zero out of the update (DAPO dynamic sampling, without resampling)."""
    gamma: float = 1.0
    """Discount of the returns behind the advantages (1.0: GRPO's undiscounted episode score)."""
    epsilon: float = 0.2
    """Lower clip: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (DAPO clip-higher, 0.28; None: epsilon)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (GRPO: per-episode mean, then mean), 'token_mean' (DAPO) or 'constant' (Dr. GRPO)."""
    n_iterations: int = 4
    """mu: epochs of policy updates over each batch (1 with one minibatch: plain on-policy gradient)."""
    batch_size: int = 8
    """Episodes per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-4
    """Adam step size."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    beta: float = 0.0
    """k3 KL-penalty coefficient to the reference policy (0: disabled, no reference forward pass)."""
    ref_update_interval: int = 0
    """Copy the current policy into the reference every n updates (0: keep the initial policy)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _require(self.group_size >= 2, "algo.group_size", self.group_size, ">= 2",
                 "a group needs at least 2 episodes to normalise within")  # fmt: skip
        _at_most("algo.group_size", self.group_size, MAX_N_ENVS * 4, "typical: 8 (TRL num_generations)")
        _require(self.n_groups >= 1, "algo.n_groups", self.n_groups, ">= 1")
        _at_most("algo.n_groups", self.n_groups, MAX_N_ENVS * 4, "typical: 4")
        _choice("algo.advantage", self.advantage, ("outcome", "process", "step_baseline"))
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _gamma("algo.gamma", self.gamma)
        _unit_open("algo.epsilon", self.epsilon, "typical: 0.2")
        if self.epsilon_high is not None:
            _positive("algo.epsilon_high", self.epsilon_high, "DAPO recommends 0.28")
        _choice("algo.loss_agg", self.loss_agg, ("seq_mean", "token_mean", "constant"))
        _require(self.n_iterations >= 1, "algo.n_iterations", self.n_iterations, ">= 1")
        _at_most("algo.n_iterations", self.n_iterations, MAX_EPOCHS, "typical: 4")
        n_episodes = self.group_size * self.n_groups
        _require(1 <= self.batch_size <= n_episodes, "algo.batch_size", self.batch_size,
                 f"in [1, group_size * n_groups = {n_episodes}]", "it counts episodes per minibatch")  # fmt: skip
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _require(self.beta >= 0, "algo.beta", self.beta, ">= 0", "0 disables the KL penalty")
        _require(self.ref_update_interval >= 0, "algo.ref_update_interval", self.ref_update_interval, ">= 0")
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: none (a batch is whole episodes, collected n_envs at a time)."""

    def check_text_env(self) -> None:
        """Rules for a text env (issue 12): a completion is one episode with one outcome reward."""
        if self.advantage != "outcome":
            raise ConfigError(
                f"algo.advantage={self.advantage} needs per-step rewards of a control task; a text task scores a "
                "whole completion once: use algo.advantage=outcome"
            )


@dataclass
class SFTConfig:
    """Supervised fine-tuning on a text task's demonstrations: the warm start of RL runs (``pgcli sft``, issue 12)."""

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
        _require(self.warmup_steps >= 0, "algo.warmup_steps", self.warmup_steps, ">= 0")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _at_most("algo.batch_size", self.batch_size, 65536, "typical: 64")
        _require(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: SFT runs on text tasks only."""

    def check_text_env(self) -> None:
        """Every SFT option applies to a text task."""


# --------------------------------------------------------------------------------------------------------------------
# algo: language-model fine-tuning on text envs (issue 12; docs/algorithms/lm.md)
# --------------------------------------------------------------------------------------------------------------------


def _clipped_lm_rules(algo: Any, min_group: int) -> None:
    """Rules shared by the clipped policy-gradient configs of text envs (RLOO, REINFORCE, PPO with a value head)."""
    _finite_fields(algo, "algo")
    _require(algo.group_size >= min_group, "algo.group_size", algo.group_size, f">= {min_group}",
             "completions sampled per prompt")  # fmt: skip
    _at_most("algo.group_size", algo.group_size, MAX_N_ENVS, "typical: 8")
    _require(algo.n_groups >= 1, "algo.n_groups", algo.n_groups, ">= 1")
    _at_most("algo.n_groups", algo.n_groups, MAX_N_ENVS, "typical: 16")
    _unit_open("algo.epsilon", algo.epsilon, "typical: 0.2")
    if algo.epsilon_high is not None:
        _positive("algo.epsilon_high", algo.epsilon_high, "DAPO recommends 0.28")
    _choice("algo.loss_agg", algo.loss_agg, ("seq_mean", "token_mean", "constant"))
    _require(algo.n_iterations >= 1, "algo.n_iterations", algo.n_iterations, ">= 1")
    _at_most("algo.n_iterations", algo.n_iterations, MAX_EPOCHS, "typical: 1 to 4")
    n_completions = algo.group_size * algo.n_groups
    _require(1 <= algo.batch_size <= n_completions, "algo.batch_size", algo.batch_size,
             f"in [1, group_size * n_groups = {n_completions}]", "it counts completions per minibatch")  # fmt: skip
    _learning_rate("algo.learning_rate", algo.learning_rate, "typical: 3e-5")
    _positive("algo.max_grad_norm", algo.max_grad_norm)
    _require(algo.beta >= 0, "algo.beta", algo.beta, ">= 0", "0 disables the KL term")
    _require(algo.ent_coef >= 0, "algo.ent_coef", algo.ent_coef, ">= 0")


@dataclass
class RLOOConfig:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): each completion's baseline is the mean reward of the
    other G - 1 completions of its prompt; the same clipped token loss and k3 KL as GRPO, text envs only."""

    name: ClassVar[str] = "rloo"

    group_size: int = 8
    """G: completions sampled per prompt (>= 2: the baseline leaves one out)."""
    n_groups: int = 16
    """M: prompts per update; a batch is M * G completions."""
    drop_degenerate_groups: bool = False
    """Leave prompts whose completions all got the same reward out of the update (their advantages are 0)."""
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
    """k3 KL-penalty coefficient to the reference (SFT) policy (0: disabled, no reference forward pass)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

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
    """k3 KL-penalty coefficient to the reference (SFT) policy (0: disabled, no reference forward pass)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self) -> None:
        _clipped_lm_rules(self, min_group=1)

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


TEXT_RL_ALGOS: tuple[Any, ...] = (RLOOConfig, REINFORCEConfig, PPOLMConfig)
"""The language-model RL algorithms that train on text tasks only (issue 12)."""
_FIRST_ALGOS: tuple[Any, ...] = (
    PPOConfig,
    A2CConfig,
    SB3TRPOConfig,
    TRPOConfig,
    VPGConfig,
    PPOKLConfig,
    GRPOConfig,
    SFTConfig,
)
ALGO_CONFIGS: dict[str, type] = {c.name: c for c in (*_FIRST_ALGOS, *TEXT_RL_ALGOS)}
TEXT_ALGOS: tuple[type, ...] = (GRPOConfig, SFTConfig, *TEXT_RL_ALGOS)
"""Algo configs that train on a text env (``pgcli.training.build.TEXT_TRAINERS`` holds their trainers)."""
CONTROL_ALGOS: tuple[type, ...] = (PPOConfig, A2CConfig, SB3TRPOConfig, TRPOConfig, VPGConfig, PPOKLConfig, GRPOConfig)
"""Algo configs that train on a gymnasium env (``pgcli.training.build.TRAINERS``)."""

# --------------------------------------------------------------------------------------------------------------------
# env, model, hardware, tracking
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """A gymnasium environment, vectorised, with the wrappers every trainer sees."""

    id: str = MISSING
    """Gymnasium id, e.g. CartPole-v1 or Hopper-v5, or module.path:EnvId-v0 (the module is imported to register it)."""
    n_envs: int = 8
    """Parallel environments in the vector env."""
    max_episode_steps: int | None = None
    """Episode step limit (None: the registered limit)."""
    normalize_obs: bool = False
    """Running mean/std observation normalisation (statistics saved with the model)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's VecNormalize)."""
    clip_obs: float = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""
    clip_reward: float = 10.0
    """Clip normalised rewards to [-clip_reward, clip_reward]."""
    rescale_actions: bool = True
    """Continuous actions: the policy acts in [-1, 1], rescaled to the env's bounds."""
    reward_threshold: float | None = None
    """Return at which the task counts as solved (reported in the summary; None: the registered threshold)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make."""
    wrappers: list[dict[str, Any]] = field(default_factory=list)
    """Gymnasium wrappers for each sub-env, innermost first: {_target_: module.Wrapper, arg: value, ...}."""

    def __post_init__(self) -> None:
        _finite_fields(self, "env")
        _require(self.n_envs >= 1, "env.n_envs", self.n_envs, ">= 1")
        _at_most("env.n_envs", self.n_envs, MAX_N_ENVS, "one process steps them all; typical: 8")
        if self.max_episode_steps is not None:
            _require(self.max_episode_steps >= 1, "env.max_episode_steps", self.max_episode_steps, ">= 1")
        _positive("env.clip_obs", self.clip_obs)
        _positive("env.clip_reward", self.clip_reward)
        from pgcli.envs.spec import check_wrapper, registered_id  # light: gymnasium, no env is made here

        registered_id(self.id)
        for index, spec in enumerate(self.wrappers):
            check_wrapper(index, spec)


@dataclass
class ModelConfig:
    """Backend-neutral MLP actor-critic: separate policy and value networks."""

    pi_hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the policy network."""
    vf_hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the value network."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu, elu, gelu or leaky_relu."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain sqrt(2) hidden, 0.01 policy head, 1 value head)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian policies (state-independent)."""

    def __post_init__(self) -> None:
        for key, sizes in (("model.pi_hidden_sizes", self.pi_hidden_sizes),
                           ("model.vf_hidden_sizes", self.vf_hidden_sizes)):  # fmt: skip
            _require(all(int(s) >= 1 for s in sizes), key, list(sizes), "a list of positive widths")
            _require(all(int(s) <= MAX_WIDTH for s in sizes), key, list(sizes), f"widths <= {MAX_WIDTH}",
                     "typical: [64, 64]")  # fmt: skip
        _choice("model.activation", self.activation, ACTIVATIONS)
        _require(math.isfinite(self.log_std_init), "model.log_std_init", self.log_std_init, "finite")
        _require(-20 <= self.log_std_init <= 5, "model.log_std_init", self.log_std_init, "in [-20, 5]",
                 "the initial std is exp(log_std_init) in units of the [-1, 1] action range; typical: 0")  # fmt: skip


@dataclass
class TextEnvConfig:
    """A generated text task (issue 12): character prompts, a verifiable reward and a fixed held-out set."""

    name: ClassVar[str] = "text"

    id: str = MISSING
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_eval: int = 256
    """Held-out problems (never sampled for training) scored at each evaluation."""
    eval_seed: int = 1234
    """Seed of the held-out set: the same set for every run, whatever its seed."""
    reward: dict[str, Any] = field(default_factory=dict)
    """{_target_: module.fn, **kwargs}: fn(problem, completion) -> float replaces the 0/1 checker ({}: the checker)."""
    format_reward: float = 0.0
    """Added to the reward when the completion is well formed (a number; digits; a parsable expression)."""
    eval_pass_k: int = 8
    """k of eval/pass@k: a held-out problem passes when one of k sampled completions is correct."""
    eval_samples: int = 16
    """Held-out completions written to the samples table (samples/step_<n>.json) at each evaluation."""

    def __post_init__(self) -> None:
        _finite_fields(self, "env")
        _require(self.id == self.name, "env.id", self.id, f"'{self.name}' for env={self.name}",
                 "choose the task with env=addition|sort|countdown")  # fmt: skip
        _require(self.n_eval >= 1, "env.n_eval", self.n_eval, ">= 1")
        _require(0 <= self.eval_seed <= MAX_SEED, "env.eval_seed", self.eval_seed, f"in [0, {MAX_SEED}]")
        _require(self.format_reward >= 0, "env.format_reward", self.format_reward, ">= 0", "0 turns it off")
        _require(1 <= self.eval_pass_k <= 256, "env.eval_pass_k", self.eval_pass_k, "in [1, 256]", "typical: 8")
        _require(self.eval_samples >= 0, "env.eval_samples", self.eval_samples, ">= 0", "0 writes no samples table")
        from pgcli.lm.tasks import make_puzzle, resolve_reward  # light: numpy only

        resolve_reward(self.reward)
        distinct = make_puzzle(self).n_distinct
        _require(self.n_eval <= distinct // 2, "env.n_eval", self.n_eval, f"<= half of the {distinct} distinct "
                 f"{self.name} prompts", "lower env.n_eval or make the task larger")  # fmt: skip


@dataclass
class AdditionEnvConfig(TextEnvConfig):
    """n-digit addition: 'a+b=' -> a + b, operands uniform in [0, 10**n_digits)."""

    name: ClassVar[str] = "addition"

    id: str = "addition"
    """The task (addition, sort or countdown); labels the run as a gymnasium id does."""
    n_digits: int = 4
    """Digits of each operand (at most)."""

    def __post_init__(self) -> None:
        _require(1 <= self.n_digits <= 12, "env.n_digits", self.n_digits, "in [1, 12]", "typical: 4")
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
        _require(2 <= self.n_digits <= 24, "env.n_digits", self.n_digits, "in [2, 24]", "typical: 6")
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
        _require(2 <= self.n_numbers <= 6, "env.n_numbers", self.n_numbers, "in [2, 6]", "typical: 3")
        _require(2 <= self.max_number <= 999, "env.max_number", self.max_number, "in [2, 999]", "typical: 9")
        _require(1 <= self.max_target <= 10**6, "env.max_target", self.max_target, "in [1, 1e6]", "typical: 100")
        super().__post_init__()


TEXT_ENV_CONFIGS: dict[str, type] = {c.name: c for c in (AdditionEnvConfig, SortEnvConfig, CountdownEnvConfig)}


@dataclass
class LMModelConfig:
    """TinyGPT: a small pre-LN causal transformer over characters (issue 12), and how the policy samples."""

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

    def __post_init__(self) -> None:
        _finite_fields(self, "model")
        for key in ("n_layers", "n_heads", "d_model", "d_ff", "max_len"):
            value = getattr(self, key)
            _require(1 <= value <= MAX_WIDTH, f"model.{key}", value, f"in [1, {MAX_WIDTH}]")
        _require(self.d_model % self.n_heads == 0, "model.d_model", self.d_model,
                 f"divisible by model.n_heads={self.n_heads}")  # fmt: skip
        _positive("model.init_std", self.init_std, "typical: 0.02")
        _positive("model.temperature", self.temperature, "typical: 1.0")
        _at_most("model.temperature", self.temperature, 10.0, "typical: 1.0")
        _require(0 < self.top_p <= 1, "model.top_p", self.top_p, "in (0, 1]", "1.0 samples the whole distribution")


@dataclass
class HardwareConfig:
    """Where the networks run and how the vectorised envs step."""

    device: str = "cpu"
    """'cpu', 'cuda' (fails clearly without a GPU) or 'auto' (cuda when available)."""
    torch_threads: int = 1
    """torch.set_num_threads; 1 suits small MLPs and parallel sweeps (0: torch's default)."""
    vec_env: str = "sync"
    """'sync' (one process), 'async' (a subprocess per env), 'worker' (half the envs in a 2nd process; as 'sync') or
    'shm' (as 'worker', over shared memory; only end-of-episode infos)."""
    eval_process: bool = False
    """Evaluate in a separate process, concurrently with training, on a snapshot of the policy (same results; in
    process with one usable CPU)."""
    busy_fallback: bool = True
    """With a second process asked for (vec_env=worker|shm, eval_process, critic_process): when no core is free at
    start (another process is running), run in one process instead, with the same results, and say so; with
    vec_env=shm, also when another process starts to use the cores mid-run (two updates in a row spent > 20% of
    the time waiting for a core)."""
    eval_in_worker: bool = True
    """With vec_env=shm's worker process (and no eval_process): the worker plays the evaluation episodes while it
    would idle, during the updates, on a snapshot of the policy (same results); false evaluates in this process."""

    def __post_init__(self) -> None:
        _choice("hardware.device", self.device, ("cpu", "cuda", "auto"))
        _require(self.torch_threads >= 0, "hardware.torch_threads", self.torch_threads, ">= 0")
        _at_most("hardware.torch_threads", self.torch_threads, MAX_N_ENVS, "0 uses torch's default")
        _choice("hardware.vec_env", self.vec_env, ("sync", "async", "worker", "shm"))


@dataclass
class TrackingConfig:
    """Experiment tracking backend."""

    backend: str = "mlflow"
    """'mlflow' or 'off' (metrics still go to the console and a CSV in the run directory)."""
    uri: str | None = None
    """MLflow tracking URI. None: $MLFLOW_TRACKING_URI if set, else the local SQLite store under store_dir."""
    store_dir: str = "outputs"
    """Directory of the embedded store (mlflow.db + mlartifacts/), relative to where pgcli starts."""
    flush_every_s: float = 5.0
    """Metrics are buffered and written in batches at most this often."""
    log_model: bool = True
    """Log the final model as an artifact."""

    def __post_init__(self) -> None:
        _finite_fields(self, "tracking")
        _choice("tracking.backend", self.backend, ("mlflow", "off"))
        _positive("tracking.flush_every_s", self.flush_every_s)
        _at_most("tracking.flush_every_s", self.flush_every_s, 3600, "a crash loses up to this much; typical: 5")


@dataclass
class EvalConfig:
    """Periodic evaluation on a separate env."""

    every: int = 10_000
    """Evaluate every this many environment steps (0: only at the end)."""
    episodes: int = 10
    """Episodes per evaluation."""
    deterministic: bool = True
    """Act with the mode of the policy (mean / argmax)."""
    n_envs: int = 1
    """Parallel evaluation envs."""
    save_best: bool = True
    """Keep the agent of the best evaluation so far in <run dir>/best_model (logged as the ``best_model`` artifact),
    as SB3's EvalCallback does: the last policy is not always the best one."""
    video_every: int = 0
    """Record the first episode of an evaluation to video every this many env steps (0: off); logged as
    ``videos/step_<steps>.mp4`` (GIF without imageio-ffmpeg)."""

    def __post_init__(self) -> None:
        _require(self.every >= 0, "eval.every", self.every, ">= 0")
        _require(self.episodes >= 1, "eval.episodes", self.episodes, ">= 1")
        _at_most("eval.episodes", self.episodes, 100_000, "typical: 10")
        _require(self.n_envs >= 1, "eval.n_envs", self.n_envs, ">= 1")
        _at_most("eval.n_envs", self.n_envs, MAX_N_ENVS, "typical: 1")
        _require(self.video_every >= 0, "eval.video_every", self.video_every, ">= 0", "0 turns videos off")


@dataclass
class TrainConfig:
    """Top level of ``pgcli train``."""

    algo: Any = MISSING
    """One of the algo group's schemas (PPOConfig, TRPOConfig, ...)."""
    env: Any = MISSING
    """A gymnasium env (EnvConfig) or a text task (AdditionEnvConfig, ...)."""
    model: Any = MISSING
    """ModelConfig (MLP actor-critic) for gymnasium envs, LMModelConfig (model=tiny_gpt) for text tasks."""
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    """Seeds torch, numpy, the envs and the action sampling."""
    total_steps: int = 100_000
    """Environment steps to train for (on-policy trainers stop at the first rollout boundary past it)."""
    experiment: str | None = None
    """MLflow experiment (None: the env's config name, e.g. 'cartpole')."""
    run_name: str | None = None
    """MLflow run name (None: '<algo>-<env>-s<seed>')."""
    checkpoint_every: int = 50_000
    """Save a checkpoint every this many env steps into <run dir>/checkpoints/step_<n> (0: only the final model)."""
    checkpoint_keep: int = 3
    """Keep the newest this many checkpoints in the run directory (0: all); best_model/ and model/ are kept apart."""
    progress: bool = True
    """Show a progress bar."""
    n_seeds: int = 1
    """Train seeds seed, seed+1, ... (this many, one after another) and return their mean final eval return: the
    objective of a hyperparameter-search trial, so the search averages over seeds instead of optimising one."""
    init: str | None = None
    """Text tasks: an SFT run (run id or run directory) whose final weights start training and are the frozen
    reference policy of the KL term (None: a freshly initialised model, no reference)."""

    def __post_init__(self) -> None:
        _require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        _at_most("total_steps", self.total_steps, MAX_TOTAL_STEPS, "at 10k steps/s that is over 3 years; typical: 1e6")
        _require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, ">= 0")
        _require(self.checkpoint_keep >= 0, "checkpoint_keep", self.checkpoint_keep, ">= 0", "0 keeps every checkpoint")
        _require(self.seed >= 0, "seed", self.seed, ">= 0")
        _require(self.n_seeds >= 1, "n_seeds", self.n_seeds, ">= 1", "n_seeds=3 trains seeds seed..seed+2 in one job")
        _at_most("n_seeds", self.n_seeds, 1000, "typical: 3 to 10")
        last = self.seed + self.n_seeds - 1
        _require(last <= MAX_SEED, "seed + n_seeds - 1", last, f"<= 2**32 - 1 = {MAX_SEED}", "numpy seeds are 32-bit")
        if type(self.algo) not in ALGO_CONFIGS.values():
            raise ConfigError(f"algo must be one of the algo group's options (got {type(self.algo).__name__})")
        if isinstance(self.env, TextEnvConfig):
            self._check_text()
            return
        if not isinstance(self.env, EnvConfig):
            raise ConfigError(f"env must be one of the env group's options (got {type(self.env).__name__})")
        text = ", ".join(name for name, c in ALGO_CONFIGS.items() if c in TEXT_ALGOS)
        if type(self.algo) not in CONTROL_ALGOS:
            raise ConfigError(f"algo={self.algo.name} trains on text tasks only (env=addition|sort|countdown); "
                              f"{self.env.id} is a gymnasium env")  # fmt: skip
        model = "tiny_gpt" if isinstance(self.model, LMModelConfig) else self.model
        _require(isinstance(self.model, ModelConfig), "model", model,
                 "an MLP option (mlp, mlp_large) on a gymnasium env", "model=tiny_gpt is for text tasks")  # fmt: skip
        _require(self.init is None, "init", self.init, "null on a gymnasium env",
                 f"init=<SFT run> starts text-task runs ({text})")  # fmt: skip
        self.algo.check_rollout(self.env.n_envs)  # cross-group: the rollout is algo.n_steps * env.n_envs
        from pgcli.envs.spec import check_train_config  # probes one throwaway env for its spaces

        check_train_config(self)

    def _check_text(self) -> None:
        """Cross-group rules of a text run: a text algo, the TinyGPT model, prompt + completion within max_len."""
        if type(self.algo) not in TEXT_ALGOS:
            able = ", ".join(name for name, c in ALGO_CONFIGS.items() if c in TEXT_ALGOS)
            raise ConfigError(f"algo={self.algo.name} does not train on text tasks; env={self.env.id} takes algo="
                              f"{able}")  # fmt: skip
        if not isinstance(self.model, LMModelConfig):
            raise ConfigError(f"env={self.env.id} is a text task: it needs model=tiny_gpt (got an MLP model option)")
        self.algo.check_text_env()
        _require(self.eval.video_every == 0, "eval.video_every", self.eval.video_every, "0 on a text task",
                 "a text task has no frames; its evaluations write samples/step_<n>.json instead")  # fmt: skip
        from pgcli.lm.tasks import make_puzzle  # light: numpy only

        puzzle = make_puzzle(self.env)
        need = puzzle.max_prompt_chars + 1 + puzzle.max_answer_chars + 1  # BOS, EOS
        _require(self.model.max_len >= need, "model.max_len", self.model.max_len,
                 f">= {need} (env={self.env.id}: BOS + prompt + completion + EOS)",
                 f"set model.max_len={need} or more")  # fmt: skip
        if self.init is not None:
            _require(bool(str(self.init).strip()), "init", self.init, "a run id or a run directory")

    @property
    def steps_per_rollout(self) -> int | None:
        """Env steps per update, ``algo.n_steps * env.n_envs`` (None for GRPO, whose updates are whole episodes)."""
        n_steps = getattr(self.algo, "n_steps", None)
        if n_steps is None or isinstance(self.env, TextEnvConfig):
            return None
        return int(n_steps * self.env.n_envs)

    @property
    def planned_steps(self) -> int | None:
        """The env steps training will take: ``total_steps`` rounded up to whole rollouts (None for GRPO)."""
        per = self.steps_per_rollout
        return -(-self.total_steps // per) * per if per else None


def register_configs() -> None:
    """Register every schema in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from pgcli.config.labels import register_resolver

    register_resolver()  # ${pgcli.env_label:...} in hydra.run.dir
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, schema in ALGO_CONFIGS.items():
        cs.store(group="schema/algo", name=name, node=schema)
    cs.store(group="schema/env", name="env", node=EnvConfig)
    for name, schema in TEXT_ENV_CONFIGS.items():
        cs.store(group="schema/env", name=name, node=schema)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/model", name="tiny_gpt", node=LMModelConfig)
    cs.store(group="schema/hardware", name="hardware", node=HardwareConfig)
    cs.store(group="schema/tracking", name="tracking", node=TrackingConfig)
