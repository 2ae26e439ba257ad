"""The image side of a run's config (docs/pixels.md): ``env.pixels``, the preprocessing between a game's frames and the
network, and ``model=cnn``, the convolutional actor-critic; and which ``conf/env`` options are image envs.

Light like the rest of :mod:`pgcli.config`: no ale_py, minatar or torch import. The wrappers are
:mod:`pgcli.envs.pixels`, the networks :mod:`pgcli.algo.cnn`.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from pgcli.config.rules import ACTIVATIONS, MAX_WIDTH, _at_most, _choice, require
from pgcli.errors import ConfigError

IMAGE_ENVS: tuple[str, ...] = (
    "pong",
    "breakout",
    "space_invaders",
    "seaquest",
    "beamrider",
    "qbert",
    "minatar_asterix",
    "minatar_breakout",
    "minatar_freeway",
    "minatar_seaquest",
    "minatar_space_invaders",
)
"""The ``conf/env`` options that are image envs (an ``env.pixels`` section): each implies ``model=cnn`` unless the
command line names a model, as a text task implies ``model=tiny_gpt``
(:func:`pgcli.config.compose.text_task_overrides`)."""

CNN_ARCHS = ("auto", "nature", "minatar", "impala", "flat")
MIN_FRAME_SIZE: dict[str, int] = {"nature": 36, "minatar": 3, "impala": 1, "flat": 1}
"""The smallest frame side each torso takes (Nature's 8/4, 4/2, 3/1 convolutions leave 1x1 of a 36x36 frame)."""


@dataclass
class PixelsConfig:
    """Image observations: the preprocessing between the game and the CNN. The defaults are the standard Atari
    settings (SB3's AtariWrapper, CleanRL's ppo_atari); the logged episode return is always the raw game score."""

    noop_max: int = 30
    """At the start of each game, a uniform number in [1, noop_max] of no-op actions (0: none; needs a NOOP action)."""
    frame_skip: int = 4
    """Repeat each action this many frames and observe the max of the last two (1: every frame, no max)."""
    screen_size: int = 84
    """Resize frames to screen_size x screen_size (0: keep the env's size)."""
    grayscale: bool = True
    """Turn RGB frames into one grey channel."""
    frame_stack: int = 4
    """Stack the last this many frames along the channel axis (1: none)."""
    terminal_on_life_loss: bool = True
    """Training only: a lost life ends the learner's episode, not the game (ALE games; evaluation plays whole games)."""
    clip_reward: bool = True
    """Training only: the learner sees the sign of each reward (-1, 0, 1); the logged return is the raw score."""
    fire_reset: bool = True
    """Press FIRE after each reset, where the game has a FIRE action (Breakout waits for it)."""

    def __post_init__(self) -> None:
        require(self.noop_max >= 0, "env.pixels.noop_max", self.noop_max, ">= 0", "0 turns no-op starts off")
        _at_most("env.pixels.noop_max", self.noop_max, 1000, "typical: 30")
        require(self.frame_skip >= 1, "env.pixels.frame_skip", self.frame_skip, ">= 1", "1 observes every frame")
        _at_most("env.pixels.frame_skip", self.frame_skip, 64, "typical: 4")
        require(
            self.screen_size == 0 or self.screen_size >= 8,
            "env.pixels.screen_size",
            self.screen_size,
            "0 (keep the env's size) or >= 8",
            "typical: 84",
        )
        _at_most("env.pixels.screen_size", self.screen_size, 1024, "typical: 84")
        require(self.frame_stack >= 1, "env.pixels.frame_stack", self.frame_stack, ">= 1", "1 stacks nothing")
        _at_most("env.pixels.frame_stack", self.frame_stack, 64, "typical: 4")


@dataclass
class CNNModelConfig:
    """Convolutional actor-critic for image observations: a CNN torso, then the policy and value heads."""

    name: ClassVar[str] = "cnn"

    arch: str = "auto"
    """'nature' (Mnih et al., 2015: 3 convolutions, 512 features; frames of 36 px or more), 'minatar' (Young & Tian,
    2019: one 3x3 convolution, 128 features), 'impala' (Espeholt et al., 2018: 3 residual stages, 256 features),
    'flat' (no convolution: the flattened frame into 256 ReLU units; with pi_hidden_sizes and vf_hidden_sizes [256]
    and share_features false, gymnax-blines' MinAtar MLPs) or 'auto' (nature for frames of 36 px or more, else
    minatar)."""
    share_features: bool = True
    """One torso for the policy and the value head (SB3's and CleanRL's default for images); false: one each."""
    pi_hidden_sizes: list[int] = field(default_factory=list)
    """Hidden layer widths of the policy head after the torso (empty: a linear head, as CleanRL's ppo_atari)."""
    vf_hidden_sizes: list[int] = field(default_factory=list)
    """Hidden layer widths of the value head after the torso (empty: a linear head)."""
    activation: str = "relu"
    """Activation of the heads' hidden layers: tanh, relu, elu, gelu or leaky_relu (the torso uses ReLU)."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain sqrt(2) torso and hidden, 0.01 policy head, 1 value head)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian policies (continuous actions)."""

    def __post_init__(self) -> None:
        _choice("model.arch", self.arch, CNN_ARCHS)
        for key, sizes in (
            ("model.pi_hidden_sizes", self.pi_hidden_sizes),
            ("model.vf_hidden_sizes", self.vf_hidden_sizes),
        ):
            require(
                all(1 <= int(s) <= MAX_WIDTH for s in sizes),
                key,
                list(sizes),
                f"a list of widths in [1, {MAX_WIDTH}]",
                "typical: [] (a linear head)",
            )
        _choice("model.activation", self.activation, ACTIVATIONS)
        require(-20 <= self.log_std_init <= 5, "model.log_std_init", self.log_std_init, "in [-20, 5]", "typical: 0")


# --------------------------------------------------------------------------------------------------------------------
# hardware.vec_env=envpool (docs/pixels.md, "EnvPool")
# --------------------------------------------------------------------------------------------------------------------

ENVPOOL_MISSING = (
    "hardware.vec_env=envpool needs the envpool package, which is not installed: pip install envpool "
    "(Linux x86-64, Python >= 3.11; the pgcli[envpool] extra), or use hardware.vec_env=sync"
)
ENVPOOL_KWARGS = ("repeat_action_probability", "full_action_space", "mode", "difficulty")
"""The ALE options of ``env.kwargs`` that EnvPool's Atari games take under the same names."""


def envpool_task(env_id: str) -> str | None:
    """EnvPool's name for the Atari game of ``env_id`` (``ale_py:BreakoutNoFrameskip-v4`` -> ``Breakout-v5``: EnvPool's
    games have the NoFrameskip-v4 settings, no sticky actions, its wrappers doing the rest); None for any other id."""
    match = re.fullmatch(r"([A-Z][A-Za-z0-9]*)NoFrameskip-v4", env_id.rpartition(":")[2])
    return None if match is None else f"{match.group(1)}-v5"


def check_envpool(
    env_id: str, pixels: PixelsConfig | None, *, kwargs: Iterable[str], n_wrappers: int, algo: str
) -> None:
    """The rules of ``hardware.vec_env=envpool``: an Atari game with ``env.pixels``, EnvPool installed (looked up,
    not imported), no gymnasium wrappers, only the ALE options EnvPool takes, and a trainer that does not reseed
    single sub-envs (EnvPool seeds its games once, when the pool is made)."""
    if pixels is None or envpool_task(env_id) is None:
        raise ConfigError(
            f"hardware.vec_env=envpool steps Atari games (env=pong, env=breakout, ...: "
            f"<Game>NoFrameskip-v4 ids with env.pixels); env.id {env_id!r} is not one: use "
            "hardware.vec_env=sync"
        )
    if importlib.util.find_spec("envpool") is None:
        raise ConfigError(ENVPOOL_MISSING)
    if n_wrappers:
        raise ConfigError(
            "env.wrappers wrap gymnasium sub-envs; hardware.vec_env=envpool steps EnvPool's own games: "
            "drop env.wrappers or use hardware.vec_env=sync"
        )
    unknown = sorted(set(kwargs) - set(ENVPOOL_KWARGS))
    if unknown:
        raise ConfigError(
            f"env.kwargs {unknown} are not options of EnvPool's Atari games (it takes "
            f"{', '.join(ENVPOOL_KWARGS)}): drop them or use hardware.vec_env=sync"
        )
    if algo == "grpo":
        raise ConfigError(
            "algo=grpo replays seeded start states in single sub-envs, which hardware.vec_env=envpool "
            "cannot (it seeds its games once, when the pool is made): use hardware.vec_env=sync"
        )
