"""Sweeps as one MLflow tree: a parent run per multirun, every job a nested child, a summary at the end.

:class:`SweepCallback` is a Hydra callback (``hydra.callbacks.pgcli_sweep`` in ``conf/train.yaml``), so it works with
every sweeper and launcher:

- ``on_multirun_start`` (in the process that runs the sweeper) creates the parent run: the sweep's overrides, the
  sweeper and launcher settings (the Optuna search space included) and the sweep directory. Its id goes into
  ``$PGCLI_PARENT_RUN_ID``; each job reads it (:func:`pgcli.cli.run_train`) and opens its run as a child in the
  parent's experiment, tagged ``mlflow.parentRunId`` (the tag the MLflow UI nests by).
- The variable must reach jobs in other processes. Launchers pickle Hydra's callbacks along with each job and call
  ``on_job_start`` in the process that runs it (joblib/loky workers, Ray workers), so :meth:`on_job_start` exports
  the id there again, whatever the launcher, however its workers were started.
- ``on_multirun_end`` ends the parent with a summary: ``children.md``/``children.csv`` (each job's status, seed,
  final return and error), Optuna's best parameters and value, and ``sweep/*`` metrics. The parent ends FINISHED,
  or FAILED if any job failed or left no run. Hydra does not call ``on_multirun_end`` when the sweeper raises
  (the basic sweeper re-raises the first failed job once the batch is done) or on Ctrl-C, so ``pgcli train``
  calls :func:`close_sweep` on those paths as well: the parent is never left RUNNING.

The summary ends with one line naming the failed jobs; ``pgcli train -m`` then exits 1.
"""

from __future__ import annotations

import csv
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pgcli.cli import PARENT_RUN_ENV

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

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED" and not self.failed


_CURRENT: SweepCallback | None = None
"""The sweep running in this process (set at multirun start; what :func:`close_sweep` ends)."""


class SweepCallback(Callback):
    """Parent MLflow run per multirun; children attach to it; a summary and a final status at the end."""

    def __init__(self, final_metric: str = FINAL_METRIC) -> None:
        self.final_metric = final_metric
        self.parent_run_id: str | None = None
        self.tracking_uri: str | None = None
        self.sweep_dir: Path | None = None
        self.torch_threads = 0
        self.outcome: SweepOutcome | None = None
        self._store: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to every worker with the job (joblib, Ray); the MLflow client stays behind.
        return {**self.__dict__, "_store": None}

    # ---------------------------------------------------------------------------------------------------------------
    # Hydra hooks
    # ---------------------------------------------------------------------------------------------------------------

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _CURRENT
        from pgcli.config import TrackingConfig
        from pgcli.tracking import resolve_tracking_target

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
        choices = config.hydra.runtime.choices
        experiment = config.get("experiment") or (SWEEP_EXPERIMENT if "env" in swept else str(choices.env))
        parent = self.store.create_run(
            experiment,
            run_name=f"sweep-{self.sweep_dir.parent.name}-{self.sweep_dir.name}",
            tags=parent_tags(config, overrides, swept, self.sweep_dir),
            artifact_root=target.artifact_root,
        )
        self.parent_run_id = parent.run_id
        os.environ[PARENT_RUN_ENV] = parent.run_id
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
        multirun_yaml = Path(str(config.hydra.sweep.dir)) / "multirun.yaml"  # Hydra saves it after on_multirun_start
        if multirun_yaml.is_file():
            from pgcli.redact import redact_yaml_file

            redact_yaml_file(multirun_yaml)  # no tracking-URI credentials in the sweep directory (issue 10)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.finish("FINISHED")

    # ---------------------------------------------------------------------------------------------------------------
    # Summary
    # ---------------------------------------------------------------------------------------------------------------

    @property
    def store(self) -> Any:
        if self._store is None:
            from pgcli.tracking import RunStore

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
        try:
            parent = store.get(parent_id)
            children = sorted(store.children(parent), key=_job_order)
            if status != "FINISHED":  # the sweep was cut short: no job is still writing to its run
                for child in children:
                    if child.status == "RUNNING":
                        store.end(child.run_id, "KILLED")
                children = sorted(store.children(parent), key=_job_order)
            rows = drop_common_overrides([child_row(c, self.final_metric) for c in children])
            failed = [_describe_failure(r) for r in rows if r["status"] != "FINISHED"]
            job_nums = {r["job"] for r in rows}
            missing = [n for n in sweep_job_numbers(self.sweep_dir) if str(n) not in job_nums]
            failed += [f"#{n}: no MLflow run (the job failed before training started)" for n in missing]
            n_jobs = len(job_nums | {str(n) for n in missing})
            final = "KILLED" if status == "KILLED" else ("FAILED" if status == "FAILED" or failed else "FINISHED")
            self._log_summary(parent_id, rows, n_jobs, len(failed))
        except BaseException:
            store.end(parent_id, "KILLED" if status == "KILLED" else "FAILED")
            raise
        store.end(parent_id, final)
        self.outcome = SweepOutcome(parent_id, final, n_jobs, failed)
        print(format_table(rows), file=sys.stderr)
        print(summary_line(self.outcome), file=sys.stderr)
        return self.outcome

    def _log_summary(self, parent_id: str, rows: list[dict[str, str]], n_jobs: int, n_failed: int) -> None:
        store, out = self.store, self.sweep_dir
        assert out is not None
        out.mkdir(parents=True, exist_ok=True)
        (out / "children.md").write_text(format_table(rows) + "\n")
        with (out / "children.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(CHILD_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        metrics: dict[str, float] = {"sweep/n_jobs": n_jobs, "sweep/n_failed": n_failed}
        returns = [float(r["final_return"]) for r in rows if r["status"] == "FINISHED" and r["final_return"]]
        if returns:
            metrics["sweep/best_return"] = max(returns)
        optuna = out / "optimization_results.yaml"
        if optuna.is_file():
            result = OmegaConf.to_container(OmegaConf.load(optuna))
            assert isinstance(result, dict)
            if "best_params" in result:
                store.log_params(parent_id, {f"best.{k}": v for k, v in result["best_params"].items()})
                metrics["best_value"] = float(result["best_value"])
            store.log_artifact(parent_id, optuna)
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
    """Make an Optuna RDB storage usable before the sweeper opens it.

    - SQLite creates the database file but not its directory (``sqlite:///outputs/optuna.db`` before any job ran).
    - Optuna 2.10 (the newest hydra-optuna-sweeper allows) stamps its alembic schema version on a connection it
      never closes or commits. Under SQLAlchemy 2 (which MLflow requires) that connection keeps SQLite's write lock
      until the garbage collector happens to free it: the stamp is lost, and the next open fails with "database is
      locked" or a bare AssertionError, depending on timing. So the tables, the version row and the alembic stamp
      are written here on connections that commit and close, and Optuna finds nothing left to initialise. Optuna's
      own ``_VersionManager`` is never built here: its constructor runs the faulty stamp.
    """
    if not storage:
        return
    if storage.startswith("sqlite:///"):
        Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    import alembic.config
    import alembic.migration
    import alembic.script
    import optuna.storages._rdb as rdb
    import sqlalchemy
    from optuna import version
    from optuna.storages._rdb import models
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(storage)
    try:
        models.BaseModel.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            if models.VersionInfoModel.find(session) is None:
                session.add(
                    models.VersionInfoModel(schema_version=models.SCHEMA_VERSION, library_version=version.__version__)
                )
        with engine.begin() as conn:
            context = alembic.migration.MigrationContext.configure(conn)
            if context.get_current_revision() is None:
                here = Path(rdb.__file__).parent
                config = alembic.config.Config(str(here / "alembic.ini"))
                config.set_main_option("script_location", str(here / "alembic"))
                script = alembic.script.ScriptDirectory.from_config(config)
                context.stamp(script, "head")
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------------------------------
# Pure helpers (tested in tests/unit/test_sweep.py)
# --------------------------------------------------------------------------------------------------------------------

CHILD_COLUMNS = {
    "job": "job",
    "run_name": "run",
    "status": "status",
    "seed": "seed",
    "overrides": "overrides",
    "final_return": "final return",
    "error": "error",
}


def swept_keys(config: DictConfig) -> set[str]:
    """Keys the sweep varies: grid overrides with several values (``env=a,b``) and the sweeper's search space."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = [str(o) for o in config.hydra.overrides.task]
    parsed = OverridesParser.create().parse_overrides(task)
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    params = OmegaConf.select(config, "hydra.sweeper.params")
    if params:
        keys |= {str(k) for k in params}
    return keys


def parent_tags(config: DictConfig, overrides: list[str], swept: set[str], sweep_dir: Path) -> dict[str, str]:
    import pgcli
    from pgcli.build import git_state

    tags = {
        "pgcli_role": "sweep",
        "sweep_dir": str(sweep_dir),
        "hydra_overrides": " ".join(overrides),
        "sweeper": _short_target(OmegaConf.select(config, "hydra.sweeper._target_")),
        "launcher": _short_target(OmegaConf.select(config, "hydra.launcher._target_")),
        "pgcli_version": pgcli.__version__,
        **git_state(),
    }
    for key in ("algo", "env"):
        if key not in swept:
            tags[key] = str(config.hydra.runtime.choices[key])
    return tags


def parent_params(config: DictConfig, overrides: list[str], sweep_dir: Path) -> dict[str, str]:
    """The sweep's overrides, its directory, and every sweeper/launcher setting (``sweeper.params.<key>`` is the
    Optuna search space)."""
    from pgcli.tracking import flatten

    params = {"sweep.overrides": " ".join(overrides) or "(none)", "sweep.dir": str(sweep_dir)}
    for node in ("sweeper", "launcher"):
        settings = OmegaConf.to_container(config.hydra[node], resolve=True) or {}
        assert isinstance(settings, dict)
        for key, value in flatten({str(k): v for k, v in settings.items()}).items():
            if value not in (None, "", {}, []):
                params[f"{node}.{key}"] = str(value)
    return params


def child_row(child: Any, final_metric: str = FINAL_METRIC) -> dict[str, str]:
    """One line of the parent's summary table, from a child's :class:`~pgcli.tracking.RunRecord`."""
    value = child.metrics.get(final_metric)
    return {
        "job": child.tags.get("sweep_job", ""),
        "run_name": child.name,
        "status": child.status,
        "seed": child.tags.get("seed", ""),
        "overrides": child.tags.get("hydra_overrides", ""),
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
    """The children as a Markdown table (the ``error`` column only when a job failed)."""
    columns = [c for c in CHILD_COLUMNS if c != "error" or any(r["error"] for r in rows)]
    lines = [
        "| " + " | ".join(CHILD_COLUMNS[c] for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(r[c].replace("|", "\\|") for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def summary_line(outcome: SweepOutcome) -> str:
    """The line ``pgcli train -m`` ends with."""
    head = f"pgcli: sweep {outcome.status.lower()}: {outcome.n_jobs} job{'' if outcome.n_jobs == 1 else 's'}"
    if outcome.failed:
        return f"{head}, {len(outcome.failed)} failed: " + "; ".join(outcome.failed)
    if outcome.status != "FINISHED":
        return f"{head} (parent run {outcome.parent_run_id} ended {outcome.status})"
    return f"{head}, all finished; compare them: pgcli compare --parent {outcome.parent_run_id}"


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


def _job_order(child: Any) -> tuple[int, int, str]:
    job, seed = child.tags.get("sweep_job", ""), child.tags.get("seed", "")
    return (int(job) if job.isdigit() else -1, int(seed) if seed.isdigit() else -1, child.name)


def _short_target(target: Any) -> str:
    return str(target).rsplit(".", 1)[-1] if target else ""
