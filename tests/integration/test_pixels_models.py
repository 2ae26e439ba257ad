"""The MLflow Model of an image run (docs/models.md, "Frames"; docs/pixels.md): ``predict`` takes uint8 frames in
the env's observation layout and gives exactly the deterministic actions the trained agent takes on them.

Runs come from real `pgcli train` subprocesses (SB3's PPO and pgcli's PPO-Penalty with ``model=cnn`` on MinAtar,
SB3's PPO on Pong); the model is loaded through ``mlflow.pyfunc.load_model``. The oracle is the agent as
``pgcli eval`` loads it, on the env's own spaces; the run's logged final evaluation is replayed with ``predict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pgcli.agent import eval_env, load_agent
from pgcli.config.saved_agent import agent_config, read_agent_spec
from pgcli.envs.episodes import run_episodes
from pgcli.envs.make import EVAL_SEED_OFFSET, make_vec_env
from tests.integration.test_eval_cli import last, trained_run

pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
pytest.importorskip("minatar", reason="pgcli[pixels] is not installed")

COMMON = ("~preset", "model.ortho_init=false", "algo.n_steps=64", "algo.n_epochs=1", "eval.every=0",
          "eval.episodes=1", "seed=0")  # fmt: skip
"""``model.ortho_init=false``: torch's default init of the policy head, not SB3's gain of 0.01, so that the briefly
trained agent's choice varies from frame to frame and a frame scaled differently from training would show."""
MINATAR = ("env=minatar_breakout", "env.n_envs=4", "algo.batch_size=128", "total_steps=512")
PONG_EVAL = ("env.max_episode_steps=400",)
"""An untrained Pong policy plays long games: 400 frames (100 env steps) bound the evaluation."""
CASES = {
    "sb3_ppo-minatar": ("algo=ppo", *MINATAR),
    "ppo_kl-minatar": ("algo=ppo_kl", *MINATAR),
    "sb3_ppo-pong": ("algo=ppo", "env=pong", "env.n_envs=2", "algo.batch_size=64", "total_steps=128", *PONG_EVAL),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> dict[str, tuple[Any, Any, Path]]:
    """(store, run, its downloaded model dir) per case."""
    out = {}
    for name, overrides in CASES.items():
        root = tmp_path_factory.mktemp(name)
        store, _, run = trained_run(root, mlflow_schema_db, *COMMON, *overrides)
        model_dir = Path(store.client().download_artifacts(run.info.run_id, "model", str(root)))
        out[name] = (store, run, model_dir)
    return out


def load(store: Any, run: Any) -> Any:
    import mlflow

    mlflow.set_tracking_uri(store.uri)
    return mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")


class Predicting:
    """The pyfunc model as an actor for ``run_episodes`` (deterministic, as the model always is)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.model.predict(obs)


@pytest.mark.parametrize("case", CASES)
def test_predict_on_frames_gives_the_trained_agents_actions(runs, case: str):
    store, run, model_dir = runs[case]
    model = load(store, run)
    cfg = agent_config(read_agent_spec(model_dir))
    env = make_vec_env(cfg.env, seed=5, n_envs=4, training=False)  # frames as the evaluations see them
    agent = load_agent(model_dir, cfg, env.single_observation_space, env.single_action_space)
    obs, batches = env.reset(seed=5)[0], []
    for _ in range(16):
        batches.append(obs)
        obs = env.step(env.action_space.sample())[0]
    # and noise, dense and sparse: the env's first frames barely move a briefly trained agent's choice
    space, rng = env.single_observation_space, np.random.default_rng(0)
    dense = rng.integers(0, 256, size=(32, *space.shape), dtype=np.uint8)
    sparse = (rng.random((16, *space.shape)) < 0.1).astype(np.uint8) * 255
    frames = np.concatenate([*batches, dense, sparse])  # [112, C, H, W] uint8
    assert frames.dtype == np.uint8 and frames.shape[1:] == space.shape
    expected = agent.act(frames, True)
    assert len(set(expected.tolist())) > 1  # frames on which the agent's choice varies

    actions = model.predict(frames)
    assert actions.dtype == np.int64
    np.testing.assert_array_equal(actions, expected)
    assert model.predict(frames[70]) == expected[70]  # one frame [C, H, W]
    some = slice(60, 72)  # env frames and noise
    np.testing.assert_array_equal(model.predict(frames[some].tolist()), expected[some])  # nested lists of ints (JSON)
    flat = pd.DataFrame(frames[some].reshape(12, -1))  # one flattened frame per row
    np.testing.assert_array_equal(model.predict(flat), expected[some])
    env.close()

    # the run's final evaluation, replayed with predict: its logged return
    replay = eval_env(model_dir)  # the run's evaluation env, from its model directory alone (docs/models.md)
    assert replay.single_observation_space == space
    result = run_episodes(replay, Predicting(model), 1, deterministic=True, seed=EVAL_SEED_OFFSET)
    assert float(np.mean(result.returns)) == last(store, run.info.run_id, "eval/return_mean")
    replay.close()


@pytest.mark.parametrize("case", ["sb3_ppo-minatar", "ppo_kl-minatar"])
def test_predict_refuses_frames_that_are_not_the_envs(runs, case: str):
    store, run, model_dir = runs[case]
    model = load(store, run)
    shape = tuple(read_agent_spec(model_dir)["observation_shape"])  # (4, 10, 10)
    dims = ", ".join(map(str, shape))
    rule = rf"^frames must be uint8 in \[0, 255\], shape \[B, {dims}\] or \[{dims}\] \(the env's observations\); got "
    frames = np.random.default_rng(0).integers(0, 2, size=(3, *shape), dtype=np.uint8) * 255
    bad = {
        "float32 [3, 4, 10, 10]": frames.astype(np.float32),  # 0..255 as floats: scaled or not? refused
        "float64 [3, 4, 10, 10]": frames / 255.0,  # 0..1
        "uint8 [3, 10, 10, 4]": np.moveaxis(frames, 1, -1),  # channels last
        "bool [3, 4, 10, 10]": frames > 0,
        "int64 [3, 4, 10, 10] with values in [0, 510]": frames.astype(np.int64) * 2,
        "uint8 [4, 10]": frames[0, :, 0],
    }
    for what, batch in bad.items():
        with pytest.raises(ValueError, match=rule) as info:
            model.predict(batch)
        assert str(info.value).endswith(f"got {what}"), str(info.value)
