"""The episodes in progress as plain values (JSON), for checkpoints that continue them exactly (docs/checkpoints.md).

:func:`env_state` / :func:`restore_env_state` capture and restore each sub-env's simulator state (classic control's
``state``, MuJoCo's integration state), its time-limit and episode-statistics counters, its ``np_random`` and
action-space RNGs, the last observation, and VecNormalize's discounted-return accumulator; for Atari games the ALE's
state (``pgcli.envs.atari_state``) and that of pgcli's Atari wrappers. The :class:`EpisodeState` wrapper, outermost
on every sub-env, reads and writes one sub-env's share, wherever that sub-env runs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array

from pgcli.envs.atari_pool import EnvPoolVectorEnv
from pgcli.envs.atari_state import ale_state, is_atari, restore_ale_state
from pgcli.envs.normalize import find_normalizer
from pgcli.envs.split import SplitVectorEnv


class EpisodeState(gym.Wrapper):
    """The outermost wrapper of each sub-env: remembers the observation it returned last and reads / writes a
    snapshot of the episode in progress as the ``episode_state`` attribute, which the vector env reaches through
    ``get_attr`` / ``set_attr`` (in this process or, with async vectorisation, in the sub-env's own).

    The snapshot holds plain values only: the simulator state (:func:`_sim_state`), the state of the wrappers below
    (time limit, episode statistics, pgcli's Atari life handling and frame stack), the env's ``np_random`` and the
    action space's RNG, and the last observation. An env whose simulator state pgcli cannot read (``sim`` is None)
    starts a new episode when the snapshot is written back, drawing its start state from the restored
    ``np_random``.
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
    """The counters of the gymnasium wrappers that carry episode state (None for stateless ones); a wrapper with
    ``checkpoint_state()`` / ``restore_checkpoint_state(state)`` (pgcli's Atari life handling and frame stack) says
    its own."""
    if callable(getattr(wrapper, "checkpoint_state", None)):  # gymnasium's wrappers do not forward attributes
        return {"own": wrapper.checkpoint_state()}  # type: ignore[attr-defined]
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        return {"elapsed_steps": wrapper._elapsed_steps}
    if isinstance(wrapper, gym.wrappers.RecordEpisodeStatistics):
        elapsed_s = time.perf_counter() - wrapper.episode_start_time
        return {
            "return": float(wrapper.episode_returns),
            "length": wrapper.episode_lengths,
            "count": wrapper.episode_count,
            "elapsed_s": elapsed_s,
        }
    if isinstance(wrapper, gym.wrappers.OrderEnforcing):
        return {"has_reset": wrapper._has_reset}
    return None


def _set_wrapper_state(wrapper: gym.Wrapper, state: dict[str, Any] | None) -> None:
    if callable(getattr(wrapper, "restore_checkpoint_state", None)):
        assert state is not None
        wrapper.restore_checkpoint_state(state["own"])  # type: ignore[attr-defined]
    elif isinstance(wrapper, gym.wrappers.TimeLimit):
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
    controls and applied forces (qpos/qvel alone would change the next step in the last bits). Atari: the ALE's state
    with its RNG (``pgcli.envs.atari_state``). Classic control: the env's ``state`` and its episode flags. An env
    with ``checkpoint_state()`` / ``restore_checkpoint_state(state)`` (MinAtar: the game's fields, its RNG, the
    sticky action) says its own.
    """
    if callable(getattr(env, "checkpoint_state", None)):  # an env that says its own state (MinAtar)
        return {"own": env.checkpoint_state()}  # type: ignore[attr-defined]
    if is_atari(env):
        return ale_state(env)
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
    if "own" in state:
        env.restore_checkpoint_state(state["own"])
        return
    if "ale" in state:
        restore_ale_state(env, state)
        return
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


def _base_vector_env(env: VectorEnv) -> SyncVectorEnv | AsyncVectorEnv | SplitVectorEnv | EnvPoolVectorEnv:
    base = env.unwrapped
    if not isinstance(base, (SyncVectorEnv, AsyncVectorEnv, SplitVectorEnv, EnvPoolVectorEnv)):
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
