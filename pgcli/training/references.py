"""The final text model of an earlier run named by an option (``init=<run>``, ``env.reward=rm:<run>``): found one way.

The run's final model is ``<run dir>/model/`` (``policy.pt`` with its ``agent.json``, the run's config). The option
may name the run directory, its ``model/`` directory, or the MLflow run id or a unique prefix of it (the run directory
is read where it exists on this machine, else the ``model`` artifact is downloaded from the store into
``<store_dir>/init/<run id>/``, under the whole id). The run must be FINISHED whichever form names it: by id its
record says so, by directory its ``run.json`` (a run directory without one, or a bare model directory, has no status
to check); a run of a control env is refused from its record, before anything is downloaded. Every failure is one
line starting with the option as typed (:class:`ModelRef`). What is found is a model directory
(:class:`pgcli.lm.init.InitSource`): :mod:`pgcli.lm` builds policies and reward models from directories and never
reads a run itself.

A reference is resolved once per process (:func:`locate_model` keeps what it found) and a new run records it whole
(:func:`pin_references`): the absolute run directory when the run is on this machine, else the whole run id, and an
existing ``model.path`` directory or rows file (``env.path``, ``env.eval_path``) as an absolute path; so ``pgcli
eval``, ``init=`` of that run and its MLflow Model work from any directory, and ``resume=`` finds the same runs
(:func:`recorded_references`: the model directory and run id the run was tagged with).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import TEXT_ENV_CONFIGS, TextEnvConfig, TrackingConfig, TrainConfig
from pgcli.config.overrides import Overrides, override_key
from pgcli.config.text import REWARD_MODEL_PREFIX
from pgcli.errors import ConfigError
from pgcli.lm.init import InitSource
from pgcli.lm.learned_reward import check_reward_model, load_learned_reward, reward_model_ref, reward_option
from pgcli.lm.load import TextModelConfig
from pgcli.tracking.status import FINISHED
from pgcli.training.logged import LoggedRun, Wording

if TYPE_CHECKING:
    import torch

    from pgcli.lm.tasks import LearnedReward
    from pgcli.tracking.store import RunStore


SAFE_VALUE = re.compile(r"[A-Za-z0-9_.@+-]*[/:][A-Za-z0-9_./:@+-]*")
"""A value Hydra's override parser reads back as the same string unquoted: a path, or ``rm:`` and a path (a bare run
id is quoted: Hydra would read ``12345678...`` as a number)."""


@dataclass(frozen=True)
class ModelRef:
    """How a command option names another run's final model in its one-line errors: ``init=<run>`` or
    ``env.reward=rm:<run>``."""

    option: str
    """The option as typed, ``init=abc12345``: every error starts with it."""
    kind: str = "an SFT run"
    """The run it should name, as the errors say it."""
    doing: str = "start from"
    """What the run uses the model for (:attr:`pgcli.training.logged.Wording.doing`)."""
    algo: str | None = None
    """The algo the run must have trained (``rm``), checked on a stored run's record before anything is downloaded."""

    def wording(self) -> Wording:
        """The errors of a reference that names no run (``{ref}``/``{uri}`` filled by :meth:`LoggedRun.locate`)."""
        option = self.option.replace("{", "{{").replace("}", "}}")
        return Wording(
            not_a_run=f"{option}: no such run directory (and not an MLflow run id)",
            no_store=f"{option}: no such run directory (and not an MLflow run id)",
            not_found=f"{option}: no run with this id in {{uri}}; pass the run directory, or tracking.uri=...",
            doing=self.doing,
        )


def locate_init(init: str, tracking: TrackingConfig) -> InitSource:
    """The model directory ``init=<run>`` names (:mod:`pgcli.lm.init`); one-line ConfigError when there is none."""
    return locate_model(init, tracking, ModelRef(f"init={init}"))


def init_source(cfg: TrainConfig) -> InitSource | None:
    """The model directory a run starts from (``cfg.init``, for :func:`pgcli.lm.init.start_from_init`); None without
    ``init``."""
    return None if cfg.init is None else locate_init(cfg.init, cfg.tracking)


def locate_reward_model(ref: str, tracking: TrackingConfig) -> InitSource:
    """The final model of the reward-model run ``ref`` names; one-line ConfigError when there is none, the run did
    not finish, or it is not a ``pgcli rm`` run."""
    from pgcli.lm.reward_model import REWARD_HEAD_FILE

    how = ModelRef(reward_option(ref), kind="a reward-model run (pgcli rm)", doing="score with", algo="rm")
    source = locate_model(ref, tracking, how)
    algo = source.spec.get("algo")
    if algo != "rm" or not (source.model_dir / REWARD_HEAD_FILE).is_file():
        raise ConfigError(
            f"{how.option}: {source.model_dir} is the model of an algo={algo} run, not a reward model; "
            f"train one with pgcli rm env={source.spec.get('env')}"
        )
    return source


def learned_reward(
    env: TextEnvConfig, model: TextModelConfig, tracking: TrackingConfig, device: torch.device
) -> tuple[LearnedReward | None, dict[str, str]]:
    """The learned reward ``env.reward`` names (None for the checker or a function) and the run's tags recording it
    (``reward_model``: its model directory; ``reward_model_run_id``)."""
    ref = reward_model_ref(env.reward)
    if ref is None:
        return None, {}
    source = locate_reward_model(ref, tracking)
    check_reward_model(source, env, model, ref)
    tags = {"reward_model": str(source.model_dir), "reward_model_run_id": source.run_id or ""}
    return load_learned_reward(source, device), tags


_FOUND: dict[tuple[str, str, str], InitSource] = {}
"""What :func:`locate_model` found in this process, by (reference, tracking config, working directory): the checks
before a run, the run and the record of its references see one resolution."""


def locate_model(ref: str, tracking: TrackingConfig, how: ModelRef) -> InitSource:
    """The final text model of the run ``ref`` names (module docstring), for ``init=`` or another option that names a
    run (``how``: its words); one-line ConfigError when there is none, or its run did not finish."""
    key = (ref, repr(tracking), os.getcwd())
    if key not in _FOUND:
        run = LoggedRun.locate(ref, store=lambda: _init_store(how.option, tracking), wording=how.wording())
        _FOUND[key] = _from_directory(run, how) if run.record is None else _from_store(run, how, tracking)
    return _FOUND[key]


def _from_directory(run: LoggedRun, how: ModelRef) -> InitSource:
    """The model of a run named by its run directory or its ``model/`` directory; the run must have ended FINISHED
    (its ``run.json``), as a run named by id must."""
    from pgcli.lm.model import POLICY_FILE
    from pgcli.training.run import read_run_file

    assert run.run_dir is not None
    found = [c for c in (run.run_dir / "model", run.run_dir) if (c / POLICY_FILE).is_file()]
    if not found:
        raise ConfigError(
            f"{how.option}: {run.run_dir} holds no model/{POLICY_FILE}; pass {how.kind}'s directory or run id"
        )
    model_dir = found[0].resolve()
    run_dir = model_dir.parent if model_dir.name == "model" else model_dir
    info = read_run_file(run_dir)
    if info is None:  # a model directory outside a run (copied): nothing says how its run ended
        return InitSource(model_dir, _read_spec(model_dir, how.option), None, run_dir)
    run_id = str(info["run_id"]) if info.get("run_id") else None
    status = _recorded_status(run_id, info)
    if status is not None and status != FINISHED:
        raise ConfigError(
            f"{how.option}: run {run_id or run_dir} is {status}, not FINISHED; its final model may be missing"
        )
    return InitSource(model_dir, _read_spec(model_dir, how.option), run_id, run_dir)


def _recorded_status(run_id: str | None, info: Mapping[str, Any]) -> str | None:
    """How the run of a run directory ended: its record's status in the local store its ``run.json`` names (what a
    run id would be checked by: ``pgcli runs --stale`` marks a dead run KILLED there), else ``run.json``'s."""
    from pgcli.tracking.uri import file_store_path, sqlite_path, store_exists

    uri = str(info.get("tracking_uri") or "")
    local = sqlite_path(uri) is not None or file_store_path(uri) is not None
    if run_id is not None and local and store_exists(uri):
        from pgcli.tracking.store import RunStore

        record = RunStore(uri).find(run_id)
        if record is not None:
            return record.status
    status = info.get("status")
    return None if status is None else str(status)


def pinned(source: InitSource) -> str:
    """How a run records a reference it resolved to ``source``: the absolute run directory when it is on this machine
    (it outlives the run's record in a store), else the whole run id."""
    if source.run_dir is not None:
        return str(source.run_dir)
    return source.run_id or str(source.model_dir)


def _read_spec(model_dir: Path, option: str) -> dict[str, Any]:
    from pgcli.config.saved_agent import AGENT_FILE

    try:
        spec: dict[str, Any] = json.loads((model_dir / AGENT_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{option}: cannot read {model_dir / AGENT_FILE} ({type(exc).__name__})") from None
    if spec.get("backend") != "text":
        raise ConfigError(f"{option}: {model_dir} is not a text policy (trained on env {spec.get('env')!r})")
    return spec


def _init_store(option: str, tracking: TrackingConfig) -> RunStore | None:
    """The store to look a run id up in; None with ``tracking=off``; a missing SQLite file is an error here (opening
    it would create one)."""
    from pgcli.tracking.store import open_run_store
    from pgcli.tracking.uri import resolve_tracking_target

    if tracking.backend != "mlflow":
        return None
    uri = resolve_tracking_target(tracking).uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"{option}: no tracking store at {uri} to look the run up in")
    return open_run_store(tracking)


def _from_store(run: LoggedRun, how: ModelRef, tracking: TrackingConfig) -> InitSource:
    """The final model of a run named by id (or a prefix of it: the option as typed names it in messages only): from its
    run directory where it is here, else downloaded from its ``model`` artifact into ``<store_dir>/init/<run id>/``
    (kept: the next run starting from it reads it there, whichever prefix names it)."""
    from pgcli.lm.model import POLICY_FILE

    assert run.record is not None and run.store is not None
    run_id = run.record.run_id
    if run.record.status != FINISHED:
        raise ConfigError(
            f"{how.option}: run {run_id} is {run.record.status}, not FINISHED; its final model may be missing"
        )
    _check_record(run.record.tags, run_id, how)
    if run.run_dir is not None and (run.run_dir / "model" / POLICY_FILE).is_file():
        run_dir = run.run_dir.resolve()
        return InitSource(run_dir / "model", _read_spec(run_dir / "model", how.option), run_id, run_dir)
    cache = Path(tracking.store_dir) / "init" / run_id
    if not (cache / "model" / POLICY_FILE).is_file():
        run.store.download(run_id, "model", cache)
    if not (cache / "model" / POLICY_FILE).is_file():
        raise ConfigError(f"{how.option}: run {run_id} has no model/{POLICY_FILE} (was it {how.kind} of pgcli?)")
    return InitSource((cache / "model").resolve(), _read_spec(cache / "model", how.option), run_id)


def _check_record(tags: Mapping[str, str], run_id: str, how: ModelRef) -> None:
    """A stored run's tags show a run of another kind (a control env, another algo): refused before its model is
    read or downloaded."""
    env_id, algo = tags.get("env_id"), tags.get("algo")
    if env_id is not None and env_id not in TEXT_ENV_CONFIGS:
        raise ConfigError(
            f"{how.option}: run {run_id} trained on env {env_id}, not a text task; pass {how.kind} (its run id or "
            "directory)"
        )
    if how.algo is not None and algo is not None and algo != how.algo:
        raise ConfigError(
            f"{how.option}: run {run_id} is an algo={algo} run, not {how.kind}; "
            f"train one with pgcli {how.algo} env={tags.get('env', env_id)}"
        )


PINNED_KEYS = ("init", "env.reward", "model.path", "env.path", "env.eval_path")
"""The overrides that name another run, a model directory or a rows file (``env=dataset``): :func:`pin_references`
writes them whole."""
LOCAL_PATH_KEYS = ("model.path", "env.path", "env.eval_path")
"""The references that are a local path or a hub id: an existing path is written absolute, a hub id as typed."""


def pin_references(overrides: list[str], tracking: TrackingConfig) -> list[str]:
    """``overrides`` with each reference set to one value written whole, in place (module docstring): ``init=<run>``
    and ``env.reward=rm:<run>`` as :func:`pinned` (the run found as the checks found it), an existing ``model.path``
    directory or ``env.path`` / ``env.eval_path`` file or directory as its absolute path. A hub id, a swept value and
    every other override are kept as typed."""
    if not any(override_key(line) in PINNED_KEYS for line in overrides):
        return overrides
    lines = []
    for override in Overrides.parse(overrides):
        line = override.input_line or ""
        value = None if override.is_sweep_override() else override.value()
        if override.key_or_group in PINNED_KEYS and isinstance(value, str):
            whole = _pinned_value(override.key_or_group, value, tracking)
            if whole != value:
                line = f"{line.partition('=')[0]}={override_value(whole)}"
        lines.append(line)
    return lines


def _pinned_value(key: str, value: str, tracking: TrackingConfig) -> str:
    if key in LOCAL_PATH_KEYS:
        local = Path(value).expanduser()
        return str(local.resolve()) if local.exists() else value
    if key == "init":
        return pinned(locate_init(value, tracking))
    ref = reward_model_ref(value)
    return value if ref is None else f"{REWARD_MODEL_PREFIX}{pinned(locate_reward_model(ref, tracking))}"


def override_value(text: str) -> str:
    """``text`` as the value of a Hydra override: as it is when Hydra reads it back unchanged, else quoted."""
    if SAFE_VALUE.fullmatch(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def recorded_references(tags: Mapping[str, str]) -> list[str]:
    """The overrides a resumed run finds its references with: the model directory it was tagged with (``init``,
    ``reward_model``) while it is on this machine, else the whole run id it was tagged with; none for a run that
    recorded none (``tracking=off``: its config holds them whole, :func:`pin_references`)."""
    lines = []
    for option, dir_tag, id_tag, prefix in (("init", "init", "init_run_id", ""), *_REWARD_TAGS):
        where = tags.get(dir_tag, "")
        whole = where if where and Path(where).is_dir() else tags.get(id_tag, "")
        if whole:
            lines.append(f"{option}={override_value(prefix + whole)}")
    return lines


_REWARD_TAGS = (("env.reward", "reward_model", "reward_model_run_id", REWARD_MODEL_PREFIX),)
