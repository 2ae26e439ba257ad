"""What logging a run's agent as an MLflow Model costs at the end of a run (docs/models.md).

For a saved agent (a real model directory: our TRPO on Hopper-v5, or SB3 PPO on CartPole, written by the trainers'
own ``save`` plus ``agent.json``), one process times, on a temporary SQLite store, in alternating order:

- ``artifact``: what runs did before: ``MLflowBackend.log_artifact(model_dir, "model")`` (files copied into the run);
- ``pyfunc``: ``MLflowBackend.log_model(model_dir, "model")`` (``mlflow.pyfunc.save_model`` with pgcli's loader module
  and pinned requirements, the agent's files beside ``MLmodel``, then the same upload);
- ``load``: ``mlflow.pyfunc.load_model("runs:/<id>/model")`` plus one ``predict`` (what a user pays to get actions).

MLflow's import is paid once before timing (every run imports it anyway). Wall-time medians over ``--repeats``.

    .venv/bin/python benchmarks/model_logging.py                      # both agents, 5 repeats
    .venv/bin/python benchmarks/model_logging.py --repeats 10 --json benchmarks/results/model_logging.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pgcli.agent import write_agent_files
from pgcli.config import EnvConfig, ModelConfig, PPOConfig, TrainConfig, TRPOConfig
from pgcli.envs.make import make_vec_env
from pgcli.tracking.backend import MLflowBackend
from pgcli.tracking.uri import TrackingTarget
from pgcli.training.build import trainer_class

AGENTS = {
    "trpo_hopper": (TRPOConfig(), EnvConfig(id="Hopper-v5", n_envs=2, normalize_obs=True, normalize_reward=True)),
    "ppo_cartpole": (PPOConfig(), EnvConfig(id="CartPole-v1", n_envs=8)),
}


def saved_agent(name: str, root: Path) -> Path:
    """A model directory as a finished run leaves it (an untrained agent: its size is what matters here)."""
    # Not run_job: nothing is trained; only a model directory of a real agent's size is needed.
    algo, env_cfg = AGENTS[name]
    cfg = TrainConfig(algo=algo, env=env_cfg, model=ModelConfig())
    env = make_vec_env(cfg.env, seed=0)
    trainer = trainer_class(cfg.algo)(cfg.algo, env=env, model=cfg.model, seed=0, device=torch.device("cpu"))
    model_dir = trainer.save(root / name / "model")
    write_agent_files(model_dir, cfg, algo_name=name.split("_")[0], env_name=name.split("_")[1], env=env)
    trainer.close()
    return model_dir


def time_once(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    import mlflow

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = TrackingTarget(f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri())
        mlflow.set_tracking_uri(target.uri)
        for name in AGENTS:
            model_dir = saved_agent(name, root)
            obs = np.zeros((1, *json.loads((model_dir / "agent.json").read_text())["observation_shape"]))
            times: dict[str, list[float]] = {"artifact": [], "pyfunc": [], "load": []}
            for i in range(args.repeats):
                backend = MLflowBackend(target, experiment="bench", run_name=f"{name}-{i}", tags={})
                order = ["artifact", "pyfunc"] if i % 2 == 0 else ["pyfunc", "artifact"]
                for kind in order:
                    log = backend.log_artifact if kind == "artifact" else backend.log_model
                    times[kind].append(time_once(log, model_dir, "raw_model" if kind == "artifact" else "model"))
                model = f"runs:/{backend.run_id}/model"
                times["load"].append(time_once(lambda uri, x: mlflow.pyfunc.load_model(uri).predict(x), model, obs))
                backend.end("FINISHED")
            size = sum(p.stat().st_size for p in model_dir.iterdir())
            results[name] = {"model_dir_bytes": size, **{k: statistics.median(v) for k, v in times.items()}}
            res = results[name]
            print(
                f"{name:13s} model dir {size / 1024:6.0f} KiB   log_artifact {res['artifact']:.3f} s   "
                f"log_model {res['pyfunc']:.3f} s   load+predict {res['load']:.3f} s"
            )
    if args.json:
        args.json.write_text(json.dumps({"repeats": args.repeats, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
