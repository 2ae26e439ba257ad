"""An example env package: a user's own gymnasium env, trained from the CLI without touching pgcli.

Importing this module registers ``MyTarget-v0``, so pgcli can name it as ``module.path:EnvId``
(docs/configuration.md, "Bring your own env"):

    pgcli train env.id=tests.example_envs.my_envs:MyTarget-v0 total_steps=20000
    pgcli train algo=trpo env.id=tests.example_envs.my_envs:MyTarget-v0 +env.kwargs.continuous=true \\
        'env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, stack_size: 4}]'

The task: a point on a line starts at a random position and must reach a random target. Observation: (position,
target) in [-1, 1]; actions: left / stay / right, or one continuous velocity in [-1, 1] with ``continuous=True``.
Reward: minus the distance to the target each step, +1 on reaching it (which ends the episode); 50 steps at most.
A policy that heads straight for the target scores about -2, a random one about -30 (solved: -3).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MyTargetEnv(gym.Env):
    """Reach a target on a line: the smallest env with both a discrete and a continuous version."""

    def __init__(self, continuous: bool = False, step_size: float = 0.1, tolerance: float = 0.05) -> None:
        self.continuous, self.step_size, self.tolerance = continuous, step_size, tolerance
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space: spaces.Space = (
            spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32) if continuous else spaces.Discrete(3)
        )
        self.position = self.target = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.target], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position, self.target = (float(x) for x in self.np_random.uniform(-1.0, 1.0, size=2))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        velocity = float(np.clip(np.asarray(action).reshape(-1)[0], -1, 1)) if self.continuous else int(action) - 1
        self.position = float(np.clip(self.position + self.step_size * velocity, -1.0, 1.0))
        distance = abs(self.position - self.target)
        reached = distance < self.tolerance
        return self._obs(), (1.0 if reached else -distance), reached, False, {}


gym.register(id="MyTarget-v0", entry_point=f"{__name__}:MyTargetEnv", max_episode_steps=50, reward_threshold=-3.0)
