"""TODO: docstring of pgcli.training.evaluation."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn, Protocol

from gymnasium.vector import VectorEnv

from pgcli.algo.base import Actor, Agent, EvalResult
from pgcli.config import EnvConfig, EvalConfig
from pgcli.envs.episodes import run_episodes
from pgcli.envs.make import (
    EVAL_SEED_OFFSET,
    load_normalizer_state,
    make_vec_env,
    normalizer_state,
)
from pgcli.envs.worker import EnvWorkerError, stop_process
from pgcli.video import EpisodeRecorder, make_recording_env


class EvaluatorLike(Protocol):
    """What the monitor evaluates with: :class:`Evaluator` (episodes) or ``pgcli.lm.evaluate.TextEvaluator``."""

    cfg: EvalConfig

    def __call__(self, agent: Agent) -> EvalResult: ...

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]: ...

    def close(self) -> None: ...


class Evaluator:
    """Runs ``episodes`` episodes on a separate env with frozen copies of the training env's normalisation."""

    def __init__(
        self,
        env_cfg: EnvConfig,
        cfg: EvalConfig,
        *,
        seed: int,
        train_env: VectorEnv,
        background: bool = False,
        in_worker: bool = False,
    ) -> None:
        self.env_cfg, self.cfg, self.seed, self.train_env = env_cfg, cfg, seed + EVAL_SEED_OFFSET, train_env
        self.in_worker = in_worker and not background and worker_channel(train_env) is not None
        """Evaluations go to the training env's worker process (:class:`WorkerEvaluation`): asked for, and it has
        one (``background``, the evaluation process, comes first)."""
        self.background = background or self.in_worker
        """Evaluate agents that can ``snapshot`` their policy concurrently, in an :class:`EvalProcess` or the worker."""
        self._env: VectorEnv | None = None
        self._process: EvalProcess | WorkerEvaluation | None = None

    def leave_worker(self) -> None:
        """The training env's worker has stopped (its sub-envs came home): evaluate in this process from now on, with
        the same results. Call it with no evaluation in flight."""
        if self.in_worker:
            self.in_worker = self.background = False
            self._process = None

    def submit(self, actor: Actor) -> None:
        """Start evaluating ``actor`` (a picklable snapshot) concurrently; :meth:`result` collects it."""
        if self._process is None:
            channel = worker_channel(self.train_env) if self.in_worker else None
            self._process = (
                WorkerEvaluation(channel, self.env_cfg, self.cfg, seed=self.seed)
                if channel is not None
                else EvalProcess(self.env_cfg, self.cfg, seed=self.seed)
            )
        self._process.submit(actor, normalizer_state(self.train_env))

    def ready(self) -> bool:
        """Whether the submitted evaluation has finished."""
        return self._process is not None and self._process.ready()

    def result(self) -> EvalResult:
        """The submitted evaluation's result (waits for it)."""
        assert self._process is not None, "result() without submit()"
        return self._process.result()

    def __call__(self, agent: Agent) -> EvalResult:
        return self._run(agent, None)[0]

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]:
        """Evaluate ``agent`` and record its first episode to ``video`` (a path; the suffix is the format's)."""
        return self._run(agent, video)

    def _run(self, agent: Agent, video: Path | None) -> tuple[EvalResult, list[Path]]:
        if not isinstance(agent, Actor):
            raise TypeError(f"{type(agent).__name__} cannot act on a gymnasium env")
        if self._env is None:
            if self.cfg.video_every > 0:  # frames on demand only; an env that cannot render fails here, once
                self._env = make_recording_env(self.env_cfg, seed=self.seed, n_envs=self.cfg.n_envs)
            else:
                self._env = make_vec_env(self.env_cfg, seed=self.seed, n_envs=self.cfg.n_envs, vectorization="lean")
        env = self._env
        load_normalizer_state(env, normalizer_state(self.train_env), training=False)
        recorder = EpisodeRecorder(env, video.parent, stem=video.name) if video is not None else None
        # the same start states at every evaluation: comparable over time
        result = run_episodes(env, agent, self.cfg.episodes, deterministic=self.cfg.deterministic, seed=self.seed,
                              recorder=recorder)  # fmt: skip
        return result, recorder.close() if recorder is not None else []

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        if self._process is not None:
            self._process.close()


def worker_channel(env: VectorEnv) -> tuple[Connection, Any] | None:
    """The evaluation pipe of ``env``'s shared-memory worker (through its VecNormalize), None when it has none."""
    from pgcli.envs.shm import SharedMemoryVectorEnv

    inner = env.unwrapped
    return inner.evaluation_channel() if isinstance(inner, SharedMemoryVectorEnv) else None


class _PipedEvaluation:
    """One evaluation in flight at a time, answered over a pipe by another process: what :class:`EvalProcess` and
    :class:`WorkerEvaluation` share. The answer is ``("ok", (returns, lengths))`` or ``("error", message)``; the other
    process's death is an EOF (only it holds the other end), reported by ``_fail``."""

    _conn: Connection
    _pending = False
    _failing = "evaluation"
    """The subject of the error raised for an ``("error", message)`` answer."""

    def _request(self, actor: Actor, normalizer: dict[str, Any] | None) -> tuple[Any, ...]:
        raise NotImplementedError

    def _fail(self) -> NoReturn:
        raise NotImplementedError

    def submit(self, actor: Actor, normalizer: dict[str, Any] | None) -> None:
        if self._pending:
            raise RuntimeError("an evaluation is already in flight")
        try:
            self._conn.send(self._request(actor, normalizer))
        except OSError:
            self._fail()
        self._pending = True

    def ready(self) -> bool:
        return self._pending and self._conn.poll()

    def result(self) -> EvalResult:
        try:
            status, value = self._conn.recv()  # the other process plays on while this one waits
        except (EOFError, OSError):
            self._fail()
        self._pending = False
        if status == "error":
            raise EnvWorkerError(f"{self._failing} failed: {value}")
        return EvalResult(*value)


class EvalProcess(_PipedEvaluation):
    """Evaluations in a separate process (``hardware.eval_process``), concurrently with training: a spare core plays
    the evaluation episodes while the trainer collects and updates.

    The process builds the evaluation env once, as :class:`Evaluator` does, and for each submitted policy snapshot
    loads the training env's normalisation statistics as they were at submission (frozen) and plays
    :func:`run_episodes` with the same seed, so its results are those an in-process evaluation at that step would
    give. It runs at a lower priority (nice +5) than the trainer. One evaluation is in flight at a time.
    """

    def __init__(self, env_cfg: EnvConfig, cfg: EvalConfig, *, seed: int) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_eval_process_main, args=(child, env_cfg, cfg, seed), daemon=True,
                                    name="pgcli-eval")  # fmt: skip
        self._process.start()
        child.close()  # only the process holds its end: its death is an EOF here, never a hang

    _failing = "evaluation process"

    def _request(self, actor: Actor, normalizer: dict[str, Any] | None) -> tuple[Any, ...]:
        return actor, normalizer

    def _fail(self) -> NoReturn:
        self._process.join(timeout=1.0)
        pid, code = self._process.pid, self._process.exitcode
        raise EnvWorkerError(
            f"the evaluation process (pid {pid}) died (exit code {code}); hardware.eval_process=false runs without it"
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        stop_process(self._process, self._conn)


class WorkerEvaluation(_PipedEvaluation):
    """Evaluations played by the shared-memory env's worker process in its idle time, i.e. during the trainer's
    updates (``hardware.eval_in_worker``; the worker side is ``pgcli.envs.shm._IdleEvaluation``).

    The interface of :class:`EvalProcess` without a process of its own: the snapshot and the frozen normaliser state
    go to the worker through its evaluation pipe, and the worker plays :func:`episode_steps` one step at a time while
    no step command arrives, so the second core that idles during updates plays the evaluation and the rollouts keep
    the worker's full attention. Its results are those an in-process evaluation at that step would give.
    """

    def __init__(self, channel: tuple[Connection, Any], env_cfg: EnvConfig, cfg: EvalConfig, *, seed: int) -> None:
        self._conn, self._process = channel
        self.env_cfg, self.cfg, self.seed = env_cfg, cfg, seed

    _failing = "evaluation in the env worker"

    def _request(self, actor: Actor, normalizer: dict[str, Any] | None) -> tuple[Any, ...]:
        return actor, normalizer, self.env_cfg, self.cfg, self.seed

    def _fail(self) -> NoReturn:
        self._process.join(timeout=1.0)
        raise EnvWorkerError(
            f"the env worker process (pid {self._process.pid}) died during an evaluation (exit code "
            f"{self._process.exitcode}); hardware.eval_in_worker=false evaluates in this process"
        )

    def close(self) -> None:
        """Nothing of its own to close: the env owns the worker and its pipes."""


def piped_eval_env(
    env: VectorEnv | None, env_cfg: EnvConfig, cfg: EvalConfig, seed: int, normalizer: dict[str, Any] | None
) -> VectorEnv:
    """The env of an evaluation played away from the trainer (its process or the env worker): ``env``, or a new lean
    one on the first request, with the trainer's normaliser statistics of this request (frozen)."""
    if env is None:
        env = make_vec_env(env_cfg, seed=seed, n_envs=cfg.n_envs, vectorization="lean")
    load_normalizer_state(env, normalizer, training=False)
    return env


def _eval_process_main(conn: Connection, env_cfg: EnvConfig, cfg: EvalConfig, seed: int) -> None:
    """The evaluation process: answer each (snapshot, normaliser state) with (returns, lengths) until None."""
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run through the main process
    os.nice(10)  # the trainer (and its env worker and critic processes) come first; evaluation fills the gaps
    torch.set_num_threads(1)
    env = None
    try:
        while (request := conn.recv()) is not None:
            actor, normalizer = request
            env = piped_eval_env(env, env_cfg, cfg, seed, normalizer)
            result = run_episodes(env, actor, cfg.episodes, deterministic=cfg.deterministic, seed=seed)
            conn.send(("ok", (result.returns, result.lengths)))
    except EOFError:  # the trainer went away
        pass
    except Exception as exc:  # reported to the trainer, which raises it as one line
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if env is not None:
            env.close()
        conn.close()
