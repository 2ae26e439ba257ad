"""Composition root: a validated :class:`~pgcli.config.TrainConfig` in; device, seeded env, trainer, logger and
monitor out; one training run executed inside :class:`pgcli.training.run.Run`, which owns the MLflow run's life.

Trainers come from the algorithm catalogue, :data:`pgcli.config.algos.ALGOS` (a trainer per kind of env, as
"module:Class"); the module is imported only when that algorithm runs, so ``pgcli --help`` and config validation never
pay for torch or SB3.
"""

from __future__ import annotations

import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import pgcli
from pgcli.config import ModelConfig, RMConfig, SFTConfig, TextEnvConfig, TrainConfig
from pgcli.config.algos import algo_entry
from pgcli.errors import ConfigError
from pgcli.hardware import distributed
from pgcli.hardware.placement import compute_of, extra_processes, select_device, workload_of
from pgcli.lm.load import TextModelConfig
from pgcli.training.summary import TrainSummary, summarize
from pgcli.training.text_parts import TextParts, text_parts

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

    from pgcli.algo.lm_base import TextTrainerFactory
    from pgcli.contracts import EvalResult, Trainer
    from pgcli.lm.dataset_rows import DemoRows, PreferenceRows
    from pgcli.lm.dataset_task import DatasetTask
    from pgcli.lm.model import CausalLM
    from pgcli.lm.tasks import Task
    from pgcli.tracking.backend import MLflowBackend
    from pgcli.training.monitor import Outputs, Schedule, TrainingMonitor
    from pgcli.training.run import ResumePoint, Run


@dataclass
class RunContext:
    """Facts about this run that come from Hydra, not from the config."""

    algo_name: str
    env_name: str
    """The env label (pgcli.config.labels.env_label): experiment, run name and ``tags.env``."""
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
    label: str = ""
    """What tells a sweep job from its siblings in its run name (:func:`pgcli.config.overrides.swept_label`)."""


class TrainerFactory(Protocol):
    """A trainer class: ``TRPO(cfg, env=env, model=model, seed=seed, device=device)``."""

    def __call__(self, cfg: Any, *, env: VectorEnv, model: ModelConfig, seed: int, device: torch.device) -> Trainer: ...


def trainer_class(algo_cfg: Any, *, kind: str = "control") -> TrainerFactory:
    """The gymnasium trainer class of an algo config for ``kind`` (``control`` or ``image``), imported on demand."""
    trainer: TrainerFactory = _registered(algo_cfg, kind, "trainer")
    return trainer


def text_trainer_class(algo_cfg: Any, *, multi_turn: bool = False) -> TextTrainerFactory:
    """The text-task trainer class for an algo config (imported on demand); ``multi_turn``: of a multi-turn task."""
    kind, what = ("multi-turn", "multi-turn trainer") if multi_turn else ("text", "text-task trainer")
    trainer: TextTrainerFactory = _registered(algo_cfg, kind, what)
    return trainer


def _registered(algo_cfg: Any, kind: str, what: str) -> Any:
    """The catalogue's trainer of ``kind`` for the type of ``algo_cfg``, its module imported now."""
    try:
        entry = algo_entry(algo_cfg)
    except KeyError:
        entry = None
    if entry is None or not entry.trains_on(kind):
        raise ConfigError(f"no {what} registered for {type(algo_cfg).__name__}")
    return entry.trainer(kind)


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
        "cpu": cpu_model(),
        **git_state(),
        **ctx.extra_tags,
    }
    return tags


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :func:`platform.processor` says. Runs with the same seed
    and versions are bit-identical on one machine, not across CPUs: SIMD kernels (MuJoCo, NumPy, torch) round
    differently on AVX2 and AVX-512 hosts, and a few ulps grow into another learning curve."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
    from pgcli.tracking.logger import flatten

    params = flatten(asdict(cfg))
    params["algo"], params["env"], params["preset"] = ctx.algo_name, ctx.env_name, ctx.preset
    params["planned_steps"] = cfg.planned_steps  # total_steps rounded up to whole rollouts (None for GRPO)
    if cfg.hardware.processes > 1:  # each rank's prompts and samples: docs/distributed.md
        params["rank_seeds"] = ",".join(map(str, distributed.rank_seeds(cfg.seed, cfg.hardware.processes)))
    return params


def open_backend(cfg: TrainConfig, ctx: RunContext, tags: dict[str, str], run_id: str | None) -> MLflowBackend | None:
    """The run's MLflow backend (None for ``tracking=off``): creates the MLflow run, or re-opens ``run_id``."""
    from pgcli.tracking.backend import MLflowBackend
    from pgcli.tracking.uri import resolve_tracking_target

    if cfg.tracking.backend != "mlflow":
        return None
    trial = "" if ctx.trial is None else f"-t{ctx.trial}"
    return MLflowBackend(
        resolve_tracking_target(cfg.tracking),
        experiment=cfg.experiment or ctx.env_name,
        run_name=cfg.run_name or f"{ctx.algo_name}-{ctx.env_name}{trial}{ctx.label}-s{cfg.seed}",
        tags=tags,
        parent_run_id=ctx.parent_run_id,
        flush_every_s=cfg.tracking.flush_every_s,
        run_id=run_id,
        spool_dir=ctx.output_dir,  # a tracking server that goes away mid-run: writes wait here (pgcli.tracking.spool)
    )


def train(cfg: TrainConfig, ctx: RunContext, resume: ResumePoint | None = None) -> TrainSummary:
    """Build everything for ``cfg`` and train (or continue ``resume``); :class:`pgcli.training.run.Run` ends the MLflow
    run FINISHED, FAILED or KILLED. A text task trains through :func:`train_text`."""
    from pgcli.agent import write_agent_files
    from pgcli.envs.make import make_vec_env, reward_threshold
    from pgcli.envs.shm_watch import run_queue_total

    if isinstance(cfg.env, TextEnvConfig):
        return train_text(cfg, ctx, resume)
    device = prepare_process(cfg)
    tags = run_tags(cfg, ctx, device)
    compute, notes = compute_of(cfg, device)
    start = time.perf_counter()

    def describe(model_dir: Path) -> None:  # agent.json: what `pgcli eval` and the MLflow Model load it from
        write_agent_files(model_dir, cfg, algo_name=ctx.algo_name, env_name=ctx.env_name, env=env)

    with new_run(cfg, ctx, tags, resume, describe_model=describe) as run:
        env = run.closing(
            make_vec_env(cfg.env, seed=cfg.seed, vectorization=cfg.hardware.vec_env, gamma=cfg.algo.gamma)
        )
        trainer_cls = trainer_class(cfg.algo, kind=cfg.env_kind)
        trainer = run.closing(trainer_cls(cfg.algo, env=env, model=cfg.model, seed=cfg.seed, device=device))
        monitor = run.closing(control_monitor(cfg, ctx, run, env))
        fit_start, queued_start = time.perf_counter(), run_queue_total(env)
        steps, final = fit(run, trainer, monitor, cfg.total_steps, says=[start_line(cfg, ctx, compute), *notes])
        note_busy_cores(env, monitor, fit_start, queued_start)
    summary = summarize(run, monitor, cfg.tracking, steps, final, start, threshold=reward_threshold(cfg.env))
    return replace(summary, compute=compute)


def prepare_process(cfg: TrainConfig) -> torch.device:
    """The run's device, with torch's thread count (``hardware.torch_threads``) and every global RNG seeded."""
    import torch

    device = select_device(cfg.hardware, workload_of(cfg))
    if cfg.hardware.torch_threads > 0:
        torch.set_num_threads(cfg.hardware.torch_threads)
    seed_everything(cfg.seed)  # the same on every rank: the same initial weights
    distributed.init(device, timeout_s=cfg.hardware.dist_timeout_s)  # several processes: join the others
    return device


def new_run(
    cfg: TrainConfig,
    ctx: RunContext,
    tags: dict[str, str],
    resume: ResumePoint | None,
    *,
    describe_model: Callable[[Path], None],
) -> Run:
    """The :class:`~pgcli.training.run.Run` of this job: its MLflow run (tagged ``tags``, with the config as params)
    is created, or re-opened for ``resume``, when the ``with`` block starts."""
    from pgcli.training.run import Run

    run = Run(
        ctx.output_dir,
        lambda run_id: open_backend(cfg, ctx, tags, run_id),
        params=config_params(cfg, ctx),
        resume=resume,
        log_model=cfg.tracking.log_model,
        describe_model=describe_model,
    )
    run.logger.title = f"{ctx.algo_name} on {cfg.env.id}, seed {cfg.seed}"  # learning_curve.png's title
    return run


def monitor_schedule(cfg: TrainConfig) -> Schedule:
    """When the monitor evaluates and checkpoints: ``eval.every`` and ``checkpoint_every`` env steps."""
    from pgcli.training.monitor import Schedule

    return Schedule(cfg.total_steps, eval_every=cfg.eval.every, checkpoint_every=cfg.checkpoint_every)


def monitor_outputs(cfg: TrainConfig, output_dir: Path, *, videos: bool = False, samples: bool = False) -> Outputs:
    """Where the monitor writes under the run directory: ``checkpoints/``, ``best_model/`` (``eval.save_best``), and
    ``videos/`` (gymnasium envs) or ``samples/`` (text tasks)."""
    from pgcli.training.checkpoints import checkpoints_dir
    from pgcli.training.monitor import Outputs

    return Outputs(
        checkpoints=checkpoints_dir(output_dir),
        keep=cfg.checkpoint_keep,
        best_model=output_dir / "best_model" if cfg.eval.save_best else None,
        videos=output_dir / "videos" if videos else None,
        samples=output_dir / "samples" if samples else None,
    )


def control_monitor(cfg: TrainConfig, ctx: RunContext, run: Run, env: VectorEnv) -> TrainingMonitor:
    """The monitor of a gymnasium run: episode evaluations beside ``env``, and the env worker's clock and watch."""
    from pgcli.envs.shm_watch import worker_wait, worker_watch
    from pgcli.hardware.placement import usable_cpus
    from pgcli.training.evaluation import Evaluator
    from pgcli.training.monitor import Hooks, TrainingMonitor

    evaluator = Evaluator(
        cfg.env,
        cfg.eval,
        seed=cfg.seed,
        train_env=env,
        background=cfg.hardware.eval_process and usable_cpus() >= 2,  # one CPU: in process, same results
        in_worker=cfg.hardware.eval_in_worker,  # vec_env=shm's worker plays them while it would idle
    )
    hooks = Hooks(
        stop=run.stop,
        on_eval=ctx.on_eval,
        env_wait=worker_wait(env),
        # the env worker as the run's only second process: an evaluation or critic process of its own would also wait
        # for a core at times, and read as another process taking the cores
        watch_worker=worker_watch(env) if cfg.hardware.busy_fallback and not extra_processes(cfg) else None,
    )
    outputs = monitor_outputs(cfg, ctx.output_dir, videos=True)
    return TrainingMonitor(
        run.logger, monitor_schedule(cfg), evaluator=evaluator, outputs=outputs, hooks=hooks, progress=cfg.progress
    )


def note_busy_cores(env: VectorEnv, monitor: TrainingMonitor, fit_start: float, queued_start: float | None) -> None:
    """After training with the env worker kept to the end: say on stderr when its core was busy with other work
    (``pgcli.hardware.watch.busy_cores_note``), measured from ``fit_start``."""
    from pgcli.envs.shm_watch import run_queue_total, worker_wait
    from pgcli.hardware.watch import busy_cores_note

    if monitor.watch_worker is not None or (waited := worker_wait(env)) is None:
        return
    queued = run_queue_total(env)
    note = busy_cores_note(
        None if queued is None or queued_start is None else queued - queued_start,
        waited(),  # from 0: no step before fit
        time.perf_counter() - fit_start,
    )
    if note:
        print(note, file=sys.stderr, flush=True)


def text_trainer(cfg: TrainConfig, parts: TextParts, device: torch.device) -> Any:
    """The run's text trainer on ``parts``, with its KL reference; on several processes seeded with this rank's
    seed (:func:`pgcli.hardware.distributed.rank_seed`); with ``hardware.shard=params``, its models sharded
    (:mod:`pgcli.training.sharded`)."""
    from pgcli.algo.lm_base import kl_reference

    # before any sharding: a KL reference without init is a copy of the whole starting policy
    reference = kl_reference(cfg.algo, parts.policy, parts.reference)  # the evaluator's is the init model's
    gathered = None
    if cfg.hardware.shard == "params":  # rank 0 evaluates and saves whole copies (docs/distributed.md)
        from pgcli.training.sharded import shard_text_models

        gathered = shard_text_models(cfg.algo, parts, reference, device)
    trainer: Any = text_trainer_class(cfg.algo, multi_turn=parts.multi_turn)(
        cfg.algo,
        task=parts.trainer_task,
        policy=parts.policy,
        reference=reference,
        model=cfg.model,  # type: ignore[arg-type]  # TrainConfig's rules: a text model
        seed=distributed.rank_seed(cfg.seed, distributed.rank()),
        device=device,
    )
    if gathered is not None:
        trainer.gathered = gathered(trainer.optimizer)
    return trainer


def evaluated_models(parts: TextParts, trainer: Any) -> tuple[Any, Any]:
    """The policy rank 0's monitor evaluates, and its reference: the trainer's, or rank 0's whole twins of sharded
    ones (a LoRA run's reference: the twin with its adapters off), which it evaluates alone."""
    from pgcli.lm.hf import AdapterOff

    gathered = getattr(trainer, "gathered", None)
    if gathered is None or gathered.twin is None:
        return parts.policy, parts.reference
    if isinstance(parts.reference, AdapterOff):
        return gathered.twin, AdapterOff(gathered.twin)
    sharded, twin = gathered.others.get("reference", (None, None))
    return gathered.twin, twin if parts.reference is not None and parts.reference is sharded else parts.reference


def train_text(cfg: TrainConfig, ctx: RunContext, resume: ResumePoint | None = None) -> TrainSummary:
    """:func:`train` for a text task (docs/lm.md): the task, the policy, the text trainer with its KL reference and
    the held-out evaluator, in the same :class:`pgcli.training.run.Run`. On several processes this is rank 0's part:
    the other ranks train alongside (:func:`pgcli.training.ranks.follow_text`) and write nothing."""
    from pgcli.agent import write_text_agent_files
    from pgcli.lm.dataset_task import recorded_fields

    device = prepare_process(cfg)
    parts = text_parts(cfg, device)
    tags = run_tags(cfg, ctx, device) | parts.tags
    compute, notes = compute_of(cfg, device)
    start = time.perf_counter()

    def describe(model_dir: Path) -> None:
        write_text_agent_files(
            model_dir,
            cfg,
            algo_name=ctx.algo_name,
            env_name=ctx.env_name,
            vocab=parts.vocab,
            task_fields=recorded_fields(parts.task),
        )

    try:
        with new_run(cfg, ctx, tags, resume, describe_model=describe) as run:
            trainer = run.closing(text_trainer(cfg, parts, device))
            policy, reference = evaluated_models(parts, trainer)
            monitor = run.closing(text_monitor(cfg, ctx, run, parts.task, policy, device, reference=reference))
            steps, final = fit(run, trainer, monitor, cfg.total_steps, says=[start_line(cfg, ctx, compute), *notes])
    finally:
        distributed.teardown()
    unit = {SFTConfig: "demonstrations", RMConfig: "preference pairs"}.get(type(cfg.algo), "sampled completions")
    unit = "sampled turns" if parts.multi_turn and unit == "sampled completions" else unit
    summary = summarize(run, monitor, cfg.tracking, steps, final, start, threshold=None, step_unit=unit)
    return replace(summary, compute=compute)


def text_monitor(
    cfg: TrainConfig,
    ctx: RunContext,
    run: Run,
    task: Task | DatasetTask | DemoRows | PreferenceRows,
    policy: CausalLM,
    device: torch.device,
    *,
    reference: CausalLM | None = None,
) -> TrainingMonitor:
    """The monitor of a text run: held-out evaluations of ``policy`` on ``task`` (a reward model's: of its held-out
    preference pairs; also at step 0 for a run from ``init``: the model it starts from), with the proxy reward of a
    learned reward and the KL to ``reference`` when there are, samples tables under the run dir."""
    from pgcli.lm.evaluation import TextEvalSettings, TextEvaluator
    from pgcli.training.monitor import Hooks, TrainingMonitor

    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # TrainConfig's rules
    from pgcli.lm.dataset_rows import DemoRows, PreferenceRows

    evaluator: Any
    if isinstance(task, DemoRows | PreferenceRows):  # pgcli sft|rm env=dataset (pgcli/lm/rows_eval.py)
        from pgcli.lm.rows_eval import rows_evaluator

        evaluator = rows_evaluator(task, policy, cfg.env, cfg.model, device)
    elif isinstance(cfg.algo, RMConfig):  # a reward model: held-out pairwise accuracy (pgcli/lm/reward_model.py)
        from pgcli.lm.reward_model import reward_model_evaluator
        from pgcli.lm.tasks import Task

        assert isinstance(task, Task)  # generated pairs are a puzzle's (a dataset's preference rows: pgcli rm's own)
        evaluator = reward_model_evaluator(cfg, task, reference, device)  # policy pairs: samples of the init model
    else:
        settings = TextEvalSettings(
            pass_k=cfg.env.eval_pass_k,
            temperature=cfg.model.temperature,
            top_p=cfg.model.top_p,
            n_table_rows=cfg.env.eval_samples,
        )
        evaluator = TextEvaluator(
            task,
            policy,
            settings,
            cfg.eval,
            seed=cfg.seed,
            device=device,
            reference=reference,
            learned_reward=task.learned_reward,
        )
    return TrainingMonitor(
        run.logger,
        replace(monitor_schedule(cfg), eval_at_start=cfg.init is not None),  # the init model's score at step 0
        evaluator=evaluator,
        outputs=monitor_outputs(cfg, ctx.output_dir, samples=True),
        hooks=Hooks(stop=run.stop, on_eval=ctx.on_eval),
        progress=cfg.progress,
    )


def start_line(cfg: TrainConfig, ctx: RunContext, compute: str) -> str:
    """What a run says as its training begins: ``pgcli: ppo on cartpole (seed 0): cpu, float32``."""
    return f"pgcli: {ctx.algo_name} on {ctx.env_name} (seed {cfg.seed}): {compute}"


def fit(
    run: Run, trainer: Any, monitor: TrainingMonitor, total_steps: int, *, says: Sequence[str] = ()
) -> tuple[int, EvalResult | None]:
    """Train inside ``run`` (control or text alike): the step-0 evaluation where the schedule asks for one, learn,
    the final evaluation, then the model. ``says``: lines for stderr and train.log once the run has started (its
    :func:`start_line` and notes), above the progress bar."""
    run.start(trainer, monitor)
    for line in says:
        monitor.say(line)
    monitor.begin(trainer)
    steps = trainer.learn(total_steps, monitor)
    run.finishing()  # a stop signal in the final evaluation ends the run KILLED, as one during training does
    final = monitor.finish(steps, trainer)
    run.save_model(trainer)
    return steps, final
