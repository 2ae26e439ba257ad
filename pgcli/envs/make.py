"""The one environment builder every trainer uses (ours and, through an adapter, SB3's): config in, seeded vector
env out.

A pgcli env is a gymnasium ``VectorEnv`` in *same-step* autoreset mode: when a sub-env's episode ends, ``step`` returns
the first observation of the next episode and puts the true final observation in ``info["final_obs"]`` (masked by
``info["_final_obs"]``), which is what bootstrapping a truncated episode needs. Per sub-env the wrappers are::

    gym.make(id, max_episode_steps, **kwargs) -> RecordEpisodeStatistics (raw return/length) -> env.wrappers
    -> FlattenObservation (Box observations of rank != 1) -> RescaleAction([-1, 1], bounded Box actions)
    -> EpisodeState (snapshots of the episode in progress, for checkpoints: ``pgcli.envs.state``)

An image env (``env.pixels``) keeps its frames, uint8 and channels first, and gets its preprocessing on both sides of
RecordEpisodeStatistics (``pgcli.envs.pixels``: the logged return is the raw score of whole games).

and over the vector env an optional ``VecNormalize`` (running observation / return statistics, as SB3's
VecNormalize; ``pgcli.envs.normalize``), whose state is saved with the model and frozen for evaluation. Which vector
env steps the sub-envs is ``hardware.vec_env`` (:func:`make_vec_env`); ``hardware.vec_env=envpool`` replaces the
sub-envs and their wrappers by EnvPool's Atari games (``pgcli.envs.atari_pool``, the same interface).
"""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from pgcli.config import EnvConfig
from pgcli.envs.atari_pool import EnvPoolVectorEnv
from pgcli.envs.normalize import VecNormalize
from pgcli.envs.pixels import quiet_ale, wrap_above_monitor, wrap_below_monitor
from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.envs.spec import apply_wrappers, registered_id
from pgcli.envs.state import EpisodeState
from pgcli.envs.worker import WorkerVectorEnv
from pgcli.hardware.placement import usable_cpus

EVAL_SEED_OFFSET = 10_000
"""Evaluation envs are seeded with seed + this, so they never replay the training episodes."""


def make_env(cfg: EnvConfig, *, training: bool = True) -> gym.Env:
    """One sub-env: ``gymnasium.make`` (a ``module:EnvId`` id imports its module first) wrapped by :func:`wrap_env`."""
    registered_id(cfg.id)  # imports the module of a `module:EnvId` id (also from the working directory)
    quiet_ale(cfg.id)
    env = gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **dict(cfg.kwargs))
    return wrap_env(env, cfg, training=training)


def wrap_env(env: gym.Env, cfg: EnvConfig, *, training: bool = True) -> gym.Env:
    """The wrappers every trainer sees, innermost first.

    RecordEpisodeStatistics comes first, so returns are the env's own (as rl-baselines3-zoo's Monitor records them),
    then ``env.wrappers``; a Box observation of rank != 1 (a frame stack) is flattened for the MLPs; bounded Box
    actions are rescaled to [-1, 1]. An image env (``env.pixels``) has its no-op starts and frame skip below the
    monitor, the rest of its preprocessing above it (the life handling and reward clipping only when ``training``),
    and keeps its frames.
    """
    if cfg.pixels is not None:
        env = wrap_below_monitor(env, cfg.pixels)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if cfg.pixels is not None:
        env = wrap_above_monitor(env, cfg.pixels, training=training)
    env = apply_wrappers(env, cfg.wrappers)
    obs_space, action_space = env.observation_space, env.action_space
    if cfg.pixels is None and isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) != 1:
        env = gym.wrappers.FlattenObservation(env)
    if cfg.rescale_actions and isinstance(action_space, gym.spaces.Box) and _bounded(action_space):
        ones = np.ones(action_space.shape, dtype=np.float32)
        env = gym.wrappers.RescaleAction(env, min_action=-ones, max_action=ones)
    return EpisodeState(env)


def _bounded(space: gym.spaces.Box) -> bool:
    return bool(np.isfinite(space.low).all() and np.isfinite(space.high).all())


def make_vec_env(
    cfg: EnvConfig,
    *,
    seed: int,
    n_envs: int | None = None,
    vectorization: str = "sync",
    gamma: float = 0.99,
    training: bool = True,
) -> VectorEnv:
    """Build the vectorised env described by ``cfg`` and reset it with ``seed`` (sub-env i gets seed + i).

    Args:
        cfg: the validated env config.
        seed: base seed; the action space is seeded with it too.
        n_envs: number of sub-envs (default ``cfg.n_envs``).
        vectorization: 'sync' (one process), 'async' (one subprocess per sub-env), 'worker' (half the sub-envs in
            one worker process, stepped while this process steps the others; ``pgcli.envs.worker``; 'sync' with one
            sub-env or one usable CPU: the same results either way) or 'shm' (the same split, synchronised through
            shared memory, with lean infos; ``pgcli.envs.shm``; all sub-envs in this process with one usable CPU) or
            'lean' (that env's lean step with every sub-env in this process: the sync env's arrays and end-of-episode
            infos, about 11 us less per step of one normalised Hopper env; what evaluations step) or 'envpool' (an
            Atari game on EnvPool's threads, one per usable CPU, with EnvPool's preprocessing;
            ``pgcli.envs.atari_pool``).
        gamma: discount used by return-based reward normalisation.
        training: an image env's training-only preprocessing (life loss ends an episode, reward signs); False for
            evaluation envs, which play whole games on the raw rewards (docs/pixels.md).
    """
    n = cfg.n_envs if n_envs is None else n_envs
    fns = [partial(make_env, cfg, training=training) for _ in range(n)]
    venv: VectorEnv
    if vectorization == "envpool":  # EnvPool's own games and preprocessing (pgcli.envs.atari_pool)
        venv = EnvPoolVectorEnv(cfg, n_envs=n, seed=seed, n_threads=usable_cpus(), training=training)
    elif vectorization == "worker" and n >= 2 and usable_cpus() >= 2:  # else nothing to gain
        venv = WorkerVectorEnv(fns)
    elif vectorization == "shm":  # one sub-env or one usable CPU: all in this process (the same lean step)
        venv = SharedMemoryVectorEnv(fns, n_worker=n // 2 if usable_cpus() >= 2 else 0)
    elif vectorization == "lean":
        venv = SharedMemoryVectorEnv(fns, n_worker=0)
    elif vectorization == "async":
        venv = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        venv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    if cfg.normalize_obs or cfg.normalize_reward:
        venv = VecNormalize(
            venv,
            norm_obs=cfg.normalize_obs,
            norm_reward=cfg.normalize_reward,
            clip_obs=cfg.clip_obs,
            clip_reward=cfg.clip_reward,
            gamma=gamma,
        )
    venv.reset(seed=seed)
    venv.action_space.seed(seed)
    return venv


def reward_threshold(cfg: EnvConfig) -> float | None:
    """The configured or registered return at which the task counts as solved."""
    if cfg.reward_threshold is not None:
        return cfg.reward_threshold
    return gym.spec(registered_id(cfg.id)).reward_threshold
