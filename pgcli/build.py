"""Composition root: a validated :class:`~pgcli.config.TrainConfig` in; device, seeded env, trainer, logger and
monitor out; one training run executed with its MLflow run ended FINISHED, FAILED or KILLED on every path.

Trainers come from one explicit table, :data:`TRAINERS` (config type -> "module:Class"); the module is imported only
when that algorithm runs, so ``pgcli --help`` and config validation never pay for torch or SB3.
"""

from __future__ import annotations

import importlib
import platform
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import pgcli
from pgcli.config import (
    A2CConfig,
    GRPOConfig,
    HardwareConfig,
    PPOConfig,
    PPOKLConfig,
    SB3TRPOConfig,
    TrainConfig,
    TRPOConfig,
    VPGConfig,
)
from pgcli.errors import ConfigError

TRAINERS: dict[type, str] = {
    PPOConfig: "pgcli.algo.sb3:SB3Trainer",
    A2CConfig: "pgcli.algo.sb3:SB3Trainer",
    SB3TRPOConfig: "pgcli.algo.sb3:SB3Trainer",
    TRPOConfig: "pgcli.algo.trpo:TRPO",
    VPGConfig: "pgcli.algo.vpg:VPG",
    PPOKLConfig: "pgcli.algo.ppo_kl:PPOKL",
    GRPOConfig: "pgcli.algo.grpo:GRPO",
}


@dataclass
class RunContext:
    """Facts about this run that come from Hydra, not from the config."""

    algo_name: str
    env_name: str
    output_dir: Path
    overrides: list[str] = field(default_factory=list)
    parent_run_id: str | None = None
    extra_tags: dict[str, str] = field(default_factory=dict)


@dataclass
class TrainSummary:
    """What a finished run reports back (printed by the CLI, returned to sweepers)."""

    run_id: str | None
    steps: int
    final_return: float
    final_return_std: float
    wall_time_s: float
    output_dir: Path
    tracking_uri: str | None
    reward_threshold: float | None
    best_return: float = float("nan")
    """The best evaluation's mean return (nan without evaluation)."""
    best_step: int | None = None
    """Env steps at the best evaluation; its agent is in ``output_dir/best_model`` when ``eval.save_best``."""


def trainer_class(algo_cfg: Any) -> type:
    """The trainer class for an algo config (imported on demand)."""
    try:
        target = TRAINERS[type(algo_cfg)]
    except KeyError:
        raise ConfigError(f"no trainer registered for {type(algo_cfg).__name__}") from None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def select_device(hw: HardwareConfig) -> Any:
    """torch.device for ``hardware.device``; 'cuda' without a visible GPU is a one-line ConfigError."""
    import torch

    if hw.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "hardware=cuda but no CUDA GPU is visible to torch (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); use hardware=cpu or hardware=auto"
        )
    if hw.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(hw.device)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_tags(cfg: TrainConfig, ctx: RunContext, device: Any) -> dict[str, str]:
    """Tags that make a run findable and reproducible."""
    import gymnasium
    import stable_baselines3
    import torch

    tags = {
        "algo": ctx.algo_name,
        "env": ctx.env_name,
        "env_id": cfg.env.id,
        "seed": str(cfg.seed),
        "device": str(device),
        "output_dir": str(ctx.output_dir),
        "hydra_overrides": " ".join(ctx.overrides),
        "pgcli_version": pgcli.__version__,
        "torch_version": torch.__version__,
        "gymnasium_version": gymnasium.__version__,
        "sb3_version": stable_baselines3.__version__,
        "python_version": platform.python_version(),
        **git_state(),
        **ctx.extra_tags,
    }
    return tags


def git_state() -> dict[str, str]:
    """``git_commit`` and ``git_dirty`` of the pgcli checkout, when it is one."""
    root = Path(pgcli.__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5
        )
        return {"git_commit": sha.stdout.strip(), "git_dirty": str(bool(dirty.stdout.strip())).lower()}
    except (OSError, subprocess.SubprocessError):
        return {}


def config_params(cfg: TrainConfig, ctx: RunContext) -> dict[str, Any]:
    """The flattened resolved config as MLflow params (``algo.clip_range`` ...), plus the group choices."""
    from pgcli.tracking import flatten

    params = flatten(asdict(cfg))
    params["algo"], params["env"] = ctx.algo_name, ctx.env_name
    return params


def open_logger(cfg: TrainConfig, ctx: RunContext, tags: dict[str, str]) -> Any:
    """The run's logger: MLflow-backed unless ``tracking=off``. Creates the MLflow run."""
    from pgcli.tracking import MLflowBackend, RunLogger, resolve_tracking_target

    backend = None
    if cfg.tracking.backend == "mlflow":
        target = resolve_tracking_target(cfg.tracking)
        backend = MLflowBackend(
            target,
            experiment=cfg.experiment or ctx.env_name,
            run_name=cfg.run_name or f"{ctx.algo_name}-{ctx.env_name}-s{cfg.seed}",
            tags=tags,
            parent_run_id=ctx.parent_run_id,
            flush_every_s=cfg.tracking.flush_every_s,
        )
    return RunLogger(ctx.output_dir, backend)


def error_tags(exc: BaseException) -> dict[str, str]:
    """The ``error`` tag of a FAILED run: exception type and first line, as the sweep summary reports it."""
    lines = str(exc).strip().splitlines()
    return {"error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]}


def end_failed(logger: Any, exc: BaseException) -> None:
    """End the run of a job that failed before training started: KILLED on Ctrl-C, else FAILED with the error."""
    if isinstance(exc, KeyboardInterrupt):
        logger.close("KILLED")
        return
    try:
        logger.set_tags(error_tags(exc))
    finally:
        logger.close("FAILED")


def train(cfg: TrainConfig, ctx: RunContext) -> TrainSummary:
    """Build everything for ``cfg`` and train. The MLflow run ends FINISHED, FAILED (exception) or KILLED (Ctrl-C)."""
    import torch

    from pgcli.agent import write_agent_files
    from pgcli.env import make_vec_env, reward_threshold
    from pgcli.monitor import Evaluator, TrainingMonitor
    from pgcli.tracking import resolve_tracking_target

    device = select_device(cfg.hardware)
    if cfg.hardware.torch_threads > 0:
        torch.set_num_threads(cfg.hardware.torch_threads)
    seed_everything(cfg.seed)
    ctx.output_dir.mkdir(parents=True, exist_ok=True)

    # The MLflow run opens before the env and trainer are built, so a job whose env fails at make time (a bad env
    # kwarg in one job of a sweep) still leaves a FAILED run that says why (issue 5: failure isolation).
    logger = open_logger(cfg, ctx, run_tags(cfg, ctx, device))
    try:
        env = make_vec_env(cfg.env, seed=cfg.seed, vectorization=cfg.hardware.vec_env, gamma=cfg.algo.gamma)
        try:
            trainer = trainer_class(cfg.algo)(cfg.algo, env=env, model=cfg.model, seed=cfg.seed, device=device)
        except BaseException:
            env.close()
            raise
    except BaseException as exc:
        end_failed(logger, exc)
        raise
    # The MLflow run exists from here on: everything, the monitor's set-up included, runs inside the try so that a
    # Ctrl-C at any point still ends the run KILLED rather than leaving it RUNNING.
    status = "FAILED"
    start = time.perf_counter()
    try:
        monitor = TrainingMonitor(
            logger,
            total_steps=cfg.total_steps,
            evaluator=Evaluator(cfg.env, cfg.eval, seed=cfg.seed, train_env=env),
            eval_every=cfg.eval.every,
            checkpoint_dir=ctx.output_dir / "checkpoints",
            checkpoint_every=cfg.checkpoint_every,
            best_dir=ctx.output_dir / "best_model" if cfg.eval.save_best else None,
            video_dir=ctx.output_dir / "videos",
            progress=cfg.progress,
        )
        try:
            logger.log_params(config_params(cfg, ctx))
            steps = trainer.learn(cfg.total_steps, monitor)
            final = monitor.finish(steps, trainer)
            model_dir = trainer.save(ctx.output_dir / "model")
            saved = [(model_dir, "model")]
            if monitor.best_dir is not None and monitor.best_dir.is_dir():
                saved.append((monitor.best_dir, "best_model"))
            for path, name in saved:  # agent.json: what `pgcli eval` and the MLflow Model load the agent from
                write_agent_files(path, cfg, algo_name=ctx.algo_name, env_name=ctx.env_name, env=env)
                if cfg.tracking.log_model:
                    logger.log_model(path, name)
            hydra_dir = ctx.output_dir / ".hydra"
            if hydra_dir.is_dir():
                logger.log_artifact(hydra_dir, "hydra")
        finally:
            monitor.close()
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as exc:
        logger.set_tags(error_tags(exc))
        raise
    finally:
        logger.close(status)
        trainer.close()
    return TrainSummary(
        run_id=logger.run_id,
        steps=steps,
        final_return=final.mean if final else float("nan"),
        final_return_std=final.std if final else float("nan"),
        wall_time_s=time.perf_counter() - start,
        output_dir=ctx.output_dir,
        tracking_uri=resolve_tracking_target(cfg.tracking).uri if cfg.tracking.backend == "mlflow" else None,
        reward_threshold=reward_threshold(cfg.env),
        best_return=monitor.best_eval.mean if monitor.best_eval else float("nan"),
        best_step=monitor.best_step,
    )
