"""Envs whose spaces some or all of pgcli's trainers cannot take, for the validation tests (registered on import).

- ``DictObs-v0``: a Dict observation (no pgcli trainer takes it; FlattenObservation makes it a Box);
- ``MultiBinaryAction-v0``: MultiBinary(3) actions (the SB3 trainers take them, pgcli's own do not).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictObsEnv(gym.Env):
    """Observation {'position': Box(1), 'target': Box(1)}; actions left / right; 20 steps."""

    def __init__(self) -> None:
        box = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.observation_space = spaces.Dict({"position": box, "target": box})
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        return self.observation_space.sample(), float(action), False, False, {}


class MultiBinaryActionEnv(gym.Env):
    """Three switches; reward = how many match a fixed pattern; 20 steps."""

    pattern = np.array([1, 0, 1], dtype=np.int8)

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.MultiBinary(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float((np.asarray(action) == self.pattern).sum())
        return np.asarray(action, dtype=np.float32), reward, False, False, {}


gym.register(id="DictObs-v0", entry_point=f"{__name__}:DictObsEnv", max_episode_steps=20)
gym.register(id="MultiBinaryAction-v0", entry_point=f"{__name__}:MultiBinaryActionEnv", max_episode_steps=20)
