"""The one environment builder every trainer uses (ours and, through an adapter, SB3's).

A pgcli env is a gymnasium ``VectorEnv`` in *same-step* autoreset mode: when a sub-env's episode ends, ``step`` returns
the first observation of the next episode and puts the true final observation in ``info["final_obs"]`` (masked by
``info["_final_obs"]``), which is what bootstrapping a truncated episode needs. Per sub-env the wrappers are::

    gym.make(id, max_episode_steps, **kwargs) -> RecordEpisodeStatistics (raw return/length) -> env.wrappers
    -> FlattenObservation (Box observations of rank != 1) -> RescaleAction([-1, 1], bounded Box actions)

and over the vector env an optional :class:`VecNormalize` (running observation / return statistics, as SB3's
VecNormalize), whose state is saved with the model and frozen for evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from pgcli.config import EnvConfig
from pgcli.envspec import apply_wrappers, registered_id

EVAL_SEED_OFFSET = 10_000
"""Evaluation envs are seeded with seed + this, so they never replay the training episodes."""


def make_env(cfg: EnvConfig) -> gym.Env:
    """One sub-env: ``gymnasium.make`` (a ``module:EnvId`` id imports its module first) wrapped by :func:`wrap_env`."""
    registered_id(cfg.id)  # imports the module of a `module:EnvId` id (also from the working directory)
    return wrap_env(gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **dict(cfg.kwargs)), cfg)


def wrap_env(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    """The wrappers every trainer sees, innermost first.

    RecordEpisodeStatistics comes first, so returns are the env's own (as rl-baselines3-zoo's Monitor records them),
    then ``env.wrappers``; a Box observation of rank != 1 (a frame stack) is flattened for the MLPs; bounded Box
    actions are rescaled to [-1, 1].
    """
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = apply_wrappers(env, cfg.wrappers)
    obs_space, action_space = env.observation_space, env.action_space
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) != 1:
        env = gym.wrappers.FlattenObservation(env)
    if cfg.rescale_actions and isinstance(action_space, gym.spaces.Box) and _bounded(action_space):
        ones = np.ones(action_space.shape, dtype=np.float32)
        env = gym.wrappers.RescaleAction(env, min_action=-ones, max_action=ones)
    return env


def _bounded(space: gym.spaces.Box) -> bool:
    return bool(np.isfinite(space.low).all() and np.isfinite(space.high).all())


def make_vec_env(
    cfg: EnvConfig,
    *,
    seed: int,
    n_envs: int | None = None,
    vectorization: str = "sync",
    gamma: float = 0.99,
) -> VectorEnv:
    """Build the vectorised env described by ``cfg`` and reset it with ``seed`` (sub-env i gets seed + i).

    Args:
        cfg: the validated env config.
        seed: base seed; the action space is seeded with it too.
        n_envs: number of sub-envs (default ``cfg.n_envs``).
        vectorization: 'sync' (one process) or 'async' (one subprocess per sub-env).
        gamma: discount used by return-based reward normalisation.
    """
    n = cfg.n_envs if n_envs is None else n_envs
    fns = [lambda: make_env(cfg) for _ in range(n)]
    venv: VectorEnv
    if vectorization == "async":
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


class RunningMeanStd:
    """Parallel running mean / variance (Chan et al.), as in SB3 and gymnasium."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        """Fold a batch [B, *shape] into the statistics."""
        b_mean, b_var, b_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": np.asarray(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64).copy()
        self.var = np.asarray(state["var"], dtype=np.float64).copy()
        self.count = float(state["count"])


class VecNormalize(VectorWrapper):
    """Observation and reward normalisation over a same-step-autoreset vector env.

    Observations: ``clip((obs - mean) / sqrt(var + eps), +-clip_obs)`` with running statistics (also applied to
    ``info["final_obs"]``). Rewards: divided by the running std of the discounted return (Engstrom et al., 2020;
    SB3's VecNormalize), then clipped. Set ``training = False`` to freeze the statistics (evaluation).
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        norm_obs: bool,
        norm_reward: bool,
        clip_obs: float,
        clip_reward: float,
        gamma: float,
        epsilon: float = 1e-8,
    ) -> None:
        super().__init__(env)
        self.norm_obs, self.norm_reward = norm_obs, norm_reward
        self.clip_obs, self.clip_reward, self.gamma, self.epsilon = clip_obs, clip_reward, gamma, epsilon
        self.obs_rms = RunningMeanStd(tuple(env.single_observation_space.shape or ()))
        self.ret_rms = RunningMeanStd(())
        self.returns = np.zeros(env.num_envs)
        self.training = True

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        if not self.norm_obs:
            return obs
        out = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon)
        return np.clip(out, -self.clip_obs, self.clip_obs).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        # options={"reset_mask": m} resets only the sub-envs in m (gymnasium pops the key, so read it first)
        rows = slice(None) if options is None or "reset_mask" not in options else options["reset_mask"].copy()
        obs, info = self.env.reset(seed=seed, options=options)
        self.returns[rows] = 0.0
        if self.training and self.norm_obs:
            self.obs_rms.update(obs[rows])
        return self.normalize_obs(obs), info

    def step(self, actions):  # type: ignore[override]
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        if self.training and self.norm_obs:
            self.obs_rms.update(obs)
        if "final_obs" in info:
            final = info["final_obs"].copy()
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = self.normalize_obs(final[i])
            info = {**info, "final_obs": final}
        if self.norm_reward:
            self.returns = self.returns * self.gamma + rewards
            if self.training:
                self.ret_rms.update(self.returns)
            rewards = np.clip(rewards / np.sqrt(self.ret_rms.var + self.epsilon), -self.clip_reward, self.clip_reward)
            self.returns[terminated | truncated] = 0.0
        return self.normalize_obs(obs), rewards, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {"obs_rms": self.obs_rms.state_dict(), "ret_rms": self.ret_rms.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obs_rms.load_state_dict(state["obs_rms"])
        self.ret_rms.load_state_dict(state["ret_rms"])


def find_normalizer(env: VectorEnv) -> VecNormalize | None:
    """The env's :class:`VecNormalize` wrapper, if it has one."""
    while isinstance(env, VectorWrapper):
        if isinstance(env, VecNormalize):
            return env
        env = env.env
    return None


def normalizer_state(env: VectorEnv) -> dict[str, Any] | None:
    """Statistics to save with a model (None when the env does not normalise)."""
    norm = find_normalizer(env)
    return None if norm is None else norm.state_dict()


def load_normalizer_state(env: VectorEnv, state: dict[str, Any] | None, *, training: bool) -> None:
    """Copy saved statistics into ``env``'s normaliser and set whether it keeps updating them."""
    norm = find_normalizer(env)
    if norm is not None:
        if state is not None:
            norm.load_state_dict(state)
        norm.training = training


@dataclass
class Episodes:
    """Episodes that ended in one vector step: raw (unnormalised) returns and lengths."""

    returns: list[float]
    lengths: list[int]


def finished_episodes(info: dict[str, Any]) -> Episodes:
    """Raw returns and lengths of the episodes that ended in this step (from RecordEpisodeStatistics)."""
    final = info.get("final_info")
    if not final or "episode" not in final:
        return Episodes([], [])
    ep, mask = final["episode"], final["_episode"]
    idx = np.flatnonzero(mask)
    return Episodes([float(ep["r"][i]) for i in idx], [int(ep["l"][i]) for i in idx])


def final_observations(obs: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """``obs`` with the rows of sub-envs whose episode ended replaced by their true final observation."""
    if "final_obs" not in info:
        return obs
    out = obs.copy()
    for i in np.flatnonzero(info["_final_obs"]):
        out[i] = info["final_obs"][i]
    return out


def reward_threshold(cfg: EnvConfig) -> float | None:
    """The configured or registered return at which the task counts as solved."""
    if cfg.reward_threshold is not None:
        return cfg.reward_threshold
    return gym.spec(registered_id(cfg.id)).reward_threshold


def save_normalizer(env: VectorEnv, path: Path) -> None:
    """Write the env's normalisation statistics to ``path/normalizer.npz`` (nothing when it has none)."""
    state = normalizer_state(env)
    if state is not None:
        np.savez(path / "normalizer.npz", **{f"{k}.{kk}": v for k, d in state.items() for kk, v in d.items()})


def load_saved_normalizer(env: VectorEnv, path: Path) -> None:
    """Restore statistics written by :func:`save_normalizer` (frozen: evaluation or enjoy)."""
    file = path / "normalizer.npz"
    if file.exists():
        data = np.load(file)
        state: dict[str, dict[str, Any]] = {}
        for key in data.files:
            outer, inner = key.split(".")
            state.setdefault(outer, {})[inner] = data[key]
        load_normalizer_state(env, state, training=False)
