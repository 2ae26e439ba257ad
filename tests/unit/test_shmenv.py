"""``hardware.vec_env=shm`` (pgcli/envs/shm.py): the sync vector env's observations, rewards, flags and end-of-episode
infos, step for step, on real envs with many resets on both sides of the process boundary; checkpoint snapshots
through the worker; a dead or failing worker is a one-line error, not a hang; the exact fast mean / variance of the
normaliser."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_vecenv import assert_same, flat_info, rollout

from pgcli.config import EnvConfig
from pgcli.envs import make as env_module
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import RunningMeanStd, batch_mean_var
from pgcli.envs.shm import SharedMemoryVectorEnv
from pgcli.hardware import placement

HOPPER = EnvConfig(id="Hopper-v5", n_envs=3, normalize_obs=True, normalize_reward=True)
END_KEYS = ("final_obs", "_final_obs", "final_info.", "_final_info")


def lean(steps: list[tuple]) -> list[tuple]:
    """A rollout's steps with only the end-of-episode infos (what the shm env carries) in the flattened info."""
    return [(*s[:8], {k: v for k, v in s[8].items() if k.startswith(END_KEYS)}) for s in steps]


@pytest.mark.parametrize("n_envs", [2, 3])
def test_shm_env_gives_exactly_the_sync_envs_experience_on_hopper(n_envs: int):
    cfg = EnvConfig(id="Hopper-v5", n_envs=n_envs, normalize_obs=True, normalize_reward=True)
    sync = make_vec_env(cfg, seed=7, vectorization="sync")
    shm = make_vec_env(cfg, seed=7, vectorization="shm")
    try:
        base = shm.unwrapped
        assert isinstance(base, SharedMemoryVectorEnv) and base.n_local == n_envs - n_envs // 2
        assert base.worker is not None and base.worker.is_alive()
        a, b = rollout(sync, 300, seed=1), rollout(shm, 300, seed=1)
        # random actions topple Hopper within ~20 steps: many resets, in both processes' sub-envs
        ended = np.array([x[3] | x[2] for x in a])
        assert ended[:, : base.n_local].sum() > 10 and ended[:, base.n_local :].sum() > 5
        assert_same(lean(a), b)
        assert all(set(step[8]) <= {k for k in step[8] if k.startswith(END_KEYS)} for step in b)
        # an idle worker (longer than it busy-waits) still answers the next step
        time.sleep(0.05)
        assert_same(lean(rollout(sync, 20, seed=3)), rollout(shm, 20, seed=3))
        # actions of another dtype go through the pipe, as given: still the same
        for _ in range(30):
            actions = np.random.default_rng(4).uniform(-1, 1, size=(n_envs, 3))  # float64
            x, y = sync.step(actions), shm.step(actions)
            for u, v in zip(x[:4], y[:4], strict=True):
                np.testing.assert_array_equal(u, v)
        # a masked reset resets only the selected sub-envs
        mask = np.zeros(n_envs, dtype=bool)
        mask[[0, -1]] = True
        seeds = [3] + [None] * (n_envs - 2) + [5]
        obs_a, _ = sync.reset(seed=seeds, options={"reset_mask": mask.copy()})
        obs_b, _ = shm.reset(seed=seeds, options={"reset_mask": mask.copy()})
        np.testing.assert_array_equal(obs_a, obs_b)
        assert_same(lean(rollout(sync, 50, seed=2)), rollout(shm, 50, seed=2))
        assert [s.tolist() for s in base.call("state_vector")] == [
            s.tolist() for s in sync.unwrapped.call("state_vector")
        ]
        assert [spec.id for spec in base.get_attr("spec")] == ["Hopper-v5"] * n_envs
    finally:
        sync.close()
        shm.close()


def test_shm_env_on_discrete_actions_and_without_a_worker(monkeypatch: pytest.MonkeyPatch):
    cartpole = EnvConfig(id="CartPole-v1", n_envs=4)
    sync = make_vec_env(cartpole, seed=3, vectorization="sync")
    shm = make_vec_env(cartpole, seed=3, vectorization="shm")
    monkeypatch.setattr(env_module, "usable_cpus", lambda: 1)
    alone = make_vec_env(cartpole, seed=3, vectorization="shm")  # one usable CPU: every sub-env here
    monkeypatch.undo()
    lean = make_vec_env(cartpole, seed=3, vectorization="lean")  # what evaluations step: never a worker
    try:
        assert shm.unwrapped.n_local == 2 and alone.unwrapped.n_local == 4 and alone.unwrapped.worker is None
        assert lean.unwrapped.n_local == 4 and lean.unwrapped.worker is None
        rng = np.random.default_rng(0)
        for t in range(300):
            actions = rng.integers(0, 2, size=4)
            x, y, z, q = sync.step(actions), shm.step(actions), alone.step(actions), lean.step(actions)
            for u, v, w, c in zip(x[:4], y[:4], z[:4], q[:4], strict=True):
                np.testing.assert_array_equal(u, v, err_msg=f"step {t}")
                np.testing.assert_array_equal(u, w, err_msg=f"step {t}")
                np.testing.assert_array_equal(u, c, err_msg=f"step {t}")
            ends = {k: v for k, v in flat_info(x[4]).items() if k.startswith(END_KEYS)}
            assert ends == flat_info(y[4]) == flat_info(z[4]) == flat_info(q[4]), f"step {t}"
    finally:
        for env in (sync, shm, alone, lean):
            env.close()


# In tests/unit/test_vecenv.py, parametrized over both two-process envs: snapshots of episodes in progress
# (test_a_two_process_env_snapshots_and_restores_episodes_in_progress), a dead worker, an exception in a worker sub-env.


def test_n_worker_is_checked():
    with pytest.raises(ValueError, match="n_worker"):
        SharedMemoryVectorEnv([], n_worker=0)


@pytest.mark.parametrize("shape", [(2,), (2, 11), (3, 5), (1, 4), (8, 17)])
def test_batch_mean_var_is_numpys_mean_and_var_bit_for_bit(shape: tuple[int, ...]):
    rng = np.random.default_rng(0)
    for _ in range(500):
        batch = rng.normal(size=shape) * rng.choice([1e-3, 1.0, 1e3]) + 10 * rng.normal()
        mean, var = batch_mean_var(batch)
        assert np.array_equal(mean, batch.mean(axis=0)) and type(mean) is type(batch.mean(axis=0))
        assert np.array_equal(var, batch.var(axis=0)) and type(var) is type(batch.var(axis=0))
    ints = rng.integers(0, 5, size=shape)  # other dtypes: numpy's own
    assert np.array_equal(batch_mean_var(ints)[1], ints.var(axis=0))


@pytest.mark.parametrize("shape", [(), (11,), (3, 2)])
def test_running_statistics_follow_the_parallel_update_formula_bit_for_bit(shape: tuple[int, ...]):
    """RunningMeanStd.update (in-place temporaries) against the textbook expression, evaluated in numpy's order."""
    rng = np.random.default_rng(1)
    stats = RunningMeanStd(shape)
    mean, var, count = np.zeros(shape), np.ones(shape), 1e-4
    for _ in range(300):
        batch = rng.normal(size=(int(rng.integers(1, 9)), *shape)) * rng.choice([1e-3, 1.0, 1e3]) + rng.normal()
        b_mean, b_var, b = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta, total = b_mean - mean, count + b
        mean = mean + delta * b / total
        var = (var * count + b_var * b + delta**2 * count * b / total) / total
        count = total
        stats.update(batch)
        assert np.array_equal(stats.mean, mean) and np.array_equal(stats.var, var) and stats.count == count


def test_the_worker_plays_evaluations_in_its_idle_time_with_the_in_process_results():
    # hardware.eval_in_worker: an evaluation submitted to the shm env's worker gives run_episodes' returns and lengths
    # exactly, while the training env keeps stepping in between (the worker plays only when no step comes); then a
    # second evaluation with other normaliser statistics, and a failing one is an error, not a hang
    import torch

    from pgcli.algo.policies import PolicySnapshot, make_policy
    from pgcli.config import EvalConfig, ModelConfig
    from pgcli.envs.episodes import run_episodes
    from pgcli.envs.make import EVAL_SEED_OFFSET
    from pgcli.envs.normalize import load_normalizer_state, normalizer_state
    from pgcli.envs.split import EnvWorkerError
    from pgcli.training.evaluation import Evaluator, WorkerEvaluation

    cfg = EnvConfig(id="Hopper-v5", n_envs=2, normalize_obs=True, normalize_reward=True)
    eval_cfg = EvalConfig(episodes=3)
    train = make_vec_env(cfg, seed=0, vectorization="shm")
    reference = make_vec_env(cfg, seed=0, n_envs=1, vectorization="lean")
    try:
        torch.manual_seed(0)
        policy = make_policy(train.single_observation_space, train.single_action_space, ModelConfig())
        evaluator = Evaluator(cfg, eval_cfg, seed=5, train_env=train, in_worker=True)
        assert evaluator.background and evaluator.in_worker
        rng = np.random.default_rng(0)
        train.reset(seed=1)
        for round_ in range(2):
            for _ in range(200 * (round_ + 1)):  # the normaliser statistics move between the two evaluations
                train.step(rng.uniform(-1, 1, size=(2, 3)).astype(np.float32))
            state = normalizer_state(train)
            evaluator.submit(PolicySnapshot(policy))
            assert isinstance(evaluator._process, WorkerEvaluation)
            for _ in range(50):  # a rollout meanwhile: steps come before evaluation steps
                train.step(rng.uniform(-1, 1, size=(2, 3)).astype(np.float32))
            got = evaluator.result()
            load_normalizer_state(reference, state, training=False)
            expected = run_episodes(reference, PolicySnapshot(policy), 3, deterministic=True, seed=5 + EVAL_SEED_OFFSET)
            np.testing.assert_array_equal(got.returns, expected.returns)
            np.testing.assert_array_equal(got.lengths, expected.lengths)
            assert len(got.returns) == 3
        evaluator._process.submit("not an actor", None)  # type: ignore[arg-type]
        with pytest.raises(EnvWorkerError, match="evaluation in the env worker failed: AttributeError"):
            evaluator._process.result()
        train.step(np.zeros((2, 3), np.float32))  # the worker is still serving the training env
    finally:
        train.close()
        reference.close()


def test_without_a_worker_the_evaluation_stays_in_process():
    from pgcli.config import EvalConfig
    from pgcli.training.evaluation import Evaluator

    cfg = EnvConfig(id="Hopper-v5", n_envs=2)
    env = make_vec_env(cfg, seed=0, vectorization="sync")
    try:
        evaluator = Evaluator(cfg, EvalConfig(), seed=0, train_env=env, in_worker=True)
        assert not evaluator.background and not evaluator.in_worker
    finally:
        env.close()


def test_a_worker_that_dies_during_an_evaluation_is_an_error_not_a_hang():
    import os
    import signal

    import torch

    from pgcli.algo.policies import PolicySnapshot, make_policy
    from pgcli.config import EvalConfig, ModelConfig
    from pgcli.envs.split import EnvWorkerError
    from pgcli.training.evaluation import Evaluator

    cfg = EnvConfig(id="Hopper-v5", n_envs=2)
    train = make_vec_env(cfg, seed=0, vectorization="shm")
    try:
        torch.manual_seed(0)
        policy = make_policy(train.single_observation_space, train.single_action_space, ModelConfig())
        evaluator = Evaluator(cfg, EvalConfig(episodes=50), seed=0, train_env=train, in_worker=True)
        train.reset(seed=0)
        evaluator.submit(PolicySnapshot(policy))
        os.kill(train.unwrapped.worker.pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerError, match=r"the env worker process \(pid \d+\) died during an evaluation"):
            evaluator.result()
    finally:
        train.close()


def test_free_core_reads_the_runnable_count_less_this_process(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement, "usable_cpus", lambda: 2)
    counts = iter([1, 2, 1, 1, 3])  # median 1: only this process runs
    monkeypatch.setattr(placement, "running_tasks", lambda: next(counts))
    assert placement.free_core(interval_s=0)
    counts = iter([2, 2, 3, 1, 2])  # median 2: one other process runs, no core left for a worker
    monkeypatch.setattr(placement, "running_tasks", lambda: next(counts))
    assert not placement.free_core(interval_s=0)
    monkeypatch.setattr(placement, "running_tasks", lambda: None)  # unreadable: decide as before
    assert placement.free_core(interval_s=0)


@pytest.mark.skipif(placement.running_tasks() is None, reason="reads /proc/loadavg")
def test_free_core_sees_a_busy_process_on_the_machine():
    from tests.conftest import busy_cores

    with busy_cores():
        assert not placement.free_core()


def test_bringing_the_worker_envs_home_mid_episode_changes_nothing():
    # the worker's sub-envs move into this process with their episodes in progress, and the worker stops: from then
    # on the experience is still exactly the sync env's
    cfg = EnvConfig(id="Hopper-v5", n_envs=2, normalize_obs=True, normalize_reward=True)
    sync = make_vec_env(cfg, seed=7, vectorization="sync")
    shm = make_vec_env(cfg, seed=7, vectorization="shm")
    try:
        base = shm.unwrapped
        worker = base.worker
        assert_same(lean(rollout(sync, 57, seed=1)), rollout(shm, 57, seed=1))
        wrappers = dict(map(tuple, base.get_attr("episode_state")[1]["wrappers"]))
        assert wrappers["TimeLimit"]["elapsed_steps"] > 0  # the worker's sub-env is mid-episode
        assert base.bring_home()
        assert base.worker is None and base.n_local == 2 and not worker.is_alive()
        assert base.evaluation_channel() is None and not base.bring_home()  # once
        assert_same(lean(rollout(sync, 300, seed=2)), rollout(shm, 300, seed=2))
    finally:
        sync.close()
        shm.close()


def test_the_worker_watch_brings_the_envs_home_when_the_cores_are_taken():
    from pgcli.envs.shm_watch import WorkerWatch

    class Env:  # the two things the watch reads and calls; the move itself is tested above
        wait_s = 0.0
        moved = 0

        def bring_home(self) -> bool:
            self.moved += 1
            return True

    env, queued = Env(), [0.0]
    watch = WorkerWatch(env, share=0.2, wait_share=0.4, patience=2, run_queue=lambda: queued[0])  # type: ignore[arg-type]

    def update(queue_share: float, wait_share: float = 0.0) -> str | None:
        time.sleep(0.02)
        queued[0] += queue_share * 0.02
        env.wait_s += wait_share * 0.02
        return watch()

    assert update(0.05) is None and update(0.9) is None  # one update off a core is not a trend
    assert update(0.05, wait_share=0.9) is None and update(0.05, wait_share=0.9) is None  # waits alone do not count
    assert update(0.9) is None
    note = update(0.9)  # the second in a row
    assert env.moved == 1 and note is not None and "continues in one process, with the same results" in note

    # where the kernel does not say (run_queue gives None), long waits for the worker stand in, with a higher bar
    env2 = Env()
    watch2 = WorkerWatch(env2, share=0.2, wait_share=0.4, patience=2, run_queue=lambda: None)  # type: ignore[arg-type]
    for share in (0.3, 0.3, 0.3):
        time.sleep(0.02)
        env2.wait_s += share * 0.02
        assert watch2() is None
    for _ in range(2):
        time.sleep(0.02)
        env2.wait_s += 0.8 * 0.02
        note2 = watch2()
    assert env2.moved == 1 and note2 is not None


def test_run_queue_time_is_read_for_live_processes_only():
    import os

    from pgcli.hardware.watch import run_queue_s

    if not os.path.exists("/proc/self/schedstat"):
        pytest.skip("no /proc/<pid>/schedstat here")
    assert (run_queue_s(os.getpid()) or 0.0) >= 0.0 and run_queue_s(os.getpid()) is not None
    assert run_queue_s(2**22 + 12345) is None  # no such process
