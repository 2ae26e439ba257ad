"""``hardware.vec_env=worker`` (pgcli/envs/worker.py): the same experience as the sync vector env, step for step, on
real envs; checkpoint snapshots through the worker; a dead or failing worker is a one-line error, not a hang. The
last three hold for ``hardware.vec_env=shm`` too (parametrized; its own tests are in test_shmenv.py); both share
pgcli/envs/split.py."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pgcli.config import EnvConfig
from pgcli.envs.episodes import final_observations, finished_episodes
from pgcli.envs.make import make_vec_env
from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.envs.split import EnvWorkerError
from pgcli.envs.state import env_state, restore_env_state
from pgcli.envs.worker import WorkerVectorEnv

HOPPER = EnvConfig(id="Hopper-v5", n_envs=3, normalize_obs=True, normalize_reward=True)


def rollout(env, n_steps: int, seed: int) -> list[tuple]:
    """Random actions from a fixed generator; everything the trainers read from each step."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_steps):
        actions = rng.uniform(-1.0, 1.0, size=(env.num_envs, *env.single_action_space.shape)).astype(np.float32)
        obs, rewards, terminated, truncated, info = env.step(actions)
        eps = finished_episodes(info)
        out.append(
            (
                obs,
                rewards,
                terminated,
                truncated,
                final_observations(obs, info),
                info.get("_final_obs"),
                eps.returns,
                eps.lengths,
                flat_info(info),
            )
        )
    return out


def flat_info(info: dict, prefix: str = "") -> dict:
    """A vector env's info as {path: (dtype, values)}, every nested array included (final_obs: an object array),
    except the episodes' wall-clock durations."""
    out = {}
    for key, value in info.items():
        if key == "t" and prefix.endswith("episode."):  # the episode's wall-clock duration
            continue
        if isinstance(value, dict):
            out.update(flat_info(value, f"{prefix}{key}."))
        elif value.dtype == object:
            out[prefix + key] = ("object", [None if v is None else v.tolist() for v in value])
        else:
            out[prefix + key] = (value.dtype.str, value.tolist())
    return out


def assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            if isinstance(u, np.ndarray) or u is None:
                np.testing.assert_array_equal(u, v, err_msg=f"step {t}, field {i}")
            else:
                assert u == v, f"step {t}, field {i}"


def test_worker_env_gives_exactly_the_sync_envs_experience_on_hopper():
    sync = make_vec_env(HOPPER, seed=7, vectorization="sync")
    worker = make_vec_env(HOPPER, seed=7, vectorization="worker")
    try:
        assert isinstance(worker.unwrapped, WorkerVectorEnv) and worker.unwrapped.n_local == 2  # 2 here, 1 there
        a, b = rollout(sync, 400, seed=1), rollout(worker, 400, seed=1)
        # random actions topple Hopper within ~20 steps: many resets, in both processes' sub-envs
        ended = np.array([x[3] | x[2] for x in a])
        assert ended[:, :2].sum() > 10 and ended[:, 2].sum() > 5
        assert_same(a, b)
        # a masked reset resets only the selected sub-envs (here: one of each process's)
        mask = np.array([True, False, True])
        obs_a, _ = sync.reset(seed=[3, None, 5], options={"reset_mask": mask.copy()})
        obs_b, _ = worker.reset(seed=[3, None, 5], options={"reset_mask": mask.copy()})
        np.testing.assert_array_equal(obs_a, obs_b)
        assert_same(rollout(sync, 50, seed=2), rollout(worker, 50, seed=2))
        # attributes and methods of the sub-envs, in order (what checkpoints and the SB3 adapter use)
        assert [spec.id for spec in worker.unwrapped.get_attr("spec")] == ["Hopper-v5"] * 3
        assert [s.tolist() for s in worker.unwrapped.call("state_vector")] == [
            s.tolist() for s in sync.unwrapped.call("state_vector")
        ]
    finally:
        sync.close()
        worker.close()


@pytest.mark.parametrize("vectorization", ["worker", "shm"])
def test_a_two_process_env_snapshots_and_restores_episodes_in_progress(vectorization: str):
    env = make_vec_env(HOPPER, seed=0, vectorization=vectorization)
    try:
        rollout(env, 30, seed=0)
        saved = env_state(env)
        assert len(saved["sub_envs"]) == 3 and all(sub["sim"] is not None for sub in saved["sub_envs"])
        first = rollout(env, 40, seed=5)
        obs = restore_env_state(env, saved)
        assert obs is not None and obs.shape == (3, 11)
        again = rollout(env, 40, seed=5)
        # the normaliser's statistics moved on during `first`, so compare what the sub-envs did: raw episodes, flags
        for x, y in zip(first, again, strict=True):
            np.testing.assert_array_equal(x[2], y[2])
            np.testing.assert_array_equal(x[3], y[3])
            assert x[6] == y[6] and x[7] == y[7]
    finally:
        env.close()


@pytest.mark.parametrize(("vectorization", "env_class"), [("worker", WorkerVectorEnv), ("shm", SharedMemoryVectorEnv)])
def test_a_dead_worker_is_a_one_line_error_not_a_hang(vectorization: str, env_class: type):
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0, vectorization=vectorization)
    base = env.unwrapped
    assert isinstance(base, env_class)
    os.kill(base.worker.pid, signal.SIGKILL)
    base.worker.join(timeout=30)
    with pytest.raises(EnvWorkerError) as err:
        env.step(np.zeros(2, dtype=np.int64))
    message = str(err.value)
    assert "\n" not in message and "env worker process" in message and "died during 'step'" in message
    assert f"exit code {-signal.SIGKILL}" in message
    with pytest.raises(EnvWorkerError, match="already stopped"):
        env.step(np.zeros(2, dtype=np.int64))
    env.close()  # closing after the worker died does not raise or hang


@pytest.mark.parametrize("vectorization", ["worker", "shm"])
def test_an_exception_in_a_worker_sub_env_is_reported_as_one_line(vectorization: str, monkeypatch):
    # A worker that is not told to stop is waited for STOP_TIMEOUT_S, then terminated: a long timeout tells the two
    # apart on a loaded machine, where even a told worker may take a few seconds to exit
    monkeypatch.setattr("pgcli.hardware.child.STOP_TIMEOUT_S", 60.0)
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2), seed=0, vectorization=vectorization)
    try:
        with pytest.raises(EnvWorkerError) as err:
            env.step(np.array([0, 7]))  # the worker's sub-env gets an action outside Discrete(2)
        assert "\n" not in str(err.value) and "AssertionError" in str(err.value)
    finally:
        start = time.perf_counter()
        env.close()
        assert time.perf_counter() - start < 30  # the worker that reported the error is told to stop, not timed out


def test_one_sub_env_falls_back_to_sync_and_n_worker_is_checked():
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=1), seed=0, vectorization="worker")
    assert not isinstance(env.unwrapped, WorkerVectorEnv)  # nothing to share with a second process
    env.close()
    with pytest.raises(ValueError, match="n_worker"):
        WorkerVectorEnv([], n_worker=1)
