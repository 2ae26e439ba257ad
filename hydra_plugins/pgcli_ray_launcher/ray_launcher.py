"""``hydra/launcher=ray``: run each job of a sweep as a Ray task, on a local or remote Ray cluster.

Why pgcli ships its own launcher instead of ``hydra-ray-launcher``: that plugin (1.2.2) works with current Ray but
requires ``cloudpickle<3``, while joblib >= 1.6 (the joblib launcher's engine) requires ``cloudpickle>=3`` and Python
3.12+ needs cloudpickle 3; both launchers could not live in one environment (docs/sweeps.md). This launcher pickles
with Ray's own vendored cloudpickle, so it adds no pin, and it carries what a pgcli job needs to a Ray worker:

- the environment: ``PGCLI_*``, ``MLFLOW_*`` and the thread-count variables of the driver, plus ``env_vars``, go to
  every task through its Ray ``runtime_env`` (a worker started by ``ray start`` inherits nothing from the driver);
- the working directory: a worker changes to the driver's directory when it exists there (same machine or shared
  filesystem), so relative paths (``outputs/``, the sweep dir, the default SQLite store) mean the same thing;
- a job that crashes its worker comes back as a failed ``JobReturn`` rather than aborting the sweep;
- the terminal: each line a job prints reaches the driver's terminal as the job prints it, prefixed
  ``(job #<n> pid=<pid>)`` by Ray, without Ray's deduplication (which delays repeated lines past the sweep's end)
  or colour codes in a pipe or file.

Ray is imported only when a sweep launches, so Hydra's plugin scan stays cheap.
"""

# No `from __future__ import annotations`: Hydra's plugin scan imports this module in a way that breaks
# dataclasses with string annotations.
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

FORWARDED_ENV_PREFIXES = ("PGCLI_", "MLFLOW_", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class RayLauncherConf:
    """Settings of ``hydra/launcher=ray`` (override as ``hydra.launcher.<key>=...``)."""

    _target_: str = "hydra_plugins.pgcli_ray_launcher.ray_launcher.RayLauncher"
    address: str | None = None
    """Cluster to run on: 'host:port' of its head (`make ray-up` starts one on 127.0.0.1:6379); 'local' for a
    temporary Ray started for this sweep; null: $RAY_ADDRESS, else the latest `ray start` head on this machine,
    else a temporary local Ray (Ray's own rule)."""
    num_cpus_per_job: float = 1.0
    """CPUs Ray reserves per job (with hardware.torch_threads=1, one job per core)."""
    num_gpus_per_job: float = 0.0
    """GPUs Ray reserves per job (hardware=cuda jobs need 1, or a fraction to share a GPU)."""
    auth_mode: str | None = "token"
    """$RAY_AUTH_MODE for the driver when unset: 'token' matches a head started by `ray start` (token auth on by
    default; the token is read from ~/.ray/auth_token), null leaves Ray's default."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the jobs (the driver's PGCLI_*, MLFLOW_* and thread counts always go)."""
    init: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ray.init (e.g. num_cpus for a temporary local Ray)."""


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="pgcli")


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (host:port) names this machine's loopback interface."""
    if not address:
        return False
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS


def loopback_only(address: str | None) -> bool:
    """Whether the driver should run Ray in single-machine loopback mode for ``address``.

    Ray replaces a 127.0.0.1 address by the machine's network IP before connecting, which fails against a head bound
    to 127.0.0.1 (`make ray-up`); its ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` switch keeps every address on loopback.
    """
    resolved = os.environ.get("RAY_ADDRESS") or address
    return resolved in (None, "", "local") or is_loopback(resolved)


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """Environment variables every job gets: the driver's PGCLI_*, MLFLOW_* and thread counts, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def _run_job_in_worker(
    hydra_context: HydraContext,
    sweep_config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
    driver_cwd: str,
) -> JobReturn:
    # Same machine or a shared filesystem: run where the driver runs, so relative paths agree.
    if os.path.isdir(driver_cwd):
        os.chdir(driver_cwd)
    setup_globals()
    Singleton.set_state(singleton_state)
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


class RayLauncher(Launcher):
    def __init__(
        self,
        address: str | None = None,
        num_cpus_per_job: float = 1.0,
        num_gpus_per_job: float = 0.0,
        auth_mode: str | None = "token",
        env_vars: dict[str, str] | None = None,
        init: dict[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.num_cpus_per_job = num_cpus_per_job
        self.num_gpus_per_job = num_gpus_per_job
        self.auth_mode = auth_mode
        self.env_vars = dict(env_vars or {})
        self.init = dict(init or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        ray = self._connect()
        log.info(
            f"Ray launcher: {len(job_overrides)} jobs on {ray.get_runtime_context().gcs_address}, sweep dir {sweep_dir}"
        )

        run_remote = ray.remote(_run_job_in_worker)
        options = {
            "num_cpus": self.num_cpus_per_job,
            "num_gpus": self.num_gpus_per_job,
            "max_retries": 0,
            "runtime_env": {"env_vars": worker_env(self.env_vars)},
        }
        pending = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"ray_{idx}"
                sweep_config.hydra.job.num = idx
            # Ray prefixes each line a job prints with the task's name: "(job #0 pid=...)"
            ref = run_remote.options(name=f"job #{idx}", **options).remote(
                self.hydra_context, sweep_config, self.task_function, Singleton.get_state(), os.getcwd()
            )
            pending.append((list(overrides), ref))
        return [self._result(ray, overrides, ref) for overrides, ref in pending]

    def _connect(self) -> Any:
        if loopback_only(self.address):
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if self.auth_mode:
            os.environ.setdefault("RAY_AUTH_MODE", self.auth_mode)
        os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
        # The jobs' lines as they come: Ray's deduplication holds back a line that another job printed too (the
        # same note from every job) and prints it late, after the sweep's summary, with a hint about Ray's settings.
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        if not sys.stderr.isatty():
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # no colour codes in a log file or a pipe
        import ray

        if not ray.is_initialized():
            init = OmegaConf.to_container(OmegaConf.create(self.init)) if self.init else {}
            assert isinstance(init, dict)
            ray.init(address=self.address, logging_level=logging.WARNING, **{str(k): v for k, v in init.items()})
        return ray

    @staticmethod
    def _result(ray: Any, overrides: list[str], ref: Any) -> JobReturn:
        """The job's JobReturn; a worker that died (or any Ray error) becomes a FAILED one, so the sweep goes on."""
        try:
            result = ray.get(ref)
            assert isinstance(result, JobReturn)
            return result
        except Exception as exc:
            ret = JobReturn(overrides=overrides, status=JobStatus.FAILED)
            ret.return_value = exc
            return ret
