"""What the two vector envs that step part of their sub-envs in a worker process share (``hardware.vec_env=worker``,
``pgcli.envs.worker``, and ``=shm``, ``pgcli.envs.shm``): the sub-env commands both processes run, the worker's
pipe commands and errors, and everything but the step in :class:`SplitVectorEnv`.

Sub-envs ``[0, n_local)`` step in this process, the rest in the worker, in order: stepped, reset and auto-reset as
``gymnasium.vector.SyncVectorEnv`` in same-step mode does, so the results are the sync vector env's
(tests/unit/test_vecenv.py, tests/unit/test_shmenv.py). A worker that dies or raises ends the run with a one-line
:class:`EnvWorkerError` instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pgcli.errors import PgcliError
from pgcli.hardware.child import ChildProcess

StepResult = tuple[Any, SupportsFloat, bool, bool, Any, Any, dict[str, Any]]
"""One sub-env's step: (obs, reward, terminated, truncated, final_obs, final_info, info); final_* are None unless the
episode ended (obs is then the next episode's first observation)."""

WORKER_DIED = (
    "the env worker process (pid {pid}) died during '{doing}' (exit code {code}); hardware.vec_env=sync runs without it"
)
WORKER_FAILED = "env worker '{doing}' failed: {message}"


class EnvWorkerError(PgcliError):
    """The env worker process (or an evaluation process) died or one of its sub-envs raised."""


# -- what both processes run on their sub-envs ------------------------------------------------------------------------
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


def set_envs(envs: Sequence[gym.Env], name: str, values: Sequence[Any]) -> None:
    """Set each env's attribute ``name`` (through its wrappers) to its value."""
    for env, value in zip(envs, values, strict=True):
        env.set_wrapper_attr(name, value)


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


def worker_command(envs: Sequence[gym.Env], command: str, payload: Any) -> Any:
    """The result of one pipe command of a worker process on its sub-envs."""
    if command == "step":
        return [_lean(r) for r in step_envs(envs, payload)]
    if command == "reset":
        return reset_envs(envs, *payload)
    if command == "call":
        return call_envs(envs, *payload)
    if command == "set_attr":
        return set_envs(envs, *payload)
    raise ValueError(f"unknown env worker command {command!r}")


def _nothing() -> None:
    pass


# -- the main process's side -------------------------------------------------------------------------------------------
class SplitVectorEnv(VectorEnv):
    """A same-step-autoreset vector env of ``n`` sub-envs: :attr:`envs` (the first :attr:`n_local`) step in this
    process, the others in :attr:`worker`, a process started by :meth:`_start_worker` (None: every sub-env steps here).

    The worker answers pipe commands ``(name, payload)``: ``reset``, ``call``, ``set_attr``
    (:func:`worker_command`) and ``close``; each env type adds its own step.
    """

    def __init__(self, n: int, n_local: int) -> None:
        self.num_envs, self.n_local = n, n_local
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.envs: list[gym.Env] = []
        self.worker: ChildProcess | None = None
        """The worker process (:class:`pgcli.hardware.child.ChildProcess`), None when every sub-env steps here."""
        self._stopped = True
        self._wake: Callable[[], None] = _nothing

    def _set_spaces(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.single_observation_space, self.single_action_space = obs_space, action_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)

    # -- the worker ---------------------------------------------------------------------------------------------------
    def _start_worker(
        self, target: Callable[..., None], *args: Any, side_pipes: int = 0, wake: Callable[[], None] = _nothing
    ) -> None:
        """Spawn the worker ``target(conn, *side_conns, *args)``; ``wake()`` tells it a pipe command follows."""
        self.worker = ChildProcess(
            target,
            *args,
            name="pgcli-env-worker",
            error=EnvWorkerError,
            died=WORKER_DIED,
            failed=WORKER_FAILED,
            side_pipes=side_pipes,
        )
        self._stopped, self._wake = False, wake

    def _check_worker(self) -> ChildProcess:
        """The worker, which must not have stopped (died, or raised: it answers nothing more)."""
        if self._stopped or self.worker is None:
            raise EnvWorkerError("the env worker process has already stopped")
        return self.worker

    def _stop(self, error: PgcliError) -> PgcliError:
        """``error``, after marking the worker stopped."""
        self._stopped = True
        return error

    def _ask(self, command: str, payload: Any) -> None:
        """Send a pipe command; its answer is ``_answer(command)`` (the worker works on it meanwhile)."""
        worker = self._check_worker()
        self._wake()
        try:
            worker.send((command, payload), command)
        except PgcliError as exc:
            raise self._stop(exc) from None

    def _answer(self, command: str) -> Any:
        """The worker's answer to ``command`` (waits for it); its error or death is an :class:`EnvWorkerError`."""
        try:
            return self._check_worker().answer(command)
        except PgcliError as exc:
            raise self._stop(exc) from None

    def _stop_worker(self) -> None:
        """Tell the worker to stop (also after an error it answered: it waits for the next command), wait for it."""
        assert self.worker is not None
        tell = self.worker.is_alive()
        if tell:
            self._wake()
        self.worker.close(("close", None), tell=tell)
        self._stopped = True

    # -- VectorEnv ----------------------------------------------------------------------------------------------------
    def _reset_sub_envs(
        self, seed: int | list[int | None] | None, options: dict[str, Any] | None
    ) -> tuple[np.ndarray, list[tuple[Any, dict[str, Any]] | None]]:
        """Reset the sub-envs as ``SyncVectorEnv.reset`` does (int seeds give sub-env i ``seed + i``;
        ``options["reset_mask"]`` resets only the selected ones): the mask, and each sub-env's (obs, info) or None."""
        n, k = self.num_envs, self.n_local
        seeds, mask, options = reset_arguments(n, seed, options)
        if self.worker is not None:
            self._ask("reset", (seeds[k:], list(mask[k:]), options))
        results = reset_envs(self.envs, seeds[:k], list(mask[:k]), options)
        if self.worker is not None:
            results += self._answer("reset")
        return mask, results

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Every sub-env's attribute ``name`` (through its wrappers), called with the arguments when it is a method;
        in sub-env order (as ``SyncVectorEnv.call``)."""
        if self.worker is not None:
            self._ask("call", (name, args, kwargs))
        local = call_envs(self.envs, name, args, kwargs)
        return tuple(local + (self._answer("call") if self.worker is not None else []))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """``call(name)``, as ``SyncVectorEnv.get_attr``."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set ``name`` on every sub-env: one value each (a list or tuple of ``num_envs``) or the same for all."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} values, got {len(values)}")
        k = self.n_local
        if self.worker is not None:
            self._ask("set_attr", (name, list(values[k:])))
        set_envs(self.envs, name, list(values[:k]))
        if self.worker is not None:
            self._answer("set_attr")

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        if self.worker is not None:
            self._stop_worker()
