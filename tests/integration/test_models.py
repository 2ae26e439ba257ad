"""The MLflow Model every run logs, and SB3's own files, loaded by code that knows nothing of pgcli's internals.

Runs come from real `pgcli train` subprocesses on a temporary store. The strongest check replays the run's final
evaluation outside pgcli: the same env seed on a plain `gym.make` env, actions from the loaded model on *raw*
observations, must give the return the run logged -- which holds only if normalisation and action rescaling inside
the model are the ones training used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

from tests.integration.test_eval_cli import last, trained_run

EVAL_SEED = 10_000  # pgcli.envs.make.EVAL_SEED_OFFSET + seed 0: the env seed of the run's evaluations


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> dict[str, tuple[Any, Any]]:
    """(store, run) per case: discrete SB3, continuous ours with obs normalisation, continuous SB3 with VecNormalize."""
    cases = {
        "ppo-cartpole": ("total_steps=1024", "eval.every=0", "eval.episodes=1"),
        "trpo-pendulum": (
            "algo=trpo",
            "env=pendulum",
            "total_steps=1024",
            "algo.n_steps=128",
            "eval.every=0",
            "eval.episodes=1",
            "env.normalize_obs=true",
        ),
        "ppo-pendulum": (
            "algo=ppo",
            "env=pendulum",
            "total_steps=1024",
            "algo.n_steps=128",
            "eval.every=0",
            "eval.episodes=1",
            "env.normalize_obs=true",
            "env.normalize_reward=true",
        ),
    }
    out = {}
    for name, overrides in cases.items():
        store, _, run = trained_run(tmp_path_factory.mktemp(name), mlflow_schema_db, *overrides)
        out[name] = (store, run)
    return out


def play(env_id: str, policy: Any) -> float:
    """One episode of a plain gymnasium env from the evaluations' seed; ``policy`` maps one raw obs to one action."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=EVAL_SEED)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        total += float(reward)
        done = terminated or truncated
    env.close()
    return total


@pytest.mark.parametrize(
    ("case", "env_id", "action_shape", "dtype"),
    [
        ("ppo-cartpole", "CartPole-v1", (), np.int64),
        ("trpo-pendulum", "Pendulum-v1", (1,), np.float32),
        ("ppo-pendulum", "Pendulum-v1", (1,), np.float32),
    ],
)
def test_pyfunc_model_maps_raw_observations_to_env_actions(runs, case, env_id, action_shape, dtype):
    import mlflow

    store, run = runs[case]
    mlflow.set_tracking_uri(store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")

    space = gym.make(env_id).observation_space
    obs = np.stack([space.sample() for _ in range(5)]).astype(np.float64)
    actions = model.predict(obs)
    assert actions.shape == (5, *action_shape) and actions.dtype == dtype
    assert np.array_equal(model.predict(pd.DataFrame(obs)), actions)  # one column per observation dimension
    assert np.allclose(model.predict(obs[0]), actions[0], atol=1e-6)  # a single observation (a 1-row matmul)
    action_space = gym.make(env_id).action_space
    assert all(action_space.contains(a.astype(action_space.dtype)) for a in actions)

    replayed = play(env_id, lambda o: model.predict(o))
    assert replayed == pytest.approx(last(store, run.info.run_id, "eval/return_mean"), rel=1e-4)


@pytest.mark.parametrize(
    ("case", "n_obs", "action_shape", "dtype"),
    [("ppo-cartpole", 4, (), np.int64), ("trpo-pendulum", 3, (1,), np.float32)],
)
def test_pyfunc_model_refuses_non_finite_observations_and_takes_an_empty_batch(runs, case, n_obs, action_shape, dtype):
    import mlflow

    store, run = runs[case]
    mlflow.set_tracking_uri(store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    obs = np.zeros((5, n_obs))
    obs[1, 0], obs[3, -1] = np.nan, -np.inf
    for batch in (obs, pd.DataFrame(obs), obs.tolist()):
        with pytest.raises(ValueError, match=r"^observations must be finite: rows 1, 3 hold NaN or inf") as info:
            model.predict(batch)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="observations must be finite: the observation holds NaN or inf"):
        model.predict(obs[1])  # a single observation
    for empty in (np.empty((0, n_obs)), pd.DataFrame(np.empty((0, n_obs))), []):
        actions = model.predict(empty)
        assert actions.shape == (0, *action_shape) and actions.dtype == dtype


def test_registered_model_loads_by_name(runs):
    import mlflow

    store, run = runs["trpo-pendulum"]
    mlflow.set_tracking_uri(store.uri)
    version = mlflow.register_model(f"runs:/{run.info.run_id}/model", "pendulum-trpo")
    assert str(version.version) == "1"
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -3.0]])
    by_name = mlflow.pyfunc.load_model("models:/pendulum-trpo/1").predict(obs)
    assert np.array_equal(by_name, mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model").predict(obs))


def test_plain_sb3_loads_the_model_and_its_vecnormalize(runs, tmp_path: Path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    store, run = runs["ppo-pendulum"]
    local = Path(store.client().download_artifacts(run.info.run_id, "model", str(tmp_path)))
    model = PPO.load(local / "model.zip", device="cpu")

    def make() -> gym.Env:  # pgcli's env: actions in [-1, 1], rescaled to Pendulum's [-2, 2]
        return gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), min_action=-1.0, max_action=1.0)

    venv = VecNormalize.load(str(local / "vecnormalize.pkl"), DummyVecEnv([make]))
    venv.training, venv.norm_reward = False, False
    venv.seed(EVAL_SEED)
    obs, total, done = venv.reset(), 0.0, False
    while not done:
        obs, reward, dones, _ = venv.step(model.predict(obs, deterministic=True)[0])
        total, done = total + float(reward[0]), bool(dones[0])
    assert total == pytest.approx(last(store, run.info.run_id, "eval/return_mean"), rel=1e-5)


def test_our_weights_load_without_unpickling_objects(runs, tmp_path: Path):
    import torch

    store, run = runs["trpo-pendulum"]
    local = Path(store.client().download_artifacts(run.info.run_id, "model", str(tmp_path)))
    payload = torch.load(local / "model.pt", weights_only=True)  # raises on any pickled non-tensor object
    assert "policy" in payload and all(isinstance(v, torch.Tensor) for v in payload["policy"].values())
    files = {p.name for p in local.iterdir()}
    assert {"MLmodel", "agent.json", "model.pt", "normalizer.npz", "requirements.txt"} <= files
    assert not any(name.endswith(".pkl") for name in files)  # plain files: no pickled python_model
