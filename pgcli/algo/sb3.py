"""Stable-Baselines3 baselines (PPO, A2C) and sb3-contrib's TRPO behind pgcli's trainer interface.

SB3 trains on the *same* env pgcli builds for its own trainers (``pgcli.envs.make.make_vec_env``: same wrappers, same
normalisation, same seeds) through :class:`SB3VecEnv`, an adapter from gymnasium's same-step-autoreset vector env to
SB3's ``VecEnv`` API. SB3's logger is routed into the run's logger with pgcli's metric keys (:data:`SB3_KEYS`);
episode statistics, evaluation, checkpoints and progress go through the run's monitor
(:class:`pgcli.contracts.Monitor`).

The monitor's per-update bookkeeping runs after each of SB3's updates (at the start of the next rollout, and once
after ``learn``), so a checkpoint holds the updated model and an exact place to continue from: SB3's ``model.zip``
(policy, optimizer, ``num_timesteps``, schedule progress, last observation) plus pgcli's ``state.json`` (RNG states,
the env's episodes in progress) and ``normalizer.npz`` (pgcli.algo.checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import VecEnv

from pgcli.algo.checkpoint import atomic_dir, load_training_state, read_file, save_training_state
from pgcli.algo.cnn import make_torso
from pgcli.algo.guard import check_update, describe
from pgcli.algo.networks import ACTIVATIONS
from pgcli.config import A2CConfig, ModelConfig, PPOConfig, SB3TRPOConfig
from pgcli.config.pixels import CNNModelConfig
from pgcli.contracts import Monitor

# SB3 logger key -> pgcli key (None: dropped because the monitor logs its own from the same episodes / clock).
SB3_KEYS: dict[str, str | None] = {
    "rollout/ep_rew_mean": None,
    "rollout/ep_len_mean": None,
    "train/entropy_loss": "train/entropy",  # negated below: SB3 logs -mean(entropy)
    "train/policy_gradient_loss": "train/policy_loss",
    "train/kl_divergence_loss": "train/kl",
    "train/is_line_search_success": "train/line_search_success",
    "train/policy_objective": "train/surrogate",
}
GUARDED_KEYS = ("train/loss", "train/policy_loss", "train/value_loss")
"""SB3 losses (pgcli names) the divergence guard checks whenever SB3 dumps its logger."""
MIN_STEPS_PER_DUMP = 2048
"""SB3 dumps its logger every ``log_interval`` updates; pick it so a dump covers at least this many env steps."""


def policy_kwargs(model: ModelConfig | CNNModelConfig) -> dict[str, Any]:
    """The backend-neutral model config as SB3 ``policy_kwargs`` (separate policy and value networks; for
    ``model=cnn``, pgcli's CNN torso as the features extractor, shared or one each, and the heads after it)."""
    kwargs: dict[str, Any] = {
        "net_arch": {"pi": list(model.pi_hidden_sizes), "vf": list(model.vf_hidden_sizes)},
        "activation_fn": ACTIVATIONS[model.activation].module,
        "ortho_init": model.ortho_init,
        "log_std_init": model.log_std_init,
    }
    if isinstance(model, CNNModelConfig):
        kwargs["features_extractor_class"] = CNNFeatures
        kwargs["features_extractor_kwargs"] = {"arch": model.arch}
        kwargs["share_features_extractor"] = model.share_features
    return kwargs


def sb3_policy(model: ModelConfig | CNNModelConfig) -> str:
    """SB3's policy class for ``model``: ``CnnPolicy`` (frames; SB3 scales uint8 images to [0, 1]) or ``MlpPolicy``."""
    return "CnnPolicy" if isinstance(model, CNNModelConfig) else "MlpPolicy"


class CNNFeatures(BaseFeaturesExtractor):
    """pgcli's CNN torso (:mod:`pgcli.algo.cnn`, ``model.arch``) as SB3's features extractor."""

    def __init__(self, observation_space: Any, arch: str = "auto") -> None:
        torso = make_torso(arch, tuple(observation_space.shape))
        super().__init__(observation_space, torso.features_dim)
        self.torso = torso

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.torso(observations)


def _schedule(value: float, kind: str) -> float | Callable[[float], float]:
    """SB3 schedules take progress_remaining (1 -> 0); 'linear' is rl-baselines3-zoo's lin_<value>.

    progress_remaining = 1 - num_timesteps / total_timesteps goes below 0 on the last update when the last rollout
    overshoots total_steps (SB3 finishes every rollout it starts), which made the learning rate and clip range
    negative there; the schedule stops at its final value, 0.
    """
    return value if kind == "constant" else (lambda progress: max(progress, 0.0) * value)


def _ppo(cfg: PPOConfig) -> tuple[type[BaseAlgorithm], dict[str, Any]]:
    return PPO, {
        "learning_rate": _schedule(cfg.learning_rate, cfg.lr_schedule),
        "n_steps": cfg.n_steps,
        "batch_size": cfg.batch_size,
        "n_epochs": cfg.n_epochs,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "clip_range": _schedule(cfg.clip_range, cfg.clip_range_schedule),
        "clip_range_vf": None if cfg.clip_range_vf is None else _schedule(cfg.clip_range_vf, cfg.clip_range_schedule),
        "normalize_advantage": cfg.normalize_advantage,
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "target_kl": cfg.target_kl,
        "use_sde": cfg.use_sde,
        "sde_sample_freq": cfg.sde_sample_freq,
    }


def _a2c(cfg: A2CConfig) -> tuple[type[BaseAlgorithm], dict[str, Any]]:
    optimizer: dict[str, Any] = {}
    if cfg.rms_prop_tf_like:  # what SB3's A2C builds for use_rms_prop, with TensorFlow's RMSprop in place of torch's
        from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

        optimizer = {
            "optimizer_class": RMSpropTFLike,
            "optimizer_kwargs": {"alpha": 0.99, "eps": cfg.rms_prop_eps, "weight_decay": 0},
        }
    return A2C, {
        "policy_kwargs": optimizer,
        "learning_rate": _schedule(cfg.learning_rate, cfg.lr_schedule),
        "n_steps": cfg.n_steps,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "use_rms_prop": cfg.use_rms_prop,
        "rms_prop_eps": cfg.rms_prop_eps,
        "normalize_advantage": cfg.normalize_advantage,
        "use_sde": cfg.use_sde,
        "sde_sample_freq": cfg.sde_sample_freq,
    }


def _sb3_trpo(cfg: SB3TRPOConfig) -> tuple[type[BaseAlgorithm], dict[str, Any]]:
    from sb3_contrib import TRPO

    return TRPO, {
        "learning_rate": cfg.learning_rate,
        "n_steps": cfg.n_steps,
        "batch_size": cfg.batch_size,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "cg_max_steps": cfg.cg_max_steps,
        "cg_damping": cfg.cg_damping,
        "line_search_shrinking_factor": cfg.line_search_shrinking_factor,
        "line_search_max_iter": cfg.line_search_max_iter,
        "n_critic_updates": cfg.n_critic_updates,
        "normalize_advantage": cfg.normalize_advantage,
        "target_kl": cfg.target_kl,
        "sub_sampling_factor": cfg.sub_sampling_factor,
        "use_sde": cfg.use_sde,
        "sde_sample_freq": cfg.sde_sample_freq,
    }


SB3_ALGOS: dict[type, Callable[[Any], tuple[type[BaseAlgorithm], dict[str, Any]]]] = {
    PPOConfig: _ppo,
    A2CConfig: _a2c,
    SB3TRPOConfig: _sb3_trpo,
}


class SB3VecEnv(VecEnv):
    """SB3's ``VecEnv`` API over a pgcli (gymnasium, same-step autoreset) vector env.

    Ended episodes carry ``terminal_observation`` (the true final observation, for SB3's truncation bootstrap),
    ``TimeLimit.truncated`` and the raw ``episode`` statistics, exactly as SB3's own DummyVecEnv + Monitor give them.
    """

    def __init__(self, venv: VectorEnv) -> None:
        self.venv = venv
        self._base: Any = venv.unwrapped  # Sync/AsyncVectorEnv: get_attr/set_attr/call live there, not on wrappers
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None
        self.last_info: dict[str, Any] = {}

    def reset(self) -> np.ndarray:
        seed = self._seeds[0] if self._seeds and self._seeds[0] is not None else None
        obs, self.last_info = self.venv.reset(seed=seed)
        self._reset_seeds()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        obs, rewards, terminated, truncated, info = self.venv.step(self._actions)
        self.last_info = info
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        final_info = info.get("final_info", {})
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = info["final_obs"][i]
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if "episode" in final_info and final_info["_episode"][i]:
                ep = final_info["episode"]
                infos[i]["episode"] = {"r": float(ep["r"][i]), "l": int(ep["l"][i]), "t": float(ep["t"][i])}
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        values = self._base.get_attr(attr_name)
        return [values[i] for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        self._base.set_attr(attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
        values = self._base.call(method_name, *method_args, **method_kwargs)
        return [values[i] for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]


class _MonitorWriter(KVWriter):
    """Routes SB3's logger into the run's logger, renamed to pgcli's metric keys."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        metrics: dict[str, float] = {}
        for key, value in key_values.items():
            if key.startswith("time/") or not isinstance(value, (int, float, np.number)):
                continue
            name = SB3_KEYS.get(key, key)
            if name is None:
                continue
            metrics[name] = -float(value) if key == "train/entropy_loss" else float(value)
        check_update(self.monitor, step, metrics, [k for k in GUARDED_KEYS if k in metrics], params=())
        self.monitor.log(step, metrics)

    def close(self) -> None:
        pass


class _MonitorCallback(BaseCallback):
    """Feeds SB3's rollouts to the shared monitor: episodes every step; after each update (when the next rollout
    starts; the trainer does it once more after the last update) the divergence check, SB3's ``train/*`` diagnostics
    every ``dump_every`` updates at the env step of the update they describe, and the monitor's bookkeeping."""

    def __init__(self, monitor: Monitor, agent: SB3Trainer, dump_every: int) -> None:
        super().__init__()
        self.monitor, self.agent, self.dump_every = monitor, agent, dump_every
        self.n_rollouts = 0

    def _on_rollout_start(self) -> None:
        self.agent.check_parameters(self.monitor)
        if self.n_rollouts > 0:  # an update happened since the last rollout (not so for a model loaded to resume)
            # SB3 records train/* during the update, so they belong to this step. SB3's own dump comes before the
            # update: it logged them one rollout late, and the last update twice at one step
            # (docs/tracking.md, "What is logged").
            if self.n_rollouts % self.dump_every == 0:
                self.agent.model.logger.dump(self.num_timesteps)
            self.monitor.update(self.model.num_timesteps, self.agent)
        self.n_rollouts += 1

    def _on_step(self) -> bool:
        new_obs = self.locals["new_obs"]
        if not np.isfinite(new_obs).all():  # before SB3's policy sees it (its distributions reject nan)
            raise self.monitor.diverged("observation", self.num_timesteps, describe(torch.as_tensor(new_obs)))
        returns, lengths = [], []
        for info in self.locals["infos"]:
            ep = info.get("episode")
            if ep is not None:
                returns.append(ep["r"])
                lengths.append(ep["l"])
        if returns:
            self.monitor.add_episodes(self.num_timesteps, returns, lengths)
        return True


class SB3Trainer:
    """PPO, A2C (SB3) or TRPO (sb3-contrib) on a pgcli env."""

    def __init__(
        self,
        cfg: PPOConfig | A2CConfig | SB3TRPOConfig,
        *,
        env: VectorEnv,
        model: ModelConfig | CNNModelConfig,
        seed: int,
        device: torch.device,
    ) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.algo_cls, kwargs = SB3_ALGOS[type(cfg)](cfg)
        self.vec = SB3VecEnv(env)
        self.model = self.algo_cls(
            sb3_policy(model),
            self.vec,
            policy_kwargs={**policy_kwargs(model), **kwargs.pop("policy_kwargs", {})},
            seed=seed,
            device=device,
            verbose=0,
            **kwargs,
        )

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        self.model.set_logger(Logger(folder=None, output_formats=[_MonitorWriter(monitor)]))
        steps_per_update = self.cfg.n_steps * self.vec.num_envs
        log_interval = max(1, math.ceil(MIN_STEPS_PER_DUMP / steps_per_update))
        remaining = total_steps - self.model.num_timesteps  # a loaded checkpoint continues its step count
        if remaining > 0:
            callback = _MonitorCallback(monitor, self, dump_every=log_interval)
            # reset_num_timesteps=False: num_timesteps and the schedules' progress continue from a loaded model;
            # log_interval=None: SB3 never dumps (the callback does); its time/* and rollout/* keys are the monitor's
            try:
                self.model.learn(
                    remaining,
                    callback=callback,
                    log_interval=None,  # type: ignore[arg-type]
                    reset_num_timesteps=False,
                )
            except ValueError:  # SB3's torch distributions reject non-finite parameters in the middle of an update
                self.check_parameters(monitor)  # a DivergenceError when that is the cause
                raise
            self.model.logger.dump(self.model.num_timesteps)  # the last update's train/*: no rollout start follows it
            self.check_parameters(monitor)
            monitor.update(self.model.num_timesteps, self)
        return int(self.model.num_timesteps)

    def check_parameters(self, monitor: Monitor) -> None:
        """Divergence guard: the policy's parameters after an update (one check on all of them)."""
        check_update(monitor, int(self.model.num_timesteps), {}, (), params=self.model.policy.parameters())

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        actions, _ = self.model.predict(obs, deterministic=deterministic)
        return actions

    def save(self, path: Path) -> Path:
        """``path/model.zip`` (SB3 format: policy, optimizer, step counters), ``normalizer.npz`` when the env
        normalises, and ``state.json`` (RNG and env states); written atomically."""
        with atomic_dir(path) as tmp:
            self.model.save(tmp / "model.zip")
            save_training_state(tmp, self.env, {})
        return path

    def load(self, path: Path) -> None:
        """Load a :meth:`save` directory. SB3's zip is read by SB3's own loader, which unpickles: load only zips
        written by your own runs (docs/checkpoints.md)."""
        self.model = read_file(path / "model.zip", lambda f: self.algo_cls.load(f, env=self.vec, device=self.device))
        restored = load_training_state(path, self.env)  # after SB3's load, which reseeds the global RNGs
        if restored.obs is not None:
            self.model._last_obs = restored.obs  # type: ignore[assignment]  # continue the episodes in progress

    def close(self) -> None:
        self.vec.close()
