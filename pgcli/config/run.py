"""The top of the config tree: a run's gymnasium env, MLP model, hardware, tracking and evaluation schemas, the
:class:`TrainConfig` that holds one option of every group (which algorithm trains on what: :mod:`pgcli.config.algos`).

Cross-group rules that need only the values (a text algo on a text task, the rollout ``algo.n_steps * env.n_envs``)
run in :meth:`TrainConfig.__post_init__`; the checks that need the world (env id registered, spaces of a probed env,
prompts within ``model.max_len``, a GPU for ``hardware=cuda``) run after composition, in :mod:`pgcli.training.checks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pgcli.config.algos import ALGOS, GYM_KINDS, TEXT_KINDS, algo_entry, algo_names
from pgcli.config.control import GRPOConfig, TRPOConfig
from pgcli.config.hf import HFModelConfig
from pgcli.config.pixels import CNNModelConfig, PixelsConfig, check_envpool
from pgcli.config.processes import check_processes
from pgcli.config.rm import RMConfig
from pgcli.config.rules import (
    ACTIVATIONS,
    MAX_N_ENVS,
    MAX_SEED,
    MAX_TOTAL_STEPS,
    MAX_WIDTH,
    _at_most,
    _choice,
    _finite_fields,
    _positive,
    require,
)
from pgcli.config.text import AGENT_ENV_CONFIGS, LMModelConfig, TextEnvConfig
from pgcli.errors import ConfigError

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
    pixels: PixelsConfig | None = None
    """Image observations and their preprocessing (docs/pixels.md; set by env=pong, env=minatar_breakout, ...); None:
    a vector env."""

    def __post_init__(self) -> None:
        _finite_fields(self, "env")
        require(self.n_envs >= 1, "env.n_envs", self.n_envs, ">= 1")
        _at_most("env.n_envs", self.n_envs, MAX_N_ENVS, "one process steps them all; typical: 8")
        if self.max_episode_steps is not None:
            require(self.max_episode_steps >= 1, "env.max_episode_steps", self.max_episode_steps, ">= 1")
        _positive("env.clip_obs", self.clip_obs)
        _positive("env.clip_reward", self.clip_reward)
        if self.pixels is not None:
            require(
                not self.normalize_obs,
                "env.normalize_obs",
                self.normalize_obs,
                "false on an image env",
                "frames stay uint8 and the CNN scales them by 1/255",
            )


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
        for key, sizes in (
            ("model.pi_hidden_sizes", self.pi_hidden_sizes),
            ("model.vf_hidden_sizes", self.vf_hidden_sizes),
        ):
            require(all(int(s) >= 1 for s in sizes), key, list(sizes), "a list of positive widths")
            require(
                all(int(s) <= MAX_WIDTH for s in sizes), key, list(sizes), f"widths <= {MAX_WIDTH}", "typical: [64, 64]"
            )
        _choice("model.activation", self.activation, ACTIVATIONS)
        require(math.isfinite(self.log_std_init), "model.log_std_init", self.log_std_init, "finite")
        require(
            -20 <= self.log_std_init <= 5,
            "model.log_std_init",
            self.log_std_init,
            "in [-20, 5]",
            "the initial std is exp(log_std_init) in units of the [-1, 1] action range; typical: 0",
        )


@dataclass
class HardwareConfig:
    """Where the networks run and how the vectorised envs step."""

    device: str = "cpu"
    """'cpu', 'cuda' (fails clearly without a GPU) or 'auto' (the GPU for text runs and CNNs on frames when one is
    visible; control runs' MLPs stay on the CPU, where they are faster)."""
    torch_threads: int = 1
    """torch.set_num_threads for training; 1 suits small MLPs and parallel sweeps (0: torch's default). Evaluations
    play on one thread whatever this is."""
    vec_env: str = "sync"
    """'sync' (one process), 'async' (a subprocess per env), 'worker' (half the envs in a 2nd process; as 'sync'),
    'shm' (as 'worker', over shared memory; only end-of-episode infos) or 'envpool' (Atari games on EnvPool's C++
    threads, its own preprocessing: docs/pixels.md, "EnvPool")."""
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
    processes: int = 1
    """Text tasks: train one run on this many processes of this machine (torch.distributed, gloo on the CPU and nccl
    on GPUs; each process trains 1/N of every global batch; docs/distributed.md). ``torchrun`` sets it."""
    dist_timeout_s: float = 1800.0
    """With processes > 1: the longest a process waits for the others at one collective (an evaluation on rank 0
    included) before the run fails."""
    shard: str = "none"
    """With processes > 1: 'none' (each process holds the whole model; the gradients are summed over the processes)
    or 'params' (``model=hf``: parameters, gradients and optimiser state sharded over the processes with FSDP2;
    docs/distributed.md, "Models that do not fit one device")."""

    def __post_init__(self) -> None:
        _choice("hardware.device", self.device, ("cpu", "cuda", "auto"))
        _choice("hardware.shard", self.shard, ("none", "params"))
        require(self.torch_threads >= 0, "hardware.torch_threads", self.torch_threads, ">= 0")
        _at_most("hardware.torch_threads", self.torch_threads, MAX_N_ENVS, "0 uses torch's default")
        _choice("hardware.vec_env", self.vec_env, ("sync", "async", "worker", "shm", "envpool"))
        require(self.processes >= 1, "hardware.processes", self.processes, ">= 1")
        _at_most("hardware.processes", self.processes, 1024, "one process per GPU or per core")
        _positive("hardware.dist_timeout_s", self.dist_timeout_s, "typical: 1800")


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
        require(self.every >= 0, "eval.every", self.every, ">= 0")
        require(self.episodes >= 1, "eval.episodes", self.episodes, ">= 1")
        _at_most("eval.episodes", self.episodes, 100_000, "typical: 10")
        require(self.n_envs >= 1, "eval.n_envs", self.n_envs, ">= 1")
        _at_most("eval.n_envs", self.n_envs, MAX_N_ENVS, "typical: 1")
        require(self.video_every >= 0, "eval.video_every", self.video_every, ">= 0", "0 turns videos off")


@dataclass
class TrainConfig:
    """Top level of ``pgcli train``."""

    algo: Any = MISSING
    """One of the algo group's schemas (PPOConfig, TRPOConfig, ...)."""
    env: Any = MISSING
    """A gymnasium env (EnvConfig) or a text task (AdditionEnvConfig, ...)."""
    model: Any = MISSING
    """ModelConfig (MLP actor-critic) for gymnasium envs, CNNModelConfig (model=cnn) for image envs; LMModelConfig
    (model=tiny_gpt) or HFModelConfig (model=hf) for text tasks."""
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
        require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        _at_most("total_steps", self.total_steps, MAX_TOTAL_STEPS, "at 10k steps/s that is over 3 years; typical: 1e6")
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, ">= 0")
        require(self.checkpoint_keep >= 0, "checkpoint_keep", self.checkpoint_keep, ">= 0", "0 keeps every checkpoint")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(self.n_seeds >= 1, "n_seeds", self.n_seeds, ">= 1", "n_seeds=3 trains seeds seed..seed+2 in one job")
        _at_most("n_seeds", self.n_seeds, 1000, "typical: 3 to 10")
        last = self.seed + self.n_seeds - 1
        require(last <= MAX_SEED, "seed + n_seeds - 1", last, f"<= 2**32 - 1 = {MAX_SEED}", "numpy seeds are 32-bit")
        try:
            entry = algo_entry(self.algo)
        except KeyError:
            raise ConfigError(
                f"algo must be one of the algo group's options (got {type(self.algo).__name__})"
            ) from None
        check_processes(self)
        if isinstance(self.env, TextEnvConfig):
            self._check_text()
            return
        if not isinstance(self.env, EnvConfig):
            raise ConfigError(f"env must be one of the env group's options (got {type(self.env).__name__})")
        if not entry.trains_on(*GYM_KINDS):
            raise ConfigError(
                f"algo={self.algo.name} trains on text tasks only (env=addition|sort|countdown|"
                f"countdown_tool); {self.env.id} is a gymnasium env"
            )
        if self.env.pixels is not None or isinstance(self.model, CNNModelConfig):
            self._check_image()
        else:
            model = self.model.name if isinstance(self.model, LMModelConfig | HFModelConfig) else self.model
            require(
                isinstance(self.model, ModelConfig),
                "model",
                model,
                "an MLP option (mlp, mlp_large) on a gymnasium env",
                f"model={model} is for text tasks",
            )
        if not entry.trains_on(self.env_kind):
            raise ConfigError(
                f"algo={self.algo.name} does not train on {self.env_kind} envs; env.id {self.env.id!r} "
                f"takes algo={', '.join(algo_names(self.env_kind))}"
            )
        require(
            self.init is None,
            "init",
            self.init,
            "null on a gymnasium env",
            f"init=<SFT run> starts text-task runs ({', '.join(algo_names(*TEXT_KINDS))})",
        )
        self.algo.check_rollout(self.env.n_envs)  # cross-group: the rollout is algo.n_steps * env.n_envs
        if self.hardware.vec_env == "envpool":
            check_envpool(
                self.env.id,
                self.env.pixels,
                kwargs=self.env.kwargs,
                n_wrappers=len(self.env.wrappers),
                algo=self.algo.name,
            )

    def _check_image(self) -> None:
        """Cross-group rules of an image run (docs/pixels.md): an image env and model=cnn go together, and TRPO's
        critic process needs a torso of its own (the spaces and the torso's frame size are
        :mod:`pgcli.training.checks`')."""
        env_id = self.env.id
        if self.env.pixels is None:
            raise ConfigError(
                f"model=cnn needs an image env (env=pong, env=minatar_breakout, ...: an env.pixels "
                f"section); env.id {env_id!r} has none: use model=mlp"
            )
        if not isinstance(self.model, CNNModelConfig):
            text = isinstance(self.model, LMModelConfig | HFModelConfig)
            got = f"model={self.model.name}" if text else "an MLP model option"
            raise ConfigError(f"env.id {env_id!r} is an image env (env.pixels is set): it needs model=cnn (got {got})")
        if isinstance(self.algo, TRPOConfig) and self.algo.critic_process and self.model.share_features:
            raise ConfigError(
                "algo.critic_process=true needs model.share_features=false: the critic process fits the "
                "value network while the policy step moves the torso they share"
            )

    def _check_text(self) -> None:
        """Cross-group rules of a text run: a text algo, a language model (TinyGPT or Hugging Face), no videos (the
        prompts' fit in ``model.max_len`` needs the task: :mod:`pgcli.training.checks`)."""
        if not ALGOS[self.algo.name].trains_on(*TEXT_KINDS):
            able = ", ".join(algo_names(*TEXT_KINDS))
            raise ConfigError(
                f"algo={self.algo.name} does not train on text tasks; env={self.env.id} takes algo={able}"
            )
        if not isinstance(self.model, LMModelConfig | HFModelConfig):
            raise ConfigError(
                f"env={self.env.id} is a text task: it needs model=tiny_gpt or model=hf (got an MLP model option)"
            )
        self.algo.check_text_env()
        self._check_turns()
        require(
            self.eval.video_every == 0,
            "eval.video_every",
            self.eval.video_every,
            "0 on a text task",
            "a text task has no frames; its evaluations write samples/step_<n>.json instead",
        )
        if self.init is not None:
            require(bool(str(self.init).strip()), "init", self.init, "a run id or a run directory")
        if isinstance(self.algo, RMConfig) and self.algo.pairs == "policy":  # docs/lm.md, "Reward models"
            require(
                self.init is not None,
                "init",
                self.init,
                "an SFT run with algo.pairs=policy",
                "its wrong "
                "samples are the rejected completions: set init=<SFT run id | run dir>, or use "
                "algo.pairs=checker",
            )

    def _check_turns(self) -> None:
        """A multi-turn task trains with Flow-GRPO, whole-trajectory GRPO or SFT (its turns as demonstrations), and
        Flow-GRPO needs one (docs/lm.md, "Multi-turn agents")."""
        multi_turn, entry = self.env_kind == "multi-turn", ALGOS[self.algo.name]
        if not multi_turn and not entry.trains_on("text"):
            raise ConfigError(
                f"algo={self.algo.name} trains on multi-turn tasks (env=countdown_tool); "
                f"env={self.env.id} is single-turn: use algo=grpo"
            )
        if multi_turn and not entry.trains_on("multi-turn"):
            raise ConfigError(
                f"env={self.env.id} is a multi-turn task: it trains with algo={', '.join(algo_names('multi-turn'))} "
                f"(got algo={self.algo.name})"
            )
        if multi_turn and isinstance(self.algo, GRPOConfig):
            require(
                self.algo.loss_agg != "seq_mean",
                "algo.loss_agg",
                self.algo.loss_agg,
                "token_mean or constant with algo=grpo on a multi-turn task",
                "a trajectory's turns are separate samples, so a "
                "per-sequence mean would weigh turns, not trajectories; algo=flow_grpo weighs turns",
            )

    @property
    def env_kind(self) -> str:
        """The kind of env (:data:`pgcli.config.algos.KINDS`): ``control``, ``image`` (``env.pixels``), ``text`` or
        ``multi-turn``; the catalogue's trainer of that kind trains the run."""
        if isinstance(self.env, TextEnvConfig):
            return "multi-turn" if isinstance(self.env, AGENT_ENV_CONFIGS) else "text"
        return "image" if self.env.pixels is not None else "control"

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
