"""Episodes on a vector env: the ones that ended in a step (:func:`finished_episodes`, :func:`final_observations`), and
whole episodes played with a fixed policy, which is what every evaluation does wherever it runs: in the trainer
(:func:`run_episodes`), in an evaluation process, or a step at a time in the env worker's idle time
(:class:`PipedEpisodes`, on a picklable :class:`EvalPlan`)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gymnasium.vector import VectorEnv

from pgcli.contracts import Actor, EvalResult
from pgcli.envs.normalize import load_normalizer_state


class Recorder(Protocol):
    """A video recorder of sub-env 0 (``pgcli.video.EpisodeRecorder``)."""

    def reset(self) -> None: ...

    def step(self, episode_over: bool) -> None: ...


def run_episodes(
    env: VectorEnv,
    agent: Actor,
    episodes: int,
    *,
    deterministic: bool,
    seed: int,
    recorder: Recorder | None = None,
    on_episode: Callable[[int], None] | None = None,
) -> EvalResult:
    """Play ``episodes`` episodes on ``env`` (reset with ``seed``); raw returns and lengths, in the order they end.

    Episodes per sub-env are fixed up front (as SB3's evaluate_policy) so short episodes are not over-counted.
    ``recorder`` (video) is told after each step whether sub-env 0's episode ended; ``on_episode`` (a progress
    display) is called with the number of episodes played each time one is counted. torch acts on one thread
    meanwhile (:func:`one_torch_thread`).
    """
    with one_torch_thread():
        return play_out(
            episode_steps(
                env, agent, episodes, deterministic=deterministic, seed=seed, recorder=recorder, on_episode=on_episode
            )
        )


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread while it lasts, then on as many as before (a run's ``hardware.torch_threads``): an
    evaluation's steps act on ``eval.n_envs`` observations at a time, where more threads gain nothing and, beside other
    busy processes, make a CNN's forward pass 10 to 60 times slower. The evaluation process and the env worker, which
    play :func:`episode_steps` away from the trainer, run on one thread throughout."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def episode_steps(
    env: VectorEnv,
    agent: Actor,
    episodes: int,
    *,
    deterministic: bool,
    seed: int,
    recorder: Recorder | None = None,
    on_episode: Callable[[int], None] | None = None,
) -> Generator[None, None, EvalResult]:
    """:func:`run_episodes` one vector step at a time: it yields after each step and returns the :class:`EvalResult`
    (the env worker plays evaluations this way in its idle time, a step per poll)."""
    n = env.num_envs
    targets = np.array([(episodes + i) // n for i in range(n)])
    counts = np.zeros(n, dtype=int)
    returns: list[float] = []
    lengths: list[int] = []
    obs, _ = env.reset(seed=seed)
    if recorder is not None:
        recorder.reset()
    while (counts < targets).any():
        obs, _, terminated, truncated, info = env.step(agent.act(obs, deterministic))
        yield
        if recorder is not None:
            recorder.step(bool(terminated[0] or truncated[0]))
        final = info.get("final_info")
        if final and "episode" in final:
            for i in np.flatnonzero(final["_episode"]):
                if counts[i] < targets[i]:
                    returns.append(float(final["episode"]["r"][i]))
                    lengths.append(int(final["episode"]["l"][i]))
                    counts[i] += 1
                    if on_episode is not None:
                        on_episode(len(returns))
    return EvalResult(np.asarray(returns), np.asarray(lengths))


def play_out(steps: Generator[None, None, EvalResult]) -> EvalResult:
    """Run :func:`episode_steps` (or :meth:`PipedEpisodes.steps`) to the end; its :class:`EvalResult`."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: EvalResult = done.value
            return result


@dataclass(frozen=True)
class EvalPlan:
    """An evaluation played away from the trainer, as picklable values: sent with each request to the evaluation
    process or the env worker (``pgcli.training.evaluation``)."""

    make_env: Callable[[], VectorEnv]
    """Builds the evaluation env, seeded (``functools.partial`` of ``pgcli.envs.make.make_vec_env``)."""
    episodes: int
    """Episodes per evaluation."""
    deterministic: bool
    """Act with the policy's mode instead of sampling."""
    seed: int
    """The seed every evaluation resets the env with (the same start states each time)."""


class PipedEpisodes:
    """The playing side of an evaluation away from the trainer: builds the env of the first request's plan once,
    loads each request's normaliser statistics into it (frozen, as they were when the trainer sent them) and plays the
    plan's episodes, so the results are those an in-process evaluation at that step gives."""

    def __init__(self) -> None:
        self.env: VectorEnv | None = None

    def steps(
        self, actor: Actor, normalizer: dict[str, Any] | None, plan: EvalPlan
    ) -> Generator[None, None, EvalResult]:
        """:func:`episode_steps` of ``actor`` on the evaluation env (see the class docstring)."""
        if self.env is None:
            self.env = plan.make_env()
        load_normalizer_state(self.env, normalizer, training=False)
        return episode_steps(self.env, actor, plan.episodes, deterministic=plan.deterministic, seed=plan.seed)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


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
