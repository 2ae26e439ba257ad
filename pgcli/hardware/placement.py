"""Where a run's work goes: the device, and whether a second process (env worker, evaluation or critic process) gets a
core of its own or the run steps in one process (the same numbers either way, docs/runs.md).

Every placement decision reads these helpers: the CPUs this process may use, the runnable tasks on the machine, and
the run's config.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING

from pgcli.config import (
    HardwareConfig,
    HFModelConfig,
    TextEnvConfig,
    TrainConfig,
)
from pgcli.config.pixels import CNNModelConfig
from pgcli.errors import ConfigError

if TYPE_CHECKING:
    import torch


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def running_tasks() -> int | None:
    """Runnable tasks on the machine now (``/proc/loadavg``'s running count, this process included); None where that
    cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def free_core(samples: int = 5, interval_s: float = 0.01) -> bool:
    """Whether a core is free for a busy-waiting env worker: the median runnable count over ``samples`` readings,
    less this process, is below the usable CPUs less one. True where it cannot be read (the run decides as before).

    Beside one CPU-bound process of another job, the two-core path's worker shares a core and every vector step waits
    for it: 30k Hopper steps took 39.5 s against 6.5 s in one process (docs/benchmarks/trpo.md, "On a busy machine").
    """
    counts = []
    for i in range(samples):
        if i:
            time.sleep(interval_s)
        count = running_tasks()
        if count is None:
            return True
        counts.append(count)
    others = sorted(counts)[len(counts) // 2] - 1
    return others < usable_cpus() - 1


TWO_CORE_VEC_ENVS = ("shm", "worker")
"""Vector envs that step half the sub-envs in a second process (``hardware.vec_env``)."""


def uses_second_core(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` asks for a second process: a two-core vector env, the evaluation process or the critic
    process. Each gives the one-process run's numbers, only sooner when it has a core of its own."""
    return cfg.hardware.vec_env in TWO_CORE_VEC_ENVS or extra_processes(cfg)


def extra_processes(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` runs an evaluation or critic process of its own (beside any env worker)."""
    return cfg.hardware.eval_process or bool(getattr(cfg.algo, "critic_process", False))


def one_process(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every second-process option off (the same numbers): for a run that shares the cores with other
    runs, such as a job of a parallel sweep, where a busy-waiting worker would take a core from another job."""
    hardware = dataclasses.replace(
        cfg.hardware,
        vec_env="sync" if cfg.hardware.vec_env in TWO_CORE_VEC_ENVS else cfg.hardware.vec_env,
        eval_process=False,
    )
    algo = dataclasses.replace(cfg.algo, critic_process=False) if hasattr(cfg.algo, "critic_process") else cfg.algo
    return dataclasses.replace(cfg, hardware=hardware, algo=algo)


BUSY_NOTE = (
    "pgcli: note: no free core (another process is running): this run steps in one process, with the same "
    "results (hardware.busy_fallback=false keeps the second process)"
)


def fall_back_when_busy(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` in one process (:func:`one_process`, the same numbers) when it asks for a second process, allows the
    fallback (``hardware.busy_fallback``) and no core is free (:func:`free_core`); says so on stderr.

    Another process keeping the second core busy would make a busy-waiting env worker share it and every vector step
    wait: 30k Hopper steps took 39.5 s against 6.5 s in one process (docs/benchmarks/trpo.md, "On a busy machine").
    Used by ``pgcli train`` and by ``pgcli train resume=`` (checkpoints do not depend on the vector env)."""
    if not (uses_second_core(cfg) and cfg.hardware.busy_fallback):
        return cfg
    if free_core():
        return cfg
    print(BUSY_NOTE, file=sys.stderr, flush=True)
    return one_process(cfg)


def parallel_launcher(target: str) -> bool:
    """Whether a Hydra launcher (its ``_target_``) runs a sweep's jobs at the same time: every launcher but Hydra's
    basic one (joblib, Ray, ...)."""
    return not target.endswith(".BasicLauncher")


AUTO_GPU_WORKLOADS = frozenset({"text", "image"})
"""What ``hardware=auto`` puts on a visible GPU (docs/configuration.md, "hardware"). Measured on one H100 against its
own CPU: TinyGPT SFT 5x and GRPO 4x faster, a 6-layer d512 transformer 74x; an MLP control policy (TRPO Hopper) ran
at 0.48x of the CPU, so control stays on the CPU. ``image`` (model=cnn on Atari or MinAtar frames) is there because
convolutions over whole batches of frames are what GPUs are built for, as CleanRL's and SB3's Atari runs use them;
not yet timed against the CPU here (docs/pixels.md, "Where it runs")."""


def workload_of(cfg: TrainConfig) -> str:
    """What a run computes, for ``hardware=auto``: ``text`` (a language model on a text task), ``image`` (a CNN on
    frames: an image env, docs/pixels.md) or ``control`` (MLPs on a vector observation)."""
    if isinstance(cfg.env, TextEnvConfig):
        return "text"
    return "image" if isinstance(cfg.model, CNNModelConfig) else "control"


SLOW_ON_CPU_DTYPES = ("bfloat16", "float16")
"""``model.dtype`` values a CPU computes slower than float32 (bfloat16 about twice as slow: measured on TinyGPT-sized
``model=hf`` runs here; CPUs without bfloat16 matrix units emulate it)."""


def compute_of(cfg: TrainConfig, device: torch.device) -> tuple[str, list[str]]:
    """Where and in what precision a run computes, as its start line and summary name it (``cpu, float32``,
    ``cuda (NVIDIA H200), bfloat16``), and a note for each choice known to be slow: ``hardware=auto`` that found no GPU
    for a workload that gains from one, a half-precision ``model.dtype`` on the CPU."""
    dtype = cfg.model.dtype if isinstance(cfg.model, HFModelConfig) else "float32"  # other models are float32
    where = str(device)
    if device.type == "cuda":
        import torch

        where = f"{device} ({torch.cuda.get_device_name(device)})"
    notes = []
    workload = workload_of(cfg)
    if cfg.hardware.device == "auto" and device.type == "cpu" and workload in AUTO_GPU_WORKLOADS:
        notes.append(
            f"pgcli: note: hardware=auto found no CUDA GPU (torch.cuda.is_available() is False): this {workload} run "
            "trains on the CPU, slower than on a GPU"
        )
    if device.type == "cpu" and dtype in SLOW_ON_CPU_DTYPES:
        notes.append(
            f"pgcli: note: model.dtype={dtype} on the CPU is slower than float32 (bfloat16 about twice as slow); "
            "model.dtype=float32 trains faster here"
        )
    return f"{where}, {dtype}", notes


def select_device(hw: HardwareConfig, workload: str = "control") -> torch.device:
    """torch.device for ``hardware.device``; 'cuda' without a visible GPU is a one-line ConfigError; 'auto' is the GPU
    for a workload that gains from one (:data:`AUTO_GPU_WORKLOADS`: ``text``, ``image``) when one is visible, else the
    CPU."""
    import torch

    if hw.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "hardware=cuda but no CUDA GPU is visible to torch (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); use hardware=cpu or hardware=auto"
        )
    if hw.device == "auto":
        gpu = workload in AUTO_GPU_WORKLOADS and torch.cuda.is_available()
        return torch.device("cuda" if gpu else "cpu")
    return torch.device(hw.device)
