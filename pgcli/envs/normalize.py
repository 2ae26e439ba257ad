"""Observation and reward normalisation (``env.normalize_obs`` / ``env.normalize_reward``): :class:`VecNormalize`
over a vector env, its running statistics, and their state as saved with a model and loaded, frozen, for evaluation.

The statistics are SB3's VecNormalize's (Engstrom et al., 2020, for the reward scale), bit for bit the numpy
expressions (tests/unit/test_shmenv.py), computed with fewer temporaries: the vector env updates them on every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper


def batch_mean_var(batch: np.ndarray) -> tuple[Any, Any]:
    """``(batch.mean(axis=0), batch.var(axis=0))``, bit for bit, for a float64 batch [B, *shape] in a third of the
    time: the same ufunc reductions numpy's ``_mean`` / ``_var`` run, without their Python-level bookkeeping (the
    vector env calls this twice per step; tests/unit/test_shmenv.py compares). Other dtypes go through numpy."""
    if batch.dtype != np.float64:
        return batch.mean(axis=0), batch.var(axis=0)
    n = batch.shape[0]
    mean = np.add.reduce(batch, axis=0) / n
    return mean, np.add.reduce(np.square(batch - mean), axis=0) / n


_clip = (np._core if hasattr(np, "_core") else np.core).umath.clip  # numpy >= 2 : numpy 1.x
"""The ufunc ``np.clip`` dispatches to (the same results), called directly on the vector env's per-step path."""


class RunningMeanStd:
    """Parallel running mean / variance (Chan et al.), as in SB3 and gymnasium."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        """Fold a batch [B, *shape] into the statistics: mean += delta * b / n and
        var = (var * count + b_var * b + delta^2 * count * b / n) / n, n = count + b, evaluated in that order (the
        temporaries updated in place: the vector env calls this twice per step)."""
        (b_mean, b_var), b_count = batch_mean_var(batch), batch.shape[0]
        count = self.count
        total = count + b_count
        delta = b_mean - self.mean
        step = delta * b_count
        step /= total
        self.mean = self.mean + step
        m2 = self.var * count
        m2 += b_var * b_count
        square = np.square(delta)
        square *= count
        square *= b_count
        square /= total
        m2 += square
        m2 /= total
        self.var = m2
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
        out = obs - self.obs_rms.mean
        out /= np.sqrt(self.obs_rms.var + self.epsilon)
        return _clip(out, -self.clip_obs, self.clip_obs, out=out).astype(np.float32)

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
            returns = self.returns * self.gamma
            returns += rewards
            self.returns = returns
            if self.training:
                self.ret_rms.update(returns)
            rewards = rewards / np.sqrt(self.ret_rms.var + self.epsilon)
            rewards = _clip(rewards, -self.clip_reward, self.clip_reward, out=rewards)
            returns[terminated | truncated] = 0.0
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
