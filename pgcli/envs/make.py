"""The one environment builder every trainer uses (ours and, through an adapter, SB3's).

A pgcli env is a gymnasium ``VectorEnv`` in *same-step* autoreset mode: when a sub-env's episode ends, ``step`` returns
the first observation of the next episode and puts the true final observation in ``info["final_obs"]`` (masked by
``info["_final_obs"]``), which is what bootstrapping a truncated episode needs. Per sub-env the wrappers are::

    gym.make(id, max_episode_steps, **kwargs) -> RecordEpisodeStatistics (raw return/length) -> env.wrappers
    -> FlattenObservation (Box observations of rank != 1) -> RescaleAction([-1, 1], bounded Box actions)
    -> EpisodeState (snapshots of the episode in progress, for checkpoints)

and over the vector env an optional :class:`VecNormalize` (running observation / return statistics, as SB3's
VecNormalize), whose state is saved with the model and frozen for evaluation.

:func:`env_state` / :func:`restore_env_state` capture and restore everything a checkpoint needs to continue the
episodes in progress exactly (docs/checkpoints.md): each sub-env's simulator state (classic control's ``state``,
MuJoCo's integration state), its time-limit and episode-statistics counters, its ``np_random`` and action-space
RNGs, the last observation, and VecNormalize's discounted-return accumulator. Plain values only (JSON).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import concatenate, create_empty_array

from pgcli.config import EnvConfig
from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.envs.spec import apply_wrappers, registered_id
from pgcli.envs.worker import WorkerVectorEnv
from pgcli.hardware.placement import usable_cpus

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
            infos, about 11 us less per step of one normalised Hopper env; what evaluations step).
        gamma: discount used by return-based reward normalisation.
    """
    n = cfg.n_envs if n_envs is None else n_envs
    fns = [partial(make_env, cfg) for _ in range(n)]
    venv: VectorEnv
    if vectorization == "worker" and n >= 2 and usable_cpus() >= 2:  # else nothing to gain
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


class EpisodeState(gym.Wrapper):
    """The outermost wrapper of each sub-env: remembers the observation it returned last and reads / writes a
    snapshot of the episode in progress as the ``episode_state`` attribute, which the vector env reaches through
    ``get_attr`` / ``set_attr`` (in this process or, with async vectorisation, in the sub-env's own).

    The snapshot holds plain values only: the simulator state (:func:`_sim_state`), the counters of the wrappers
    below (time limit, episode statistics), the env's ``np_random`` and the action space's RNG, and the last
    observation. An env whose simulator state pgcli cannot read (``sim`` is None) starts a new episode when the
    snapshot is written back, drawing its start state from the restored ``np_random``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.last_obs: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.last_obs = obs
        return obs, reward, terminated, truncated, info

    @property
    def episode_state(self) -> dict[str, Any]:
        return {
            "sim": _sim_state(self.env.unwrapped),
            "wrappers": [[type(w).__name__, _wrapper_state(w)] for w in _wrapper_chain(self.env)],
            "np_random": self.env.unwrapped.np_random.bit_generator.state,
            "action_space": self.action_space.np_random.bit_generator.state,
            "last_obs": _encode(self.last_obs),
        }

    @episode_state.setter
    def episode_state(self, state: dict[str, Any]) -> None:
        self.env.unwrapped.np_random.bit_generator.state = state["np_random"]
        self.action_space.np_random.bit_generator.state = state["action_space"]
        if state["sim"] is None:  # unknown simulator: a new episode from the restored RNG
            self.reset()
            return
        _set_sim_state(self.env.unwrapped, state["sim"])
        chain = _wrapper_chain(self.env)
        if [type(w).__name__ for w in chain] != [name for name, _ in state["wrappers"]]:
            raise ValueError(f"wrapper chain {[type(w).__name__ for w in chain]} differs from the saved one")
        for wrapper, (_, saved) in zip(chain, state["wrappers"], strict=True):
            _set_wrapper_state(wrapper, saved)
        self.last_obs = _decode(state["last_obs"])


def _wrapper_chain(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def _wrapper_state(wrapper: gym.Wrapper) -> dict[str, Any] | None:
    """The counters of the gymnasium wrappers that carry episode state (None for stateless ones)."""
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        return {"elapsed_steps": wrapper._elapsed_steps}
    if isinstance(wrapper, gym.wrappers.RecordEpisodeStatistics):
        elapsed_s = time.perf_counter() - wrapper.episode_start_time
        return {"return": float(wrapper.episode_returns), "length": wrapper.episode_lengths,
                "count": wrapper.episode_count, "elapsed_s": elapsed_s}  # fmt: skip
    if isinstance(wrapper, gym.wrappers.OrderEnforcing):
        return {"has_reset": wrapper._has_reset}
    return None


def _set_wrapper_state(wrapper: gym.Wrapper, state: dict[str, Any] | None) -> None:
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        assert state is not None
        wrapper._elapsed_steps = state["elapsed_steps"]
    elif isinstance(wrapper, gym.wrappers.RecordEpisodeStatistics):
        assert state is not None
        wrapper.episode_returns, wrapper.episode_lengths = state["return"], state["length"]
        wrapper.episode_count, wrapper.episode_start_time = state["count"], time.perf_counter() - state["elapsed_s"]
    elif isinstance(wrapper, gym.wrappers.OrderEnforcing):
        assert state is not None
        wrapper._has_reset = state["has_reset"]


def _classic_control_attrs(env: gym.Env) -> tuple[str, ...] | None:
    """The attributes that hold a classic-control env's whole dynamic state (None for other envs)."""
    from gymnasium.envs import classic_control as cc

    table: dict[type, tuple[str, ...]] = {
        cc.CartPoleEnv: ("state", "steps_beyond_terminated"),
        cc.AcrobotEnv: ("state",),
        cc.PendulumEnv: ("state", "last_u"),
        cc.Continuous_MountainCarEnv: ("state",),
        cc.MountainCarEnv: ("state",),
    }
    return table.get(type(env))


def _sim_state(env: gym.Env) -> dict[str, Any] | None:
    """A simulator's full dynamic state as plain values; None when pgcli does not know how to read it.

    MuJoCo: ``mj_getState(mjSTATE_INTEGRATION)``: time, qpos, qvel, actuator activations, the solver's warm start,
    controls and applied forces (qpos/qvel alone would change the next step in the last bits). Classic control: the
    env's ``state`` and its episode flags.
    """
    mujoco_env = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")  # loaded iff a MuJoCo env was made
    if mujoco_env is not None and isinstance(env, mujoco_env.MujocoEnv):
        import mujoco

        sim: Any = env
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(sim.model, spec))
        mujoco.mj_getState(sim.model, sim.data, state, spec)
        return {"mujoco": state.tolist()}
    attrs = _classic_control_attrs(env)
    return None if attrs is None else {name: _encode(getattr(env, name)) for name in attrs}


def _set_sim_state(env: Any, state: dict[str, Any]) -> None:
    if "mujoco" in state:
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        mujoco.mj_setState(env.model, env.data, np.asarray(state["mujoco"], dtype=np.float64), spec)
        mujoco.mj_forward(env.model, env.data)  # derived quantities (positions of bodies, contacts) for rendering
        return
    for name, value in state.items():
        setattr(env, name, _decode(value))


def _encode(value: Any) -> Any:
    """A numpy array or scalar as JSON (its exact values and dtype); other plain values unchanged."""
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return {"scalar": value.item(), "dtype": value.dtype.str}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "ndarray" in value:
        return np.asarray(value["ndarray"], dtype=np.dtype(value["dtype"]))
    if isinstance(value, dict) and "scalar" in value:
        return np.dtype(value["dtype"]).type(value["scalar"])
    return value


def _base_vector_env(env: VectorEnv) -> SyncVectorEnv | AsyncVectorEnv | WorkerVectorEnv | SharedMemoryVectorEnv:
    base = env.unwrapped
    if not isinstance(base, (SyncVectorEnv, AsyncVectorEnv, WorkerVectorEnv, SharedMemoryVectorEnv)):
        raise TypeError(f"expected a pgcli vector env, got {type(base).__name__}")
    return base


def env_state(env: VectorEnv) -> dict[str, Any]:
    """Everything needed to continue ``env``'s episodes in progress exactly (plain values; see the module doc)."""
    norm = find_normalizer(env)
    return {
        "n_envs": env.num_envs,
        "sub_envs": list(_base_vector_env(env).get_attr("episode_state")),
        "action_space": env.action_space.np_random.bit_generator.state,
        "normalizer": None if norm is None else {"returns": norm.returns.tolist(), "training": norm.training},
    }


def restore_env_state(env: VectorEnv, state: dict[str, Any]) -> np.ndarray | None:
    """Put ``env`` back into the saved :func:`env_state` and return the observation batch to act on next (what the
    env returned last, normalised as it was then).

    Sub-envs whose simulator pgcli cannot restore start new episodes (their rows of the returned batch are reset
    observations). Returns None, leaving ``env`` untouched, when its number of sub-envs differs from the saved one
    (e.g. a model loaded into an evaluation env).
    """
    if state["n_envs"] != env.num_envs:
        return None
    base = _base_vector_env(env)
    base.set_attr("episode_state", state["sub_envs"])
    env.action_space.np_random.bit_generator.state = state["action_space"]
    space = env.single_observation_space
    obs: np.ndarray = concatenate(space, base.get_attr("last_obs"), create_empty_array(space, n=env.num_envs))  # type: ignore[arg-type,assignment]  # Box spaces
    norm = find_normalizer(env)
    if norm is None or state["normalizer"] is None:
        return obs
    norm.returns = np.asarray(state["normalizer"]["returns"], dtype=np.float64)
    norm.returns[[sub["sim"] is None for sub in state["sub_envs"]]] = 0.0  # restarted episodes
    norm.training = bool(state["normalizer"]["training"])
    return norm.normalize_obs(obs)


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
