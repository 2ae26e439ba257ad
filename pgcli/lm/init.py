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
from typing import Any

from pgcli.config import LMModelConfig, TextEnvConfig, TrackingConfig
from pgcli.errors import ConfigError

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

    path = Path(init).expanduser()
    if path.exists():
        for candidate in (path / "model", path):
            if (candidate / POLICY_FILE).is_file():
                run_id = _run_id_of(candidate.parent if candidate != path else path)
                return InitSource(candidate.resolve(), _read_spec(candidate, init), run_id)
        raise ConfigError(f"init={init}: {path} holds no model/{POLICY_FILE}; pass an SFT run's directory or run id")
    return _from_store(init, tracking)


def _run_id_of(run_dir: Path) -> str | None:
    from pgcli.training.run import read_run_file

    info = read_run_file(run_dir) or {}
    run_id = info.get("run_id")
    return str(run_id) if run_id else None


def _read_spec(model_dir: Path, init: str) -> dict[str, Any]:
    from pgcli.agent import AGENT_FILE

    try:
        spec: dict[str, Any] = json.loads((model_dir / AGENT_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"init={init}: cannot read {model_dir / AGENT_FILE} ({type(exc).__name__})") from None
    if spec.get("backend") != "text":
        raise ConfigError(f"init={init}: {model_dir} is not a text policy (trained on env {spec.get('env')!r})")
    return spec


def _from_store(init: str, tracking: TrackingConfig) -> InitSource:
    from pgcli.lm.model import POLICY_FILE
    from pgcli.tracking.backend import open_run_store, resolve_tracking_target

    looks_like_id = len(init) == 32 and all(c in "0123456789abcdef" for c in init)
    if not looks_like_id or tracking.backend != "mlflow":
        raise ConfigError(f"init={init}: no such run directory (and not an MLflow run id)")
    uri = resolve_tracking_target(tracking).uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"init={init}: no tracking store at {uri} to look the run up in")
    store = open_run_store(tracking)
    record = store.find(init) if store is not None else None
    if store is None or record is None:
        raise ConfigError(f"init={init}: no run with this id in {uri}; pass the run directory, or tracking.uri=...")
    if record.status != "FINISHED":
        raise ConfigError(f"init={init}: run {init} is {record.status}, not FINISHED; its final model may be missing")
    run_dir = Path(record.tags.get("output_dir", ""))
    if record.tags.get("output_dir") and (run_dir / "model" / POLICY_FILE).is_file():
        return InitSource(run_dir.resolve() / "model", _read_spec(run_dir / "model", init), init)
    cache = Path(tracking.store_dir) / "init" / init
    if not (cache / "model" / POLICY_FILE).is_file():
        store.download(init, "model", cache)
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
