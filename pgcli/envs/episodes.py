"""Playing whole episodes with a fixed policy on a vector env: what every evaluation does, wherever it runs (in the
trainer, in an evaluation process, or a step at a time in the env worker's idle time)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol

import numpy as np
from gymnasium.vector import VectorEnv

from pgcli.algo.base import Actor, EvalResult


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
) -> EvalResult:
    """Play ``episodes`` episodes on ``env`` (reset with ``seed``); raw returns and lengths, in the order they end.

    Episodes per sub-env are fixed up front (as SB3's evaluate_policy) so short episodes are not over-counted.
    ``recorder`` (video) is told after each step whether sub-env 0's episode ended.
    """
    steps = episode_steps(env, agent, episodes, deterministic=deterministic, seed=seed, recorder=recorder)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: EvalResult = done.value
            return result


def episode_steps(
    env: VectorEnv,
    agent: Actor,
    episodes: int,
    *,
    deterministic: bool,
    seed: int,
    recorder: Recorder | None = None,
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
    return EvalResult(np.asarray(returns), np.asarray(lengths))
