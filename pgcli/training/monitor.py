"""What every trainer shares around its update loop: episode statistics, evaluation, checkpoints, progress.

A trainer (ours or the SB3 adapter) reports three things to the :class:`TrainingMonitor`, through the
:class:`pgcli.contracts.Monitor` protocol:

- ``episodes(step, info)`` after each vector step: raw returns/lengths of the episodes that ended;
- ``log(step, metrics)``: its ``train/*`` diagnostics;
- ``update(step, agent)`` after each update: the monitor logs ``rollout/*`` and ``time/sps``, moves the progress bar,
  and evaluates or checkpoints ``agent`` when their cadence is due.

The monitor is built from a few small parts (``pgcli.training.build`` fills them from the config): the run's
:class:`MetricLogger`, a :class:`Schedule` (when to log, evaluate and checkpoint), an evaluator, its :class:`Outputs`
(where checkpoints, the best agent, videos and samples go) and :class:`Hooks` (the run's stop request, the search
trial's ``on_eval``, the env worker's wait clock and watch).

After each evaluation the monitor calls its ``on_eval`` hook, if any, with the evaluation's scheduled step and mean
return: an Optuna trial reports it to its study there, and the hook raises to stop a pruned trial
(:class:`pgcli.sweeps.study.TrialLink`; the monitor itself knows nothing of Optuna).

Metric keys are the same for every algorithm; ``step`` is always environment steps.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgcli.contracts import Agent, EvalResult
from pgcli.envs.episodes import finished_episodes
from pgcli.errors import DivergenceError
from pgcli.tracking.logger import MetricLogger
from pgcli.training.checkpoints import (
    CHECKPOINTS_DIR,
    best_candidate_dir,
    complete_checkpoint,
    discard,
    prune_checkpoints,
    put_in_place,
    staging_dir,
    step_name,
)
from pgcli.training.evaluation import Evaluator, EvaluatorLike
from pgcli.training.monitor_state import read_monitor_state, write_monitor_state
from pgcli.training.progress import number, progress_bar
from pgcli.training.run import StopRequest

log = logging.getLogger("pgcli")


@dataclass(frozen=True)
class Schedule:
    """When the monitor acts, in env steps; an interval of 0 turns that cadence off."""

    total_steps: int
    """The run's budget: the progress bar's length and the final evaluation's scheduled step."""
    eval_every: int = 0
    """Evaluate at the first update at or past each multiple (``eval.every``; 0: only at the end)."""
    checkpoint_every: int = 0
    """Checkpoint at the first update at or past each multiple (``checkpoint_every``)."""
    log_every_steps: int = 1000
    """Log rollout statistics at most this often (A2C updates every 40 env steps)."""
    window: int = 100
    """Episodes in the rolling ``rollout/ep_return_mean`` and ``rollout/ep_len_mean``."""
    eval_at_start: bool = False
    """Also evaluate at step 0, before the first update (:meth:`TrainingMonitor.begin`): a run from ``init=`` starts
    its curves at the model it starts from (docs/lm.md, "Starting RL from SFT")."""


@dataclass(frozen=True)
class Outputs:
    """Where the monitor writes; None turns that output off."""

    checkpoints: Path | None = None
    """``step_<n>`` checkpoint directories (each with ``monitor.json``), logged as ``checkpoints/step_<n>``."""
    keep: int = 0
    """How many of the newest checkpoints to keep (``checkpoint_keep``; 0: all)."""
    best_model: Path | None = None
    """The agent of the best evaluation so far (``eval.save_best``)."""
    videos: Path | None = None
    """Evaluation videos, every ``eval.video_every`` env steps."""
    samples: Path | None = None
    """A text evaluator's samples tables (``samples/step_<n>.json``)."""


@dataclass(frozen=True)
class Hooks:
    """What the monitor answers to besides the trainer; each is optional."""

    stop: StopRequest | None = None
    """The run's stop request (``pgcli.training.run``): checkpoint at the update where a stop signal came, then end."""
    on_eval: Callable[[int, float], None] | None = None
    """Called with (scheduled step, mean return) after each evaluation; may raise to stop training."""
    env_wait: Callable[[], float] | None = None
    """Seconds the env has waited for its worker process so far (``pgcli.envs.shm_watch.worker_wait``): logged as
    ``time/env_wait_frac``, the share of wall time since the last log."""
    watch_worker: Callable[[], str | None] | None = None
    """Called after each update with no evaluation in flight (``pgcli.envs.shm_watch.WorkerWatch``): a note when the
    env's worker sub-envs came home, after which evaluations run in this process."""


class TrainingMonitor:
    """Shared bookkeeping of one training run (see the module docstring)."""

    def __init__(
        self,
        logger: MetricLogger,
        schedule: Schedule,
        *,
        evaluator: EvaluatorLike | None = None,
        outputs: Outputs = Outputs(),
        hooks: Hooks = Hooks(),
        progress: bool = True,
    ) -> None:
        self.logger, self.schedule, self.evaluator, self.outputs = logger, schedule, evaluator, outputs
        self.stop, self.on_eval, self.env_wait = hooks.stop, hooks.on_eval, hooks.env_wait
        self.watch_worker = hooks.watch_worker
        """``hooks.watch_worker`` until the worker has gone (then None: evaluations run in this process)."""
        # episodes
        self.recent_returns: deque[float] = deque(maxlen=schedule.window)
        self.recent_lengths: deque[int] = deque(maxlen=schedule.window)
        self.n_episodes = 0
        # evaluations
        self.last_eval: EvalResult | None = None
        self.best_eval: EvalResult | None = None
        self.best_step: int | None = None
        self._last_eval_step: int | None = None
        self._pending_eval: tuple[int, int | None, Path | None] | None = None
        """(step, scheduled step, saved agent) of the evaluation running in the evaluation process."""
        video_every = evaluator.cfg.video_every if evaluator is not None and outputs.videos is not None else 0
        self._video_every, self._next_video = video_every, _first_due(video_every)
        self._next_eval = _first_due(schedule.eval_every)
        # checkpoints
        self._next_ckpt = _first_due(schedule.checkpoint_every)
        self._pending_ckpt: tuple[int, Path, dict[str, Any]] | None = None
        """(step, staged agent directory, monitor state) of a checkpoint waiting for that evaluation's result."""
        self.last_checkpoint: Path | None = None
        """The newest complete checkpoint (named by DivergenceError as the last good one)."""
        self._last_ckpt_step: int | None = None
        self._step = 0
        """The step of the last update (:meth:`save_state` writes the state at it)."""
        # rates and progress
        self._waited = (self.env_wait(), time.perf_counter()) if self.env_wait is not None else (0.0, 0.0)
        self._eval_seconds = 0.0
        self._start = time.perf_counter()
        self._start_step = 0
        self._last_logged_step: int | None = None
        self._bar = _progress_bar(schedule.total_steps) if progress else None
        self._postfix: dict[str, str] = {}
        self._signal: tuple[str, float] | None = None
        """The last training signal the bar shows (:data:`BAR_SIGNALS`)."""

    @property
    def best_dir(self) -> Path | None:
        """Where the best evaluation's agent is kept (None: not kept); the run logs it as ``best_model``."""
        return self.outputs.best_model

    def begin(self, agent: Agent) -> None:
        """Before the first update: the step-0 evaluation of a schedule with ``eval_at_start``, logged as every other
        one, but not reported to ``on_eval`` (it scores the starting model, not a search trial's settings). A resumed
        run has logged it already."""
        if not self.schedule.eval_at_start or self._start_step != 0 or self._last_eval_step is not None:
            return
        on_eval, self.on_eval = self.on_eval, None
        try:
            self.evaluate(0, agent)
        finally:
            self.on_eval = on_eval

    # -- called by trainers ------------------------------------------------------------------------------------------
    def episodes(self, step: int, info: Mapping[str, Any]) -> None:
        """Record the episodes that ended in this vector step (raw, unnormalised returns)."""
        eps = finished_episodes(dict(info))
        self.add_episodes(step, eps.returns, eps.lengths)

    def add_episodes(self, step: int, returns: list[float], lengths: list[int]) -> None:
        for ret, length in zip(returns, lengths, strict=True):
            self.logger.log_metrics({"rollout/ep_return": ret, "rollout/ep_len": length}, step)
        self.recent_returns.extend(returns)
        self.recent_lengths.extend(lengths)
        self.n_episodes += len(returns)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log a trainer's diagnostics (``train/*``) at ``step``; the progress bar shows a text trainer's training
        signal (:data:`BAR_SIGNALS`)."""
        if metrics:
            self.logger.log_metrics({k: float(v) for k, v in metrics.items()}, step)
            for key, label in BAR_SIGNALS:
                if key in metrics:
                    self._signal = (label, float(metrics[key]))
                    break

    def update(self, step: int, agent: Agent) -> None:
        """After an update: rollout statistics, SPS, progress; evaluate / checkpoint when due.

        Rollout statistics are logged at most every ``log_every_steps`` env steps (A2C updates every 40 steps).
        """
        schedule, self._step = self.schedule, step
        self.collect_evaluation(wait=False)
        if self._last_logged_step is None or step - self._last_logged_step >= schedule.log_every_steps:
            self._log_rollout_stats(step)
        if self.watch_worker is not None and self._pending_eval is None and (note := self.watch_worker()):
            self.watch_worker = None  # the worker is gone; evaluations due from now on run here
            if self.evaluator is not None and (concurrent := self.evaluator.concurrent) is not None:
                concurrent.leave_worker()
            self.say(note)
        if self._next_eval is not None and step >= self._next_eval:
            # Scheduled step: the last multiple of eval.every reached, so runs whose updates end at different env
            # steps (other n_steps) report comparable steps to on_eval.
            self.evaluate(step, agent, scheduled=min(step - step % schedule.eval_every, schedule.total_steps))
            while self._next_eval <= step:
                self._next_eval += schedule.eval_every
        if self._next_ckpt is not None and step >= self._next_ckpt and self.outputs.checkpoints is not None:
            while self._next_ckpt <= step:
                self._next_ckpt += schedule.checkpoint_every
            self.save_checkpoint(step, agent, defer=True)
        self._stop_if_requested(step, agent)

    def due(self, step: int) -> bool:
        """Whether :meth:`update` at ``step`` reads the agent: an evaluation or checkpoint is due, or a stop was
        asked for (a sharded model is gathered for it first: ``hardware.shard=params``)."""
        evaluates = self._next_eval is not None and step >= self._next_eval
        saves = self._next_ckpt is not None and step >= self._next_ckpt and self.outputs.checkpoints is not None
        return evaluates or saves or bool(self.stop)

    def say(self, note: str) -> None:
        """A one-line note on stderr (above the progress bar, which stays) and in train.log."""
        log.info(note.removeprefix("pgcli: note: ").removeprefix("pgcli: "))
        if self._bar is not None:
            self._bar.write(note, file=sys.stderr)
        else:
            print(note, file=sys.stderr, flush=True)

    def save_checkpoint(self, step: int, agent: Agent, *, defer: bool = False) -> Path | None:
        """Save ``agent`` and this monitor's state to ``<checkpoints>/step_<step>`` and log it as an artifact.

        Buffered metrics are flushed first, so a store never lacks a point from before its last checkpoint (a
        resumed run continues from there and logs only later steps).

        The monitor state includes the evaluations up to ``step``. With ``defer`` and an evaluation still running in
        the evaluation process, training does not wait for it: the agent is saved now to a hidden staging
        directory, and the checkpoint is completed and put in place (``step_<step>``) when that evaluation's result
        is collected, usually after the next update (resume never sees it before). Returns None then.
        """
        checkpoints = self.outputs.checkpoints
        if checkpoints is None:
            return None
        if defer and self._pending_eval is not None:
            self._discard_staged_checkpoint()
            staged = agent.save(staging_dir(checkpoints, step))
            self._pending_ckpt = (step, staged, self.state_dict(step))
            return None
        self.collect_evaluation(wait=True)  # the monitor state saved below includes it
        path = agent.save(staging_dir(checkpoints, step))  # named step_<step> once monitor.json is in it
        return self._complete_checkpoint(step, path, self.state_dict(step))

    def _complete_checkpoint(self, step: int, path: Path, state: dict[str, Any]) -> Path:
        """Write the monitor ``state`` into the saved agent ``path``, move it to ``step_<step>``, log it, prune."""
        checkpoints = self.outputs.checkpoints
        assert checkpoints is not None  # only called once a checkpoint was saved there
        self.logger.flush()
        final = complete_checkpoint(checkpoints, step, path, state)
        self._last_ckpt_step = step
        self.last_checkpoint = final
        self.logger.log_artifact(final, f"{CHECKPOINTS_DIR}/{step_name(step)}")
        if self.outputs.keep > 0:
            prune_checkpoints(checkpoints, self.outputs.keep)
        return final

    def _discard_staged_checkpoint(self) -> None:
        if self._pending_ckpt is not None:
            discard(self._pending_ckpt[1])
            self._pending_ckpt = None

    def _stop_if_requested(self, step: int, agent: Agent) -> None:
        """A stop signal came during this update: checkpoint (unless one was just saved) and end training."""
        if self.stop:
            self.collect_evaluation(wait=True)  # completes a checkpoint that waits for it
            if self._last_ckpt_step != step:
                self.save_checkpoint(step, agent)
            self.stop.stop_now()

    def diverged(self, quantity: str, step: int, value: str) -> DivergenceError:
        """The error that stops a run whose ``quantity`` became non-finite (``pgcli.algo.guard``)."""
        last = None if self.last_checkpoint is None else str(self.last_checkpoint)
        return DivergenceError(quantity, step, value, last)

    def evaluate(self, step: int, agent: Agent, scheduled: int | None = None) -> EvalResult | None:
        """Evaluate now and log ``eval/return_mean``, ``eval/return_std``, ``eval/ep_len_mean`` and
        ``eval/best_return_mean``; save the agent to ``best_dir`` when this is the best evaluation so far; then call
        ``on_eval`` with ``scheduled`` (default ``step``).

        With a background evaluator (``hardware.eval_process``), an agent that can ``snapshot`` its policy, no
        video due and no ``on_eval`` hook, the evaluation runs in the evaluation process instead and this returns
        None: its results are logged at ``step`` when it finishes (:meth:`collect_evaluation`), with the agent as
        it was at ``step`` kept for ``best_dir``.
        """
        if self.evaluator is None:
            return None
        self.collect_evaluation(wait=True)  # one evaluation at a time, logged in order
        t0 = time.perf_counter()
        video = None
        if self._next_video is not None and self.outputs.videos is not None and step >= self._next_video:
            video = self.outputs.videos / f"step_{step}"  # eval.video_every: the evaluation's first episode
            while self._next_video <= step:
                self._next_video += self._video_every
        snapshot = getattr(agent, "snapshot", None)
        evaluator = self.evaluator
        concurrent = evaluator.concurrent  # None for text evaluators: they have no process
        if concurrent is not None and video is None and self.on_eval is None and snapshot is not None:
            candidate = None
            if self.best_dir is not None:  # the agent at this step, in case this evaluation is the best
                candidate = agent.save(best_candidate_dir(self.best_dir, step))
            concurrent.submit(snapshot())
            self._pending_eval = (step, scheduled, candidate)
            self._last_eval_step = step
            self._eval_seconds += time.perf_counter() - t0
            return None
        if video is None:
            result = self.evaluator(agent)
        else:
            result, videos = self.evaluator.record(agent, video)
            for path in videos:
                self.logger.log_artifact(path, "videos")
        self._eval_seconds += time.perf_counter() - t0
        self._record_evaluation(step, scheduled, result, save_best=lambda: agent.save(self.best_dir))  # type: ignore[arg-type]
        return result

    def collect_evaluation(self, *, wait: bool) -> EvalResult | None:
        """Log the evaluation running in the evaluation process, if it has finished (``wait``: wait for it)."""
        concurrent = self.evaluator.concurrent if self.evaluator is not None else None
        if self._pending_eval is None or concurrent is None or not (wait or concurrent.ready()):
            return None
        step, scheduled, candidate = self._pending_eval
        t0 = time.perf_counter()
        try:
            result = concurrent.result()
        finally:
            self._pending_eval = None
            self._eval_seconds += time.perf_counter() - t0

        def keep_candidate() -> None:
            assert candidate is not None and self.best_dir is not None
            put_in_place(candidate, self.best_dir)

        try:
            self._record_evaluation(step, scheduled, result, save_best=keep_candidate)
        finally:
            if candidate is not None and candidate.exists():
                discard(candidate)
        if self._pending_ckpt is not None:  # a checkpoint that waited for this evaluation
            ckpt_step, staged, state = self._pending_ckpt
            self._pending_ckpt = None
            best = self.best_eval
            state |= {
                "last_eval_step": self._last_eval_step,
                "best_step": self.best_step,
                "best_returns": best.returns.tolist() if best is not None else None,
                "best_lengths": best.lengths.tolist() if best is not None else None,
            }
            self._complete_checkpoint(ckpt_step, staged, state)
        return result

    def _record_evaluation(
        self, step: int, scheduled: int | None, result: EvalResult, *, save_best: Callable[[], Any]
    ) -> None:
        if self.best_eval is None or result.mean > self.best_eval.mean:
            self.best_eval, self.best_step = result, step
            if self.best_dir is not None:
                save_best()
        if result.samples is not None and self.outputs.samples is not None:  # a text task's completions, as a table
            self.outputs.samples.mkdir(parents=True, exist_ok=True)
            table = self.outputs.samples / f"step_{step}.json"
            table.write_text(json.dumps(result.samples, indent=1) + "\n")
            self.logger.log_artifact(table, "samples")
        self.last_eval, self._last_eval_step = result, step
        self.logger.log_metrics(
            {
                "eval/return_mean": result.mean,
                "eval/return_std": result.std,
                "eval/ep_len_mean": float(result.lengths.mean()),
                "eval/best_return_mean": self.best_eval.mean,
                **result.extra,
            },
            step,
        )
        log.info(eval_line(step, result, text=bool(result.extra) and not isinstance(self.evaluator, Evaluator)))
        if self.on_eval is not None:
            self.on_eval(step if scheduled is None else scheduled, result.mean)

    def finish(self, step: int, agent: Agent) -> EvalResult | None:
        """Final evaluation (unless one just ran at this step) and close the progress bar."""
        self._step = step
        self._stop_if_requested(step, agent)
        if self._last_logged_step != step:
            self._log_rollout_stats(step)
        self.collect_evaluation(wait=True)
        # a run resumed into its ending holds no result of the evaluation at its last step: it is played again
        if self.evaluator is not None and (self._last_eval_step != step or self.last_eval is None):
            self._final_evaluation(step, agent)
        self._advance_bar(step, None)
        self.close()
        return self.last_eval

    def _final_evaluation(self, step: int, agent: Agent) -> None:
        """The evaluation at the end of training, said before it starts (an Atari game can take minutes), with the
        episodes played so far on the progress bar as each one ends."""
        evaluator = self.evaluator
        assert evaluator is not None
        episodes = "the held-out set"  # a text evaluator's
        if isinstance(evaluator, Evaluator):
            n = evaluator.cfg.episodes
            episodes = f"{n} episode{'s' * (n != 1)}"
        self.say(f"pgcli: final evaluation at step {step:,}: {episodes}...")
        if isinstance(evaluator, Evaluator) and self._bar is not None:
            bar, total = self._bar, evaluator.cfg.episodes

            def played(n: int) -> None:
                bar.set_postfix({**self._postfix, "eval": f"{n}/{total} episodes"}, refresh=True)

            evaluator.on_episode = played
        try:
            self.evaluate(step, agent, scheduled=self.schedule.total_steps)
            self.collect_evaluation(wait=True)
        finally:
            if isinstance(evaluator, Evaluator):
                evaluator.on_episode = None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.evaluator is not None:
            self.evaluator.close()
        if self._pending_eval is not None and self._pending_eval[2] is not None:  # a run that ended early
            discard(self._pending_eval[2])
        self._discard_staged_checkpoint()

    # -- resume ------------------------------------------------------------------------------------------------------
    def state_dict(self, step: int) -> dict[str, Any]:
        """What continues the curves after a resume from a checkpoint at ``step`` (plain JSON values)."""
        best = self.best_eval
        return {
            "step": step,
            "next_eval": self._next_eval,
            "next_checkpoint": self._next_ckpt,
            "n_episodes": self.n_episodes,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "last_eval_step": self._last_eval_step,
            "last_logged_step": self._last_logged_step,
            "best_step": self.best_step,
            "best_returns": best.returns.tolist() if best is not None else None,
            "best_lengths": best.lengths.tolist() if best is not None else None,
        }

    def save_state(self, path: Path) -> None:
        """Write the state at the last update into ``path`` (the final ``model/``: resumable like a checkpoint)."""
        write_monitor_state(path, self.state_dict(self._step))

    def load_state(self, checkpoint: Path, step: int) -> None:
        """Continue from a checkpoint at ``step``: episode counters, the return window, the best evaluation, the next
        evaluation and checkpoint steps, the step the rollout statistics were last logged at, and SPS counted from
        ``step``. A checkpoint without ``monitor.json`` (an older run) continues with the counters derived from ``step``
        alone."""
        state = read_monitor_state(checkpoint, step) or {}  # validated: pgcli.training.monitor_state
        self._step = step
        every, ckpt_every = self.schedule.eval_every, self.schedule.checkpoint_every
        self._next_eval = state.get("next_eval") or ((step // every + 1) * every if every > 0 else None)
        # checkpoint_every may change on resume: the next one is the next multiple of the current interval
        self._next_ckpt = (step // ckpt_every + 1) * ckpt_every if ckpt_every > 0 else None
        self.n_episodes = int(state.get("n_episodes", 0))
        self.recent_returns.extend(state.get("recent_returns", []))
        self.recent_lengths.extend(state.get("recent_lengths", []))
        self._last_eval_step = state.get("last_eval_step")
        if state.get("best_returns") is not None:
            self.best_eval = EvalResult(np.asarray(state["best_returns"]), np.asarray(state["best_lengths"]))
            self.best_step = state.get("best_step")
        self._last_logged_step = state.get("last_logged_step", step)  # older checkpoints: counted from their step
        self._last_ckpt_step = step
        self.last_checkpoint = checkpoint  # what a divergence error names until the next checkpoint
        self._start, self._start_step, self._eval_seconds = time.perf_counter(), step, 0.0
        self._advance_bar(step, None)

    # -- internals ---------------------------------------------------------------------------------------------------
    def _log_rollout_stats(self, step: int) -> None:
        self._last_logged_step = step
        elapsed = time.perf_counter() - self._start - self._eval_seconds
        sps = (step - self._start_step) / max(elapsed, 1e-9)
        stats = {"time/sps": sps, "time/episodes": float(self.n_episodes)}
        if self.env_wait is not None:
            waited, now = self.env_wait(), time.perf_counter()
            stats["time/env_wait_frac"] = (waited - self._waited[0]) / max(now - self._waited[1], 1e-9)
            self._waited = (waited, now)
        if self.recent_returns:
            stats["rollout/ep_return_mean"] = float(np.mean(self.recent_returns))
            stats["rollout/ep_len_mean"] = float(np.mean(self.recent_lengths))
        self.logger.log_metrics(stats, step)
        self._advance_bar(step, sps)

    def _advance_bar(self, step: int, sps: float | None) -> None:
        if self._bar is None:
            return
        if step > self._bar.total:  # the last update ends past total_steps (whole rollouts or episodes): show them
            self._bar.total = step
        postfix = {}
        if sps is not None:
            postfix["sps"] = f"{sps:,.0f}"
        if self.recent_returns:
            postfix["return"] = f"{np.mean(self.recent_returns):.1f}"
        elif self._signal is not None:  # a text run has no episodes: its reward (RL) or loss (SFT, reward model)
            postfix[self._signal[0]] = f"{self._signal[1]:.3f}"
        if self.last_eval is not None:
            postfix["eval"] = _eval_postfix(self.last_eval)
        self._postfix = postfix
        self._bar.set_postfix(postfix, refresh=False)  # shown with this step's count by the update below
        self._bar.update(max(0, step - self._bar.n))


BAR_SIGNALS = (("rollout/reward_mean", "reward"), ("train/loss", "loss"))
"""What the progress bar shows of a run without episodes (a text run), first found: an RL run's mean reward of its
sampled completions, else the loss (SFT, a reward model)."""
EVAL_HEADLINES = ("eval/accuracy", "eval/pairwise_accuracy")
"""A text evaluation's headline metric (the bar's ``eval``), first found; else its mean return."""


def _eval_postfix(result: EvalResult) -> str:
    for key in EVAL_HEADLINES:
        if key in result.extra:
            return f"{result.extra[key]:.3f}"
    return f"{result.mean:.1f}"


def eval_line(step: int, result: EvalResult, *, text: bool) -> str:
    """The train.log line of one evaluation: episode returns, or a text run's metrics on its held-out problems (or
    pairs)."""
    extra = "".join(f", {k.removeprefix('eval/')} {number(v)}" for k, v in result.extra.items())
    n = len(result.returns)
    if not text:
        return f"eval at step {step}: return {result.mean:.2f} ± {result.std:.2f} over {n} episodes{extra}"
    what = "pairs" if "eval/pairwise_accuracy" in result.extra else "problems"
    return f"eval at step {step} on {n} held-out {what}: return {number(result.mean)}{extra}"


def _progress_bar(total: int) -> Any:
    return progress_bar(total)  # a live bar, or progress lines in a parallel sweep


def _first_due(every: int) -> int | None:
    """The first step a cadence of ``every`` env steps is due (None: never)."""
    return every if every > 0 else None
