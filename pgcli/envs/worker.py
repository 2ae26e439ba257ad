"""A vector env that uses a second core: :class:`WorkerVectorEnv` (``hardware.vec_env=worker``).

The last ``n_envs // 2`` sub-envs live in one worker process, the others in this one. Each ``step`` sends the
worker its share of the actions, steps this process's share meanwhile, then waits for the worker's results, so on
two cores a vector step costs about one sub-env share of stepping instead of all of it (issue 11, item 2). The two
shares are stepped exactly as ``gymnasium.vector.SyncVectorEnv`` steps its sub-envs in same-step autoreset mode,
and their infos are put together in the same sub-env order, so observations, rewards, flags and infos are the same
as the sync vector env's for the same seed (tests/unit/test_vecenv.py); only the process that runs each sub-env
differs. Sub-env attributes (checkpoint snapshots) are reached through ``get_attr`` / ``set_attr`` as with
gymnasium's vector envs.

A worker that dies or raises ends the run with a one-line :class:`EnvWorkerError` instead of hanging.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable, Sequence
from copy import deepcopy
from multiprocessing.connection import Connection
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from pgcli.errors import PgcliError

StepResult = tuple[Any, SupportsFloat, bool, bool, Any, Any, dict[str, Any]]
"""One sub-env's step: (obs, reward, terminated, truncated, final_obs, final_info, info); final_* are None unless the
episode ended (obs is then the next episode's first observation)."""


class EnvWorkerError(PgcliError):
    """The env worker process died or one of its sub-envs raised."""


def step_envs(envs: Sequence[gym.Env], actions: Sequence[Any]) -> list[StepResult]:
    """Step each env once with its action, resetting an env whose episode ended (same-step autoreset)."""
    results: list[StepResult] = []
    for env, action in zip(envs, actions, strict=True):
        obs, reward, terminated, truncated, info = env.step(action)
        final_obs = final_info = None
        if terminated or truncated:
            final_obs, final_info = obs, info
            obs, info = env.reset()
        results.append((obs, reward, terminated, truncated, final_obs, final_info, info))
    return results


def reset_arguments(
    n: int, seed: int | list[int | None] | None, options: dict[str, Any] | None
) -> tuple[list[int | None], np.ndarray, dict[str, Any] | None]:
    """``SyncVectorEnv.reset``'s arguments for ``n`` sub-envs: per-sub-env seeds (an int gives sub-env i ``seed + i``),
    the ``options["reset_mask"]`` mask (all True without one) and the options without it."""
    seeds: list[int | None] = (
        [None] * n if seed is None else ([seed + i for i in range(n)] if isinstance(seed, int) else list(seed))
    )
    if len(seeds) != n:
        raise ValueError(f"expected {n} seeds, got {len(seeds)}")
    mask = np.ones(n, dtype=bool)
    if options is not None and "reset_mask" in options:
        options = dict(options)
        mask = np.asarray(options.pop("reset_mask"), dtype=bool)
        if mask.shape != (n,) or not mask.any():
            raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},) with a True value")
    return seeds, mask, options


def stop_process(process: Any, conn: Connection) -> None:
    """Wait up to 5 s for a helper ``process`` that was told to stop, terminate it if it is still alive, and close
    its ``conn``."""
    process.join(timeout=5.0)
    if process.is_alive():
        process.terminate()
        process.join()
    conn.close()


def reset_envs(
    envs: Sequence[gym.Env], seeds: Sequence[int | None], mask: Sequence[bool], options: dict[str, Any] | None
) -> list[tuple[Any, dict[str, Any]] | None]:
    """Reset the envs selected by ``mask`` (None for the others)."""
    return [
        env.reset(seed=seed, options=options) if selected else None
        for env, seed, selected in zip(envs, seeds, mask, strict=True)
    ]


def call_envs(envs: Sequence[gym.Env], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """Each env's attribute ``name`` (through its wrappers), called with ``args`` when it is a method."""
    out = []
    for env in envs:
        attr = env.get_wrapper_attr(name)
        out.append(attr(*args, **kwargs) if callable(attr) else attr)
    return out


def _lean(value: Any) -> Any:
    """``value`` with numpy float64 scalars (MuJoCo envs' rewards and info entries) as Python floats, which pickle
    several times faster. Both batch into the same float64 arrays (``VectorEnv._add_info``), so infos are unchanged."""
    if type(value) is np.float64:
        return float(value)
    if type(value) is tuple:
        return tuple(_lean(v) for v in value)
    if type(value) is dict:
        return {k: _lean(v) for k, v in value.items()}
    return value


def _worker(conn: Connection, env_fns: list[Callable[[], gym.Env]]) -> None:
    """The worker process: build its sub-envs, then answer commands until ``close`` (or the pipe closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run through the main process, which checkpoints
    envs: list[gym.Env] = []
    try:
        envs = [fn() for fn in env_fns]
        conn.send(("ok", [(env.observation_space, env.action_space) for env in envs]))
        while True:
            command, payload = conn.recv()
            if command == "close":
                break
            conn.send(("ok", answer(envs, command, payload)))
    except EOFError:  # the main process went away
        pass
    except BaseException as exc:  # reported to the main process, which raises it as one line
        with contextlib.suppress(OSError):
            conn.send(("error", describe(exc)))
    finally:
        for env in envs:
            env.close()
        conn.close()


def answer(envs: Sequence[gym.Env], command: str, payload: Any) -> Any:
    """The result of one pipe command of a worker process on its sub-envs."""
    if command == "step":
        return [_lean(r) for r in step_envs(envs, payload)]
    if command == "reset":
        return reset_envs(envs, *payload)
    if command == "call":
        return call_envs(envs, *payload)
    if command == "set_attr":
        name, values = payload
        for env, value in zip(envs, values, strict=True):
            env.set_wrapper_attr(name, value)
        return None
    raise ValueError(f"unknown env worker command {command!r}")


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, message and where it was raised."""
    last = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


class WorkerVectorEnv(VectorEnv):
    """Same-step-autoreset vector env over ``env_fns``: sub-envs ``[0, n - n_worker)`` step in this process, the
    rest in one worker process, concurrently (see the module docstring).

    Args:
        env_fns: picklable functions that make each sub-env (the worker process is spawned, not forked).
        n_worker: how many of the last sub-envs the worker steps (default ``len(env_fns) // 2``; at least 1).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, n_worker: int | None = None) -> None:
        n = len(env_fns)
        n_worker = n // 2 if n_worker is None else n_worker
        if not 1 <= n_worker <= n:
            raise ValueError(f"n_worker must be in [1, {n}] (got {n_worker})")
        self.num_envs, self.n_local = n, n - n_worker
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.autoreset_mode = AutoresetMode.SAME_STEP
        ctx = mp.get_context("spawn")  # torch's threads do not survive a fork
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker, args=(child, list(env_fns[self.n_local :])), daemon=True,
                                    name="pgcli-env-worker")  # fmt: skip
        self._process.start()
        child.close()  # only the worker holds its end: its death is an EOF here, never a hang
        self._closed_worker = False
        self.envs = [fn() for fn in env_fns[: self.n_local]]
        spaces = self._receive("start")
        single = self.envs[0] if self.envs else None
        obs_space, action_space = (single.observation_space, single.action_space) if single else spaces[0]
        self.single_observation_space, self.single_action_space = obs_space, action_space
        self.observation_space = batch_space(obs_space, n)
        self.action_space = batch_space(action_space, n)
        self._env_obs: list[Any] = [None] * n
        self._observations: Any = create_empty_array(obs_space, n=n, fn=np.zeros)
        self._rewards = np.zeros(n, dtype=np.float64)
        self._terminations = np.zeros(n, dtype=np.bool_)
        self._truncations = np.zeros(n, dtype=np.bool_)

    # -- the worker ---------------------------------------------------------------------------------------------------
    def _receive(self, command: str) -> Any:
        try:
            status, result = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._process.join(timeout=1.0)
            code = self._process.exitcode
            self._closed_worker = True
            raise EnvWorkerError(
                f"the env worker process (pid {self._process.pid}) died during '{command}' "
                f"(exit code {code}); hardware.vec_env=sync runs without it"
            ) from None
        if status == "error":
            self._closed_worker = True
            raise EnvWorkerError(f"env worker '{command}' failed: {result}")
        return result

    def _call(self, command: str, payload: Any = None) -> Any:
        self._send(command, payload)
        return self._receive(command)

    def _send(self, command: str, payload: Any) -> None:
        if self._closed_worker:
            raise EnvWorkerError("the env worker process has already stopped")
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._receive(command)  # raises the worker's error or its death

    # -- VectorEnv ----------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        """As ``SyncVectorEnv.reset``: int seeds give sub-env i ``seed + i``; ``options["reset_mask"]`` resets only
        the selected sub-envs."""
        n, k = self.num_envs, self.n_local
        seeds, mask, options = reset_arguments(n, seed, options)
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._send("reset", (seeds[k:], list(mask[k:]), options))
        results = reset_envs(self.envs, seeds[:k], list(mask[:k]), options) + self._receive("reset")
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            if result is not None:
                self._env_obs[i], env_info = result
                infos = self._add_info(infos, env_info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        return deepcopy(self._observations), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:  # type: ignore[override]
        k = self.n_local
        rows = list(iterate(self.action_space, actions))
        self._send("step", rows[k:])  # the worker steps its share while this process steps the rest
        results = step_envs(self.envs, rows[:k]) + self._receive("step")
        infos: dict[str, Any] = {}
        for i, (obs, reward, terminated, truncated, final_obs, final_info, info) in enumerate(results):
            self._env_obs[i], self._rewards[i] = obs, reward
            self._terminations[i], self._truncations[i] = terminated, truncated
            if final_info is not None:
                infos = self._add_info(infos, {"final_obs": final_obs, "final_info": final_info}, i)
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        return (deepcopy(self._observations), np.copy(self._rewards), np.copy(self._terminations),
                np.copy(self._truncations), infos)  # fmt: skip

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Every sub-env's attribute ``name`` (through its wrappers), called with the arguments when it is a method;
        in sub-env order (as ``SyncVectorEnv.call``)."""
        self._send("call", (name, args, kwargs))
        local = call_envs(self.envs, name, args, kwargs)
        return tuple(local + self._receive("call"))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """``call(name)``, as ``SyncVectorEnv.get_attr``."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set ``name`` on every sub-env: one value each (a list or tuple of ``num_envs``) or the same for all."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} values, got {len(values)}")
        self._send("set_attr", (name, list(values[self.n_local :])))
        for env, value in zip(self.envs, values[: self.n_local], strict=True):
            env.set_wrapper_attr(name, value)
        self._receive("set_attr")

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        if not self._closed_worker:
            self._closed_worker = True
            with contextlib.suppress(OSError):
                self._conn.send(("close", None))
        stop_process(self._process, self._conn)
