"""A vector env that uses a second core: :class:`WorkerVectorEnv` (``hardware.vec_env=worker``).

The last ``n_envs // 2`` sub-envs live in one worker process, the others in this one. Each ``step`` sends the
worker its share of the actions through a pipe, steps this process's share meanwhile, then waits for the worker's
results, so on two cores a vector step costs about one sub-env share of stepping instead of all of it
(docs/benchmarks/trpo.md, "Two cores"). The two shares are stepped exactly as ``SyncVectorEnv`` steps its
sub-envs in same-step autoreset mode, and their infos are put together in the same sub-env order, so observations,
rewards, flags and infos are the same as the sync vector env's for the same seed (tests/unit/test_vecenv.py); only
the process that runs each sub-env differs. What it shares with ``hardware.vec_env=shm`` (reset, ``call``,
``get_attr`` / ``set_attr``, the worker's one-line errors) is ``pgcli.envs.split``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from copy import deepcopy
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from pgcli.envs.split import SplitVectorEnv, step_envs, worker_command
from pgcli.hardware.child import describe


def _worker(conn: Connection, env_fns: list[Callable[[], gym.Env]]) -> None:
    """The worker process: build its sub-envs, then answer commands until ``close`` (or the pipe closes)."""
    envs: list[gym.Env] = []
    try:
        envs = [fn() for fn in env_fns]
        conn.send(("ok", [(env.observation_space, env.action_space) for env in envs]))
        while True:
            command, payload = conn.recv()
            if command == "close":
                break
            conn.send(("ok", worker_command(envs, command, payload)))
    except EOFError:  # the main process went away
        pass
    except BaseException as exc:  # reported to the main process, which raises it as one line
        with contextlib.suppress(OSError):
            conn.send(("error", describe(exc)))
    finally:
        for env in envs:
            env.close()
        conn.close()


class WorkerVectorEnv(SplitVectorEnv):
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
        super().__init__(n, n - n_worker)
        self._start_worker(_worker, list(env_fns[self.n_local :]))
        self.envs = [fn() for fn in env_fns[: self.n_local]]  # while the worker builds its own
        spaces = self._answer("start")
        single = self.envs[0] if self.envs else None
        obs_space, action_space = (single.observation_space, single.action_space) if single else spaces[0]
        self._set_spaces(obs_space, action_space)
        self._env_obs: list[Any] = [None] * n
        self._observations: Any = create_empty_array(obs_space, n=n, fn=np.zeros)
        self._rewards = np.zeros(n, dtype=np.float64)
        self._terminations = np.zeros(n, dtype=np.bool_)
        self._truncations = np.zeros(n, dtype=np.bool_)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        """As ``SyncVectorEnv.reset``: int seeds give sub-env i ``seed + i``; ``options["reset_mask"]`` resets only
        the selected sub-envs."""
        mask, results = self._reset_sub_envs(seed, options)
        self._terminations[mask] = False
        self._truncations[mask] = False
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
        self._ask("step", rows[k:])  # the worker steps its share while this process steps the rest
        results = step_envs(self.envs, rows[:k]) + self._answer("step")
        infos: dict[str, Any] = {}
        for i, (obs, reward, terminated, truncated, final_obs, final_info, info) in enumerate(results):
            self._env_obs[i], self._rewards[i] = obs, reward
            self._terminations[i], self._truncations[i] = terminated, truncated
            if final_info is not None:
                infos = self._add_info(infos, {"final_obs": final_obs, "final_info": final_info}, i)
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        return (
            deepcopy(self._observations),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )
