"""``hardware.vec_env=envpool``: an Atari game stepped by EnvPool's C++ threads (Weng et al., 2022), seen as a pgcli
vector env (docs/pixels.md, "EnvPool").

The promise: the interface of ``hardware.vec_env=sync`` on the same game. ``step`` autoresets in the same step (the
next game's or life's first frames, the true final frames in ``info["final_obs"]``), and ``info["final_info"]``
carries the raw score and length of each finished *game* (``episode``, as RecordEpisodeStatistics below the life
handling gives them), so pgcli's trainers, its monitor and SB3 (through ``pgcli.algo.sb3.SB3VecEnv``) cannot tell the
two apart. The preprocessing is EnvPool's own, set from ``env.pixels`` (:func:`pool_options`): the same steps in the
same order as ``pgcli.envs.pixels``, with the differences docs/pixels.md lists (grey from the ALE's palette, OpenCV's
area resize, single-frame FIRE and no-ops at each reset, the frame stack kept over a lost life).

EnvPool seeds its games once, when the pool is made (sub-env i gets seed + i, as ``make_vec_env``), so a seeded
``reset`` makes the pool again; a seedless one starts new games from the pool's own RNGs. The ``envpool`` package
is imported here only, when a pool is made.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pgcli.config import EnvConfig
from pgcli.config.pixels import ENVPOOL_MISSING, envpool_task
from pgcli.errors import ConfigError

ALE_MAX_FRAMES = 108_000
"""The ALE's frame limit of a NoFrameskip-v4 game (30 minutes): what ``env.max_episode_steps=null`` means there."""


def pool_options(cfg: EnvConfig, *, training: bool) -> dict[str, Any]:
    """``envpool.make``'s Atari options for ``cfg`` (its ``env.pixels``; the life handling and reward clipping only
    when ``training``, as the gymnasium path)."""
    px = cfg.pixels
    if px is None:
        raise ConfigError(f"hardware.vec_env=envpool needs an env.pixels section; env.id {cfg.id!r} has none")
    frames = ALE_MAX_FRAMES if cfg.max_episode_steps is None else cfg.max_episode_steps  # counted below the skip
    return {
        "noop_max": max(px.noop_max, 1),  # EnvPool draws from [1, noop_max], the FIRE frame counted as one of them
        "frame_skip": px.frame_skip,
        "img_height": px.screen_size or 210,  # 0: the ALE's own 210 x 160 frames
        "img_width": px.screen_size or 160,
        "gray_scale": px.grayscale,
        "stack_num": px.frame_stack,
        "episodic_life": training and px.terminal_on_life_loss,
        "reward_clip": training and px.clip_reward,
        "use_fire_reset": px.fire_reset,
        "repeat_action_probability": 0.0,  # the NoFrameskip-v4 setting; env.kwargs may say otherwise
        "max_episode_steps": math.ceil(frames / px.frame_skip),
        **dict(cfg.kwargs),
    }


class EnvPoolVectorEnv(VectorEnv):
    """EnvPool's synchronous Atari pool in same-step autoreset mode, with the raw game statistics of pgcli's monitor.

    Args:
        cfg: the validated env config (an Atari ``<Game>NoFrameskip-v4`` id with ``env.pixels``).
        n_envs: number of games stepped together.
        seed: sub-env i plays from seed + i.
        n_threads: EnvPool's stepping threads.
        training: the training-only preprocessing (life loss ends an episode, reward signs).
    """

    def __init__(self, cfg: EnvConfig, *, n_envs: int, seed: int, n_threads: int, training: bool = True) -> None:
        task = envpool_task(cfg.id)
        if task is None:
            raise ConfigError(
                f"hardware.vec_env=envpool steps Atari <Game>NoFrameskip-v4 ids; env.id {cfg.id!r} "
                "is not one: use hardware.vec_env=sync"
            )
        self.task, self.options = task, pool_options(cfg, training=training)
        self.num_envs, self.n_threads = n_envs, max(1, min(n_threads, n_envs))
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.seed = seed
        self.pool: Any = self._new_pool(seed)
        self.single_observation_space = self.pool.single_observation_space
        self.single_action_space = self.pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, n_envs)
        self.action_space = batch_space(self.single_action_space, n_envs)
        self._returns = np.zeros(n_envs)  # the raw score of each game in progress
        self._lengths = np.zeros(n_envs, dtype=np.int64)
        self._starts = np.full(n_envs, time.perf_counter())
        self._fresh = True  # no reset or step since the pool was made: a reset with its seed replays nothing
        self.last_obs: np.ndarray | None = None

    def _new_pool(self, seed: int) -> Any:
        try:
            import envpool
        except ImportError as exc:
            raise ConfigError(ENVPOOL_MISSING) from exc
        self.seed = seed
        return envpool.make(
            self.task,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            num_threads=self.n_threads,
            seed=seed,
            **self.options,
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """New games in every sub-env; with ``seed``, the games sub-env i plays from seed + i (the pool made again,
        unless it is still fresh from that seed)."""
        if options:
            raise ValueError(f"hardware.vec_env=envpool resets every sub-env at once (got options {options})")
        if seed is not None and not (self._fresh and seed == self.seed):
            self.pool.close()
            self.pool = self._new_pool(int(seed))
        obs, info = self.pool.reset()
        self._fresh = False
        self._returns[:], self._lengths[:], self._starts[:] = 0.0, 0, time.perf_counter()
        self.last_obs = obs
        return obs, {"lives": info["lives"], "_lives": np.ones(self.num_envs, dtype=bool)}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, reward, terminated, truncated, pool_info = self.pool.step(np.asarray(actions))
        self._fresh = False
        self._returns += pool_info["reward"]  # the raw reward, before EnvPool's clipping
        self._lengths += 1
        info: dict[str, Any] = {"lives": pool_info["lives"], "_lives": np.ones(self.num_envs, dtype=bool)}
        dones = terminated | truncated
        if dones.any():
            game_over = dones & (pool_info["terminated"].astype(bool) | truncated)  # not just a lost life
            obs = self._autoreset(obs, dones, game_over, info)
        self.last_obs = obs
        return obs, reward.astype(np.float64), terminated, truncated, info

    def _autoreset(self, obs: np.ndarray, dones: np.ndarray, game_over: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """Same-step autoreset: the ended rows of ``obs`` replaced by the next game's (or, after a lost life, the next
        life's) first frames, the final frames and the finished games' statistics put in ``info``."""
        ended = np.flatnonzero(dones)
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i in ended:
            final_obs[i] = obs[i].copy()
        # stepping an ended sub-env resets it (EnvPool ignores the action): after a lost life the game goes on
        first_obs, *_ = self.pool.step(np.zeros(len(ended), dtype=np.int64), ended)
        obs = obs.copy()
        obs[ended] = first_obs
        info.update(final_obs=final_obs, _final_obs=dones.copy(), _final_info=dones.copy())
        info["final_info"] = {"lives": info["lives"], "_lives": dones.copy()}
        if game_over.any():
            now = time.perf_counter()
            mask = game_over.copy()
            episode = {
                "r": np.where(mask, self._returns, 0.0),
                "l": np.where(mask, self._lengths, 0),
                "t": np.where(mask, np.round(now - self._starts, 6), 0.0),
            }
            episode.update(_r=mask, _l=mask, _t=mask)
            info["final_info"].update(episode=episode, _episode=mask)
            self._returns[mask], self._lengths[mask], self._starts[mask] = 0.0, 0, now
        return obs

    # -- what pgcli.envs.state and SB3's VecEnv ask of a vector env ------------------------------------------------

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """One value per sub-env. EnvPool cannot read an emulator's state, so ``episode_state`` says so
        (``sim: None``: a restored sub-env starts a new game, unlike the gymnasium path's Atari games, which resume
        exactly)."""
        if name == "episode_state":
            return tuple({"sim": None, "wrappers": [], "last_obs": None} for _ in range(self.num_envs))
        if name == "last_obs":
            return tuple(self.last_obs) if self.last_obs is not None else (None,) * self.num_envs
        if name in ("render_mode", "spec"):
            return (None,) * self.num_envs
        raise AttributeError(f"EnvPool's sub-envs have no attribute {name!r}")

    def set_attr(self, name: str, values: Any) -> None:
        """``episode_state`` (a checkpoint's episodes, ``pgcli.envs.state``): new games in every sub-env."""
        if name != "episode_state":
            raise AttributeError(f"EnvPool's sub-envs take no attribute {name!r}")
        self.reset()

    def close_extras(self, **kwargs: Any) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
