"""Schemas of the algorithms that train on gymnasium envs (``algo=ppo|a2c|sb3_trpo|trpo|vpg|ppo_kl|grpo``).

One dataclass per ``conf/algo`` option: its fields (each with a one-line docstring), their defaults, and the rules of
their values in ``__post_init__``. ``check_rollout(n_envs)`` adds the rules that involve ``env.n_envs``, which
:class:`pgcli.config.run.TrainConfig` calls once the env is known. GRPO also trains on text tasks
(``check_text_env``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from pgcli.config.lm_algos import ClippedPolicyOptions, clipped_schema
from pgcli.config.rules import (
    MAX_CG_RESIDUAL_TOL,
    MAX_EPOCHS,
    MAX_N_ENVS,
    SCHEDULES,
    _at_most,
    _choice,
    _finite_fields,
    _gamma,
    _lambda,
    _learning_rate,
    _positive,
    _rollout_rules,
    _sde_sample_freq,
    _trust_region,
    _unit_open,
    require,
)
from pgcli.errors import ConfigError

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
    clip_range_vf: float | None = None
    """Clip the value prediction to within this of the rollout's value (SB3's clip_range_vf, on clip_range_schedule;
    None: no clipping). SB3 takes the clipped prediction's loss, not the larger of the two as OpenAI baselines do; it
    is in the units of the (normalised) rewards."""
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
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        if self.normalize_advantage:  # SB3 asserts it (DLR-RM/stable-baselines3#440): a minibatch of 1 has no std
            require(
                self.batch_size > 1,
                "algo.batch_size",
                self.batch_size,
                "> 1 with algo.normalize_advantage=true",
                "a one-sample minibatch has no standard deviation",
            )
        require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _at_most("algo.n_epochs", self.n_epochs, MAX_EPOCHS, "typical: 10")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _unit_open("algo.clip_range", self.clip_range, "typical: 0.2")
        _choice("algo.clip_range_schedule", self.clip_range_schedule, SCHEDULES)
        if self.clip_range_vf is not None:
            _positive("algo.clip_range_vf", self.clip_range_vf, "typical: 0.2; null turns value clipping off")
        require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
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
    rms_prop_tf_like: bool = False
    """TensorFlow's RMSprop (SB3's ``RMSpropTFLike``: epsilon inside the square root, the running average started at
    1), as Stable Baselines 2 and rl-baselines3-zoo's Atari A2C train; false: torch's RMSprop. Needs use_rms_prop."""
    normalize_advantage: bool = False
    """Standardise advantages per update."""
    use_sde: bool = False
    """Generalised state-dependent exploration (continuous actions only)."""
    sde_sample_freq: int = -1
    """Resample the gSDE noise every n steps (-1: once per rollout)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        require(
            self.use_rms_prop or not self.rms_prop_tf_like,
            "algo.rms_prop_tf_like",
            self.rms_prop_tf_like,
            "false when algo.use_rms_prop=false (it picks which RMSprop)",
        )
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 7e-4")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
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
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        require(self.cg_max_steps >= 1, "algo.cg_max_steps", self.cg_max_steps, ">= 1")
        _at_most("algo.cg_max_steps", self.cg_max_steps, MAX_EPOCHS, "typical: 15")
        require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0")
        _unit_open("algo.line_search_shrinking_factor", self.line_search_shrinking_factor)
        require(self.line_search_max_iter >= 1, "algo.line_search_max_iter", self.line_search_max_iter, ">= 1")
        _at_most("algo.line_search_max_iter", self.line_search_max_iter, MAX_EPOCHS, "typical: 10")
        require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        _trust_region("algo.target_kl", self.target_kl)
        require(self.sub_sampling_factor >= 1, "algo.sub_sampling_factor", self.sub_sampling_factor, ">= 1")
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
    renamed: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "cg_iters": "cg_max_steps",
            "backtrack_coeff": "line_search_shrinking_factor",
            "backtrack_iters": "line_search_max_iter",
            "vf_learning_rate": "learning_rate",
            "vf_lr_schedule": "lr_schedule",
        }
    )
    """Old key -> key now (sb3-contrib's TRPO's names, and PPO's ``lr_schedule``): still read, with a note, on the
    command line and in runs logged before (:mod:`pgcli.config.renames`)."""

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
    cg_max_steps: int = 15
    """Conjugate-gradient iterations for the natural-gradient direction."""
    cg_residual_tol: float = 1e-10
    """Stop CG early when the squared residual falls below this."""
    cg_damping: float = 0.1
    """Damping added to the Fisher-vector product (F + damping * I)."""
    fvp_sub_sampling: int = 1
    """Compute Fisher-vector products on every k-th sample (openai/baselines uses 5; sb3_trpo's sub_sampling_factor
    sub-samples the whole policy step instead)."""
    line_search_shrinking_factor: float = 0.8
    """Line-search step shrink factor."""
    line_search_max_iter: int = 10
    """Maximum line-search steps tried, the full step included."""
    npg: bool = False
    """Natural policy gradient: take the trust-region step without the line search."""
    learning_rate: float = 1e-3
    """Adam step size of the value network (initial value when lr_schedule=linear)."""
    lr_schedule: str = "constant"
    """'constant' or 'linear' (the critic's step size decays to 0 over total_steps)."""
    critic_process: bool = False
    """Fit the value network in a second process while the policy step runs (same numbers; CPU, >= 2 CPUs only)."""
    n_critic_updates: int = 10
    """Epochs of value-network minibatch updates per batch."""
    batch_size: int = 128
    """Minibatch size of the value-network updates."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _trust_region("algo.target_kl", self.target_kl)
        _choice("algo.target_kl_schedule", self.target_kl_schedule, SCHEDULES)
        _trust_region("algo.target_kl_final", self.target_kl_final)
        require(self.cg_max_steps >= 1, "algo.cg_max_steps", self.cg_max_steps, ">= 1")
        _at_most("algo.cg_max_steps", self.cg_max_steps, MAX_EPOCHS, "typical: 15")
        # CG stops before its first iteration when the squared gradient norm (~1e-2 on CartPole) is below the
        # tolerance: the direction is zero, the line search finds no improvement, and every update silently keeps
        # the old policy (measured: line_search_success 0 on every update at 1.0; docs/configuration.md, "Validation").
        require(
            0 <= self.cg_residual_tol <= MAX_CG_RESIDUAL_TOL,
            "algo.cg_residual_tol",
            self.cg_residual_tol,
            f"in [0, {MAX_CG_RESIDUAL_TOL:g}]",
            "a larger tolerance can stop CG before its first step, making every update a no-op; typical: 1e-10",
        )
        require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0", "typical: 0.1")
        require(self.fvp_sub_sampling >= 1, "algo.fvp_sub_sampling", self.fvp_sub_sampling, ">= 1")
        _unit_open("algo.line_search_shrinking_factor", self.line_search_shrinking_factor, "typical: 0.8")
        require(self.line_search_max_iter >= 1, "algo.line_search_max_iter", self.line_search_max_iter, ">= 1")
        _at_most("algo.line_search_max_iter", self.line_search_max_iter, MAX_EPOCHS, "typical: 10")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 1e-3")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")

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
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _learning_rate("algo.vf_learning_rate", self.vf_learning_rate, "typical: 1e-3")
        require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _at_most("algo.n_critic_updates", self.n_critic_updates, MAX_EPOCHS, "typical: 10")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
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
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _at_most("algo.n_epochs", self.n_epochs, MAX_EPOCHS, "typical: 10")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _trust_region("algo.kl_target", self.kl_target)
        _positive("algo.beta_init", self.beta_init)
        require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)

    def check_rollout(self, n_envs: int) -> None:
        """Rules that involve ``env.n_envs``: the minibatches."""
        _rollout_rules(self, n_envs)


@clipped_schema(
    advantage="n_groups",
    scale_rewards="advantage",
    gamma="drop_degenerate_groups",
    kl_estimator="beta",
    ref_update_interval="kl_estimator",
)
class GRPOConfig(ClippedPolicyOptions):
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
    epsilon_high: float | None = None
    """Upper clip: ratio <= 1 + epsilon_high (DAPO clip-higher, 0.28; None: epsilon)."""
    loss_agg: str = "token_mean"
    """'seq_mean' (GRPO: per-episode mean, then mean), 'token_mean' (DAPO) or 'constant' (Dr. GRPO)."""
    n_iterations: int = 4
    """mu: epochs of policy updates over each batch (1 with one minibatch: plain on-policy gradient)."""
    batch_size: int = 8
    """Episodes per minibatch (<= group_size * n_groups)."""
    learning_rate: float = 3e-4  # the control defaults; the docs of the shared options: ClippedPolicyOptions'
    max_grad_norm: float = 0.5
    beta: float = 0.0
    """KL-penalty coefficient to the reference policy (0: disabled, no reference forward pass)."""
    kl_estimator: str = "k3"
    """Per-token estimator of the KL term: 'k1', 'k2' (text tasks only) or 'k3' (DeepSeekMath's)."""
    ref_update_interval: int = 0
    """Copy the current policy into the reference every n updates (0: keep the initial policy)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit the length limit without EOS out of the loss (text tasks only)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        require(
            self.group_size >= 2,
            "algo.group_size",
            self.group_size,
            ">= 2",
            "a group needs at least 2 episodes to normalise within",
        )
        _at_most("algo.group_size", self.group_size, MAX_N_ENVS * 4, "typical: 8 (TRL num_generations)")
        require(self.n_groups >= 1, "algo.n_groups", self.n_groups, ">= 1")
        _at_most("algo.n_groups", self.n_groups, MAX_N_ENVS * 4, "typical: 4")
        _choice("algo.advantage", self.advantage, ("outcome", "process", "step_baseline"))
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _gamma("algo.gamma", self.gamma)
        _unit_open("algo.epsilon", self.epsilon, "typical: 0.2")
        if self.epsilon_high is not None:
            _positive("algo.epsilon_high", self.epsilon_high, "DAPO recommends 0.28")
        _choice("algo.loss_agg", self.loss_agg, ("seq_mean", "token_mean", "constant"))
        require(self.n_iterations >= 1, "algo.n_iterations", self.n_iterations, ">= 1")
        _at_most("algo.n_iterations", self.n_iterations, MAX_EPOCHS, "typical: 4")
        n_episodes = self.group_size * self.n_groups
        require(
            1 <= self.batch_size <= n_episodes,
            "algo.batch_size",
            self.batch_size,
            f"in [1, group_size * n_groups = {n_episodes}]",
            "it counts episodes per minibatch",
        )
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        require(self.beta >= 0, "algo.beta", self.beta, ">= 0", "0 disables the KL penalty")
        _choice("algo.kl_estimator", self.kl_estimator, ("k1", "k2", "k3"))
        require(self.ref_update_interval >= 0, "algo.ref_update_interval", self.ref_update_interval, ">= 0")
        require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")

    def check_rollout(self, n_envs: int) -> None:
        """Rules of a control task (a batch is whole episodes, collected n_envs at a time): no text-only option."""
        require(
            self.kl_estimator == "k3",
            "algo.kl_estimator",
            self.kl_estimator,
            "k3 on a control task",
            "k1 and k2 are for text tasks (docs/algorithms/lm.md)",
        )
        require(
            not self.mask_truncated_completions,
            "algo.mask_truncated_completions",
            self.mask_truncated_completions,
            "false on a control task",
            "it drops completions without EOS of text tasks",
        )

    def check_text_env(self) -> None:
        """Rules for a text env (docs/algorithms/lm.md): a completion is one episode with one outcome reward."""
        if self.advantage != "outcome":
            raise ConfigError(
                f"algo.advantage={self.advantage} needs per-step rewards of a control task; a text task scores a "
                "whole completion once: use algo.advantage=outcome"
            )
