"""pgcli.video: episodes recorded from a real env's renderer, as MP4 or (without an encoder) GIF."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from pgcli.config import EnvConfig
from pgcli.envs.episodes import run_episodes
from pgcli.envs.make import make_vec_env
from pgcli.video import (
    EpisodeRecorder,
    RenderError,
    first_frame,
    make_recording_env,
    prepare_rendering,
    rendering_env_config,
)


class Push:
    """Always push the cart one way: CartPole falls within a few dozen steps (short, deterministic episodes)."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


def cartpole(render: bool):
    cfg = EnvConfig(id="CartPole-v1", n_envs=1)
    prepare_rendering()
    return make_vec_env(rendering_env_config(cfg) if render else cfg, seed=0)


def frames(path: Path) -> list[np.ndarray]:
    return [frame for frame in imageio.get_reader(path)]  # not list(): the ffmpeg reader's length hint is inf


def test_recorder_writes_one_video_per_episode_and_leaves_returns_alone(tmp_path: Path):
    plain = run_episodes(cartpole(render=False), Push(), 3, deterministic=True, seed=5)
    env = cartpole(render=True)
    recorder = EpisodeRecorder(env, tmp_path, n_episodes=2)
    result = run_episodes(env, Push(), 3, deterministic=True, seed=5, recorder=recorder)
    paths = recorder.close()
    np.testing.assert_array_equal(result.returns, plain.returns)  # rendering does not change the episodes
    suffix = ".mp4" if importlib.util.find_spec("imageio_ffmpeg") else ".gif"
    assert [p.name for p in paths] == [f"episode_0{suffix}", f"episode_1{suffix}"]
    for path, length in zip(paths, result.lengths, strict=False):
        video = frames(path)
        assert len(video) == length  # the first observation .. the state before the final step
        assert video[0].shape == (400, 600, 3)
        assert not np.array_equal(video[0], video[-1])


def test_without_an_encoder_videos_are_gifs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a)
    )
    env = cartpole(render=True)
    recorder = EpisodeRecorder(env, tmp_path)
    result = run_episodes(env, Push(), 1, deterministic=True, seed=5, recorder=recorder)
    (path,) = recorder.close()
    assert path.name == "episode.gif"
    assert 1 < len(frames(path)) <= result.lengths[0]  # Pillow merges identical consecutive frames


def test_an_env_without_rgb_frames_is_a_render_error():
    with pytest.raises(RenderError, match="CartPole-v1 returned no frame"):
        first_frame(cartpole(render=False))


def test_a_missing_gl_backend_is_a_one_line_render_error():
    # a fresh interpreter: MuJoCo reads MUJOCO_GL once, when it is first imported
    probe = (
        "from pgcli.config import EnvConfig\n"
        "from pgcli.video import RenderError, make_recording_env\n"
        "try:\n"
        "    make_recording_env(EnvConfig(id='InvertedPendulum-v5', n_envs=1), seed=0, n_envs=1)\n"
        "except RenderError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "MUJOCO_GL": "no-such-backend"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("cannot render InvertedPendulum-v5 (MUJOCO_GL=no-such-backend): ")
    assert proc.stdout.count("\n") == 1


def test_training_videos_every_n_steps_are_logged_as_artifacts(tmp_path: Path):
    from pgcli.config import EvalConfig
    from pgcli.training.evaluation import Evaluator
    from pgcli.training.monitor import Outputs, Schedule, TrainingMonitor
    from tests.unit.test_monitor import RecordingLogger, RowPolicy

    env_cfg = EnvConfig(id="CartPole-v1", n_envs=2)
    evaluator = Evaluator(
        env_cfg, EvalConfig(episodes=1, video_every=200), seed=0, train_env=make_vec_env(env_cfg, seed=0)
    )
    logger = RecordingLogger()
    monitor = TrainingMonitor(
        logger,
        Schedule(400, eval_every=100),
        evaluator=evaluator,
        outputs=Outputs(videos=tmp_path / "videos"),
        progress=False,
    )
    for step in (100, 200, 300, 400):
        monitor.update(step, RowPolicy())
    monitor.close()
    assert logger.steps_of("eval/return_mean") == [100, 200, 300, 400]
    suffix = ".mp4" if importlib.util.find_spec("imageio_ffmpeg") else ".gif"
    assert [(p.name, where) for p, where in logger.artifacts] == [
        (f"step_200{suffix}", "videos"),
        (f"step_400{suffix}", "videos"),
    ]
    assert len(frames(tmp_path / "videos" / f"step_200{suffix}")) > 1


class Stay:
    """MinAtar Breakout's action 0 (stay): the paddle waits and the ball is missed within a few dozen steps."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


def test_minatar_episodes_are_recorded_as_a_picture_of_the_game(tmp_path: Path):
    # MinAtar has no frames of its own to render: pgcli draws the 10x10xC state, 32 px a cell, one colour a channel
    pytest.importorskip("minatar", reason="pgcli[pixels] is not installed")
    from pgcli.training.checks import train_config

    cfg = train_config(["env=minatar_breakout"]).env
    env = make_recording_env(cfg, seed=0, n_envs=1)  # what `pgcli eval --video` and eval.video_every use
    recorder = EpisodeRecorder(env, tmp_path)
    result = run_episodes(env, Stay(), 1, deterministic=True, seed=3, recorder=recorder)
    (path,) = recorder.close()
    video = frames(path)
    assert len(video) == result.lengths[0] > 1
    assert {frame.shape for frame in video} == {(320, 320, 3)}
    first = video[0].astype(float)
    assert first[:32].mean() < 20 and first[40:120].mean() > 150  # row 0 empty; rows 1-3 the bricks, a light colour
    assert not np.array_equal(video[0], video[-1])  # the ball moves


def test_minatar_frames_use_minatar_display_palette():
    import matplotlib

    from pgcli.envs.pixels import minatar_rgb

    state = np.zeros((10, 10, 4), dtype=bool)
    state[9, 2, 0] = state[0, 0, 3] = state[0, 0, 1] = True  # the last channel shows where two overlap
    image = minatar_rgb(state, cell_px=2)
    assert image.shape == (20, 20, 3) and image.dtype == np.uint8
    palette = np.round(matplotlib.colormaps["cubehelix"](np.linspace(0, 1, 6)[1:-1])[:, :3] * 255)
    np.testing.assert_array_equal(image[18:20, 4:6], np.broadcast_to(palette[0], (2, 2, 3)))
    np.testing.assert_array_equal(image[0:2, 0:2], np.broadcast_to(palette[3], (2, 2, 3)))
    assert image[2:, 6:].max() == 0  # empty cells are black
