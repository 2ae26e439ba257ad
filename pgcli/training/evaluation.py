"""How a training run scores its agent: :class:`Evaluator` plays ``eval.episodes`` episodes on an env of its own with a
frozen copy of the training env's normalisation, the same start states at every evaluation.

It plays them in this process, or concurrently with training in an evaluation process (:class:`EvalProcess`,
``hardware.eval_process``) or in the shared-memory env's worker (:class:`WorkerEvaluation`,
``hardware.eval_in_worker``), with the same results wherever they run. :class:`EvaluatorLike` is what the monitor needs
of any evaluator (text tasks have ``pgcli.lm.evaluation.TextEvaluator``), and :class:`BackgroundEvaluation` what it
needs of one that evaluates concurrently with training (its :attr:`EvaluatorLike.concurrent` side).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from gymnasium.vector import VectorEnv

from pgcli.config import EnvConfig, EvalConfig
from pgcli.contracts import Actor, Agent, EvalResult
from pgcli.envs.episodes import EvalPlan, PipedEpisodes, play_out, run_episodes
from pgcli.envs.make import EVAL_SEED_OFFSET, make_vec_env
from pgcli.envs.normalize import load_normalizer_state, normalizer_state
from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.envs.split import EnvWorkerError
from pgcli.hardware.child import ChildPipe, ChildProcess, describe
from pgcli.video import EpisodeRecorder, make_recording_env


class BackgroundEvaluation(Protocol):
    """An evaluator's concurrent side: one evaluation of a policy snapshot in flight at a time, beside training."""

    def submit(self, actor: Actor) -> None:
        """Start evaluating ``actor`` (a picklable snapshot); :meth:`result` collects it."""

    def ready(self) -> bool:
        """Whether the submitted evaluation has finished."""

    def result(self) -> EvalResult:
        """The submitted evaluation's result (waits for it)."""

    def leave_worker(self) -> None:
        """The training env's worker has stopped: evaluate in this process from now on (no evaluation in flight)."""


class EvaluatorLike(Protocol):
    """What the monitor evaluates with: :class:`Evaluator` (episodes) or ``pgcli.lm.evaluation.TextEvaluator``."""

    cfg: EvalConfig

    @property
    def concurrent(self) -> BackgroundEvaluation | None:
        """Where an agent that can ``snapshot`` its policy is evaluated beside training; None: only in this process."""

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
        self.on_episode: Callable[[int], None] | None = None
        """Called with the number of episodes played as each one ends, in an evaluation played in this process (the
        final evaluation's progress: ``pgcli.training.monitor``)."""

    @property
    def concurrent(self) -> Evaluator | None:
        """Itself while evaluations run concurrently (:attr:`background`), else None."""
        return self if self.background else None

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
                self._env = make_vec_env(
                    self.env_cfg, seed=self.seed, n_envs=self.cfg.n_envs, vectorization="lean", training=False
                )  # whole games, raw rewards (docs/pixels.md)
        env = self._env
        load_normalizer_state(env, normalizer_state(self.train_env), training=False)
        recorder = EpisodeRecorder(env, video.parent, stem=video.name) if video is not None else None
        # the same start states at every evaluation: comparable over time
        result = run_episodes(
            env,
            agent,
            self.cfg.episodes,
            deterministic=self.cfg.deterministic,
            seed=self.seed,
            recorder=recorder,
            on_episode=self.on_episode,
        )
        return result, recorder.close() if recorder is not None else []

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        if self._process is not None:
            self._process.close()


def worker_channel(env: VectorEnv) -> tuple[Connection, Any] | None:
    """The evaluation pipe of ``env``'s shared-memory worker (through its VecNormalize), None when it has none."""
    inner = env.unwrapped
    return inner.evaluation_channel() if isinstance(inner, SharedMemoryVectorEnv) else None


def eval_plan(env_cfg: EnvConfig, cfg: EvalConfig, seed: int) -> EvalPlan:
    """What an evaluation away from the trainer plays (picklable): ``cfg``'s episodes on the lean env an in-process
    :class:`Evaluator` builds, seeded ``seed`` (built once, on the first request)."""
    make_env = partial(make_vec_env, env_cfg, seed=seed, n_envs=cfg.n_envs, vectorization="lean", training=False)
    return EvalPlan(make_env, episodes=cfg.episodes, deterministic=cfg.deterministic, seed=seed)


class _PipedEvaluation:
    """One evaluation in flight at a time, answered over a pipe by another process: what :class:`EvalProcess` and
    :class:`WorkerEvaluation` share. A request is ``(actor snapshot, normaliser state, EvalPlan)``, played by
    ``pgcli.envs.episodes.PipedEpisodes``; the answer ``("ok", (returns, lengths))`` or ``("error", message)``. The
    other process's death and its errors are one-line :class:`EnvWorkerError` s (:class:`ChildPipe`)."""

    def __init__(self, pipe: ChildPipe, plan: EvalPlan) -> None:
        self._pipe, self._plan = pipe, plan
        self._pending = False

    def submit(self, actor: Actor, normalizer: dict[str, Any] | None) -> None:
        if self._pending:
            raise RuntimeError("an evaluation is already in flight")
        self._pipe.send((actor, normalizer, self._plan))
        self._pending = True

    def ready(self) -> bool:
        return self._pending and self._pipe.poll()

    def result(self) -> EvalResult:
        message = self._pipe.recv()  # the other process plays on while this one waits
        self._pending = False
        return EvalResult(*self._pipe.unpack(message))


class EvalProcess(_PipedEvaluation):
    """Evaluations in a separate process (``hardware.eval_process``), concurrently with training: a spare core plays
    the evaluation episodes while the trainer collects and updates.

    The process builds the evaluation env once, as :class:`Evaluator` does, and for each submitted policy snapshot
    loads the training env's normalisation statistics as they were at submission (frozen) and plays
    :func:`run_episodes` with the same seed, so its results are those an in-process evaluation at that step would
    give. It runs at a lower priority (nice +10) than the trainer. One evaluation is in flight at a time.
    """

    def __init__(self, env_cfg: EnvConfig, cfg: EvalConfig, *, seed: int) -> None:
        self._process = ChildProcess(
            _eval_process_main,
            name="pgcli-eval",
            error=EnvWorkerError,
            died="the evaluation process (pid {pid}) died (exit code {code}); "
            "hardware.eval_process=false runs without it",
            failed="evaluation process failed: {message}",
        )
        super().__init__(self._process, eval_plan(env_cfg, cfg, seed))

    def close(self) -> None:
        self._process.close(None)


class WorkerEvaluation(_PipedEvaluation):
    """Evaluations played by the shared-memory env's worker process in its idle time, i.e. during the trainer's
    updates (``hardware.eval_in_worker``; the worker side is ``pgcli.envs.shm._IdleEvaluation``).

    The interface of :class:`EvalProcess` without a process of its own: the snapshot and the frozen normaliser state
    go to the worker through its evaluation pipe, and the worker plays the episodes one step at a time while no step
    command arrives, so the second core that idles during updates plays the evaluation and the rollouts keep the
    worker's full attention. Its results are those an in-process evaluation at that step would give.
    """

    def __init__(self, channel: tuple[Connection, Any], env_cfg: EnvConfig, cfg: EvalConfig, *, seed: int) -> None:
        conn, process = channel
        pipe = ChildPipe(
            conn,
            process,
            error=EnvWorkerError,
            died="the env worker process (pid {pid}) died during an evaluation (exit code {code}); "
            "hardware.eval_in_worker=false evaluates in this process",
            failed="evaluation in the env worker failed: {message}",
        )
        super().__init__(pipe, eval_plan(env_cfg, cfg, seed))

    def close(self) -> None:
        """Nothing of its own to close: the env owns the worker and its pipes."""


def _eval_process_main(conn: Connection) -> None:
    """The evaluation process: answer each (snapshot, normaliser state, plan) with (returns, lengths) until None."""
    import torch

    os.nice(10)  # the trainer (and its env worker and critic processes) come first; evaluation fills the gaps
    torch.set_num_threads(1)
    episodes = PipedEpisodes()
    try:
        while (request := conn.recv()) is not None:
            result = play_out(episodes.steps(*request))
            conn.send(("ok", (result.returns, result.lengths)))
    except EOFError:  # the trainer went away
        pass
    except Exception as exc:  # reported to the trainer, which raises it as one line
        with contextlib.suppress(OSError):
            conn.send(("error", describe(exc, where=False)))
    finally:
        episodes.close()
        conn.close()
