"""A trained agent loaded back from its model directory, for ``pgcli eval`` and the MLflow Model (``pgcli.pyfunc``).

A model directory (``<run dir>/model``, ``best_model``, the ``model`` artifact) holds what the trainer saved --
``model.pt`` (our trainers: state dicts, read with ``torch.load(weights_only=True)``) or ``model.zip`` (SB3's own
format), ``normalizer.npz`` when the env normalises -- and, written at the end of the run by :func:`write_agent_files`:

- ``agent.json``: the run's resolved config, its algo option, the observation shape and both action spaces (the
  env's own and the policy's, which is [-1, 1] when ``env.rescale_actions``). Enough to rebuild the policy and a
  fresh env without the run directory.
- ``vecnormalize.pkl`` (SB3 runs whose env normalises): the same statistics in SB3's ``VecNormalize`` format, so
  plain SB3 code loads the run with ``PPO.load("model.zip")`` and ``VecNormalize.load("vecnormalize.pkl", venv)``.

:class:`SavedAgent` acts on observations of pgcli's env (already normalised, actions in the policy's space), as the
evaluator needs; :class:`RawPolicy` wraps it for raw environment observations in and env actions out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from pgcli.config import EnvConfig, TrainConfig
from pgcli.config.saved_agent import (
    AGENT_FILE,
    FORMAT_VERSION,
    NORMALIZER_FILE,
    SB3_FILE,
    SB3_NORMALIZER_FILE,
    TORCH_FILE,
    agent_config,
    read_agent_spec,
)
from pgcli.errors import ConfigError
from pgcli.redact import redact_tree


def eval_env(model_dir: str | Path, *, n_envs: int = 1, seed: int | None = None) -> VectorEnv:
    """The evaluation env of the run whose model is ``model_dir`` (a model directory, or the ``model`` artifact as
    ``mlflow.artifacts.download_artifacts("runs:/<run id>/model")`` gives it): the env its ``agent.json`` records, with
    evaluation's preprocessing (an image env's whole games on raw rewards), ``n_envs`` sub-envs reset with ``seed``
    (default: the seed of the run's evaluations, so one deterministic episode replays its last one). Its observations
    are what the run's MLflow Model takes (docs/models.md, "Frames")."""
    from pgcli.envs.make import EVAL_SEED_OFFSET, make_vec_env

    cfg = agent_config(read_agent_spec(Path(model_dir)))
    if not isinstance(cfg.env, EnvConfig):
        raise ConfigError(f"{model_dir} is the model of a text run: it takes prompts, not an env's observations")
    start = cfg.seed + EVAL_SEED_OFFSET if seed is None else seed
    return make_vec_env(cfg.env, seed=start, n_envs=n_envs, vectorization="lean", training=False)


def space_spec(space: gym.Space) -> dict[str, Any]:
    """A JSON-able description of a Discrete or Box space."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "box", "shape": list(space.shape), "low": space.low.tolist(), "high": space.high.tolist()}
    raise ValueError(f"cannot describe action space {space}")


def space_from_spec(spec: dict[str, Any]) -> gym.Space:
    """Inverse of :func:`space_spec`."""
    if spec["type"] == "discrete":
        return gym.spaces.Discrete(int(spec["n"]))
    low = np.asarray(spec["low"], dtype=np.float32).reshape(spec["shape"])
    high = np.asarray(spec["high"], dtype=np.float32).reshape(spec["shape"])
    return gym.spaces.Box(low, high, dtype=np.float32)


def env_action_space(cfg: EnvConfig) -> gym.Space:
    """The action space of the gymnasium env itself (before pgcli's ``RescaleAction``)."""
    env = gym.make(cfg.id, **dict(cfg.kwargs))
    try:
        return env.action_space
    finally:
        env.close()


def write_agent_files(model_dir: Path, cfg: TrainConfig, *, algo_name: str, env_name: str, env: VectorEnv) -> None:
    """Write ``agent.json`` (and, for SB3 models of a normalising env, ``vecnormalize.pkl``) into ``model_dir``.

    Args:
        model_dir: a directory the trainer has saved into.
        cfg: the run's validated config.
        algo_name: the algo option (``ppo``, ``trpo``, ...), which picks the algo schema when the config is read back.
        env_name: the env option (``cartpole``, ``hopper``, ...).
        env: the training env (its spaces).
    """
    spec = {
        "format": FORMAT_VERSION,
        "algo": algo_name,
        "env": env_name,
        "backend": "sb3" if (model_dir / SB3_FILE).is_file() else "torch",
        "observation_shape": list(env.single_observation_space.shape or ()),
        "policy_action_space": space_spec(env.single_action_space),
        "env_action_space": space_spec(env_action_space(cfg.env)),
        # no tracking credentials or secret-named values in a model (docs/tracking.md, "Credentials and secrets")
        "config": redact_tree(asdict(cfg)),
    }
    (model_dir / AGENT_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    if spec["backend"] == "sb3" and (model_dir / NORMALIZER_FILE).is_file():
        write_sb3_vecnormalize(model_dir, cfg.env, gamma=cfg.algo.gamma, env=env)


def write_text_agent_files(
    model_dir: Path,
    cfg: TrainConfig,
    *,
    algo_name: str,
    env_name: str,
    vocab: str | None = None,
    task_fields: Mapping[str, Any] | None = None,
) -> None:
    """Write ``agent.json`` for a text policy (``policy.pt``): what ``init=<run>`` and ``pgcli eval`` read
    (docs/models.md, "Text policies").

    Args:
        model_dir: a directory the trainer has saved into (``policy.pt``).
        cfg: the run's validated config (a text env, ``model=tiny_gpt``).
        algo_name: the algo option (``sft``, ``grpo``, ...).
        env_name: the env option (``addition``, ...).
        vocab: TinyGPT's characters when they are not the task's (``env=dataset``: built from the rows).
        task_fields: what the task records beside (``env=dataset``: its token budgets;
            :func:`pgcli.lm.dataset_task.recorded_fields`).
    """
    from pgcli.lm.tasks import make_puzzle

    spec = {
        "format": FORMAT_VERSION,
        "algo": algo_name,
        "env": env_name,
        "backend": "text",
        "vocab": make_puzzle(cfg.env).chars if vocab is None else vocab,
        "config": redact_tree(asdict(cfg)),
        **(task_fields or {}),
    }
    (model_dir / AGENT_FILE).write_text(json.dumps(spec, indent=1) + "\n")


def write_sb3_vecnormalize(model_dir: Path, cfg: EnvConfig, *, gamma: float, env: VectorEnv) -> Path:
    """``model_dir/vecnormalize.pkl``: pgcli's saved statistics as an SB3 ``VecNormalize`` (``VecNormalize.save``)."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    data = np.load(model_dir / NORMALIZER_FILE)
    obs_space, act_space = env.single_observation_space, env.single_action_space

    class _Spaces(gym.Env):  # VecNormalize needs a VecEnv for its spaces; nothing is stepped
        observation_space, action_space = obs_space, act_space

    norm = VecNormalize(
        DummyVecEnv([_Spaces]),
        training=False,
        norm_obs=cfg.normalize_obs,
        norm_reward=cfg.normalize_reward,
        clip_obs=cfg.clip_obs,
        clip_reward=cfg.clip_reward,
        gamma=gamma,
        epsilon=1e-8,
    )
    rms: Any  # SB3 types obs_rms as RunningMeanStd or a dict of them (dict observation spaces); ours is one
    for name, rms in (("obs_rms", norm.obs_rms), ("ret_rms", norm.ret_rms)):
        rms.mean, rms.var = data[f"{name}.mean"], data[f"{name}.var"]
        rms.count = float(data[f"{name}.count"])
    path = model_dir / SB3_NORMALIZER_FILE
    norm.save(str(path))
    return path


@dataclass
class SavedAgent:
    """A policy loaded from a model directory; acts on pgcli-env observations (normalised when the env normalises)."""

    act_fn: Callable[[np.ndarray, bool], np.ndarray]

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.act_fn(obs, deterministic)


def load_agent(model_dir: Path, cfg: TrainConfig, obs_space: gym.Space, action_space: gym.Space) -> SavedAgent:
    """The policy saved in ``model_dir``, on the CPU.

    Our trainers' ``model.pt`` is read with ``torch.load(weights_only=True)`` (tensors and plain values only, never
    arbitrary pickled objects); SB3's ``model.zip`` with the algorithm's own ``load``.

    Args:
        model_dir: a model directory (``model.pt`` or ``model.zip``).
        cfg: the run's config (the algo picks the loader; ``model`` the network shape).
        obs_space: the policy's observation space (pgcli's env).
        action_space: the policy's action space (pgcli's env: [-1, 1] when actions are rescaled).
    """
    import torch

    if (model_dir / SB3_FILE).is_file():
        from pgcli.algo.sb3 import SB3_ALGOS

        algo_cls, _ = SB3_ALGOS[type(cfg.algo)](cfg.algo)
        model = algo_cls.load(model_dir / SB3_FILE, device="cpu")
        return SavedAgent(lambda obs, deterministic: model.predict(obs, deterministic=deterministic)[0])
    from pgcli.algo.policies import make_policy

    policy = make_policy(obs_space, action_space, cfg.model)
    try:
        payload = torch.load(model_dir / TORCH_FILE, map_location="cpu", weights_only=True)
        policy.load_state_dict(payload["policy"])
    except FileNotFoundError:
        raise ConfigError(f"{model_dir} has no {TORCH_FILE} or {SB3_FILE}") from None
    except (RuntimeError, KeyError, OSError) as exc:  # truncated file, other architecture, not a pgcli checkpoint
        raise ConfigError(f"cannot load {model_dir / TORCH_FILE}: {str(exc).splitlines()[0]}") from None
    return SavedAgent(policy.predict)


class RawPolicy:
    """Raw environment observations in, actions the gymnasium env takes out; normalisation inside, deterministic.

    The MLflow Model's ``predict`` (``pgcli.pyfunc``): observations are normalised with the run's frozen statistics
    (as pgcli's ``VecNormalize`` does: ``clip((obs - mean) / sqrt(var + 1e-8), +-clip_obs)``), the policy acts, and
    continuous actions are clipped to the policy's bounds and mapped to the env's (``RescaleAction``). An image env's
    policy (``env.pixels``) takes the env's frames as they are, uint8 and channels first, and scales them as in
    training (docs/models.md, "Frames").
    """

    def __init__(self, model_dir: Path) -> None:
        spec = read_agent_spec(model_dir)
        self.cfg = agent_config(spec)
        self.obs_shape = tuple(spec["observation_shape"])
        self.takes_frames = self.cfg.env.pixels is not None
        obs_space = (
            gym.spaces.Box(0, 255, self.obs_shape, dtype=np.uint8)
            if self.takes_frames
            else gym.spaces.Box(-np.inf, np.inf, self.obs_shape, dtype=np.float32)
        )
        self.policy_space = space_from_spec(spec["policy_action_space"])
        self.env_space = space_from_spec(spec["env_action_space"])
        self.agent = load_agent(model_dir, self.cfg, obs_space, self.policy_space)
        self.obs_mean: np.ndarray | None = None
        self.obs_std: np.ndarray | None = None
        if self.cfg.env.normalize_obs and (model_dir / NORMALIZER_FILE).is_file():
            data = np.load(model_dir / NORMALIZER_FILE)
            self.obs_mean = data["obs_rms.mean"]
            self.obs_std = np.sqrt(data["obs_rms.var"] + 1e-8)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of raw observations [B, *obs_shape] (or one observation [*obs_shape]).

        Returns:
            [B] int64 actions (discrete) or [B, *action_shape] float32 actions within the env's bounds.
        """
        single = np.shape(obs) == self.obs_shape
        batch = self._frames(obs) if self.takes_frames else self._vectors(obs)
        actions = self.agent.act(batch, True)
        if isinstance(self.env_space, gym.spaces.Discrete):
            out = np.asarray(actions, dtype=np.int64).reshape(len(batch))
        else:
            out = self._to_env_bounds(np.asarray(actions, dtype=np.float32).reshape(len(batch), -1))
        return out[0] if single else out

    def _vectors(self, obs: np.ndarray) -> np.ndarray:
        """A float32 batch [B, *obs_shape], normalised as in training."""
        # C order whatever the caller's layout (a DataFrame's values are column-major): the matmul kernels chosen
        # for a layout round differently on some CPUs, and the same observations must give the same actions
        obs = np.ascontiguousarray(obs, dtype=np.float64)
        batch = obs.reshape(1, *self.obs_shape) if obs.shape == self.obs_shape else obs
        if batch.shape[1:] != self.obs_shape:
            raise ValueError(
                f"observations must have shape [B, {', '.join(map(str, self.obs_shape))}], got {obs.shape}"
            )
        if self.obs_mean is not None and self.obs_std is not None:
            clip = self.cfg.env.clip_obs
            batch = np.clip((batch - self.obs_mean) / self.obs_std, -clip, clip)
        return batch.astype(np.float32)

    def _frames(self, obs: np.ndarray) -> np.ndarray:
        """A uint8 batch [B, C, H, W] of frames as the env gives them (integers in [0, 255] of another dtype too: a
        JSON list). Floats are refused: frames of 0..255 and frames already scaled to 0..1 cannot be told apart, and
        the policy scales by 1/255 itself."""
        frames = np.asarray(obs)
        batch = frames.reshape(1, *self.obs_shape) if frames.shape == self.obs_shape else frames
        integers = np.issubdtype(frames.dtype, np.integer) and frames.size > 0  # not bool, not float
        in_range = integers and 0 <= frames.min() <= frames.max() <= 255
        if batch.shape[1:] == self.obs_shape and (frames.dtype == np.uint8 or in_range):
            return np.ascontiguousarray(batch, dtype=np.uint8)
        dims = ", ".join(map(str, self.obs_shape))
        got = f"{frames.dtype} [{', '.join(map(str, frames.shape))}]"
        if integers and not in_range:
            got += f" with values in [{frames.min()}, {frames.max()}]"
        raise ValueError(
            f"frames must be uint8 in [0, 255], shape [B, {dims}] or [{dims}] (the env's observations); got {got}"
        )

    def _to_env_bounds(self, actions: np.ndarray) -> np.ndarray:
        from gymnasium.wrappers.utils import rescale_box

        assert isinstance(self.policy_space, gym.spaces.Box) and isinstance(self.env_space, gym.spaces.Box)
        actions = np.clip(actions, self.policy_space.low.reshape(-1), self.policy_space.high.reshape(-1))
        actions = actions.reshape(len(actions), *self.env_space.shape)
        if self.cfg.env.rescale_actions:  # the map pgcli's RescaleAction applies: [-1, 1] -> the env's bounds
            _, _, to_env = rescale_box(self.env_space, self.policy_space.low, self.policy_space.high)
            actions = np.stack([to_env(a) for a in actions])
        return actions.astype(self.env_space.dtype)
