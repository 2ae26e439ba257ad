"""Hopper-v4 against Hopper-v5: same seeds, same actions, step by step (docs/benchmarks/ppo.md, "Why the zoo preset
stands still").

rl-baselines3-zoo tuned its PPO preset on Hopper-v3/v4; pgcli runs Hopper-v5. This replays identical random action
sequences in both versions and reports the largest observation and reward differences, and any step where only one
of them terminates. It takes a few seconds and needs no training.

    .venv/bin/python benchmarks/investigations/hopper_v4_v5.py --episodes 20
"""

from __future__ import annotations

import argparse
import warnings

import gymnasium as gym
import numpy as np


def compare(episodes: int, action_scale: float, seed: int) -> dict[str, float]:
    """Replay ``episodes`` episodes of uniform random actions (times ``action_scale``) in both versions."""
    v4, v5 = gym.make("Hopper-v4"), gym.make("Hopper-v5")
    rng = np.random.default_rng(seed)
    steps, obs_diff, reward_diff, term_mismatch, terminal_diffs = 0, 0.0, 0.0, 0, []
    for episode in range(episodes):
        obs4, _ = v4.reset(seed=seed + episode)
        obs5, _ = v5.reset(seed=seed + episode)
        obs_diff = max(obs_diff, float(np.abs(obs4 - obs5).max()))
        done = False
        while not done:
            action = action_scale * rng.uniform(-1.0, 1.0, size=v5.action_space.shape)
            obs4, r4, term4, trunc4, _ = v4.step(action)
            obs5, r5, term5, trunc5, _ = v5.step(action)
            steps += 1
            obs_diff = max(obs_diff, float(np.abs(obs4 - obs5).max()))
            term_mismatch += int(term4 != term5)
            if term4 or term5:
                terminal_diffs.append(float(r4) - float(r5))
            else:
                reward_diff = max(reward_diff, abs(float(r4) - float(r5)))
            done = term4 or term5 or trunc4 or trunc5
    return {
        "steps": steps,
        "max_obs_diff": obs_diff,
        "max_reward_diff_before_termination": reward_diff,
        "termination_mismatches": term_mismatch,
        "terminal_steps": len(terminal_diffs),
        "mean_terminal_reward_v4_minus_v5": float(np.mean(terminal_diffs)) if terminal_diffs else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--action-scale", type=float, default=0.3, help="smaller actions: longer episodes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*Hopper-v4 is out of date.*")
    for key, value in compare(args.episodes, args.action_scale, args.seed).items():
        print(f"{key}: {value:g}")


if __name__ == "__main__":
    main()
