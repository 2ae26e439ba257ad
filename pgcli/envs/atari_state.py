"""An Atari game's emulator state as plain values (JSON), so that a checkpoint continues the game exactly
(docs/checkpoints.md, "Episodes in progress are restored").

``ale.cloneState(include_rng=True)`` holds the whole ALE: the console's RAM, CPU and TIA registers, the frame
counters (which end a game after ``max_num_frames_per_episode``), the lives and score the game shows, and the ALE's
own RNG, which decides the sticky actions (``repeat_action_probability``; Machado et al., 2018) with the last action
it repeats. Without the RNG a restored game with sticky actions would drift from the first repeated action. What
``AtariEnv`` keeps outside the ALE is its ``np_random`` (stochastic frame skip; pgcli's no-op starts draw from it
too), which ``pgcli.envs.state`` saves for every env. The state of pgcli's Atari wrappers (life handling, frame
stack) is their own (``pgcli.envs.pixels``: ``checkpoint_state``).
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import gymnasium as gym


def is_atari(env: gym.Env) -> bool:
    """Whether ``env`` (an unwrapped env) is ale-py's ``AtariEnv``; ale_py is not imported for other envs."""
    module = sys.modules.get("ale_py.env")  # loaded iff an ALE env was made
    return module is not None and isinstance(env, module.AtariEnv)


def ale_state(env: Any) -> dict[str, Any]:
    """The ALE's whole state, RNG included, as the emulator's own serialisation in base64 (about 14 KB)."""
    serialized: bytes = env.ale.cloneState(include_rng=True).serialize()
    return {"ale": base64.b64encode(serialized).decode("ascii")}


def restore_ale_state(env: Any, state: dict[str, Any]) -> None:
    """Put an :func:`ale_state` back into ``env``'s emulator (the same game: the ROM is not part of the state)."""
    import ale_py

    env.ale.restoreState(ale_py.ALEState(base64.b64decode(state["ale"])))
