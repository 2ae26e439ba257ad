"""Sweeps as one MLflow tree: a parent run per multirun, every job a nested child, a summary at the end.

:class:`SweepCallback` is a Hydra callback (``hydra.callbacks.pgcli_sweep`` in ``conf/train.yaml``), so it works with
every sweeper and launcher:

- ``on_multirun_start`` (in the process that runs the sweeper) creates the parent run: the sweep's overrides, the
  sweeper and launcher settings (the Optuna search space included) and the sweep directory. Its id goes into
  ``$PGCLI_PARENT_RUN_ID``; each job reads it (``pgcli.commands.train.run_train``) and opens its run as a child in the
  parent's experiment, tagged ``mlflow.parentRunId`` (the tag the MLflow UI nests by).
- The variable must reach jobs in other processes. Launchers pickle Hydra's callbacks along with each job and call
  ``on_job_start`` in the process that runs it (joblib/loky workers, Ray workers), so :meth:`on_job_start` exports
  the id there again, whatever the launcher, however its workers were started.
- ``on_multirun_end`` ends the parent with a summary: ``children.md``/``children.csv`` (each job's status, seed,
  final return and error), Optuna's best parameters and value, and ``sweep/*`` metrics. The parent ends FINISHED,
  or FAILED if any job failed or left no run. Hydra does not call ``on_multirun_end`` when the sweeper raises
  (the basic sweeper re-raises the first failed job once the batch is done) or on Ctrl-C, so ``pgcli train``
  calls :func:`close_sweep` on those paths as well: the parent is never left RUNNING.

A failed job says so on one line as it fails, its traceback in its log (:mod:`pgcli.sweeps.failures`;
:meth:`on_job_end` keeps Hydra from printing it again). The summary ends with one line naming the failed jobs;
``pgcli train -m`` then exits 1. A sweep stopped by Ctrl-C (or SIGTERM) calls its stopped jobs interrupted, not
failed, and ends with the commands that finish it (:mod:`pgcli.sweeps.leftover`).
"""

from __future__ import annotations

import csv
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pgcli.config.overrides import plain_override
from pgcli.sweeps.failures import quiet_failure
from pgcli.sweeps.leftover import Leftover, SweepPlan, leftover
from pgcli.sweeps.results import search_summary
from pgcli.tracking.status import FINISHED, KILLED, PRUNED, RUNNING
from pgcli.training.owner import process_tags
from pgcli.training.run import PARENT_RUN_ENV, SWEPT_KEYS_ENV, sweep_status

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn

    from pgcli.tracking.store import RunRecord, RunStore

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
FINAL_METRIC = "eval/return_mean"
"""The metric whose last value is a run's final return (the monitor logs a final evaluation at the end)."""
SWEEP_EXPERIMENT = "sweeps"
"""Experiment of a sweep over several envs with no ``experiment=`` set (a parent and its children share one)."""


@dataclass
class SweepOutcome:
    """How a sweep ended: what ``pgcli train -m`` reports and turns into its exit status."""

    parent_run_id: str
    status: str
    n_jobs: int
    failed: list[str] = field(default_factory=list)
    """One description per failed job: '#<num> <overrides>: <error>'."""
    n_pruned: int = 0
    """Runs an Optuna pruner stopped (KILLED with tag pruned=true; not failures)."""
    left: Leftover | None = None
    """A stopped sweep's interrupted and never-started jobs, and the commands that finish it (not failures)."""

    @property
    def ok(self) -> bool:
        return self.status == FINISHED and not self.failed


_CURRENT: SweepCallback | None = None
"""The sweep running in this process (set at multirun start; what :func:`close_sweep` ends)."""


class SweepCallback(Callback):
    """Parent MLflow run per multirun; children attach to it; a summary and a final status at the end."""

    def __init__(self, final_metric: str = FINAL_METRIC) -> None:
        self.final_metric = final_metric
        self.swept = ""
        """The keys the sweep varies, comma-separated (its jobs' run names show them)."""
        self.parent_run_id: str | None = None
        self.tracking_uri: str | None = None
        self.sweep_dir: Path | None = None
        self.torch_threads = 0
        self.outcome: SweepOutcome | None = None
        self.plan: SweepPlan | None = None
        self._store: RunStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to every worker with the job (joblib, Ray); the MLflow client stays behind.
        return {**self.__dict__, "_store": None}

    # ---------------------------------------------------------------------------------------------------------------
    # Hydra hooks
    # ---------------------------------------------------------------------------------------------------------------

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _CURRENT
        from pgcli.config import TrackingConfig
        from pgcli.tracking.uri import resolve_tracking_target

        self.torch_threads = int(OmegaConf.select(config, "hardware.torch_threads", default=0) or 0)
        limit_threads(self.torch_threads)
        prepare_optuna_storage(OmegaConf.select(config, "hydra.sweeper.storage", default=None))
        tracking = OmegaConf.to_object(config.tracking)
        if not isinstance(tracking, TrackingConfig) or tracking.backend != "mlflow":
            return
        target = resolve_tracking_target(tracking)
        self.tracking_uri = target.uri
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        overrides = [str(o) for o in config.hydra.overrides.task]
        swept = swept_keys(config)
        experiment = config.get("experiment") or (SWEEP_EXPERIMENT if swept & {"env", "env.id"} else env_label(config))
        parent = self.store.create_run(
            experiment,
            run_name=f"sweep-{self.sweep_dir.parent.name}-{self.sweep_dir.name}",
            tags={**parent_tags(config, overrides, swept, self.sweep_dir), **process_tags()},
            artifact_root=target.artifact_root,
        )
        self.parent_run_id = parent.run_id
        self.plan = SweepPlan.from_config(config)  # what a stopped sweep has left to run
        os.environ[PARENT_RUN_ENV] = parent.run_id
        self.swept = ",".join(sorted(swept))
        os.environ[SWEPT_KEYS_ENV] = self.swept
        _CURRENT = self
        self.store.log_params(parent.run_id, parent_params(config, overrides, self.sweep_dir))
        print(
            f"pgcli: sweep parent run {parent.run_id} (experiment '{experiment}'); after the sweep: "
            f"pgcli compare --parent {parent.run_id}",
            file=sys.stderr,
        )

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Runs in the process that runs the job; for joblib and Ray that is a worker this callback was pickled to.
        limit_threads(self.torch_threads)
        if self.parent_run_id:
            os.environ[PARENT_RUN_ENV] = self.parent_run_id
            os.environ[SWEPT_KEYS_ENV] = self.swept
        multirun_yaml = Path(str(config.hydra.sweep.dir)) / "multirun.yaml"  # Hydra saves it after on_multirun_start
        if multirun_yaml.is_file():
            from pgcli.redact import redact_yaml_file

            redact_yaml_file(multirun_yaml)  # no URI credentials there (docs/tracking.md, "Credentials and secrets")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        # In the job's process, as on_job_start: a failure the job reported is not printed again (sweeps/failures.py)
        quiet_failure(job_return, sweeper=str(OmegaConf.select(config, "hydra.sweeper._target_", default="")))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.finish(FINISHED)

    # ---------------------------------------------------------------------------------------------------------------
    # Summary
    # ---------------------------------------------------------------------------------------------------------------

    @property
    def store(self) -> RunStore:
        if self._store is None:
            from pgcli.tracking.store import RunStore

            assert self.tracking_uri is not None
            self._store = RunStore(self.tracking_uri)
        return self._store

    def finish(self, status: str) -> SweepOutcome | None:
        """End the parent run with the summary (once). ``status`` is how the sweep itself ended: FINISHED, FAILED
        (the sweeper raised) or KILLED (Ctrl-C); a FINISHED sweep with a failed job still ends the parent FAILED."""
        if self.outcome is not None or self.parent_run_id is None:
            return self.outcome
        store, parent_id = self.store, self.parent_run_id
        os.environ.pop(PARENT_RUN_ENV, None)
        os.environ.pop(SWEPT_KEYS_ENV, None)
        try:
            parent = store.get(parent_id)
            children = sorted(store.children(parent), key=_job_order)
            if status != FINISHED:  # the sweep was cut short: no job is still writing to its run
                for child in children:
                    if child.status == RUNNING:
                        store.end(child.run_id, KILLED)
                children = sorted(store.children(parent), key=_job_order)
            rows = drop_common_overrides([child_row(c, self.final_metric) for c in children])
            stopped = status == KILLED  # its KILLED jobs were interrupted, not failed (docs/sweeps.md)
            ok = (FINISHED, PRUNED, KILLED) if stopped else (FINISHED, PRUNED)
            failed = [_describe_failure(r) for r in rows if r["status"] not in ok]
            n_pruned = sum(r["status"] == PRUNED for r in rows)
            job_nums = {r["job"] for r in rows}
            missing = [n for n in sweep_job_numbers(self.sweep_dir) if str(n) not in job_nums]
            left = leftover(self.plan, children, missing) if stopped else None
            if not stopped:
                failed += [f"#{n}: no MLflow run (the job failed before training started)" for n in missing]
            n_jobs = len(job_nums | {str(n) for n in missing}) + (left.not_started if left else 0)
            final = sweep_status(status, len(failed))
            self._log_summary(parent_id, rows, n_jobs, len(failed), n_pruned)
        except BaseException:
            store.end(parent_id, sweep_status(status, n_failed_jobs=1))
            raise
        store.end(parent_id, final)
        self.outcome = SweepOutcome(parent_id, final, n_jobs, failed, n_pruned, left)
        print(format_table(rows), file=sys.stderr)
        print(summary_line(self.outcome), file=sys.stderr)
        for line in search_summary(self.sweep_dir):  # an Optuna search's best trial, its re-run command, the plots
            print(line, file=sys.stderr)
        if left is not None and left.commands:
            print("pgcli: to finish the sweep: " + "; ".join(left.commands), file=sys.stderr)
        return self.outcome

    def _log_summary(
        self, parent_id: str, rows: list[dict[str, str]], n_jobs: int, n_failed: int, n_pruned: int
    ) -> None:
        store, out = self.store, self.sweep_dir
        assert out is not None
        out.mkdir(parents=True, exist_ok=True)
        (out / "children.md").write_text(format_table(rows) + "\n")
        with (out / "children.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(CHILD_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        metrics: dict[str, float] = {"sweep/n_jobs": n_jobs, "sweep/n_failed": n_failed, "sweep/n_pruned": n_pruned}
        returns = [float(r["final_return"]) for r in rows if r["status"] == FINISHED and r["final_return"]]
        if returns:
            metrics["sweep/best_return"] = max(returns)
        optuna = out / "optimization_results.yaml"
        if optuna.is_file():
            result = OmegaConf.to_container(OmegaConf.load(optuna))
            assert isinstance(result, dict)
            if "best_params" in result:
                # an appended key (++env.kwargs.g) is no MLflow param name: log it as env.kwargs.g
                store.log_params(parent_id, {f"best.{k.lstrip('+~')}": v for k, v in result["best_params"].items()})
                metrics["best_value"] = float(result["best_value"])
            store.log_artifact(parent_id, optuna)
            for name in result.get("plots", []):  # optuna_history.png, optuna_importance.png
                store.log_artifact(parent_id, out / name)
        store.log_metrics(parent_id, metrics)
        for name in ("children.md", "children.csv", "multirun.yaml"):
            if (out / name).is_file():
                store.log_artifact(parent_id, out / name)


def close_sweep(status: str) -> SweepOutcome | None:
    """End this process's sweep if it is still open (Hydra skipped ``on_multirun_end``); return how it ended.

    None when no sweep with a parent run ran in this process.
    """
    if _CURRENT is None:
        return None
    return _CURRENT.finish(status)


def limit_threads(n: int) -> None:
    """Cap BLAS/OpenMP threads of this process and the workers it starts at ``n`` (0: leave them alone).

    ``hardware.torch_threads`` sets torch's own pool; numpy's BLAS and OpenMP read these variables at import, so a
    job in a fresh worker process gets them before it imports anything heavy. Explicit user settings win.
    """
    if n > 0:
        for var in THREAD_ENV_VARS:
            os.environ.setdefault(var, str(n))


def prepare_optuna_storage(storage: str | None) -> None:
    """Make an Optuna storage URL openable: SQLite creates the database file but not its directory
    (``sqlite:///outputs/optuna.db`` before anything ran).

    Optuna 2.10 (held by the former hydra-optuna-sweeper) also needed its tables and alembic stamp written here: it
    stamped the schema on a connection it never committed, which under SQLAlchemy 2 held SQLite's write lock until
    the garbage collector freed it ("database is locked"). Optuna >= 3 stamps in a committed transaction; the
    regression test (tests/unit/test_sweep.py) opens, fills and reopens a study with the garbage collector off.
    """
    if storage and storage.startswith("sqlite:///"):
        Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


# --------------------------------------------------------------------------------------------------------------------
# Pure helpers (tested in tests/unit/test_sweep.py)
# --------------------------------------------------------------------------------------------------------------------

CHILD_COLUMNS = {
    "job": "job",
    "trial": "trial",
    "run_name": "run",
    "status": "status",
    "seed": "seed",
    "overrides": "overrides",
    "final_return": "final return",
    "error": "error",
}


def swept_keys(config: DictConfig) -> set[str]:
    """Keys the sweep varies: grid overrides with several values (``env=a,b``) and the sweeper's search space."""
    from pgcli.config.overrides import Overrides

    keys = Overrides.parse(str(o) for o in config.hydra.overrides.task).swept_keys()
    params = OmegaConf.select(config, "hydra.sweeper.params")
    if params:
        keys |= {str(k) for k in params}
    return keys


def parent_tags(config: DictConfig, overrides: list[str], swept: set[str], sweep_dir: Path) -> dict[str, str]:
    import pgcli
    from pgcli.training.build import git_state

    tags = {
        "pgcli_role": "sweep",
        "sweep_dir": str(sweep_dir),
        "hydra_overrides": " ".join(overrides),
        "sweeper": _short_target(OmegaConf.select(config, "hydra.sweeper._target_")),
        "launcher": _short_target(OmegaConf.select(config, "hydra.launcher._target_")),
        "pgcli_version": pgcli.__version__,
        **git_state(),
    }
    if "algo" not in swept:
        tags["algo"] = str(config.hydra.runtime.choices.algo)
    if not swept & {"env", "env.id"}:
        tags["env"] = env_label(config)
    return tags


def env_label(config: DictConfig) -> str:
    """The env label of a sweep whose env is fixed (pgcli.config.labels.env_label: follows ``env.id``, not ``env=``)."""
    from pgcli.config.compose import CONF_DIR
    from pgcli.config.labels import env_label as label

    return label(str(config.env.id), config.hydra.runtime.choices.env, CONF_DIR)


def parent_params(config: DictConfig, overrides: list[str], sweep_dir: Path) -> dict[str, str]:
    """The sweep's overrides, its directory, and every sweeper/launcher setting (``sweeper.params.<key>`` is the
    Optuna search space)."""
    from pgcli.tracking.logger import flatten

    params = {"sweep.overrides": " ".join(overrides) or "(none)", "sweep.dir": str(sweep_dir)}
    for node in ("sweeper", "launcher"):
        settings = OmegaConf.to_container(config.hydra[node], resolve=True) or {}
        assert isinstance(settings, dict)
        for key, value in flatten({str(k): v for k, v in settings.items()}).items():
            if value not in (None, "", {}, []):
                params[f"{node}.{key}"] = str(value)
    return params


def child_row(child: RunRecord, final_metric: str = FINAL_METRIC) -> dict[str, str]:
    """One line of the parent's summary table, from a child's :class:`~pgcli.tracking.store.RunRecord`."""
    value = child.metrics.get(final_metric)
    return {
        "job": child.tags.get("sweep_job", ""),
        "trial": child.tags.get("trial", ""),
        "run_name": child.name,
        "status": PRUNED if child.tags.get("pruned") == "true" else child.status,
        "seed": child.tags.get("seed", ""),
        "overrides": " ".join(plain_override(o) for o in child.tags.get("hydra_overrides", "").split()),
        "final_return": "" if value is None or math.isnan(value) else f"{value:.2f}",
        "error": child.tags.get("error", ""),
    }


def drop_common_overrides(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Keep in each row's ``overrides`` only what differs between jobs (``seed=1``, not the whole command line)."""
    if len(rows) < 2:
        return rows
    common = set.intersection(*(set(r["overrides"].split()) for r in rows))
    return [{**r, "overrides": " ".join(o for o in r["overrides"].split() if o not in common)} for r in rows]


def format_table(rows: list[dict[str, str]]) -> str:
    """The children as a Markdown table (``trial`` only for an Optuna search, ``error`` only when a job failed);
    floats in the overrides are rounded to 4 significant digits (``children.csv`` keeps them exact)."""
    optional = ("trial", "error")
    columns = [c for c in CHILD_COLUMNS if c not in optional or any(r.get(c) for r in rows)]
    rows = [{**r, "overrides": round_overrides(r["overrides"])} for r in rows]
    lines = [
        "| " + " | ".join(CHILD_COLUMNS[c] for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(r[c].replace("|", "\\|") for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def summary_line(outcome: SweepOutcome) -> str:
    """The line ``pgcli train -m`` ends with."""
    head = f"pgcli: sweep {outcome.status.lower()}: {outcome.n_jobs} job{'' if outcome.n_jobs == 1 else 's'}"
    if outcome.left is not None:
        return _stopped_line(head, outcome, outcome.left)
    if outcome.failed:
        return f"{head}, {len(outcome.failed)} failed: " + "; ".join(outcome.failed)
    if outcome.n_pruned and outcome.status == FINISHED:
        return (
            f"{head}, {outcome.n_pruned} pruned, the others finished; compare them: "
            f"pgcli compare --parent {outcome.parent_run_id}"
        )
    if outcome.status != FINISHED:
        return f"{head} (parent run {outcome.parent_run_id} ended {outcome.status})"
    return f"{head}, all finished; compare them: pgcli compare --parent {outcome.parent_run_id}"


def _stopped_line(head: str, outcome: SweepOutcome, left: Leftover) -> str:
    """A stopped sweep's summary: how many jobs finished, failed, were interrupted or never started."""
    n_failed, n_left = len(outcome.failed), left.interrupted + left.not_started
    counts = [
        (outcome.n_jobs - n_failed - outcome.n_pruned - n_left, "finished"),
        (outcome.n_pruned, "pruned"),
        (n_failed, "failed"),
        (left.interrupted, "interrupted"),
        (left.not_started, "not started"),
    ]
    line = head + "".join(f", {n} {what}" for n, what in counts if n > 0)
    line += f" (parent run {outcome.parent_run_id} ended {outcome.status})"
    return line + ("; failed: " + "; ".join(outcome.failed) if outcome.failed else "")


def round_overrides(overrides: str) -> str:
    """``algo.learning_rate=0.000312345678 seed=1`` -> ``algo.learning_rate=0.0003123 seed=1`` (floats only)."""
    out = []
    for item in overrides.split():
        key, sep, value = item.partition("=")
        if sep and any(c in value for c in ".eE") and _is_float(value):
            item = f"{key}={float(value):.4g}"
        out.append(item)
    return " ".join(out)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def sweep_job_numbers(sweep_dir: Path | None) -> list[int]:
    """``hydra.job.num`` of every job that started under ``sweep_dir`` (each writes ``.hydra/hydra.yaml``)."""
    if sweep_dir is None or not sweep_dir.is_dir():
        return []
    nums = []
    for hydra_yaml in sorted(sweep_dir.glob("*/.hydra/hydra.yaml")):
        num = OmegaConf.select(OmegaConf.load(hydra_yaml), "hydra.job.num")
        if num is not None:
            nums.append(int(num))
    return sorted(nums)


def _describe_failure(row: dict[str, str]) -> str:
    what = f"#{row['job']} {row['overrides']}".rstrip()
    return f"{what}: {row['status']}" + (f" ({row['error']})" if row["error"] else "")


def _job_order(child: RunRecord) -> tuple[int, int, str]:
    job, seed = child.tags.get("sweep_job", ""), child.tags.get("seed", "")
    return (int(job) if job.isdigit() else -1, int(seed) if seed.isdigit() else -1, child.name)


def _short_target(target: Any) -> str:
    return str(target).rsplit(".", 1)[-1] if target else ""
