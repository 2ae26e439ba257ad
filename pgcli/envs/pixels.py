"""Image envs (docs/pixels.md): the preprocessing ``env.pixels`` asks for, and MinAtar's games as gymnasium envs.

With ``env.pixels`` set, each sub-env is (``pgcli.envs.make.wrap_env``; innermost first)::

    gym.make(id)                 ALE frames (210, 160, 3), or MinAtar's (10, 10, C) bool
    -> NoopReset                 1..noop_max no-ops at the start of each game
    -> MaxAndSkip                each action frame_skip frames; the max of the last two frames
    -> RecordEpisodeStatistics   pgcli's monitor: whole games, the raw score, lengths in env steps
    -> EpisodicLife              training only: a lost life ends the learner's episode, not the game
    -> FireReset                 FIRE after each reset, where the game has a FIRE action
    -> FireOnLifeLoss            evaluation only: FIRE after each lost life, where the game has a FIRE action
    -> ImageObservation          uint8 [0, 255], channels first; grey and resized to screen_size
    -> SignReward                training only: the learner sees sign(reward)
    -> FrameStack                the last frame_stack frames along the channel axis: (4, 84, 84) for Atari

as SB3's AtariWrapper (``stable_baselines3.common.atari_wrappers``) and CleanRL's ppo_atari do it, with the monitor
placed where the logged episode return is the game's score. The packages (``pip install 'pgcli[pixels]'``) are
imported only when an env is made: ale_py through an ``ale_py:`` env id, minatar by :class:`MinAtarEnv`.
"""

from __future__ import annotations

import base64
import importlib.util
import sys
from collections import deque
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from pgcli.config.pixels import PixelsConfig
from pgcli.envs.spec import describe_space
from pgcli.errors import ConfigError

INSTALL_HINT = "pip install 'pgcli[pixels]'"
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
GREY_WEIGHTS = np.array([0.299, 0.587, 0.114], dtype=np.float32)
"""ITU-R 601 luma, as OpenCV's RGB2GRAY (SB3's WarpFrame)."""


def minatar_id(game: str) -> str:
    """The gymnasium id pgcli registers for a MinAtar game: ``breakout`` -> ``MinAtar/Breakout-v1`` (the minimal
    action set, as ``minatar.gym``'s v1 ids)."""
    return f"MinAtar/{game.title().replace('_', '')}-v1"


for _game in MINATAR_GAMES:  # string entry points: minatar itself is imported only when a game is made
    if minatar_id(_game) not in gym.registry:
        gym.register(id=minatar_id(_game), entry_point="pgcli.envs.pixels:MinAtarEnv", kwargs={"game": _game})


def missing_package(env_id: str) -> ConfigError | None:
    """The one-line error for an ALE or MinAtar env id whose package is not installed, else None."""
    module, _, name = env_id.rpartition(":")
    if module.split(".")[0] == "ale_py" or name.startswith("ALE/"):
        package, dist = "ale_py", "ale-py"
    elif name.startswith("MinAtar/"):
        package, dist = "minatar", "minatar"
    else:
        return None
    if importlib.util.find_spec(package) is not None:
        return None
    return ConfigError(f"env.id {env_id!r} needs the {dist} package, which is not installed: {INSTALL_HINT}")


def quiet_ale(env_id: str) -> None:
    """Keep the ALE's banner ("A.L.E: Arcade Learning Environment ... [Powered by Stella]") off stderr: it is printed
    each time an emulator starts, once per sub-env and evaluation env. Errors still show. A no-op for other envs."""
    module = sys.modules.get("ale_py")
    if module is not None or env_id.startswith(("ale_py:", "ALE/")):
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


class MinAtarEnv(gym.Env):
    """A MinAtar game (Young & Tian, 2019) as a gymnasium env: (10, 10, C) bool frames, the game's minimal action set,
    sticky actions (the last action repeats with probability 0.1) and difficulty ramping, as MinAtar's own
    ``Environment`` (whose seeding it follows: one ``RandomState`` for the game and the sticky actions)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012 (gym.Env declares it so)

    def __init__(
        self,
        game: str,
        sticky_action_prob: float = 0.1,
        difficulty_ramping: bool = True,
        render_mode: str | None = None,
    ) -> None:
        self.render_mode = render_mode
        self.game = _minatar_game(game).Env(ramping=difficulty_ramping)
        self.sticky_action_prob = sticky_action_prob
        self.random = self.game.random
        self.actions = list(self.game.minimal_action_set())
        self.last_action = 0
        self.action_space = spaces.Discrete(len(self.actions))
        self.observation_space = spaces.Box(0, 1, shape=tuple(self.game.state_shape()), dtype=bool)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.random = self.game.random = np.random.RandomState(seed)
        self.game.reset()
        self.last_action = 0
        return self.game.state(), {}

    STATIC = ("random", "channels", "action_map", "ramping")
    """The game's attributes that are not its dynamic state (the RNG is saved apart)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The game's whole dynamic state as plain values (``pgcli.envs.state``: exact resume)."""
        kind, keys, pos, has_gauss, gauss = self.random.get_state()
        game = {k: _plain(v) for k, v in vars(self.game).items() if k not in self.STATIC}
        return {
            "game": game,
            "random": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
            "last_action": int(self.last_action),
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        kind, keys, pos, has_gauss, gauss = state["random"]
        self.random = self.game.random = np.random.RandomState()
        self.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        for name, value in state["game"].items():
            setattr(self.game, name, _from_plain(value))
        self.last_action = int(state["last_action"])

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        game_action = self.actions[int(action)]
        if self.random.rand() < self.sticky_action_prob:
            game_action = self.last_action
        self.last_action = game_action
        reward, terminated = self.game.act(game_action)
        return self.game.state(), float(reward), bool(terminated), False, {}

    def render(self) -> np.ndarray | None:
        """The game as an RGB picture with ``render_mode="rgb_array"`` (videos: :func:`minatar_rgb`), else None."""
        return minatar_rgb(self.game.state()) if self.render_mode == "rgb_array" else None


def _plain(value: Any) -> Any:
    """A MinAtar game attribute (ints, bools, nested lists, arrays) as JSON values, arrays with their dtype."""
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _from_plain(value: Any) -> Any:
    if isinstance(value, dict) and "ndarray" in value:
        return np.asarray(value["ndarray"], dtype=np.dtype(value["dtype"]))
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    return value


def _minatar_game(game: str) -> Any:
    """MinAtar's module of ``game`` (``minatar/environments/<game>.py``, numpy only), loaded from its file: importing
    it through the package would run ``minatar/__init__``, which imports matplotlib and seaborn (2.3 s, for its
    display) in every process that makes the env."""
    spec = importlib.util.find_spec("minatar")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"MinAtar/{game} needs the minatar package, which is not installed: {INSTALL_HINT}")
    path = Path(spec.submodule_search_locations[0], "environments", f"{game}.py")
    module_spec = importlib.util.spec_from_file_location(f"pgcli_minatar_{game}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"MinAtar/{game}: no such game in the minatar package ({path} is missing)")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


MINATAR_CELL_PX = 32
"""Pixels per cell of a rendered MinAtar frame: the 10x10 grid as a 320x320 picture."""


def minatar_rgb(state: np.ndarray, cell_px: int = MINATAR_CELL_PX) -> np.ndarray:
    """A MinAtar state, (10, 10, C) bool, as an RGB picture [10 * cell_px, 10 * cell_px, 3] uint8: a black background
    and one colour per channel, the palette of MinAtar's own display (matplotlib's cubehelix at C evenly spaced points,
    as ``minatar.Environment.display_state`` takes it from seaborn, which is not needed here); where objects overlap,
    the later channel shows."""
    n_channels = state.shape[-1]
    palette = np.vstack([np.zeros(3), _cubehelix(np.linspace(0, 1, n_channels + 2)[1:-1])])  # [C + 1, 3] in [0, 1]
    index = np.max(np.asarray(state, dtype=np.int64) * np.arange(1, n_channels + 1), axis=-1)  # [10, 10]; 0: empty
    image = np.round(palette[index] * 255).astype(np.uint8)  # [10, 10, 3]
    return image.repeat(cell_px, axis=0).repeat(cell_px, axis=1)


def _cubehelix(x: np.ndarray, start: float = 0.5, rotations: float = -1.5, hue: float = 1.0) -> np.ndarray:
    """Green's (2011) cubehelix colour scheme at ``x`` in [0, 1] with matplotlib's defaults: [len(x), 3] RGB."""
    amplitude = hue * x * (1 - x) / 2
    phi = 2 * np.pi * (start / 3 + rotations * x)
    cos, sin = np.cos(phi), np.sin(phi)
    rgb = [
        x + amplitude * (-0.14861 * cos + 1.78277 * sin),
        x + amplitude * (-0.29227 * cos - 0.90649 * sin),
        x + amplitude * (1.97294 * cos),
    ]
    return np.clip(np.stack(rgb, axis=-1), 0.0, 1.0)


# --------------------------------------------------------------------------------------------------------------------
# the preprocessing
# --------------------------------------------------------------------------------------------------------------------


def wrap_below_monitor(env: gym.Env, cfg: PixelsConfig) -> gym.Env:
    """No-op starts and frame skipping: under the monitor, so its lengths count the agent's steps."""
    if cfg.noop_max > 0:
        env = NoopReset(env, cfg.noop_max)
    if cfg.frame_skip > 1:
        env = MaxAndSkip(env, cfg.frame_skip)
    return env


def wrap_above_monitor(env: gym.Env, cfg: PixelsConfig, *, training: bool) -> gym.Env:
    """Life handling, fire reset, the image layout, reward clipping and the frame stack: over the monitor, so the
    logged return is the raw score of whole games."""
    if training and cfg.terminal_on_life_loss:
        env = EpisodicLife(env)
    if cfg.fire_reset and "FIRE" in _action_meanings(env):
        env = FireReset(env)
        if not training and hasattr(env.unwrapped, "ale"):
            env = FireOnLifeLoss(env)  # whole games: a lost life is no reset
    env = ImageObservation(env, screen_size=cfg.screen_size, grayscale=cfg.grayscale)
    if training and cfg.clip_reward:
        env = SignReward(env)
    if cfg.frame_stack > 1:
        env = FrameStack(env, cfg.frame_stack)
    return env


def _action_meanings(env: gym.Env) -> list[str]:
    meanings = getattr(env.unwrapped, "get_action_meanings", None)
    return list(meanings()) if callable(meanings) else []


class NoopReset(gym.Wrapper):
    """Start each game with a uniform number in [1, noop_max] of NOOP actions (Mnih et al., 2015), drawn from the
    env's own ``np_random`` (so seeded)."""

    def __init__(self, env: gym.Env, noop_max: int) -> None:
        super().__init__(env)
        if _action_meanings(env)[:1] != ["NOOP"]:
            raise ConfigError(
                f"env.pixels.noop_max={noop_max} needs an env whose action 0 is NOOP (an ALE game); "
                "set env.pixels.noop_max=0"
            )
        self.noop_max = noop_max

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.unwrapped.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat each action ``skip`` frames, sum the rewards, and observe the pixel-wise max of the last two frames
    (Atari sprites flicker between frames)."""

    def __init__(self, env: gym.Env, skip: int) -> None:
        super().__init__(env)
        self.skip = skip

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        frames: list[Any] = []
        total = 0.0
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            frames, total = [*frames[-1:], obs], total + float(reward)
            if terminated or truncated:
                break
        return np.maximum(frames[0], frames[-1]), total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learner's episode; the game goes on (its next life is the next episode), and only the
    game's end resets the env, so the monitor below records whole games (Mnih et al., 2015; SB3's EpisodicLifeEnv)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not hasattr(env.unwrapped, "ale"):
            raise ConfigError(
                "env.pixels.terminal_on_life_loss=true needs an ALE game (it counts lives); set "
                "env.pixels.terminal_on_life_loss=false"
            )
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over or kwargs.get("seed") is not None:  # a seeded reset starts a new game, as asked
            obs, info = self.env.reset(**kwargs)
        else:  # the next life: one no-op step from where the last one ended
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, info

    def checkpoint_state(self) -> dict[str, Any]:
        """The lives counted so far and whether the game is over (``pgcli.envs.state``: exact resume)."""
        return {"lives": self.lives, "game_over": self.game_over}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.lives, self.game_over = int(state["lives"]), bool(state["game_over"])


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after each reset: games such as Breakout wait for it (SB3's FireResetEnv)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class FireOnLifeLoss(gym.Wrapper):
    """Press FIRE after each lost life that does not end the game, as :class:`FireReset` does after each reset.

    Training meets each new life through :class:`EpisodicLife`'s reset, so FireReset serves it; an evaluation plays
    whole games, where a deterministic policy that never learnt to press FIRE would wait (Breakout) until the ALE's
    108,000-frame limit ends the game (issue 34). SB3's and CleanRL's evaluations keep the life handling and FIRE
    reset and count whole games from the monitor; rl-algo-impls' ``FireOnLifeStarttEnv`` presses FIRE as here. The
    lives are read from the emulator before and after each step: no state of its own (checkpoints need none)."""

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        ale = self.unwrapped.ale  # type: ignore[attr-defined]
        lives = ale.lives()
        obs, reward, terminated, truncated, info = self.env.step(action)
        if 0 < ale.lives() < lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(1)
            reward = float(reward) + float(fire_reward)
        return obs, reward, terminated, truncated, info


class ImageObservation(gym.ObservationWrapper):
    """Frames as the CNN takes them: uint8 in [0, 255], channels first (C, H, W); RGB made grey and the frame
    resized to ``screen_size`` when asked. (H, W, C) and (H, W) frames of uint8 or bool (MinAtar: 0/1 -> 0/255)."""

    def __init__(self, env: gym.Env, *, screen_size: int, grayscale: bool) -> None:
        super().__init__(env)
        space = env.observation_space
        if not (isinstance(space, spaces.Box) and len(space.shape) in (2, 3) and space.dtype in (np.uint8, np.bool_)):
            raise ConfigError(
                f"env.pixels needs image observations, (H, W) or (H, W, C) of uint8 or bool; the env "
                f"gives {describe_space(space)}; drop env.pixels (and use model=mlp)"
            )
        height, width, channels = (*space.shape, 1)[:3]
        if grayscale and channels != 3:
            raise ConfigError(
                f"env.pixels.grayscale=true needs RGB frames; the env gives {channels} channel(s) "
                f"({describe_space(space)}); set env.pixels.grayscale=false"
            )
        self.scale = 255 if space.dtype == np.bool_ else 1
        self.grayscale, self.size = grayscale, (screen_size, screen_size) if screen_size else (height, width)
        shape = (1 if grayscale else channels, *self.size)
        self.observation_space = spaces.Box(0, 255, shape=shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        frame = np.asarray(observation)
        frame = frame[:, :, None] if frame.ndim == 2 else frame  # [H, W, C]
        if self.grayscale:
            frame = (frame.astype(np.float32) @ GREY_WEIGHTS).round().astype(np.uint8)[:, :, None]
        frame = np.moveaxis(frame.astype(np.uint8) * np.uint8(self.scale), -1, 0)  # [C, H, W]
        if frame.shape[1:] != self.size:
            frame = np.stack([_resize(channel, self.size) for channel in frame])
        return np.ascontiguousarray(frame)


def _resize(channel: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """One [H, W] uint8 channel resized by area averaging (as OpenCV's INTER_AREA, which SB3's WarpFrame uses)."""
    from PIL import Image

    return np.asarray(Image.fromarray(channel).resize((size[1], size[0]), Image.Resampling.BOX))


class SignReward(gym.RewardWrapper):
    """The learner sees sign(reward): one scale for every game (Mnih et al., 2015)."""

    def reward(self, reward: Any) -> float:
        return float(np.sign(reward))


class FrameStack(gym.Wrapper):
    """The last ``k`` frames along the channel axis, (k * C, H, W), oldest first; a reset fills the stack with the
    first frame."""

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, spaces.Box)  # ImageObservation's
        self.frames: deque[np.ndarray] = deque(maxlen=k)
        self.observation_space = spaces.Box(0, 255, shape=(k * space.shape[0], *space.shape[1:]), dtype=np.uint8)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.frames.maxlen or 1):
            self.frames.append(obs)
        return np.concatenate(self.frames), info

    def step(self, action: Any) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return np.concatenate(self.frames), reward, terminated, truncated, info

    def checkpoint_state(self) -> dict[str, Any]:
        """The stacked frames as uint8 bytes in base64 (``pgcli.envs.state``: exact resume)."""
        return {"frames": base64.b64encode(b"".join(frame.tobytes() for frame in self.frames)).decode("ascii")}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        shape = self.env.observation_space.shape or ()
        frames = np.frombuffer(base64.b64decode(state["frames"]), dtype=np.uint8).reshape(-1, *shape)
        self.frames.clear()
        self.frames.extend(frames.copy())  # writable rows, one per frame
