"""Typed configuration schemas: one dataclass per config-group option.

The YAML files under ``conf/`` only set values; these dataclasses define the keys, their types and the rules a value
must follow. Each is registered in Hydra's ConfigStore under ``schema/<group>/<option>`` and extended by its YAML file,
so a typo'd key or a wrong type fails at composition. Range and cross-field rules live in ``__post_init__`` and run
once, when :func:`to_train_config` turns the composed ``DictConfig`` into these objects.

This module must stay light (no torch, SB3 or MLflow imports): ``pgcli --help`` and config validation use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from pgcli.errors import ConfigError

ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "leaky_relu")
SCHEDULES = ("constant", "linear")


def _require(ok: bool, key: str, value: object, rule: str, hint: str = "") -> None:
    """Raise a one-line :class:`ConfigError` naming the key, the value and the rule when ``ok`` is false."""
    if not ok:
        raise ConfigError(f"{key} must be {rule} (got {value!r})" + (f"; {hint}" if hint else ""))


def _positive(key: str, value: float, hint: str = "") -> None:
    _require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key, value, "> 0", hint)


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
        _positive("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _unit_open("algo.clip_range", self.clip_range, "typical: 0.2")
        _choice("algo.clip_range_schedule", self.clip_range_schedule, SCHEDULES)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        if self.target_kl is not None:
            _positive("algo.target_kl", self.target_kl)


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
        _positive("algo.learning_rate", self.learning_rate, "typical: 7e-4")
        _choice("algo.lr_schedule", self.lr_schedule, SCHEDULES)
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _positive("algo.rms_prop_eps", self.rms_prop_eps)


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
        _positive("algo.learning_rate", self.learning_rate)
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _require(self.cg_max_steps >= 1, "algo.cg_max_steps", self.cg_max_steps, ">= 1")
        _require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0")
        _unit_open("algo.line_search_shrinking_factor", self.line_search_shrinking_factor)
        _require(self.line_search_max_iter >= 1, "algo.line_search_max_iter", self.line_search_max_iter, ">= 1")
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _positive("algo.target_kl", self.target_kl, "typical: 0.01")
        _require(self.sub_sampling_factor >= 1, "algo.sub_sampling_factor", self.sub_sampling_factor, ">= 1")


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
    """Trust-region radius delta: maximum mean KL(old || new) per update."""
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
    """Adam step size of the value network."""
    n_critic_updates: int = 10
    """Epochs of value-network minibatch updates per batch."""
    batch_size: int = 128
    """Minibatch size of the value-network updates."""

    def __post_init__(self) -> None:
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _positive("algo.target_kl", self.target_kl, "typical: 0.01")
        _require(self.cg_iters >= 1, "algo.cg_iters", self.cg_iters, ">= 1")
        _require(self.cg_damping >= 0, "algo.cg_damping", self.cg_damping, ">= 0", "typical: 0.1")
        _require(self.fvp_sub_sampling >= 1, "algo.fvp_sub_sampling", self.fvp_sub_sampling, ">= 1")
        _unit_open("algo.backtrack_coeff", self.backtrack_coeff, "typical: 0.8")
        _require(self.backtrack_iters >= 1, "algo.backtrack_iters", self.backtrack_iters, ">= 1")
        _positive("algo.vf_learning_rate", self.vf_learning_rate, "typical: 1e-3")
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")


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
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _positive("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _positive("algo.vf_learning_rate", self.vf_learning_rate, "typical: 1e-3")
        _require(self.n_critic_updates >= 1, "algo.n_critic_updates", self.n_critic_updates, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)


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
        _positive("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")
        _require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _require(self.n_epochs >= 1, "algo.n_epochs", self.n_epochs, ">= 1")
        _gamma("algo.gamma", self.gamma)
        _lambda("algo.gae_lambda", self.gae_lambda)
        _positive("algo.kl_target", self.kl_target, "typical: 0.01")
        _positive("algo.beta_init", self.beta_init)
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")
        _require(self.vf_coef >= 0, "algo.vf_coef", self.vf_coef, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)


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
        _require(self.group_size >= 2, "algo.group_size", self.group_size, ">= 2",
                 "a group needs at least 2 episodes to normalise within")  # fmt: skip
        _require(self.n_groups >= 1, "algo.n_groups", self.n_groups, ">= 1")
        _choice("algo.advantage", self.advantage, ("outcome", "process", "step_baseline"))
        _choice("algo.scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _gamma("algo.gamma", self.gamma)
        _unit_open("algo.epsilon", self.epsilon, "typical: 0.2")
        if self.epsilon_high is not None:
            _positive("algo.epsilon_high", self.epsilon_high, "DAPO recommends 0.28")
        _choice("algo.loss_agg", self.loss_agg, ("seq_mean", "token_mean", "constant"))
        _require(self.n_iterations >= 1, "algo.n_iterations", self.n_iterations, ">= 1")
        n_episodes = self.group_size * self.n_groups
        _require(1 <= self.batch_size <= n_episodes, "algo.batch_size", self.batch_size,
                 f"in [1, group_size * n_groups = {n_episodes}]", "it counts episodes per minibatch")  # fmt: skip
        _positive("algo.learning_rate", self.learning_rate, "typical: 3e-4")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _require(self.beta >= 0, "algo.beta", self.beta, ">= 0", "0 disables the KL penalty")
        _require(self.ref_update_interval >= 0, "algo.ref_update_interval", self.ref_update_interval, ">= 0")
        _require(self.ent_coef >= 0, "algo.ent_coef", self.ent_coef, ">= 0")


ALGO_CONFIGS: dict[str, type] = {
    c.name: c for c in (PPOConfig, A2CConfig, SB3TRPOConfig, TRPOConfig, VPGConfig, PPOKLConfig, GRPOConfig)
}

# --------------------------------------------------------------------------------------------------------------------
# env, model, hardware, tracking
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """A gymnasium environment, vectorised, with the wrappers every trainer sees."""

    id: str = MISSING
    """Gymnasium id, e.g. CartPole-v1 or Hopper-v5."""
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

    def __post_init__(self) -> None:
        _require(self.n_envs >= 1, "env.n_envs", self.n_envs, ">= 1")
        if self.max_episode_steps is not None:
            _require(self.max_episode_steps >= 1, "env.max_episode_steps", self.max_episode_steps, ">= 1")
        _positive("env.clip_obs", self.clip_obs)
        _positive("env.clip_reward", self.clip_reward)
        import gymnasium  # light (~0.1 s); the registry knows every id without importing MuJoCo

        if self.id not in gymnasium.registry:
            import difflib

            close = difflib.get_close_matches(self.id, list(gymnasium.registry), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.pprint_registry()"
            raise ConfigError(f"env.id {self.id!r} is not a registered gymnasium environment; {hint}")


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
        _choice("model.activation", self.activation, ACTIVATIONS)
        _require(math.isfinite(self.log_std_init), "model.log_std_init", self.log_std_init, "finite")


@dataclass
class HardwareConfig:
    """Where the networks run and how the vectorised envs step."""

    device: str = "cpu"
    """'cpu', 'cuda' (fails clearly without a GPU) or 'auto' (cuda when available)."""
    torch_threads: int = 1
    """torch.set_num_threads; 1 suits small MLPs and parallel sweeps (0: torch's default)."""
    vec_env: str = "sync"
    """'sync' (one process; fastest for cheap envs on few cores) or 'async' (one subprocess per env)."""

    def __post_init__(self) -> None:
        _choice("hardware.device", self.device, ("cpu", "cuda", "auto"))
        _require(self.torch_threads >= 0, "hardware.torch_threads", self.torch_threads, ">= 0")
        _choice("hardware.vec_env", self.vec_env, ("sync", "async"))


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
        _choice("tracking.backend", self.backend, ("mlflow", "off"))
        _positive("tracking.flush_every_s", self.flush_every_s)


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
        _require(self.n_envs >= 1, "eval.n_envs", self.n_envs, ">= 1")
        _require(self.video_every >= 0, "eval.video_every", self.video_every, ">= 0", "0 turns videos off")


@dataclass
class TrainConfig:
    """Top level of ``pgcli train``."""

    algo: Any = MISSING
    """One of the algo group's schemas (PPOConfig, TRPOConfig, ...)."""
    env: EnvConfig = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
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
    checkpoint_every: int = 0
    """Save a checkpoint every this many env steps (0: only the final model)."""
    progress: bool = True
    """Show a progress bar."""
    n_seeds: int = 1
    """Train seeds seed, seed+1, ... (this many, one after another) and return their mean final eval return: the
    objective of a hyperparameter-search trial, so the search averages over seeds instead of optimising one."""

    def __post_init__(self) -> None:
        _require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        _require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, ">= 0")
        _require(self.seed >= 0, "seed", self.seed, ">= 0")
        _require(self.n_seeds >= 1, "n_seeds", self.n_seeds, ">= 1", "n_seeds=3 trains seeds seed..seed+2 in one job")
        if type(self.algo) not in ALGO_CONFIGS.values():
            raise ConfigError(f"algo must be one of the algo group's options (got {type(self.algo).__name__})")


def register_configs() -> None:
    """Register every schema in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, schema in ALGO_CONFIGS.items():
        cs.store(group="schema/algo", name=name, node=schema)
    cs.store(group="schema/env", name="env", node=EnvConfig)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/hardware", name="hardware", node=HardwareConfig)
    cs.store(group="schema/tracking", name="tracking", node=TrackingConfig)
