"""Episode videos: frames from an env's ``rgb_array`` renderer, streamed to MP4 (or GIF where no encoder exists).

MuJoCo envs render offscreen: with no display, ``MUJOCO_GL=egl`` is set when the user has not chosen a backend
(gymnasium reads it when the first frame is rendered). Classic-control envs draw with pygame; SDL is pointed at its
dummy video driver when there is no display, so nothing tries to open a window. Frames go to the encoder one by one:
a 1000-step Hopper episode at 480x480 is ~690 MB of raw frames, never held in memory.

MP4 needs the ``imageio-ffmpeg`` package (it ships an ffmpeg binary); without it videos are GIFs (Pillow, which
matplotlib already needs).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from pgcli.config import EnvConfig
from pgcli.envs.make import make_vec_env
from pgcli.errors import PgcliError


class RenderError(PgcliError):
    """The env cannot render frames here (no GL, no pygame, ...); the message says why in one line."""


def prepare_rendering() -> None:
    """Choose headless backends where the user has not: EGL for MuJoCo, SDL's dummy driver for pygame."""
    headless = not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")
    if headless:
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def video_suffix() -> str:
    """``.mp4`` when an ffmpeg encoder is installed (imageio-ffmpeg), else ``.gif``."""
    return ".mp4" if importlib.util.find_spec("imageio_ffmpeg") is not None else ".gif"


def rendering_env_config(cfg: EnvConfig) -> EnvConfig:
    """``cfg`` with ``render_mode="rgb_array"`` (frames are drawn only when asked for, so stepping costs the same)."""
    return replace(cfg, kwargs={**cfg.kwargs, "render_mode": "rgb_array"})


def make_recording_env(cfg: EnvConfig, *, seed: int, n_envs: int) -> VectorEnv:
    """pgcli's env for ``cfg`` with frames to record; a one-line :class:`RenderError` naming the cause if it has none.

    MuJoCo reads ``MUJOCO_GL`` when it is first imported (building the env) and gymnasium when the first frame is
    drawn, so both steps are checked here, before any episode or MLflow run starts.
    """
    prepare_rendering()
    try:
        env = make_vec_env(rendering_env_config(cfg), seed=seed, n_envs=n_envs, training=False)
    except Exception as exc:  # MuJoCo's import with an unusable GL backend
        raise _render_error(cfg.id, exc) from None
    try:
        first_frame(env)
    except Exception:
        env.close()
        raise
    return env


def first_frame(env: VectorEnv) -> np.ndarray:
    """Render sub-env 0 of a synchronous vector env once; a :class:`RenderError` naming the cause if it cannot."""
    try:
        return render(env)
    except RenderError:
        raise
    except Exception as exc:  # GL context, missing pygame, ...: the library's own words, first line
        raise _render_error(env_id(env), exc) from None


MUJOCO_GL_BACKENDS = {
    "egl": "libegl1: headless, a GPU driver or Mesa",
    "osmesa": "libosmesa6: software",
    "glfw": "libglfw3 and a display",
}
"""The values of ``MUJOCO_GL`` gymnasium's MuJoCo renderer takes, with what each needs (docs/evaluation.md)."""


def _render_error(env_name: str, exc: BaseException) -> RenderError:
    backend = os.environ.get("MUJOCO_GL", "default")
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0][:160] if text else ''}"
    if not _uses_mujoco(env_name):
        return RenderError(f"cannot render {env_name} (MUJOCO_GL={backend}): {detail}")
    if backend not in MUJOCO_GL_BACKENDS:  # MuJoCo's import or gymnasium's renderer refused the value
        *first, last = (f"{name} ({needs})" for name, needs in MUJOCO_GL_BACKENDS.items())
        choices = f"{', '.join(first)} or {last}"
        return RenderError(f"cannot render {env_name} (MUJOCO_GL={backend}): set MUJOCO_GL to one of {choices}")
    # a known backend whose GL library is missing fails deep in PyOpenGL ('NoneType' object has no attribute ...)
    others = " or ".join(f"{name} ({needs})" for name, needs in MUJOCO_GL_BACKENDS.items() if name != backend)
    return RenderError(
        f"cannot render {env_name} (MUJOCO_GL={backend}): its GL library did not load ({detail}); install what "
        f"{backend} needs ({MUJOCO_GL_BACKENDS[backend]}) or set MUJOCO_GL={others}"
    )


def _uses_mujoco(env_name: str) -> bool:
    """Whether gymnasium's registry builds ``env_name`` from its MuJoCo envs (which render through ``MUJOCO_GL``)."""
    import gymnasium as gym

    try:
        entry_point = gym.spec(env_name).entry_point
    except Exception:  # not registered (a custom env): not ours to name
        return False
    return "mujoco" in str(entry_point).lower()


def env_id(env: VectorEnv) -> str:
    base: Any = env.unwrapped
    spec = base.envs[0].spec
    return spec.id if spec is not None else "the env"


def render(env: VectorEnv) -> np.ndarray:
    """One RGB frame [H, W, 3] of sub-env 0."""
    base: Any = env.unwrapped  # SyncVectorEnv: its sub-envs are in .envs
    frame = base.envs[0].render()
    if frame is None:
        raise RenderError(f"{env_id(env)} returned no frame (render_mode is not 'rgb_array')")
    return np.asarray(frame, dtype=np.uint8)


class VideoWriter:
    """One video file, written frame by frame."""

    def __init__(self, path: Path, fps: float) -> None:
        import imageio.v2 as imageio

        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".mp4":
            # macro_block_size=2: H.264 needs even sizes; the default (16) would rescale e.g. CartPole's 600x400
            self._writer = imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=2)
        else:
            self._writer = imageio.get_writer(path, mode="I", duration=1000.0 / fps, loop=0)
        self.n_frames = 0

    def append(self, frame: np.ndarray) -> None:
        self._writer.append_data(frame)
        self.n_frames += 1

    def close(self) -> Path:
        self._writer.close()
        return self.path


class EpisodeRecorder:
    """Records the first ``n_episodes`` episodes of sub-env 0 of a same-step-autoreset vector env.

    Call :meth:`reset` after ``env.reset`` and :meth:`step` after each ``env.step`` with whether sub-env 0's episode
    ended. When it ends the env has already reset it, so its last frame is the next episode's first: each file holds
    an episode from its first observation to the state before its final step.
    """

    def __init__(self, env: VectorEnv, out_dir: Path, *, n_episodes: int = 1, stem: str = "episode") -> None:
        self.env, self.out_dir, self.n_episodes, self.stem = env, out_dir, n_episodes, stem
        fps = env.metadata.get("render_fps") or 30
        self.fps = float(fps)
        self.paths: list[Path] = []
        self._writer: VideoWriter | None = None

    def reset(self) -> None:
        self._open(first_frame(self.env))

    def step(self, episode_over: bool) -> None:
        if self._writer is None:
            return
        frame = render(self.env)
        if episode_over:
            self._finish()
            if len(self.paths) < self.n_episodes:
                self._open(frame)
        else:
            self._writer.append(frame)

    def close(self) -> list[Path]:
        """Finish the file being written (an episode cut short) and return every file written."""
        if self._writer is not None:
            self._finish()
        return self.paths

    def _open(self, frame: np.ndarray) -> None:
        name = self.stem if self.n_episodes == 1 else f"{self.stem}_{len(self.paths)}"
        self._writer = VideoWriter(self.out_dir / f"{name}{video_suffix()}", self.fps)
        self._writer.append(frame)

    def _finish(self) -> None:
        assert self._writer is not None
        self.paths.append(self._writer.close())
        self._writer = None
