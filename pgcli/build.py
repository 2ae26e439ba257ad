"""Composition root: a validated :class:`~pgcli.config.TrainConfig` in; device, seeded env, trainer, logger and
monitor out; one training run executed inside :class:`pgcli.run.Run`, which owns the MLflow run's life.

Trainers come from one explicit table, :data:`TRAINERS` (config type -> "module:Class"); the module is imported only
when that algorithm runs, so ``pgcli --help`` and config validation never pay for torch or SB3.
"""

from __future__ import annotations

import importlib
import platform
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import pgcli
from pgcli.config import (
    A2CConfig,
    GRPOConfig,
    HardwareConfig,
    ModelConfig,
    PPOConfig,
    PPOKLConfig,
    SB3TRPOConfig,
    TrainConfig,
    TRPOConfig,
    VPGConfig,
)
from pgcli.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

    from pgcli.monitor import Trainer
    from pgcli.run import ResumePoint
    from pgcli.tracking import MLflowBackend

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
    """The env label (pgcli.labels.env_label): experiment, run name and ``tags.env``."""
    output_dir: Path
    overrides: list[str] = field(default_factory=list)
    parent_run_id: str | None = None
    extra_tags: dict[str, str] = field(default_factory=dict)
    trial: int | None = None
    """Optuna trial number when the run is one seed of a search trial (named ``...-t<trial>-s<seed>``)."""
    on_eval: Callable[[int, float], None] | None = None
    """The monitor's evaluation hook: a search trial reports to its study there (and is pruned)."""
    preset: str = "none"
    """The preset the config was composed with (``conf/preset/<name>.yaml``), or 'none'."""


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


class TrainerFactory(Protocol):
    """A trainer class: ``TRPO(cfg, env=env, model=model, seed=seed, device=device)``."""

    def __call__(self, cfg: Any, *, env: VectorEnv, model: ModelConfig, seed: int, device: torch.device) -> Trainer: ...


def trainer_class(algo_cfg: Any) -> TrainerFactory:
    """The trainer class for an algo config (imported on demand)."""
    try:
        target = TRAINERS[type(algo_cfg)]
    except KeyError:
        raise ConfigError(f"no trainer registered for {type(algo_cfg).__name__}") from None
    module, name = target.split(":")
    trainer: TrainerFactory = getattr(importlib.import_module(module), name)
    return trainer


def select_device(hw: HardwareConfig) -> torch.device:
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


def run_tags(cfg: TrainConfig, ctx: RunContext, device: torch.device) -> dict[str, str]:
    """Tags that make a run findable and reproducible."""
    import gymnasium
    import stable_baselines3
    import torch

    tags = {
        "algo": ctx.algo_name,
        "env": ctx.env_name,
        "env_id": cfg.env.id,
        "preset": ctx.preset,
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
    params["algo"], params["env"], params["preset"] = ctx.algo_name, ctx.env_name, ctx.preset
    params["planned_steps"] = cfg.planned_steps  # total_steps rounded up to whole rollouts (None for GRPO)
    return params


def open_backend(cfg: TrainConfig, ctx: RunContext, tags: dict[str, str], run_id: str | None) -> MLflowBackend | None:
    """The run's MLflow backend (None for ``tracking=off``): creates the MLflow run, or re-opens ``run_id``."""
    from pgcli.tracking import MLflowBackend, resolve_tracking_target

    if cfg.tracking.backend != "mlflow":
        return None
    trial = "" if ctx.trial is None else f"-t{ctx.trial}"
    return MLflowBackend(
        resolve_tracking_target(cfg.tracking),
        experiment=cfg.experiment or ctx.env_name,
        run_name=cfg.run_name or f"{ctx.algo_name}-{ctx.env_name}{trial}-s{cfg.seed}",
        tags=tags,
        parent_run_id=ctx.parent_run_id,
        flush_every_s=cfg.tracking.flush_every_s,
        run_id=run_id,
        spool_dir=ctx.output_dir,  # a tracking server that goes away mid-run: writes wait here (pgcli.spool)
    )


def train(cfg: TrainConfig, ctx: RunContext, resume: ResumePoint | None = None) -> TrainSummary:
    """Build everything for ``cfg`` and train (or continue ``resume``); :class:`pgcli.run.Run` ends the MLflow run
    FINISHED, FAILED or KILLED."""
    import torch

    from pgcli.agent import write_agent_files
    from pgcli.env import make_vec_env, reward_threshold
    from pgcli.monitor import Evaluator, TrainingMonitor
    from pgcli.run import Run
    from pgcli.tracking import resolve_tracking_target

    device = select_device(cfg.hardware)
    if cfg.hardware.torch_threads > 0:
        torch.set_num_threads(cfg.hardware.torch_threads)
    seed_everything(cfg.seed)
    tags = run_tags(cfg, ctx, device)
    start = time.perf_counter()
    with Run(
        ctx.output_dir,
        lambda run_id: open_backend(cfg, ctx, tags, run_id),
        params=config_params(cfg, ctx),
        resume=resume,
        log_model=cfg.tracking.log_model,
        describe_model=lambda path: write_agent_files(
            path, cfg, algo_name=ctx.algo_name, env_name=ctx.env_name, env=env
        ),
    ) as run:
        env = run.closing(
            make_vec_env(cfg.env, seed=cfg.seed, vectorization=cfg.hardware.vec_env, gamma=cfg.algo.gamma)
        )
        trainer = run.closing(trainer_class(cfg.algo)(cfg.algo, env=env, model=cfg.model, seed=cfg.seed, device=device))
        monitor = run.closing(
            TrainingMonitor(
                run.logger,
                total_steps=cfg.total_steps,
                evaluator=Evaluator(
                    cfg.env, cfg.eval, seed=cfg.seed, train_env=env, background=cfg.hardware.eval_process
                ),
                eval_every=cfg.eval.every,
                checkpoint_dir=ctx.output_dir / "checkpoints",
                checkpoint_every=cfg.checkpoint_every,
                checkpoint_keep=cfg.checkpoint_keep,
                best_dir=ctx.output_dir / "best_model" if cfg.eval.save_best else None,
                video_dir=ctx.output_dir / "videos",
                progress=cfg.progress,
                stop=run.stop,
                on_eval=ctx.on_eval,
            )
        )
        run.start(trainer, monitor)
        steps = trainer.learn(cfg.total_steps, monitor)
        final = monitor.finish(steps, trainer)
        run.save_model(trainer)
    return TrainSummary(
        run_id=run.logger.run_id,
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
