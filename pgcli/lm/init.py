"""``init=<run id | run dir>``: start a text run from an SFT run's weights, which are also its KL reference.

The SFT run's final policy is ``<run dir>/model/policy.pt`` with its ``agent.json`` (the run's config). ``init`` may
name the run directory, its ``model/`` directory, or the MLflow run id (the run directory is read where it exists on
this machine, else the ``model`` artifact is downloaded from the store into ``<store_dir>/init/<run id>/``).

The source must fit the new run: the same character vocabulary (the same task family) and the same transformer sizes
(``n_layers``, ``n_heads``, ``d_model``, ``d_ff``, ``max_len``); a mismatch is a one-line error naming the key, before
anything is created.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import LMModelConfig, TextEnvConfig, TrackingConfig
from pgcli.errors import ConfigError
from pgcli.training.logged import LoggedRun, Wording

if TYPE_CHECKING:
    from pgcli.tracking.store import RunStore

INIT = Wording(
    not_a_run="init={ref}: no such run directory (and not an MLflow run id)",
    no_store="init={ref}: no such run directory (and not an MLflow run id)",
    not_found="init={ref}: no run with this id in {uri}; pass the run directory, or tracking.uri=...",
)
ARCHITECTURE = ("n_layers", "n_heads", "d_model", "d_ff", "max_len")
"""LMModelConfig fields that fix the shape of the weights."""


@dataclass(frozen=True)
class InitSource:
    """Where the initial weights come from."""

    model_dir: Path
    """A directory with ``policy.pt`` and ``agent.json``."""
    spec: dict[str, Any]
    """Its ``agent.json``."""
    run_id: str | None
    """The SFT run's MLflow run id (None for a ``tracking=off`` run)."""


def locate_init(init: str, tracking: TrackingConfig) -> InitSource:
    """The model directory ``init`` names (module docstring); one-line ConfigError when there is none."""
    from pgcli.lm.model import POLICY_FILE

    run = LoggedRun.locate(init, store=lambda: _init_store(init, tracking), wording=INIT)
    if run.record is None:  # a run directory, or its model directory
        assert run.run_dir is not None
        for candidate in (run.run_dir / "model", run.run_dir):
            if (candidate / POLICY_FILE).is_file():
                return InitSource(candidate.resolve(), _read_spec(candidate, init), run.run_id)
        raise ConfigError(
            f"init={init}: {run.run_dir} holds no model/{POLICY_FILE}; pass an SFT run's directory or run id"
        )
    return _from_store(run, init, tracking)


def _read_spec(model_dir: Path, init: str) -> dict[str, Any]:
    from pgcli.agent import AGENT_FILE

    try:
        spec: dict[str, Any] = json.loads((model_dir / AGENT_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"init={init}: cannot read {model_dir / AGENT_FILE} ({type(exc).__name__})") from None
    if spec.get("backend") != "text":
        raise ConfigError(f"init={init}: {model_dir} is not a text policy (trained on env {spec.get('env')!r})")
    return spec


def _init_store(init: str, tracking: TrackingConfig) -> RunStore | None:
    """The store to look a run id up in; None with ``tracking=off``; a missing SQLite file is an error here (opening
    it would create one)."""
    from pgcli.tracking.store import open_run_store
    from pgcli.tracking.uri import resolve_tracking_target

    if tracking.backend != "mlflow":
        return None
    uri = resolve_tracking_target(tracking).uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"init={init}: no tracking store at {uri} to look the run up in")
    return open_run_store(tracking)


def _from_store(run: LoggedRun, init: str, tracking: TrackingConfig) -> InitSource:
    """The final model of a run named by id: from its run directory where it is here, else downloaded from its
    ``model`` artifact into ``<store_dir>/init/<run id>/`` (kept: the next run starting from it reads it there)."""
    from pgcli.lm.model import POLICY_FILE

    assert run.record is not None and run.store is not None
    if run.record.status != "FINISHED":
        raise ConfigError(
            f"init={init}: run {init} is {run.record.status}, not FINISHED; its final model may be missing"
        )
    if run.run_dir is not None and (run.run_dir / "model" / POLICY_FILE).is_file():
        return InitSource(run.run_dir.resolve() / "model", _read_spec(run.run_dir / "model", init), init)
    cache = Path(tracking.store_dir) / "init" / init
    if not (cache / "model" / POLICY_FILE).is_file():
        run.store.download(init, "model", cache)
    if not (cache / "model" / POLICY_FILE).is_file():
        raise ConfigError(f"init={init}: run {init} has no model/{POLICY_FILE} (was it an SFT run of pgcli?)")
    return InitSource((cache / "model").resolve(), _read_spec(cache / "model", init), init)


def check_init(source: InitSource, env: TextEnvConfig, model: LMModelConfig, init: str) -> None:
    """Raise a one-line ConfigError when the source's weights cannot start a run on ``env`` with ``model``."""
    from pgcli.lm.tasks import make_puzzle

    cfg = source.spec.get("config", {})
    src_env, src_model = cfg.get("env", {}), cfg.get("model", {})
    from pgcli.config import TEXT_ENV_CONFIGS

    src_schema = TEXT_ENV_CONFIGS.get(str(src_env.get("id")))
    if src_schema is None:
        raise ConfigError(f"init={init}: the source was not trained on a text task (env {src_env.get('id')!r})")
    src_chars = make_puzzle(src_schema(**src_env)).chars
    if src_chars != make_puzzle(env).chars:
        raise ConfigError(f"init={init}: the source was trained on env={src_env.get('id')}, whose characters differ "
                          f"from env={env.id}'s; SFT on env={env.id} first")  # fmt: skip
    ours = asdict(model)
    for key in ARCHITECTURE:
        if src_model.get(key) != ours[key]:
            raise ConfigError(f"init={init}: the source has model.{key}={src_model.get(key)}, this run "
                              f"model.{key}={ours[key]}; set model.{key}={src_model.get(key)}")  # fmt: skip


def check_init_overrides(overrides: list[str]) -> None:
    """``pgcli train``'s check of ``init=<run>`` before Hydra or MLflow create anything: the source exists and fits.

    Only an ``init`` given as one value is checked here (a sweep over ``init`` is checked by each job when it builds).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pgcli.config.compose import compose_train_config

    parsed = OverridesParser.create().parse_overrides(overrides)
    if not any(o.key_or_group == "init" and not o.is_sweep_override() for o in parsed):
        return
    cfg = compose_train_config([o.input_line or "" for o in parsed if not o.is_sweep_override()])
    if cfg.init is None or not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, LMModelConfig):
        return
    check_init(locate_init(cfg.init, cfg.tracking), cfg.env, cfg.model, cfg.init)
