"""``hardware.vec_env=shm``: a same-step-autoreset vector env whose second half steps in a worker process that
exchanges actions and results with this one through shared memory (issue 11, item 2).

Why not a pipe (``hardware.vec_env=worker``): with Hopper's 2 sub-envs a vector step moves ~0.1 ms of stepping to
the other core, and a pipe round trip (pickling, two syscalls, a kernel wake-up on each side) costs more than that
(docs/benchmarks.md, "TRPO on two cores"). Here one vector step is:

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
``set_attr`` (checkpoints) go through the pipe as with ``WorkerVectorEnv``.

**Evaluation in the worker's idle time** (``hardware.eval_in_worker``, the default): during the updates the worker
has nothing to step, so it plays the evaluation episodes (:class:`_IdleEvaluation`, fed by
``pgcli.training.evaluation.WorkerEvaluation`` through a second pipe) one step between polls, and answers a step command
within one evaluation step when the next rollout starts. The trainer no longer plays them on its own core; the
results are those of an in-process evaluation (tests/integration/test_parallel_training.py).

With one sub-env, one usable CPU, or spaces other than Box / Discrete, every sub-env steps in this process (the
same lean step, no worker). The busy-wait protocol relies on x86's ordering of stores (a writer's data is visible
before its counter), so on other CPU architectures the worker is not started either.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import signal
import time
from collections.abc import Callable, Sequence
from copy import deepcopy
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from pgcli.envs.worker import EnvWorkerError, answer, describe, reset_arguments, reset_envs, stop_process

SPIN_S = 0.002
"""How long a waiting process busy-waits before it polls instead (the worker, between rollouts)."""
POLL_S = 0.0005
"""Sleep between polls of an idle worker: the latency of the first step after an update."""
X86 = ("x86_64", "amd64", "i386", "i686")

# the control block: int64 slots
_SEQ, _CMD, _DONE, _STATUS = 0, 1, 2, 3
_STEP, _PIPE, _CLOSE = 1, 2, 3  # commands
_OK, _ENDED, _ERROR = 0, 1, 2  # a step's status


def _layout(n: int, obs_space: gym.spaces.Box, action_space: gym.Space) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """The arrays in shared memory for ``n`` worker sub-envs: (name, dtype, shape)."""
    act_dtype = np.dtype(np.int64) if isinstance(action_space, gym.spaces.Discrete) else action_space.dtype
    act_shape = tuple(action_space.shape or ())
    return [("ctrl", np.dtype(np.int64), (4,)), ("actions", np.dtype(act_dtype), (n, *act_shape)),
            ("obs", np.dtype(obs_space.dtype), (n, *obs_space.shape)), ("rewards", np.dtype(np.float64), (n,)),
            ("terminated", np.dtype(np.bool_), (n,)), ("truncated", np.dtype(np.bool_), (n,))]  # fmt: skip


def _views(buffer: Any, layout: list[tuple[str, np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """numpy views of ``buffer`` laid out as ``layout`` (each array 8-byte aligned)."""
    views, offset = {}, 0
    for name, dtype, shape in layout:
        count = int(np.prod(shape, dtype=np.int64))
        views[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += -(-count * dtype.itemsize // 8) * 8
    return views


def _nbytes(layout: list[tuple[str, np.dtype, tuple[int, ...]]]) -> int:
    return sum(-(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // 8) * 8 for _, dtype, shape in layout)


class _IdleEvaluation:
    """Evaluations the worker plays while it would otherwise sleep (``hardware.eval_in_worker``).

    A request ``(actor, normaliser state, env config, eval config, seed)`` arrives on the evaluation pipe; the worker
    builds the evaluation env once (``make_vec_env(..., vectorization="lean")``, as an in-process evaluation does),
    loads the frozen statistics and plays ``pgcli.envs.episodes.episode_steps`` one vector step per call, only after
    ``SPIN_S`` without a step command: during the trainer's updates, never inside a rollout. The answer is
    ``("ok", (returns, lengths))`` or ``("error", message)``; the results are those an in-process evaluation gives.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.env: Any = None
        self.steps: Any = None
        self.warm = False

    def __call__(self) -> bool:
        """One unit of work (take a request, or play one step); False when there is nothing to do."""
        if not self.warm:  # the first idle moment: import what an evaluation needs (torch: about a second), once
            import torch  # noqa: F401

            import pgcli.training.monitor  # noqa: F401

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

        from pgcli.envs.episodes import episode_steps
        from pgcli.training.evaluation import piped_eval_env

        actor, normalizer, env_cfg, cfg, seed = request
        torch.set_num_threads(1)
        self.env = piped_eval_env(self.env, env_cfg, cfg, seed, normalizer)
        self.steps = episode_steps(self.env, actor, cfg.episodes, deterministic=cfg.deterministic, seed=seed)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def _worker(
    conn: Connection,
    buffer: Any,
    layout: list,
    env_fns: list[Callable[[], gym.Env]],
    first: int,
    eval_conn: Connection | None = None,
) -> None:
    """The worker process: build its sub-envs (global indices ``first``, ``first + 1``, ...), then answer commands
    until ``close``, or until the main process is gone; in between, play the evaluations sent on ``eval_conn``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run through the main process, which checkpoints
    parent = os.getppid()
    idle = _IdleEvaluation(eval_conn) if eval_conn is not None else None
    envs: list[gym.Env] = []
    views = _views(buffer, layout)
    ctrl = memoryview(buffer).cast("B").cast("q")[:4]  # plain-int reads: the cheapest spin
    actions, obs, rewards = views["actions"], views["obs"], views["rewards"]
    terminated, truncated = views["terminated"], views["truncated"]
    try:
        envs = [fn() for fn in env_fns]
        conn.send(("ok", None))
        seq = 0
        while True:
            seq = _next_command(ctrl, seq, parent, idle)
            if seq < 0:  # the main process went away
                break
            command = ctrl[_CMD]
            if command == _STEP:
                status = _OK
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
                        status = _ENDED
                except Exception as exc:
                    conn.send(describe(exc))
                    status = _ERROR
                ctrl[_STATUS] = status
                ctrl[_DONE] = seq  # last: the results above are visible before it (x86 store order)
            elif command == _PIPE:
                name, payload = conn.recv()
                try:
                    conn.send(("ok", answer(envs, name, payload)))
                except Exception as exc:
                    conn.send(("error", describe(exc)))
            else:  # _CLOSE
                break
    except (EOFError, OSError):  # the main process went away
        pass
    finally:
        for env in envs:
            env.close()
        if idle is not None:
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


def _with_worker(env: VectorEnv) -> SharedMemoryVectorEnv | None:
    """``env``'s shared-memory vector env (through its wrappers) while its worker process runs, else None."""
    base = env.unwrapped
    return base if isinstance(base, SharedMemoryVectorEnv) and base._process is not None else None


def worker_wait(env: VectorEnv) -> Callable[[], float] | None:
    """Seconds ``env``'s shared-memory worker has kept :meth:`SharedMemoryVectorEnv.step` waiting so far (a
    counter, through its wrappers), None when ``env`` steps everything in this process."""
    base = _with_worker(env)
    return None if base is None else lambda: base.wait_s


def run_queue_s(pid: int) -> float | None:
    """Seconds the task ``pid`` (a process's main thread) has spent runnable but waiting for a core: the second field
    of ``/proc/<pid>/schedstat``. None where it cannot be read (another OS, a process that is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def run_queue_total(env: VectorEnv) -> float | None:
    """Seconds this process and ``env``'s shared-memory worker have waited for a core so far (:func:`run_queue_s`);
    None without a worker or where the kernel does not say."""
    base = _with_worker(env)
    if base is None:
        return None
    ours, worker = run_queue_s(os.getpid()), run_queue_s(base._process.pid)
    return None if ours is None or worker is None else ours + worker


BUSY_SHARE = 0.2
"""The share of wall time the run's two processes may spend waiting for a core before the run counts its cores as
taken (:class:`WorkerWatch`, :func:`busy_cores_note`): near 0 on an otherwise idle machine (0.17 ms in 0.54 s of
a busy loop, one reading), about half the wall time per process with twice as many CPU-bound processes as cores
(0.53 s in 1 s beside three busy loops on 2 cores, one reading)."""
WAIT_SHARE = 0.4
"""Where the kernel does not say: the share of wall time the trainer may wait for its worker (10-28% per update on an
idle machine early in a Hopper run, when episodes end often and the two sub-envs' steps differ in cost)."""


def busy_share(
    queued_s: float | None, waited_s: float, wall_s: float, *, share: float = BUSY_SHARE, wait_share: float = WAIT_SHARE
) -> tuple[float, bool]:
    """The share of ``wall_s`` in which the run's processes waited ``queued_s`` for a core, and whether it is over
    ``share``: the sign that other processes use the run's cores. Where the kernel does not say (``queued_s`` None),
    the trainer's ``waited_s`` for its worker stand in, against ``wait_share``."""
    if queued_s is not None:
        return queued_s / wall_s, queued_s / wall_s > share
    return waited_s / wall_s, waited_s / wall_s > wait_share


def busy_cores_note(queued_s: float | None, waited_s: float, wall_s: float) -> str | None:
    """The end-of-run note for a run that kept its worker (``hardware.busy_fallback=false``) while other processes
    used the cores (:func:`busy_share`); None when the cores were the run's own."""
    if wall_s <= 0:
        return None
    share, over = busy_share(queued_s, waited_s, wall_s)
    if not over:
        return None
    who = "its two processes waited for a core" if queued_s is not None else "it waited for its env worker"
    what = f"{who} {share:.0%} of the time"
    return (
        f"pgcli: note: another process used this run's cores ({what}): hardware.vec_env=sync may be faster "
        "on this machine"
    )


HOME_NOTE = (
    "pgcli: note: another process is using this run's cores (its two processes waited for one {share} of the "
    "time): the run continues in one process, with the same results (hardware.busy_fallback=false keeps the worker)"
)


class WorkerWatch:
    """Between updates: brings a shared-memory env's worker sub-envs home (:meth:`SharedMemoryVectorEnv.bring_home`,
    the same results) when another process has started to use the run's cores (a second run started beside it, say):
    then the trainer and its busy-waiting worker share two cores with it, and every vector step waits for whichever
    is descheduled, while one process would have a core to itself.

    The sign: for ``patience`` updates in a row, the run's two processes together spent more than ``share`` of the
    wall time runnable but off a core (:func:`run_queue_s`; see :data:`BUSY_SHARE`). Where the kernel does not
    tell, the trainer's waits for the worker (``wait_s``) stand in, with a higher bar (``wait_share``): they are
    also 10-28% per update on an idle machine, when the two sub-envs' steps differ in cost. :func:`pgcli.hardware.placement.free_core`
    cannot tell here: the run's own worker counts as a runnable process while it busy-waits.

    Call it only with no evaluation in the worker; it returns the note to print when the sub-envs came home."""

    def __init__(
        self,
        env: SharedMemoryVectorEnv,
        *,
        share: float = BUSY_SHARE,
        wait_share: float = WAIT_SHARE,
        patience: int = 2,
        run_queue: Callable[[], float | None] | None = None,
    ) -> None:
        self.env, self.share, self.wait_share, self.patience = env, share, wait_share, patience
        self.run_queue = run_queue or self._run_queue
        """Seconds the run's processes have waited for a core so far (None: not known here)."""
        self._last = (self.run_queue(), env.wait_s, time.perf_counter())
        self._strikes = 0

    def _run_queue(self) -> float | None:
        return run_queue_total(self.env)

    def __call__(self) -> str | None:
        queued, waited, now = self.run_queue(), self.env.wait_s, time.perf_counter()
        (queued0, waited0, then), self._last = self._last, (queued, waited, now)
        queued_s = None if queued is None or queued0 is None else queued - queued0
        share, busy = busy_share(queued_s, waited - waited0, max(now - then, 1e-9), share=self.share,
                                 wait_share=self.wait_share)  # fmt: skip
        self._strikes = self._strikes + 1 if busy else 0
        if self._strikes < self.patience or not self.env.bring_home():
            return None
        return HOME_NOTE.format(share=f"{share:.0%}")


def worker_watch(env: VectorEnv) -> WorkerWatch | None:
    """A :class:`WorkerWatch` for ``env``'s shared-memory worker (through its wrappers), None without one."""
    base = _with_worker(env)
    return None if base is None else WorkerWatch(base)


class SharedMemoryVectorEnv(VectorEnv):
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
        self.num_envs = n
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.envs = [fn() for fn in env_fns[: n - n_worker]]
        obs_space, action_space = self.envs[0].observation_space, self.envs[0].action_space
        self.single_observation_space, self.single_action_space = obs_space, action_space
        self.observation_space, self.action_space = batch_space(obs_space, n), batch_space(action_space, n)
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
        self._process: Any = None
        self._closed_worker = True
        self.wait_s = 0.0
        """Seconds :meth:`step` waited for the worker after stepping its own sub-envs: near 0 when the worker has a
        core of its own, more when another process takes it (:class:`WorkerWatch` reads the run queue instead)."""
        if n_worker:
            self._start_worker(list(env_fns[self.n_local :]), obs_space, action_space)

    def _start_worker(self, env_fns: list[Callable[[], gym.Env]], obs_space: Any, action_space: Any) -> None:
        layout = _layout(len(env_fns), obs_space, action_space)
        ctx = mp.get_context("spawn")  # torch's threads do not survive a fork
        self._buffer = ctx.RawArray("B", _nbytes(layout))
        self._shared = _views(self._buffer, layout)
        self._ctrl = memoryview(self._buffer).cast("B").cast("q")[:4]
        self._seq = 0
        self._conn, child = ctx.Pipe()
        self._eval_conn, eval_child = ctx.Pipe()
        args = (child, self._buffer, layout, env_fns, self.n_local, eval_child)
        self._process = ctx.Process(target=_worker, args=args, daemon=True, name="pgcli-env-worker")
        self._process.start()
        child.close()  # only the worker holds its end: its death is an EOF here, never a hang
        eval_child.close()
        self._closed_worker = False
        self._receive("start")

    # -- the worker ---------------------------------------------------------------------------------------------------
    def evaluation_channel(self) -> tuple[Connection, Any] | None:
        """The worker's evaluation pipe and process (:class:`_IdleEvaluation`), None without a worker."""
        if self._process is None or self._closed_worker:
            return None
        return self._eval_conn, self._process

    def _died(self, command: str) -> EnvWorkerError:
        self._process.join(timeout=1.0)
        self._closed_worker = True
        return EnvWorkerError(
            f"the env worker process (pid {self._process.pid}) died during '{command}' "
            f"(exit code {self._process.exitcode}); hardware.vec_env=sync runs without it"
        )

    def _receive(self, command: str) -> Any:
        try:
            status, result = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            raise self._died(command) from None
        if status == "error":
            self._closed_worker = True
            raise EnvWorkerError(f"env worker '{command}' failed: {result}")
        return result

    def _signal(self, command: int) -> None:
        if self._closed_worker:
            raise EnvWorkerError("the env worker process has already stopped")
        self._seq += 1
        self._ctrl[_CMD] = command
        self._ctrl[_SEQ] = self._seq  # last: the worker reads the command (and the actions) after it

    def _pipe(self, command: str, payload: Any) -> None:
        """Send a pipe command; its answer is ``_receive(command)``."""
        self._signal(_PIPE)
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._died(command) from None

    def _wait_step(self) -> int:
        """Busy-wait for the worker's step (then poll, checking that it lives); its status."""
        ctrl, seq = self._ctrl, self._seq
        if ctrl[_DONE] != seq:
            start = time.perf_counter()
            deadline = start + SPIN_S
            while ctrl[_DONE] != seq and time.perf_counter() < deadline:
                pass
            while ctrl[_DONE] != seq:
                if not self._process.is_alive():
                    raise self._died("step")
                time.sleep(0)
            self.wait_s += time.perf_counter() - start
        return ctrl[_STATUS]

    # -- VectorEnv ----------------------------------------------------------------------------------------------------
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:  # type: ignore[override]
        n, k = self.num_envs, self.n_local
        worker = self._process is not None
        shared = worker and isinstance(actions, np.ndarray) and actions.dtype == self._shared["actions"].dtype
        if shared:
            self._shared["actions"][...] = actions[k:]
            self._signal(_STEP)
        elif worker:  # actions of another dtype: through the pipe, exactly as given
            self._pipe("step", list(actions[k:]))
        obs: Any = np.empty(self.observation_space.shape, self.observation_space.dtype) if self._box_obs else [None] * n  # type: ignore[arg-type]
        rewards = np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
        ended: list[tuple[int, Any, dict[str, Any]]] = []
        try:
            for i in range(k):
                o, r, te, tr, info = self.envs[i].step(actions[i])
                if te or tr:
                    ended.append((i, o, info))
                    o, _ = self.envs[i].reset()
                obs[i], rewards[i], terminated[i], truncated[i] = o, r, te, tr
        except BaseException:
            if shared:  # collect the worker's step, so no stale message waits in the pipe
                with contextlib.suppress(EnvWorkerError, EOFError, OSError):
                    if self._wait_step() != _OK:
                        self._conn.recv()
            raise
        if shared:
            status = self._wait_step()
            obs[k:] = self._shared["obs"]
            rewards[k:], terminated[k:] = self._shared["rewards"], self._shared["terminated"]
            truncated[k:] = self._shared["truncated"]
            if status != _OK:
                try:
                    message = self._conn.recv()
                except (EOFError, ConnectionResetError, OSError):
                    raise self._died("step") from None
                if status == _ERROR:
                    self._closed_worker = True
                    raise EnvWorkerError(f"env worker 'step' failed: {message}")
                ended += message
        elif worker:
            for i, (o, r, te, tr, final_o, final_info, _) in enumerate(self._receive("step"), start=k):
                obs[i], rewards[i], terminated[i], truncated[i] = o, r, te, tr
                if final_info is not None:
                    ended.append((i, final_o, final_info))
        infos: dict[str, Any] = {}
        for i, final_o, final_info in ended:  # in sub-env order, as SyncVectorEnv adds them
            infos = self._add_info(infos, {"final_obs": final_o, "final_info": final_info}, i)
        if not self._box_obs:
            out: Any = create_empty_array(self.single_observation_space, n)
            obs = concatenate(self.single_observation_space, obs, out)
        self._last_obs = obs
        return (obs.copy() if self._box_obs else deepcopy(obs)), rewards, terminated, truncated, infos

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        """As ``SyncVectorEnv.reset``: int seeds give sub-env i ``seed + i``; ``options["reset_mask"]`` resets only
        the selected sub-envs (the others' rows of the returned batch are their last observations)."""
        n, k = self.num_envs, self.n_local
        seeds, mask, options = reset_arguments(n, seed, options)
        if self._process is not None:
            self._pipe("reset", (seeds[k:], list(mask[k:]), options))
        results = reset_envs(self.envs, seeds[:k], list(mask[:k]), options)
        if self._process is not None:
            results += self._receive("reset")
        infos: dict[str, Any] = {}
        rows = []
        for i, result in enumerate(results):
            if result is None:
                rows.append(self._last_obs[i])
            else:
                rows.append(result[0])
                infos = self._add_info(infos, result[1], i)
        space = self.single_observation_space
        out: Any = create_empty_array(space, n)
        self._last_obs = concatenate(space, rows, out)
        return self._last_obs.copy(), infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Every sub-env's attribute ``name`` (through its wrappers), called with the arguments when it is a method;
        in sub-env order (as ``SyncVectorEnv.call``)."""
        if self._process is not None:
            self._pipe("call", (name, args, kwargs))
        local = answer(self.envs, "call", (name, args, kwargs))
        return tuple(local + (self._receive("call") if self._process is not None else []))

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
        if self._process is not None:
            self._pipe("set_attr", (name, list(values[k:])))
        answer(self.envs, "set_attr", (name, list(values[:k])))
        if self._process is not None:
            self._receive("set_attr")

    def bring_home(self) -> bool:
        """Step every sub-env in this process from now on, and stop the worker: for a run whose worker has lost its
        core to another process. The worker's sub-envs are made here and continue their episodes in progress from
        their ``episode_state`` (simulator, wrapper counters, RNGs: the run's results do not change). False, changing
        nothing, when there is no worker or a sub-env's simulator state cannot be read (it would restart)."""
        if self._process is None:
            return False
        states = list(self.get_attr("episode_state"))[self.n_local :]
        if any(state["sim"] is None for state in states):
            return False
        envs = [fn() for fn in self._env_fns[self.n_local :]]
        for env in envs:  # as a vector env's first reset does (the wrappers' checks expect one); then overwritten
            env.reset(seed=0)
        answer(envs, "set_attr", ("episode_state", states))
        self._stop_worker()
        self.envs += envs
        self.n_local, self._process = self.num_envs, None
        return True

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        if self._process is not None:
            self._stop_worker()

    def _stop_worker(self) -> None:
        self._closed_worker = True
        if self._process.is_alive():  # also after an error it answered: it waits for the next command
            self._seq += 1
            self._ctrl[_CMD] = _CLOSE
            self._ctrl[_SEQ] = self._seq
        stop_process(self._process, self._conn)
        self._eval_conn.close()
