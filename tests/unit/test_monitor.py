"""The Evaluator (``pgcli.training.evaluation``) on real CartPole / Pendulum envs, and the TrainingMonitor's cadences,
metrics, resume and clean stop (``pgcli.training.monitor``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgcli.config import EnvConfig, EvalConfig
from pgcli.contracts import EvalResult
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.training import monitor as monitor_module
from pgcli.training.evaluation import Evaluator
from pgcli.training.monitor import Hooks, Outputs, Schedule, TrainingMonitor
from pgcli.training.run import StopRequest


class RowPolicy:
    """CartPole: sub-env 0 always pushes left (episodes of ~10 steps), the others balance (they reach the limit)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        self.seen.append(obs.copy())
        balance = (obs[:, 2] + obs[:, 3] > 0).astype(np.int64)
        balance[0] = 0
        return balance

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.zip").write_bytes(b"checkpoint")
        return path


class RecordingLogger:
    """A MetricLogger that keeps everything in lists."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.artifacts: list[tuple[Path, str | None]] = []
        self.flushes = 0

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append((path, artifact_path))

    def flush(self) -> None:
        self.flushes += 1

    def close(self, status: str) -> None: ...

    def steps_of(self, key: str) -> list[int]:
        return [step for step, m in self.metrics if key in m]

    def values_of(self, key: str) -> list[float]:
        return [m[key] for _, m in self.metrics if key in m]


# --------------------------------------------------------------------------------------------------------------------
# Evaluator
# --------------------------------------------------------------------------------------------------------------------


def test_evaluator_counts_episodes_per_sub_env():
    # 7 episodes over 3 eval envs: 2 + 2 + 3 (SB3's evaluate_policy split). Sub-env 0 ends an episode every ~10 steps
    # and would fill all 7 slots if episodes were taken first-come; the split must give it exactly 2.
    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1, max_episode_steps=60)
    train_env = make_vec_env(env_cfg, seed=0)
    evaluator = Evaluator(env_cfg, EvalConfig(episodes=7, n_envs=3), seed=0, train_env=train_env)
    result = evaluator(RowPolicy())
    assert len(result.returns) == len(result.lengths) == 7
    short = [length for length in result.lengths if length < 60]
    assert len(short) == 2 and all(length < 20 for length in short)
    assert sorted(result.lengths)[2:] == [60] * 5
    np.testing.assert_array_equal(result.returns, result.lengths)  # CartPole: +1 per step
    evaluator.close()


def test_an_in_process_evaluation_acts_on_one_torch_thread_and_gives_the_run_its_threads_back():
    import torch

    class ThreadsSeen(RowPolicy):
        def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
            self.threads = torch.get_num_threads()
            return super().act(obs, deterministic)

    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1, max_episode_steps=20)
    evaluator = Evaluator(env_cfg, EvalConfig(episodes=2, n_envs=1), seed=0, train_env=make_vec_env(env_cfg, seed=0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # hardware.torch_threads=2
    try:
        policy = ThreadsSeen()
        evaluator(policy)
        assert policy.threads == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
        evaluator.close()


def test_evaluation_is_repeatable():
    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1, max_episode_steps=60)
    evaluator = Evaluator(env_cfg, EvalConfig(episodes=4, n_envs=2), seed=0, train_env=make_vec_env(env_cfg, seed=0))
    first, second = evaluator(RowPolicy()), evaluator(RowPolicy())
    np.testing.assert_array_equal(first.returns, second.returns)  # same start states at every evaluation
    assert first.mean == pytest.approx(float(np.mean(first.returns)))
    assert first.std == pytest.approx(float(np.std(first.returns)))
    evaluator.close()


def test_evaluator_uses_frozen_copy_of_training_normalisation():
    env_cfg = EnvConfig(id="Pendulum-v1", n_envs=1, normalize_obs=True, max_episode_steps=5)
    train_env = make_vec_env(env_cfg, seed=0)
    train_norm = find_normalizer(train_env)
    train_norm.obs_rms.mean = np.array([100.0, 0.0, 0.0])  # far from any raw cos(theta) in [-1, 1]
    train_norm.obs_rms.var = np.ones(3)

    class Zero:
        def __init__(self) -> None:
            self.seen: list[np.ndarray] = []

        def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
            self.seen.append(obs.copy())
            return np.zeros((obs.shape[0], 1), dtype=np.float32)

        def save(self, path: Path) -> Path:
            return path

    agent = Zero()
    evaluator = Evaluator(env_cfg, EvalConfig(episodes=2, n_envs=1), seed=0, train_env=train_env)
    evaluator(agent)
    seen = np.concatenate(agent.seen)
    np.testing.assert_allclose(seen[:, 0], -10.0)  # (cos - 100) / 1, clipped at -clip_obs: the training statistics
    eval_norm = find_normalizer(evaluator._env)
    assert eval_norm.training is False
    np.testing.assert_array_equal(eval_norm.obs_rms.mean, [100.0, 0.0, 0.0])  # not updated by evaluation
    np.testing.assert_array_equal(train_norm.obs_rms.mean, [100.0, 0.0, 0.0])
    evaluator.close()


# --------------------------------------------------------------------------------------------------------------------
# TrainingMonitor
# --------------------------------------------------------------------------------------------------------------------


class CountingEvaluator:
    """Stands in for Evaluator: returns fixed episodes and counts calls; advances a fake clock if given one."""

    concurrent = None  # evaluates in this process only

    def __init__(self, clock: list[float] | None = None, seconds: float = 0.0) -> None:
        self.calls = 0
        self.clock, self.seconds = clock, seconds

    def __call__(self, agent: Any) -> EvalResult:
        self.calls += 1
        if self.clock is not None:
            self.clock[0] += self.seconds
        return EvalResult(np.array([10.0, 20.0]), np.array([10, 20]))

    def close(self) -> None: ...


def make_monitor(
    logger: RecordingLogger,
    tmp_path: Path,
    *,
    evaluator: Any = "counting",
    best_dir: Path | None = None,
    stop: StopRequest | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    **cadence: Any,
) -> TrainingMonitor:
    """A monitor of 1000 env steps that evaluates every 100 (``cadence``: other :class:`Schedule` fields) with a
    :class:`CountingEvaluator` and checkpoints to ``tmp_path/checkpoints``, without a progress bar."""
    schedule = Schedule(**({"total_steps": 1000, "eval_every": 100, "log_every_steps": 1} | cadence))
    return TrainingMonitor(
        logger,  # type: ignore[arg-type]
        schedule,
        evaluator=CountingEvaluator() if isinstance(evaluator, str) else evaluator,
        outputs=Outputs(checkpoints=tmp_path / "checkpoints", best_model=best_dir),
        hooks=Hooks(stop=stop, on_eval=on_eval),
        progress=False,
    )


def test_eval_and_checkpoint_cadence_in_env_steps(tmp_path: Path):
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, checkpoint_every=150)
    agent = RowPolicy()
    for step in range(40, 401, 40):  # updates every 40 env steps: 40, 80, ..., 400
        monitor.update(step, agent)
    assert logger.steps_of("eval/return_mean") == [120, 200, 320, 400]  # first update at or past 100, 200, 300, 400
    assert [a for _, a in logger.artifacts] == ["checkpoints/step_160", "checkpoints/step_320"]
    assert (tmp_path / "checkpoints" / "step_160" / "model.zip").is_file()
    assert logger.values_of("eval/return_mean")[0] == 15.0 and logger.values_of("eval/return_std")[0] == 5.0

    final = monitor.finish(400, agent)  # an evaluation just ran at 400: not repeated
    assert logger.steps_of("eval/return_mean") == [120, 200, 320, 400]
    assert final is not None and final.mean == 15.0


def test_eval_every_zero_evaluates_only_at_the_end(tmp_path: Path):
    logger = RecordingLogger()
    evaluator = CountingEvaluator()
    monitor = make_monitor(logger, tmp_path, eval_every=0, evaluator=evaluator)
    for step in (100, 200, 300):
        monitor.update(step, RowPolicy())
    assert evaluator.calls == 0
    monitor.finish(300, RowPolicy())
    assert evaluator.calls == 1 and logger.steps_of("eval/return_mean") == [300]


def test_episodes_logged_one_by_one_and_rolling_means(tmp_path: Path):
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, window=3)
    monitor.add_episodes(50, [1.0, 2.0], [10, 20])
    monitor.add_episodes(90, [3.0, 4.0], [30, 40])
    monitor.update(100, RowPolicy())
    assert logger.values_of("rollout/ep_return") == [1.0, 2.0, 3.0, 4.0]
    assert logger.steps_of("rollout/ep_return") == [50, 50, 90, 90]
    assert logger.values_of("rollout/ep_len") == [10, 20, 30, 40]
    assert logger.values_of("rollout/ep_return_mean") == [3.0]  # mean of the last 3 episodes (window)
    assert logger.values_of("rollout/ep_len_mean") == [30.0]
    assert logger.values_of("time/episodes") == [4.0]


def test_episodes_from_a_vector_step_info(tmp_path: Path):
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path)
    venv = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=2, max_episode_steps=3), seed=0)
    for step in range(1, 4):
        *_, info = venv.step(np.zeros(2, dtype=np.int64))
        monitor.episodes(step * 2, info)
    assert logger.values_of("rollout/ep_return") == [3.0, 3.0] and logger.steps_of("rollout/ep_return") == [6, 6]
    venv.close()


def test_rollout_statistics_are_throttled_but_always_logged_at_the_end(tmp_path: Path):
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, log_every_steps=1000, eval_every=0, evaluator=None)
    for step in range(40, 2401, 40):
        monitor.update(step, RowPolicy())
    assert logger.steps_of("time/sps") == [40, 1040, 2040]
    monitor.finish(2440, RowPolicy())
    assert logger.steps_of("time/sps")[-1] == 2440


def test_sps_excludes_evaluation_time(tmp_path: Path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(monitor_module.time, "perf_counter", lambda: clock[0])
    logger = RecordingLogger()
    evaluator = CountingEvaluator(clock, seconds=100.0)  # each evaluation "takes" 100 s
    monitor = make_monitor(logger, tmp_path, eval_every=1000, evaluator=evaluator)
    clock[0] = 1.0
    monitor.update(1000, RowPolicy())  # 1000 steps in 1 s; then an evaluation of 100 s
    clock[0] += 1.0
    monitor.update(2000, RowPolicy())  # 1000 more steps in 1 s of training
    assert evaluator.calls == 2
    assert logger.values_of("time/sps") == pytest.approx([1000.0, 1000.0])


def test_the_best_evaluation_keeps_its_agent(tmp_path: Path):
    class ScriptedEvaluator(CountingEvaluator):
        def __init__(self, means: list[float]) -> None:
            super().__init__()
            self.means = means

        def __call__(self, agent: Any) -> EvalResult:
            mean = self.means[self.calls]
            self.calls += 1
            return EvalResult(np.array([mean]), np.array([1]))

    class Versioned(RowPolicy):  # saves which update it is at, so the kept agent can be told apart
        version = 0

        def save(self, path: Path) -> Path:
            path.mkdir(parents=True, exist_ok=True)
            (path / "model.zip").write_text(str(self.version))
            return path

    logger, agent = RecordingLogger(), Versioned()
    monitor = make_monitor(
        logger, tmp_path, evaluator=ScriptedEvaluator([1.0, 3.0, 2.0, 3.0]), best_dir=tmp_path / "best_model"
    )
    for step in (100, 200, 300, 400):
        agent.version = step
        monitor.update(step, agent)
    assert logger.values_of("eval/best_return_mean") == [1.0, 3.0, 3.0, 3.0]  # the running best
    assert monitor.best_step == 200 and monitor.best_eval is not None and monitor.best_eval.mean == 3.0
    assert (tmp_path / "best_model" / "model.zip").read_text() == "200"  # a tie does not replace the first best

    no_dir = make_monitor(RecordingLogger(), tmp_path / "other", evaluator=ScriptedEvaluator([1.0]))
    no_dir.update(100, agent)
    assert no_dir.best_step == 100 and not (tmp_path / "other").exists()  # eval.save_best=false: nothing written


# --------------------------------------------------------------------------------------------------------------------
# Resume and clean stop
# --------------------------------------------------------------------------------------------------------------------


class ScriptedEvaluator(CountingEvaluator):
    """Returns the mean returns of a script, one per evaluation: the best so far is not always the latest."""

    MEANS = (50.0, 20.0, 30.0, 60.0)

    def __call__(self, agent: Any) -> EvalResult:
        super().__call__(agent)
        mean = self.MEANS[self.calls - 1]
        return EvalResult(np.array([mean - 1, mean + 1]), np.array([5, 7]))


def drive(monitor: TrainingMonitor, steps: range) -> None:
    """Updates every 40 env steps, with one episode (return = step / 10) ending before each."""
    for step in steps:
        monitor.add_episodes(step - 1, [step / 10], [step // 40])
        monitor.update(step, RowPolicy())


def test_a_resumed_monitor_continues_its_curves_exactly(tmp_path: Path):
    kw: dict[str, Any] = {"checkpoint_every": 150, "window": 4}
    straight = RecordingLogger()
    drive(make_monitor(straight, tmp_path / "a", evaluator=ScriptedEvaluator(), **kw), range(40, 401, 40))

    first = RecordingLogger()
    drive(make_monitor(first, tmp_path / "b", evaluator=ScriptedEvaluator(), **kw), range(40, 161, 40))
    checkpoint = tmp_path / "b" / "checkpoints" / "step_160"
    assert first.flushes == 1 and (checkpoint / "monitor.json").is_file()  # flushed before the checkpoint
    second = RecordingLogger()
    evaluator = ScriptedEvaluator()
    evaluator.calls = 1  # evaluations at 120 (before the checkpoint), then 200, 320, 400
    resumed = make_monitor(second, tmp_path / "b", evaluator=evaluator, **kw)
    resumed.load_state(checkpoint, 160)
    drive(resumed, range(200, 401, 40))

    for key in (
        "eval/return_mean",
        "eval/best_return_mean",
        "time/episodes",
        "rollout/ep_return_mean",
        "rollout/ep_len_mean",
        "rollout/ep_return",
    ):
        assert first.steps_of(key) + second.steps_of(key) == straight.steps_of(key), key
        assert first.values_of(key) + second.values_of(key) == straight.values_of(key), key
    assert [a for _, a in first.artifacts + second.artifacts] == [a for _, a in straight.artifacts]
    assert second.values_of("eval/best_return_mean") == [50.0, 50.0, 60.0]  # the best of the first attempt counts
    assert resumed.best_step == 400 and resumed.best_eval is not None and resumed.best_eval.mean == 60.0


def test_a_run_resumed_at_its_budget_plays_its_final_evaluation_again(tmp_path: Path):
    # Issue 34: killed after the checkpoint at its budget (whose evaluation ran before it), a run is resumed into its
    # ending; that evaluation's result is not in the checkpoint, so the final one is played again for the summary.
    first = make_monitor(RecordingLogger(), tmp_path, checkpoint_every=200, total_steps=200)
    for step in (100, 200):
        first.update(step, RowPolicy())
    checkpoint = tmp_path / "checkpoints" / "step_200"
    logger, evaluator = RecordingLogger(), CountingEvaluator()
    resumed = make_monitor(logger, tmp_path, evaluator=evaluator, checkpoint_every=200, total_steps=200)
    resumed.load_state(checkpoint, 200)
    final = resumed.finish(200, RowPolicy())
    assert evaluator.calls == 1 and final is not None and final.mean == 15.0
    assert logger.steps_of("eval/return_mean") == [200]


def test_a_checkpoint_without_monitor_state_continues_from_its_step(tmp_path: Path):
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, checkpoint_every=150)
    (tmp_path / "old").mkdir()
    monitor.load_state(tmp_path / "old", 160)  # an older checkpoint: next eval and checkpoint derived from the step
    drive(monitor, range(200, 401, 40))
    assert logger.steps_of("eval/return_mean") == [200, 320, 400]
    assert [a for _, a in logger.artifacts] == ["checkpoints/step_320"]


def test_a_stop_request_checkpoints_at_the_update_and_raises(tmp_path: Path):
    from pgcli.training.run import Interrupted

    stop = StopRequest()
    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, checkpoint_every=0, stop=stop)
    drive(monitor, range(40, 121, 40))
    stop.signum = 15  # what the SIGTERM handler does while training runs
    with pytest.raises(Interrupted) as info:
        monitor.update(160, RowPolicy())
    assert info.value.exit_code == 143 and stop.clean
    assert [a for _, a in logger.artifacts] == ["checkpoints/step_160"]  # saved although checkpoint_every=0
    assert (tmp_path / "checkpoints" / "step_160" / "monitor.json").is_file()


def test_on_eval_gets_each_evaluation_at_its_scheduled_step(tmp_path: Path):
    # A search trial reports evaluations to its study through this hook; the step is the scheduled one (a multiple
    # of eval_every, total_steps for the final one), so trials whose updates end at different env steps report at
    # the same steps and a pruner can compare them.
    seen: list[tuple[int, float]] = []
    monitor = make_monitor(RecordingLogger(), tmp_path, total_steps=450, on_eval=lambda s, v: seen.append((s, v)))
    for step in range(60, 481, 60):  # updates every 60 env steps; training stops at 480 >= 450
        monitor.update(step, RowPolicy())
    monitor.finish(480, RowPolicy())
    assert seen == [(100, 15.0), (200, 15.0), (300, 15.0), (400, 15.0), (450, 15.0)]  # evaluated at 120 ... 480


def test_on_eval_raising_stops_training_there(tmp_path: Path):
    class Stop(Exception):
        pass

    def stop_at_200(step: int, value: float) -> None:
        if step == 200:
            raise Stop

    logger = RecordingLogger()
    monitor = make_monitor(logger, tmp_path, on_eval=stop_at_200)
    with pytest.raises(Stop):
        for step in range(50, 1001, 50):
            monitor.update(step, RowPolicy())
    assert logger.steps_of("eval/return_mean") == [100, 200]  # the evaluation that decided it is logged


# --------------------------------------------------------------------------------------------------------------------
# Evaluation in a separate process (hardware.eval_process)
# --------------------------------------------------------------------------------------------------------------------
class SnapshotAgent:
    """A real CartPole policy whose weights change at every update; ``save`` writes its weights."""

    def __init__(self) -> None:
        import torch

        from pgcli.algo.policies import make_policy
        from pgcli.config import ModelConfig

        env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=1), seed=0)
        torch.manual_seed(0)
        self.policy = make_policy(
            env.single_observation_space, env.single_action_space, ModelConfig(pi_hidden_sizes=[8])
        )
        env.close()

    def perturb(self, update: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(update)
        with torch.no_grad():
            for p in self.policy.parameters():
                p.add_(torch.randn(p.shape, generator=gen))

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.policy.predict(obs, deterministic)

    def snapshot(self) -> Any:
        from pgcli.algo.policies import PolicySnapshot

        return PolicySnapshot(self.policy)

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "weights.txt").write_text(repr([p.tolist() for p in self.policy.parameters()]))
        return path


def eval_history(tmp_path: Path, *, background: bool) -> tuple[list[tuple[int, dict[str, float]]], str]:
    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1)
    logger, agent = RecordingLogger(), SnapshotAgent()
    evaluator = Evaluator(
        env_cfg, EvalConfig(episodes=3), seed=0, train_env=make_vec_env(env_cfg, seed=0), background=background
    )
    monitor = make_monitor(logger, tmp_path, evaluator=evaluator, checkpoint_every=250, best_dir=tmp_path / "best")
    for update, step in enumerate(range(40, 401, 40)):
        agent.perturb(update)
        monitor.update(step, agent)
    monitor.finish(400, agent)
    evals = sorted((s, m) for s, m in logger.metrics if "eval/return_mean" in m)
    assert not list(tmp_path.glob(".best.step_*"))  # candidates of evaluations that were not the best are gone
    assert (evaluator._process is not None) == background  # the evaluations ran where they were meant to
    return evals, (tmp_path / "best" / "weights.txt").read_text()


def test_evaluation_process_logs_what_in_process_evaluation_logs(tmp_path: Path):
    serial, serial_best = eval_history(tmp_path / "serial", background=False)
    background, background_best = eval_history(tmp_path / "background", background=True)
    assert [s for s, _ in serial] == [120, 200, 320, 400]
    assert len({m["eval/return_mean"] for _, m in serial}) > 1  # the policy changed between evaluations
    assert background == serial
    assert background_best == serial_best  # the agent as it was at the best evaluation, not at the end


def test_a_dead_evaluation_process_is_a_one_line_error(tmp_path: Path):
    import os
    import signal

    from pgcli.envs.split import EnvWorkerError

    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1)
    evaluator = Evaluator(
        env_cfg, EvalConfig(episodes=2), seed=0, train_env=make_vec_env(env_cfg, seed=0), background=True
    )
    agent = SnapshotAgent()
    evaluator.submit(agent.snapshot())
    assert evaluator._process is not None
    os.kill(evaluator._process._process.pid, signal.SIGKILL)
    with pytest.raises(EnvWorkerError) as err:
        evaluator.result()
    assert "\n" not in str(err.value) and "evaluation process" in str(err.value) and "died" in str(err.value)
    evaluator.close()


def test_only_a_background_evaluator_has_a_concurrent_side():
    """The monitor asks ``evaluator.concurrent`` (pgcli.training.evaluation.EvaluatorLike), never its class."""
    from pgcli.lm.evaluation import TextEvaluator

    env_cfg = EnvConfig(id="CartPole-v1", n_envs=1)
    train_env = make_vec_env(env_cfg, seed=0)
    try:
        assert Evaluator(env_cfg, EvalConfig(), seed=0, train_env=train_env).concurrent is None
        background = Evaluator(env_cfg, EvalConfig(), seed=0, train_env=train_env, background=True)
        assert background.concurrent is background
        assert TextEvaluator.concurrent is None
    finally:
        train_env.close()


class RecordingBar:
    """The progress bar's interface, keeping each postfix it was given."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.postfixes = total, 0, []

    def set_postfix(self, stats: Mapping[str, str], refresh: bool = False) -> None:
        self.postfixes.append(dict(stats))

    def update(self, n: int) -> None:
        self.n += n

    def close(self) -> None: ...


@pytest.mark.parametrize(
    ("stats", "shown"),
    [
        ({"train/loss": 0.512345, "train/grad_norm": 1.0}, {"loss": "0.512"}),  # SFT, a reward model
        ({"rollout/reward_mean": 0.25, "train/loss": -0.01}, {"reward": "0.250"}),  # GRPO: the reward, not the loss
    ],
)
def test_the_progress_bar_shows_a_text_runs_training_signal(monkeypatch, stats, shown):
    bars: list[RecordingBar] = []
    monkeypatch.setattr(monitor_module, "_progress_bar", lambda total: bars.append(RecordingBar(total)) or bars[-1])
    monitor = TrainingMonitor(RecordingLogger(), Schedule(total_steps=64, log_every_steps=1), progress=True)
    monitor.log(32, stats)
    monitor.update(32, RowPolicy())
    (bar,) = bars
    assert {k: v for k, v in bar.postfixes[-1].items() if k != "sps"} == shown
    monitor.close()


def test_a_text_evaluation_is_logged_on_held_out_problems_not_episodes():
    result = EvalResult(np.ones(32), np.ones(32), extra={"eval/accuracy": 0.5, "eval/kl_ref": -1e-9})
    line = monitor_module.eval_line(512, result, text=True)
    assert line == "eval at step 512 on 32 held-out problems: return 1.000, accuracy 0.500, kl_ref 0.000"
    pairs = EvalResult(np.ones(8), np.ones(8), extra={"eval/pairwise_accuracy": 1.0})
    assert monitor_module.eval_line(0, pairs, text=True).startswith("eval at step 0 on 8 held-out pairs:")
    assert monitor_module.eval_line(0, pairs, text=False).startswith(
        "eval at step 0: return 1.00 ± 0.00 over 8 episodes"
    )
