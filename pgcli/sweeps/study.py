"""Optuna hyperparameter searches: what pgcli's sweeper plugin and each trial's job share.

``hydra/sweeper=optuna`` is pgcli's own Hydra sweeper (``hydra_plugins/pgcli_optuna_sweeper``) on Optuna's
ask-and-tell API. This module holds everything it shares with the CLI (checked before a search starts) and with the
jobs (which may run in other processes):

- :class:`OptunaSearchConfig`: the sweeper's settings, validated in ``__post_init__``.
- :class:`SearchSpace`: Hydra's sweep syntax (``choice``, ``range``, ``interval``, ``tag(log, interval(...))``) as
  Optuna distributions.
- The study's **budget** (:data:`BUDGET_KEYS`): stored as the study's user attr ``budget`` by its first sweep; a
  sweep with another budget is refused (:func:`check_budget`), so the best value never compares unequal budgets.
- Pruners built the same way in the sweeper and in every job (:func:`make_pruner`).
- :class:`TrialLink`: the job's side of a trial. The sweeper passes each job its trial through ``hydra.job.env_set``
  (:data:`TRIAL_ENV`, :data:`STUDY_ENV`, :data:`TRIAL_ID_ENV`), so it reaches joblib and Ray workers like any job
  setting; the job opens the study by name in the storage, reports each periodic evaluation as an intermediate
  value and raises :class:`TrialPruned` when the pruner says so. The training monitor only calls a hook.

Optuna is imported inside functions: ``pgcli.training.build`` imports :class:`TrialPruned` from here for every run.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgcli.errors import ConfigError
from pgcli.training.run import StoppedEarly

SWEEPER_TARGET = "hydra_plugins.pgcli_optuna_sweeper.optuna_sweeper.OptunaSweeper"
TRIAL_ENV = "PGCLI_TRIAL"
"""The trial number of the job (names and tags its runs)."""
STUDY_ENV = "PGCLI_OPTUNA_STUDY"
"""The study the job's trial belongs to."""
TRIAL_ID_ENV = "PGCLI_OPTUNA_TRIAL_ID"
"""The trial's id in the storage (what ``optuna.trial.Trial`` takes to report to a running trial)."""
BUDGET_KEYS = ("total_steps", "n_seeds", "eval.episodes")
"""What a trial's objective is measured on: one study, one budget."""
SAMPLERS = ("tpe", "random")
PRUNERS = ("none", "median", "hyperband")


class TrialPruned(StoppedEarly):
    """Raised from the evaluation hook when the study's pruner stops the trial (not an error); ``step`` is the run's
    (scheduled) env step of the evaluation that decided it. The run ends KILLED, tagged ``pruned``."""

    def __init__(self, trial: int, step: int, value: float) -> None:
        super().__init__(trial, step, value)
        self.trial, self.step, self.value = trial, step, value

    def tags(self) -> dict[str, str]:
        return {"pruned": "true", "pruned_at_step": str(self.step)}

    def __str__(self) -> str:
        return f"trial {self.trial} pruned at step {self.step} (evaluation return {self.value:.2f})"


@dataclass
class OptunaSearchConfig:
    """Settings of ``hydra/sweeper=optuna``: pgcli's Optuna sweeper (override as ``hydra.sweeper.<key>=...``)."""

    _target_: str = SWEEPER_TARGET
    direction: str = "maximize"
    """'maximize' or 'minimize' the job's return value (pgcli train: the mean final evaluation return)."""
    study_name: str | None = None
    """The study in ``storage``; a sweep with the same storage and study name resumes it (null: a new study)."""
    storage: str | None = None
    """Optuna storage URL, e.g. sqlite:///outputs/optuna.db (null: in memory, so no resuming and no pruning)."""
    n_trials: int = 20
    """Trials this sweep adds to the study."""
    n_jobs: int = 1
    """Trials launched together per batch (in parallel with hydra/launcher=joblib or ray)."""
    max_failure_rate: float = 0.0
    """Fraction of a batch's trials that may fail before the search stops (1.0: never stop; pruned is not failed)."""
    sampler: str = "tpe"
    """'tpe' (Bayesian, after n_startup_trials random ones) or 'random'."""
    seed: int | None = None
    """Sampler seed; each sweep seeds it with seed + the trials already in the study, so a resumed study draws new
    hyperparameters (null: unseeded)."""
    n_startup_trials: int = 10
    """tpe: random trials before TPE starts modelling the results."""
    allow_duplicates: bool = False
    """Run a parameter set a trial of the study already ran (false: it is recorded as a copy and the sampler asked
    again)."""
    pruner: str = "none"
    """'median', 'hyperband' or 'none': stop unpromising trials on their periodic evaluations (eval.every > 0)."""
    pruner_startup_trials: int = 5
    """median: no pruning until this many trials of the study have completed."""
    pruner_warmup_steps: int = 0
    """median: no pruning before this many env steps of a trial."""
    hyperband_min_resource: int = 0
    """hyperband: env steps a trial gets before its first pruning decision (0: eval.every)."""
    hyperband_reduction_factor: int = 3
    """hyperband: 1/factor of the trials go on at each rung."""
    params: dict[str, Any] = field(default_factory=dict)
    """The search space: config key -> Hydra sweep syntax, e.g. algo.gamma: choice(0.9, 0.99) or
    algo.learning_rate: tag(log, interval(1e-4, 1e-2)); a plain value is fixed for every trial."""

    def __post_init__(self) -> None:
        _one_of("hydra.sweeper.direction", self.direction, ("maximize", "minimize"))
        _one_of("hydra.sweeper.sampler", self.sampler, SAMPLERS)
        _one_of("hydra.sweeper.pruner", self.pruner, PRUNERS)
        for key in ("n_trials", "n_jobs", "n_startup_trials", "hyperband_reduction_factor"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hydra.sweeper.{key} must be >= 1 (got {getattr(self, key)})")
        for key in ("pruner_startup_trials", "pruner_warmup_steps", "hyperband_min_resource"):
            if getattr(self, key) < 0:
                raise ConfigError(f"hydra.sweeper.{key} must be >= 0 (got {getattr(self, key)})")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ConfigError(f"hydra.sweeper.max_failure_rate must be in [0, 1] (got {self.max_failure_rate})")
        if self.pruner != "none" and not self.storage:
            raise ConfigError(
                f"hydra.sweeper.pruner={self.pruner} needs a storage: the jobs report their evaluations through it "
                "(e.g. hydra.sweeper.storage=sqlite:///outputs/optuna.db)"
            )


def _one_of(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(options)} (got {value!r})")


# --------------------------------------------------------------------------------------------------------------------
# Search space
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class SearchSpace:
    """Optuna distributions for the swept keys, and the overrides every trial gets as they are."""

    distributions: dict[str, Any]
    fixed: list[str]

    @classmethod
    def parse(cls, params: Mapping[str, Any], arguments: list[str]) -> SearchSpace:
        """From ``hydra.sweeper.params`` and the command line's task overrides (``algo.gamma=choice(0.9,0.99)``
        there is a dimension too; a plain ``key=value`` is passed to every trial)."""
        from pgcli.config.overrides import Overrides

        lines = [f"{key}={value}" for key, value in params.items()] + list(arguments)
        parsed = Overrides.parse(lines, what="the search space")
        distributions, fixed = {}, []
        for i, override in enumerate(parsed):
            key = override.get_key_element()
            if key in BUDGET_KEYS and (i < len(params) or override.is_sweep_override()):
                raise ConfigError(
                    f"the search space sets {key}: that is the study's budget, the same for every trial; set it "
                    f"as a plain override ({key}=...), outside hydra.sweeper.params"
                )
            if override.is_sweep_override():
                distributions[key] = distribution(override)
            else:
                fixed.append(override.input_line or "")
        if not distributions:
            raise ConfigError("the Optuna search has no search space: set hydra.sweeper.params or key=choice(...)")
        return cls(distributions, fixed)

    def size(self) -> int | None:
        """How many distinct points the space has (None: a continuous dimension makes it infinite)."""
        n = 1
        for d in self.distributions.values():
            if hasattr(d, "choices"):
                n *= len(d.choices)
            elif d.step is not None and not getattr(d, "log", False):
                n *= round((d.high - d.low) / d.step) + 1
            else:
                return None
        return n

    def trial_overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's job overrides: the fixed ones, then its sampled values."""
        return [*self.fixed, *(f"{key}={value}" for key, value in params.items())]

    def first_point(self) -> dict[str, Any]:
        """One point of the space (each dimension's first choice or lower bound): to validate before searching."""
        return {key: d.choices[0] if hasattr(d, "choices") else d.low for key, d in self.distributions.items()}


def distribution(override: Any) -> Any:
    """An Optuna distribution for one Hydra sweep override.

    ``choice(a, b)`` is categorical; ``range(start, stop, step)`` is an int (or stepped float) range over the same
    values as Hydra's (``stop`` excluded); ``interval(low, high)`` is uniform over floats, ``int(interval(...))``
    over ints; ``tag(log, ...)`` makes an interval log-uniform. ``shuffle(...)`` is categorical.
    """
    from hydra.core.override_parser.types import Glob, IntervalSweep, RangeSweep, Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    key, value = override.get_key_element(), override.value()
    if isinstance(value, Glob):
        raise ConfigError(f"search space: {override.input_line} is not supported (use choice, range or interval)")
    if override.is_choice_sweep() or (isinstance(value, RangeSweep) and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator())
        if not values:
            raise ConfigError(f"search space: {override.input_line} is empty")
        if all(isinstance(v, int) for v in values):
            return IntDistribution(values[0], values[-1], step=int(value.step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(value.step))
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        low, high = value.start, value.end
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        if log and (low is None or low <= 0):
            raise ConfigError(f"search space: {key} is log-scaled, so its interval must start above 0 (got {low})")
        return FloatDistribution(float(low), float(high), log=log)  # type: ignore[arg-type]
    raise ConfigError(f"search space: {override.input_line} is not supported (use choice, range or interval)")


# --------------------------------------------------------------------------------------------------------------------
# Study: storage, budget, sampler, pruner
# --------------------------------------------------------------------------------------------------------------------


def storage_kwargs(url: str) -> dict[str, Any]:
    """RDBStorage arguments for ``url``: parallel jobs report into one SQLite file, so writers wait up to 60 s for
    the lock (Python's sqlite3 default is 5 s)."""
    return {"engine_kwargs": {"connect_args": {"timeout": 60}}} if url.startswith("sqlite:") else {}


def open_storage(url: str) -> Any:
    """An Optuna RDB storage; a storage that cannot be opened (an older Optuna's schema) is a one-line error."""
    import optuna

    from pgcli.sweeps.tree import prepare_optuna_storage

    prepare_optuna_storage(url)
    try:
        return optuna.storages.RDBStorage(url, **storage_kwargs(url))
    except (RuntimeError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot open the Optuna storage {url}: {str(exc).splitlines()[0]}") from None


def budget_of(config: Any) -> dict[str, Any]:
    """The budget of a search (:data:`BUDGET_KEYS`) from its composed config."""
    from omegaconf import OmegaConf

    return {key: OmegaConf.select(config, key) for key in BUDGET_KEYS}


def format_budget(budget: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in budget.items())


def check_budget(study: Any, budget: Mapping[str, Any], storage: str | None) -> None:
    """Bind ``study`` to ``budget`` (its first sweep stores it) or refuse a different one with a one-line error."""
    stored = study.user_attrs.get("budget")
    if stored is None:
        study.set_user_attr("budget", dict(budget))
        return
    refuse_other_budget(study.study_name, storage, stored, budget)


def refuse_other_budget(
    study_name: str, storage: str | None, stored: Mapping[str, Any], budget: Mapping[str, Any]
) -> None:
    """Raise the one-line error of a search whose budget differs from the study's."""
    if dict(stored) != dict(budget):
        raise ConfigError(
            f"study '{study_name}' in {storage} was run with {format_budget(stored)}; this search has "
            f"{format_budget(budget)}: trials with different budgets cannot be ranked together; use the study's "
            f"budget or another study (hydra.sweeper.study_name={study_name}_2)"
        )


def stored_budget(storage: str, study_name: str) -> dict[str, Any] | None:
    """The budget a study in an existing storage is bound to (None: no such study, or none recorded)."""
    import optuna

    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        return None  # nothing to check, and nothing is created before the search starts
    summaries = optuna.get_all_study_summaries(open_storage(storage), include_best_trial=False)
    for summary in summaries:
        if summary.study_name == study_name:
            return summary.user_attrs.get("budget")
    return None


def make_sampler(cfg: OptunaSearchConfig, n_existing: int) -> Any:
    """The study's sampler for this sweep: seeded with ``seed + n_existing`` so a resumed study draws new points."""
    import optuna

    seed = None if cfg.seed is None else cfg.seed + n_existing
    if cfg.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.n_startup_trials)


def make_pruner(cfg: OptunaSearchConfig, *, eval_every: int, max_resource: int) -> Any:
    """The study's pruner; the same in the sweeper and in every job.

    Intermediate values are reported at a trial's cumulative env steps (seed ``k`` of ``n_seeds`` adds
    ``k * total_steps``), so ``max_resource`` is ``n_seeds * total_steps``.
    """
    import optuna

    if cfg.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=cfg.pruner_startup_trials, n_warmup_steps=cfg.pruner_warmup_steps
        )
    if cfg.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=cfg.hyperband_min_resource or eval_every,
            max_resource=max_resource,
            reduction_factor=cfg.hyperband_reduction_factor,
        )
    return optuna.pruners.NopPruner()


def check_pruning(cfg: OptunaSearchConfig, config: Any) -> None:
    """A pruner needs periodic evaluations to act on."""
    from omegaconf import OmegaConf

    if cfg.pruner != "none" and not OmegaConf.select(config, "eval.every"):
        raise ConfigError(
            f"hydra.sweeper.pruner={cfg.pruner} prunes on the periodic evaluations, but eval.every=0; "
            "set eval.every (e.g. eval.every=10000) or hydra.sweeper.pruner=none"
        )


def check_search(overrides: list[str]) -> None:
    """Before ``pgcli train -m`` starts an Optuna search: its settings, one point of its search space (composed and
    validated like a job), pruning, and the budget of the study it would resume. Raises a one-line ConfigError;
    creates nothing. Other sweepers pass through."""
    from omegaconf import OmegaConf

    from pgcli.config.compose import hydra_compose, primary_overrides
    from pgcli.config.overrides import Overrides
    from pgcli.training.checks import train_config

    parsed = Overrides.parse(overrides)
    config = hydra_compose(primary_overrides(overrides), hydra_node=True)
    if OmegaConf.select(config, "hydra.sweeper._target_") != SWEEPER_TARGET:
        return
    cfg = search_config(config.hydra.sweeper)
    task = parsed.task().lines
    space = SearchSpace.parse(cfg.params, task)
    point = [f"{key}={value}" for key, value in space.first_point().items()]
    train_config([*space.fixed, *point])
    check_pruning(cfg, config)
    if cfg.storage and cfg.study_name:
        stored = stored_budget(cfg.storage, cfg.study_name)
        if stored is not None:
            refuse_other_budget(cfg.study_name, cfg.storage, stored, budget_of(config))


def search_config(node: Any) -> OptunaSearchConfig:
    """The sweeper's settings from its config node (``hydra.sweeper``), validated."""
    from omegaconf import OmegaConf

    settings = OmegaConf.to_container(node, resolve=True)
    assert isinstance(settings, dict)
    return OptunaSearchConfig(**{str(k): v for k, v in settings.items()})


# --------------------------------------------------------------------------------------------------------------------
# The job's side
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TrialLink:
    """The Optuna trial a job runs (from the variables the sweeper set for it), and where it reports."""

    number: int
    study_name: str
    trial_id: int
    storage: str | None
    pruner: Any
    max_step: int
    """Cumulative env steps of the trial's last evaluation (n_seeds * total_steps): pruning then would save nothing."""
    _trial: Any = field(default=None, repr=False)
    """The opened ``optuna.trial.Trial`` (on the first report)."""

    @classmethod
    def from_job(cls, sweeper: Any, *, n_seeds: int, total_steps: int, eval_every: int) -> TrialLink | None:
        """This job's trial: None outside an Optuna search (no :data:`TRIAL_ENV` in the environment)."""
        from omegaconf import OmegaConf

        if TRIAL_ENV not in os.environ or OmegaConf.select(sweeper, "_target_") != SWEEPER_TARGET:
            return None
        cfg = search_config(sweeper)
        max_step = n_seeds * total_steps
        return cls(
            number=int(os.environ[TRIAL_ENV]),
            study_name=os.environ[STUDY_ENV],
            trial_id=int(os.environ[TRIAL_ID_ENV]),
            storage=cfg.storage,
            pruner=make_pruner(cfg, eval_every=eval_every, max_resource=max_step),
            max_step=max_step,
        )

    def reporter(self, offset: int) -> Callable[[int, float], None] | None:
        """The evaluation hook of one seed's run (``offset``: env steps of the trial's earlier seeds); None when the
        study is in memory (another process's)."""
        if self.storage is None:
            return None
        return functools.partial(self.report, offset)

    def report(self, offset: int, step: int, value: float) -> None:
        """Report an evaluation at the trial's cumulative step; raise :class:`TrialPruned` if the pruner says so."""
        if math.isnan(value):
            return
        trial = self._open()
        at = offset + step
        trial.report(value, at)
        if at < self.max_step and trial.should_prune():
            raise TrialPruned(self.number, step, value)

    def _open(self) -> Any:
        if self._trial is None:
            import optuna

            assert self.storage is not None
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.load_study(
                study_name=self.study_name, storage=open_storage(self.storage), pruner=self.pruner
            )
            self._trial = optuna.trial.Trial(study, self.trial_id)
        return self._trial


def trial_env(study_name: str, number: int, trial_id: int) -> list[str]:
    """Job overrides that give a job its trial: Hydra sets ``hydra.job.env_set`` in whichever process runs the job."""
    quoted = "'" + study_name.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return [
        f"++hydra.job.env_set.{TRIAL_ENV}={number}",
        f"++hydra.job.env_set.{STUDY_ENV}={quoted}",
        f"++hydra.job.env_set.{TRIAL_ID_ENV}={trial_id}",
    ]
