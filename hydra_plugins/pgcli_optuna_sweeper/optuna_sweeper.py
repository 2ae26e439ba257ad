"""``hydra/sweeper=optuna``: a hyperparameter search on Optuna's ask-and-tell API, one Hydra job per trial.

Why pgcli ships its own sweeper instead of ``hydra-optuna-sweeper``: that plugin holds Optuna at 2.10, fixes the
sampler seed so a resumed study re-runs the same hyperparameters, ranks trials of different budgets together, and
cannot prune (the trial never reaches the job). This one, per batch of ``n_jobs`` trials:

1. asks the study for new trials (:meth:`OptunaSweeper._ask`): the sampler is seeded with ``seed`` + the trials
   already in the study, and a parameter set that a trial of the study already ran is recorded as a pruned copy
   (user attr ``duplicate_of``; Optuna's FAQ) and the sampler asked again, unless ``allow_duplicates``;
2. launches one job per trial with the sampled overrides plus the trial's identity in ``hydra.job.env_set``, so the
   job (in this process, a joblib worker or a Ray worker) can report its periodic evaluations to the study and be
   pruned (:class:`pgcli.sweeps.study.TrialLink`);
3. tells the study each job's outcome: its return value (COMPLETE), PRUNED when the job raised
   :class:`pgcli.sweeps.study.TrialPruned`, FAIL otherwise. A batch with more failures than ``max_failure_rate``
   ends the search as a failed job ends a basic sweep (:mod:`pgcli.sweeps.failures`): the results of the trials so
   far are written, then :class:`~pgcli.sweeps.failures.SweepJobFailed` (exit status 1, no traceback).

The study is bound to its budget (``total_steps``, ``n_seeds``, ``eval.episodes``;
:func:`pgcli.sweeps.study.check_budget`). Each trial records its sweep's base overrides (user attr ``base_overrides``),
so the best trial can be re-run from any later sweep of the study.
At the end, the sweep directory holds ``optimization_results.yaml`` (the best trial of the whole study and the command
that re-runs it), ``optuna_history.png`` and ``optuna_importance.png`` (:mod:`pgcli.sweeps.results`).
Optuna is imported only when a sweep runs, so Hydra's plugin scan stays cheap.
"""

# No `from __future__ import annotations`: Hydra's plugin scan imports this module in a way that breaks
# dataclasses with string annotations (the settings dataclass itself lives in pgcli.sweeps.study).
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from pgcli.redact import redact_text, redact_yaml_file
from pgcli.sweeps.failures import JobFailed, SweepJobFailed
from pgcli.sweeps.results import BASE_ATTR, DUPLICATE_ATTR, RESULTS_FILE, save_results
from pgcli.sweeps.study import (
    OptunaSearchConfig,
    SearchSpace,
    TrialPruned,
    budget_of,
    check_budget,
    check_pruning,
    make_pruner,
    make_sampler,
    open_storage,
    trial_env,
)

log = logging.getLogger(__name__)

MAX_DUPLICATES_IN_A_ROW = 100
"""Consecutive duplicate samples after which the search space counts as exhausted and the search ends."""

ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSearchConfig, provider="pgcli")


class OptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        # The settings are OptunaSearchConfig's fields (Hydra passes the node's values); building the dataclass
        # runs its validation.
        plain = OmegaConf.to_container(OmegaConf.create(settings), resolve=True)
        assert isinstance(plain, dict)
        self.settings = OptunaSearchConfig(**{str(k): v for k, v in plain.items()})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None
        self.n_duplicates = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> None:
        import optuna

        assert self.config is not None
        cfg = self.settings
        space = SearchSpace.parse(cfg.params, arguments)
        check_pruning(cfg, self.config)
        budget = budget_of(self.config)
        max_resource = int(budget["total_steps"]) * int(budget["n_seeds"])
        study = optuna.create_study(
            study_name=cfg.study_name,
            storage=open_storage(cfg.storage) if cfg.storage else None,
            direction=cfg.direction,
            pruner=make_pruner(cfg, eval_every=int(self.config.eval.every), max_resource=max_resource),
            load_if_exists=True,
        )
        check_budget(study, budget, cfg.storage)
        self._save_config()
        n_before = len(study.trials)
        study.sampler = make_sampler(cfg, n_before)
        seed = "unseeded" if cfg.seed is None else f"seed {cfg.seed + n_before}"
        log.info(
            f"Optuna study '{study.study_name}' ({cfg.storage or 'in memory'}): {n_before} trials so far, "
            f"{cfg.n_trials} to run; sampler {cfg.sampler} ({seed}), pruner {cfg.pruner}"
        )

        job_idx, n_run = 0, 0
        while n_run < cfg.n_trials:
            trials = self._ask_batch(study, space, min(cfg.n_jobs, cfg.n_trials - n_run))
            if not trials:
                log.warning("The search space is exhausted: every new sample repeats a trial of the study")
                break
            # The storage's trial id is what optuna.trial.Trial(study, trial_id) takes in the job; Optuna exposes it
            # only as Trial._trial_id.
            overrides = [
                [*space.trial_overrides(t.params), *trial_env(study.study_name, t.number, t._trial_id)] for t in trials
            ]
            try:
                returns = self.launcher.launch(overrides, initial_job_idx=job_idx)
            except BaseException:
                for trial in trials:  # never left RUNNING in the study
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            job_idx += len(returns)
            n_run += len(trials)
            failed = [ret for trial, ret in zip(trials, returns, strict=True) if not self._tell(study, trial, ret)]
            if failed and len(failed) / len(returns) > cfg.max_failure_rate:
                log.error(
                    f"{len(failed)} of {len(returns)} trials failed (max_failure_rate={cfg.max_failure_rate}): "
                    "the search stops"
                )
                self._save_results(study, space.fixed)  # the trials so far, as a search that ends normally
                _end_search(failed)
        self._save_results(study, space.fixed)

    # ---------------------------------------------------------------------------------------------------------------

    def _save_config(self) -> None:
        """``multirun.yaml`` in the sweep directory, as Hydra's basic sweeper writes it: a failed job's line names
        the keys the sweep varies from it (:func:`pgcli.sweeps.failures.distinct_overrides`), and the parent run logs
        it. Credentials masked at once (docs/tracking.md, "Credentials and secrets")."""
        assert self.config is not None
        path = Path(str(self.config.hydra.sweep.dir)) / "multirun.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, path)
        redact_yaml_file(path)

    def _ask_batch(self, study: Any, space: SearchSpace, n: int) -> list[Any]:
        """Up to ``n`` new trials (fewer once the space is exhausted), each recording its sweep's base overrides:
        what re-runs it besides its parameters (:func:`pgcli.sweeps.results.best_overrides`)."""
        trials = []
        for _ in range(n):
            trial = self._ask(study, space)
            if trial is None:
                break
            trial.set_user_attr(BASE_ATTR, [redact_text(o) for o in space.fixed])  # no credentials in the storage
            trials.append(trial)
        if self.n_duplicates:
            log.info(f"{self.n_duplicates} samples repeated earlier trials: recorded as pruned copies, not run")
            self.n_duplicates = 0
        return trials

    def _ask(self, study: Any, space: SearchSpace) -> Any:
        """A new trial whose parameters no trial of the study ran or is running; None once the space is exhausted.

        A repeated sample is told PRUNED with user attr ``duplicate_of`` (Optuna's FAQ: a pruned repeat also steers
        TPE away from the point) and the sampler is asked again.
        """
        import optuna

        if self.settings.allow_duplicates:
            return study.ask(space.distributions)
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
        for _ in range(MAX_DUPLICATES_IN_A_ROW):
            ran = {
                t.number: t.params
                for t in study.get_trials(deepcopy=False, states=states)
                if DUPLICATE_ATTR not in t.user_attrs
            }
            size = space.size()
            if size is not None and len({_key(p) for p in ran.values()}) >= size:
                return None  # every point has run
            trial = study.ask(space.distributions)
            original = next((n for n, params in ran.items() if params == trial.params), None)
            if original is None:
                return trial
            trial.set_user_attr(DUPLICATE_ATTR, original)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log.debug(f"Trial {trial.number} repeats trial {original}'s parameters: recorded, not run")
            self.n_duplicates += 1
        return None

    @staticmethod
    def _tell(study: Any, trial: Any, ret: Any) -> bool:
        """Tell the study how the trial's job ended; False when it failed."""
        import optuna

        # A pruned job raised TrialPruned; read it without JobReturn.return_value, which reports it as an error.
        if ret.status == JobStatus.FAILED and isinstance(ret._return_value, TrialPruned):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log.info(str(ret._return_value))
            return True
        try:
            value = float(ret.return_value)  # re-raises the job's exception when it failed
        except Exception as exc:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.warning(f"Trial {trial.number} failed: {_reason(exc)}")
            return False
        if math.isnan(value):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.warning(f"Trial {trial.number} returned nan")
            return False
        study.tell(trial, value)
        return True

    def _save_results(self, study: Any, fixed: Sequence[str]) -> None:
        """The study's best trial (over all its sweeps: they share one budget), its re-run command and the plots, in
        the sweep directory; the sweep's summary prints them (pgcli.sweeps.tree)."""
        assert self.config is not None
        out = Path(str(self.config.hydra.sweep.dir))
        results = save_results(study, fixed, out)
        if "best_params" in results:
            shown = " ".join(f"{k}={_rounded(v)}" for k, v in results["best_params"].items())
            log.info(f"Best trial {results['best_trial']}: value {results['best_value']:.2f}, {shown}")
        log.info(f"Results, plots and the best trial's re-run command: {out / RESULTS_FILE}")


def _end_search(failed: Sequence[Any]) -> NoReturn:
    """End the search on its failed jobs' records: :class:`SweepJobFailed` once each job has said so on one line; a
    failure no job reported (one before pgcli's job code, or any under ``PGCLI_DEBUG=1``) is re-raised instead, for
    Hydra to print with its traceback."""
    for ret in failed:
        if ret.status == JobStatus.FAILED and not isinstance(ret._return_value, JobFailed):
            ret.return_value  # noqa: B018  (re-raises the job's exception)
    raise SweepJobFailed(1)


def _reason(exc: Exception) -> str:
    """Why a trial failed: a reported failure's reason (its job printed the line that names it), else the
    exception's type and first line."""
    if isinstance(exc, JobFailed):
        return str(exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _rounded(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))
