"""``hardware.vec_env=shm``: a same-step-autoreset vector env whose second half steps in a worker process that
exchanges actions and results with this one through shared memory.

Why not a pipe (``hardware.vec_env=worker``): with Hopper's 2 sub-envs a vector step moves ~0.1 ms of stepping to
the other core, and a pipe round trip (pickling, two syscalls, a kernel wake-up on each side) costs more than that
(docs/benchmarks/trpo.md, "Two cores"). Here one vector step is:

1. this process writes the worker's rows of the actions into shared memory and bumps a command counter;
2. it steps its own sub-envs meanwhile, while the worker, which busy-waits on the counter, steps its share and
   writes observations, rewards and termination flags back, then bumps a done counter;
3. this process busy-waits on the done counter and reads the results.

Busy waiting keeps both processes on their cores for the whole rollout; when no command arrives for
``SPIN_S`` (the update phase, evaluation) the worker polls every ``POLL_S`` instead, so it costs no core while
idle. Observations, rewards and flags are exactly the sync vector env's (the sub-envs are stepped and auto-reset in
the same order with the same actions; tests/unit/test_shmenv.py checks it against ``SyncVectorEnv``).

**Infos are lean**: a step's info holds only what pgcli's trainers and monitor read, ``final_obs`` and
``final_info`` (each ended episode's last info, its ``episode`` statistics included) with their ``_`` masks, built
by the same ``VectorEnv._add_info`` calls as the sync env's. The per-step env infos (e.g. Hopper's ``x_position``)
are left out; they cost a dict merge per step and nothing reads them. On the rare steps where a worker sub-env's
episode ends, its final observation and info come through the pipe. Reset, ``call``, ``get_attr`` and
``set_attr`` (checkpoints) go through the pipe as with ``WorkerVectorEnv`` (both are ``pgcli.envs.split``'s).

**Evaluation in the worker's idle time** (``hardware.eval_in_worker``, the default): during the updates the worker
has nothing to step, so it plays the evaluation episodes (:class:`_IdleEvaluation`, fed by
``pgcli.training.evaluation.WorkerEvaluation`` through a second pipe with an ``EvalPlan``: ``pgcli.envs.episodes``)
one step between polls, and answers a step command
within one evaluation step when the next rollout starts. The trainer no longer plays them on its own core; the
results are those of an in-process evaluation (tests/integration/test_parallel_training.py).

With one sub-env, one usable CPU, or spaces other than Box / Discrete, every sub-env steps in this process (the
same lean step, no worker). The busy-wait protocol relies on x86's ordering of stores (a writer's data is visible
before its counter), so on other CPU architectures the worker is not started either. Whether another process takes
the worker's core mid-run is ``pgcli.envs.shm_watch``'s question.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import time
from collections.abc import Callable, Generator, Sequence
from copy import deepcopy
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

from pgcli.contracts import EvalResult
from pgcli.envs.episodes import PipedEpisodes
from pgcli.envs.split import EnvWorkerError, SplitVectorEnv, set_envs, worker_command
from pgcli.errors import PgcliError
from pgcli.hardware.child import describe

SPIN_S = 0.002
"""How long a waiting process busy-waits before it polls instead (the worker, between rollouts)."""
POLL_S = 0.0005
"""Sleep between polls of an idle worker: the latency of the first step after an update."""
X86 = ("x86_64", "amd64", "i386", "i686")

# the control block: int64 slots
_SEQ, _CMD, _DONE, _STATUS = 0, 1, 2, 3
_STEP, _PIPE = 1, 2  # commands (``close`` is a pipe command)
_OK, _ENDED, _ERROR = 0, 1, 2  # a step's status

Layout = list[tuple[str, np.dtype, tuple[int, ...]]]
"""The arrays in shared memory: (name, dtype, shape) each."""


def _layout(n: int, obs_space: gym.spaces.Box, action_space: gym.Space) -> Layout:
    """The arrays in shared memory for ``n`` worker sub-envs."""
    act_dtype = np.dtype(np.int64) if isinstance(action_space, gym.spaces.Discrete) else action_space.dtype
    act_shape = tuple(action_space.shape or ())
    return [
        ("ctrl", np.dtype(np.int64), (4,)),
        ("actions", np.dtype(act_dtype), (n, *act_shape)),
        ("obs", np.dtype(obs_space.dtype), (n, *obs_space.shape)),
        ("rewards", np.dtype(np.float64), (n,)),
        ("terminated", np.dtype(np.bool_), (n,)),
        ("truncated", np.dtype(np.bool_), (n,)),
    ]


def _views(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    """numpy views of ``buffer`` laid out as ``layout`` (each array 8-byte aligned)."""
    views, offset = {}, 0
    for name, dtype, shape in layout:
        count = int(np.prod(shape, dtype=np.int64))
        views[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += -(-count * dtype.itemsize // 8) * 8
    return views


def _nbytes(layout: Layout) -> int:
    return sum(-(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // 8) * 8 for _, dtype, shape in layout)


def _control(buffer: Any) -> memoryview:
    """The control block as plain ints: the cheapest reads for a spin."""
    return memoryview(buffer).cast("B").cast("q")[:4]


class _IdleEvaluation:
    """Evaluations the worker plays while it would otherwise sleep (``hardware.eval_in_worker``).

    A request ``(actor, normaliser state, EvalPlan)`` arrives on the evaluation pipe; the worker builds the plan's
    evaluation env once (a lean env, as an in-process evaluation steps), loads the frozen statistics and plays
    :meth:`pgcli.envs.episodes.PipedEpisodes.steps` one vector step per call, only after ``SPIN_S`` without a step
    command: during the trainer's updates, never inside a rollout. The answer is ``("ok", (returns, lengths))`` or
    ``("error", message)``; the results are those an in-process evaluation gives.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.episodes = PipedEpisodes()
        self.steps: Generator[None, None, EvalResult] | None = None
        self.warm = False

    def __call__(self) -> bool:
        """One unit of work (take a request, or play one step); False when there is nothing to do."""
        if not self.warm:  # the first idle moment: import what an evaluation needs (torch: about a second), once
            import torch  # noqa: F401

            self.warm = True
            return True
        if self.steps is None:
            if not self.conn.poll():
                return False
            request = self.conn.recv()  # EOF: the main process is gone, and the worker ends
            try:
                self._start(request)
            except Exception as exc:
                self.conn.send(("error", describe(exc)))
            return True
        try:
            next(self.steps)
        except StopIteration as done:
            self.steps = None
            self.conn.send(("ok", (done.value.returns, done.value.lengths)))
        except Exception as exc:
            self.steps = None
            self.conn.send(("error", describe(exc)))
        return True

    def _start(self, request: tuple[Any, ...]) -> None:
        import torch

        actor, normalizer, plan = request
        torch.set_num_threads(1)
        self.steps = self.episodes.steps(actor, normalizer, plan)

    def close(self) -> None:
        self.episodes.close()


def _step_share(envs: list[gym.Env], arrays: tuple[np.ndarray, ...], first: int, conn: Connection) -> int:
    """Step the worker's sub-envs with the actions in shared memory and write the results there; the step's status.
    The final observations and infos of episodes that ended (global sub-env indices), or the error, go through the
    pipe."""
    actions, obs, rewards, terminated, truncated = arrays
    try:
        ended = []
        for j, env in enumerate(envs):
            o, r, te, tr, info = env.step(actions[j].copy())
            if te or tr:
                ended.append((first + j, o, info))
                o, _ = env.reset()
            obs[j], rewards[j], terminated[j], truncated[j] = o, r, te, tr
        if ended:
            conn.send(ended)  # before the done counter: it is in the pipe when the main process looks
            return _ENDED
    except Exception as exc:
        conn.send(describe(exc))
        return _ERROR
    return _OK


def _worker(
    conn: Connection,
    eval_conn: Connection,
    buffer: Any,
    layout: Layout,
    env_fns: list[Callable[[], gym.Env]],
    first: int,
) -> None:
    """The worker process: build its sub-envs (global indices ``first``, ``first + 1``, ...), then answer commands
    until ``close``, or until the main process is gone; in between, play the evaluations sent on ``eval_conn``."""
    parent = os.getppid()
    idle = _IdleEvaluation(eval_conn)
    envs: list[gym.Env] = []
    views = _views(buffer, layout)
    arrays = tuple(views[name] for name in ("actions", "obs", "rewards", "terminated", "truncated"))
    ctrl = _control(buffer)
    try:
        envs = [fn() for fn in env_fns]
        conn.send(("ok", None))
        seq = 0
        while (seq := _next_command(ctrl, seq, parent, idle)) >= 0:  # < 0: the main process went away
            if ctrl[_CMD] == _STEP:
                ctrl[_STATUS] = _step_share(envs, arrays, first, conn)
                ctrl[_DONE] = seq  # last: the results above are visible before it (x86 store order)
                continue
            name, payload = conn.recv()  # _PIPE
            if name == "close":
                break
            try:
                conn.send(("ok", worker_command(envs, name, payload)))
            except Exception as exc:
                conn.send(("error", describe(exc)))
    except (EOFError, OSError):  # the main process went away
        pass
    finally:
        for env in envs:
            env.close()
        idle.close()
        conn.close()


def _next_command(ctrl: memoryview, seq: int, parent: int, idle: Callable[[], bool] | None = None) -> int:
    """Wait until the command counter passes ``seq``; its new value, or -1 when the parent process is gone. After
    ``SPIN_S`` of busy waiting, ``idle()`` does a unit of other work between polls (it returns False when it had
    none; then the worker sleeps ``POLL_S``)."""
    if ctrl[_SEQ] != seq:
        return ctrl[_SEQ]
    deadline = time.perf_counter() + SPIN_S
    while ctrl[_SEQ] == seq:
        if time.perf_counter() > deadline:
            break
    polls = 0
    while ctrl[_SEQ] == seq:
        if idle is None or not idle():
            time.sleep(POLL_S)
        polls += 1
        if polls % 200 == 0 and os.getppid() != parent:
            return -1
    return ctrl[_SEQ]


class SharedMemoryVectorEnv(SplitVectorEnv):
    """Same-step-autoreset vector env over ``env_fns``: sub-envs ``[0, n - n_worker)`` step in this process, the
    rest in one worker process synchronised through shared memory (see the module docstring).

    Args:
        env_fns: picklable functions that make each sub-env (the worker process is spawned, not forked).
        n_worker: how many of the last sub-envs the worker steps (0: none, no worker process; default
            ``len(env_fns) // 2``).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, n_worker: int | None = None) -> None:
        n = len(env_fns)
        n_worker = n // 2 if n_worker is None else n_worker
        if not 0 <= n_worker < n:
            raise ValueError(f"n_worker must be in [0, {n - 1}] (got {n_worker})")
        requested = n_worker
        super().__init__(n, n - n_worker)
        self.envs = [fn() for fn in env_fns[: n - n_worker]]
        obs_space, action_space = self.envs[0].observation_space, self.envs[0].action_space
        self._set_spaces(obs_space, action_space)
        self._box_obs = isinstance(obs_space, gym.spaces.Box)
        if not (self._box_obs and isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete))):
            n_worker = 0
        if platform.machine().lower() not in X86:
            n_worker = 0
        if n_worker == 0:  # the sub-envs meant for the worker step here
            self.envs += [fn() for fn in env_fns[n - requested :]]
        self.n_local = n - n_worker
        self._env_fns = list(env_fns)
        self._last_obs: Any = None  # the batch returned last: the rows a masked reset leaves
        self.wait_s = 0.0
        """Seconds :meth:`step` waited for the worker after stepping its own sub-envs: near 0 when the worker has a
        core of its own, more when another process takes it (``pgcli.hardware.watch`` reads the run queue instead)."""
        if n_worker:
            self._start_shared_worker(list(env_fns[self.n_local :]), obs_space, action_space)

    def _start_shared_worker(self, env_fns: list[Callable[[], gym.Env]], obs_space: Any, action_space: Any) -> None:
        layout = _layout(len(env_fns), obs_space, action_space)
        self._buffer = mp.get_context("spawn").RawArray("B", _nbytes(layout))
        self._shared = _views(self._buffer, layout)
        self._ctrl = _control(self._buffer)
        self._seq = 0
        self._start_worker(_worker, self._buffer, layout, env_fns, self.n_local, side_pipes=1, wake=self._signal_pipe)
        self._answer("start")

    # -- the worker ---------------------------------------------------------------------------------------------------
    def evaluation_channel(self) -> tuple[Connection, Any] | None:
        """The worker's evaluation pipe and process (:class:`_IdleEvaluation`), None without a worker."""
        if self.worker is None or self._stopped:
            return None
        return self.worker.side[0], self.worker.process

    def _signal(self, command: int) -> None:
        self._seq += 1
        self._ctrl[_CMD] = command
        self._ctrl[_SEQ] = self._seq  # last: the worker reads the command (and the actions) after it

    def _signal_pipe(self) -> None:
        """Tell the worker that a pipe command follows."""
        self._signal(_PIPE)

    def _wait_step(self) -> int:
        """Busy-wait for the worker's step (then poll, checking that it lives); its status."""
        ctrl, seq = self._ctrl, self._seq
        if ctrl[_DONE] != seq:
            start = time.perf_counter()
            deadline = start + SPIN_S
            while ctrl[_DONE] != seq and time.perf_counter() < deadline:
                pass
            while ctrl[_DONE] != seq:
                if not self._check_worker().is_alive():
                    raise self._stop(self._check_worker().died("step"))
                time.sleep(0)
            self.wait_s += time.perf_counter() - start
        return ctrl[_STATUS]

    def _worker_ended(self, status: int) -> list[tuple[int, Any, dict[str, Any]]]:
        """After a shared-memory step of ``status``: the worker's episodes that ended (its error raises)."""
        if status == _OK:
            return []
        worker = self._check_worker()
        try:
            message = worker.recv("step")
        except PgcliError as exc:
            raise self._stop(exc) from None
        if status == _ERROR:
            raise self._stop(worker.failed(message, "step"))
        ended: list[tuple[int, Any, dict[str, Any]]] = message
        return ended

    # -- VectorEnv ----------------------------------------------------------------------------------------------------
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:  # type: ignore[override]
        n = self.num_envs
        shared = self._send_worker_actions(actions)
        obs: Any = np.empty(self.observation_space.shape, self.observation_space.dtype) if self._box_obs else [None] * n  # type: ignore[arg-type]
        rewards = np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
        try:
            ended = self._step_local(actions, obs, rewards, terminated, truncated)
        except BaseException:
            if shared:  # collect the worker's step, so no stale message waits in the pipe
                with contextlib.suppress(EnvWorkerError, EOFError, OSError):
                    if self._wait_step() != _OK:
                        self._check_worker().conn.recv()
            raise
        ended += self._collect_worker_step(shared, obs, rewards, terminated, truncated)
        infos: dict[str, Any] = {}
        for i, final_o, final_info in ended:  # in sub-env order, as SyncVectorEnv adds them
            infos = self._add_info(infos, {"final_obs": final_o, "final_info": final_info}, i)
        if not self._box_obs:
            out: Any = create_empty_array(self.single_observation_space, n)
            obs = concatenate(self.single_observation_space, obs, out)
        self._last_obs = obs
        return (obs.copy() if self._box_obs else deepcopy(obs)), rewards, terminated, truncated, infos

    def _send_worker_actions(self, actions: Any) -> bool:
        """Start the worker's half of a step; True when it goes through shared memory (actions of the buffer's
        dtype), False through the pipe (exactly as given) or without a worker."""
        k = self.n_local
        if self.worker is None:
            return False
        if isinstance(actions, np.ndarray) and actions.dtype == self._shared["actions"].dtype:
            self._shared["actions"][...] = actions[k:]
            self._check_worker()
            self._signal(_STEP)
            return True
        self._ask("step", list(actions[k:]))
        return False

    def _step_local(
        self, actions: Any, obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> list[tuple[int, Any, dict[str, Any]]]:
        """Step this process's sub-envs into rows ``[0, n_local)``; the episodes that ended, reset at once."""
        ended: list[tuple[int, Any, dict[str, Any]]] = []
        for i in range(self.n_local):
            o, r, te, tr, info = self.envs[i].step(actions[i])
            if te or tr:
                ended.append((i, o, info))
                o, _ = self.envs[i].reset()
            obs[i], rewards[i], terminated[i], truncated[i] = o, r, te, tr
        return ended

    def _collect_worker_step(
        self, shared: bool, obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> list[tuple[int, Any, dict[str, Any]]]:
        """The worker's half of the step into rows ``[n_local, n)``; the episodes that ended there."""
        k = self.n_local
        if shared:
            status = self._wait_step()
            obs[k:] = self._shared["obs"]
            rewards[k:], terminated[k:] = self._shared["rewards"], self._shared["terminated"]
            truncated[k:] = self._shared["truncated"]
            return self._worker_ended(status)
        ended: list[tuple[int, Any, dict[str, Any]]] = []
        if self.worker is not None:
            for i, (o, r, te, tr, final_o, final_info, _) in enumerate(self._answer("step"), start=k):
                obs[i], rewards[i], terminated[i], truncated[i] = o, r, te, tr
                if final_info is not None:
                    ended.append((i, final_o, final_info))
        return ended

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        """As ``SyncVectorEnv.reset``: int seeds give sub-env i ``seed + i``; ``options["reset_mask"]`` resets only
        the selected sub-envs (the others' rows of the returned batch are their last observations)."""
        _, results = self._reset_sub_envs(seed, options)
        infos: dict[str, Any] = {}
        rows = []
        for i, result in enumerate(results):
            if result is None:
                rows.append(self._last_obs[i])
            else:
                rows.append(result[0])
                infos = self._add_info(infos, result[1], i)
        space = self.single_observation_space
        out: Any = create_empty_array(space, self.num_envs)
        self._last_obs = concatenate(space, rows, out)
        return self._last_obs.copy(), infos

    def bring_home(self) -> bool:
        """Step every sub-env in this process from now on, and stop the worker: for a run whose worker has lost its
        core to another process. The worker's sub-envs are made here and continue their episodes in progress from
        their ``episode_state`` (simulator, wrapper counters, RNGs: the run's results do not change). False, changing
        nothing, when there is no worker or a sub-env's simulator state cannot be read (it would restart)."""
        if self.worker is None:
            return False
        states = list(self.get_attr("episode_state"))[self.n_local :]
        if any(state["sim"] is None for state in states):
            return False
        envs = [fn() for fn in self._env_fns[self.n_local :]]
        for env in envs:  # as a vector env's first reset does (the wrappers' checks expect one); then overwritten
            env.reset(seed=0)
        set_envs(envs, "episode_state", states)
        self._stop_worker()
        self.envs += envs
        self.n_local, self.worker = self.num_envs, None
        return True
