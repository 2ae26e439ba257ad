"""The final text model of an earlier run named by an option (``init=<run>``, ``env.reward=rm:<run>``): found one way.

The run's final model is ``<run dir>/model/`` (``policy.pt`` with its ``agent.json``, the run's config). The option
may name the run directory, its ``model/`` directory, or the MLflow run id or a unique prefix of it (the run directory
is read where it exists on this machine, else the ``model`` artifact is downloaded from the store into
``<store_dir>/init/<run id>/``, under the whole id); a run named by id must be FINISHED. Every failure is one line
starting with the option as typed (:class:`ModelRef`). What is found is a model directory
(:class:`pgcli.lm.init.InitSource`): :mod:`pgcli.lm` builds policies and reward models from directories and never
reads a run itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import TextEnvConfig, TrackingConfig, TrainConfig
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

    how = ModelRef(reward_option(ref), kind="a reward-model run (pgcli rm)", doing="score with")
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


def locate_model(ref: str, tracking: TrackingConfig, how: ModelRef) -> InitSource:
    """The final text model of the run ``ref`` names (module docstring), for ``init=`` or another option that names a
    run (``how``: its words); one-line ConfigError when there is none."""
    from pgcli.lm.model import POLICY_FILE

    run = LoggedRun.locate(ref, store=lambda: _init_store(how.option, tracking), wording=how.wording())
    if run.record is None:  # a run directory, or its model directory
        assert run.run_dir is not None
        for candidate in (run.run_dir / "model", run.run_dir):
            if (candidate / POLICY_FILE).is_file():
                return InitSource(candidate.resolve(), _read_spec(candidate, how.option), run.run_id)
        raise ConfigError(
            f"{how.option}: {run.run_dir} holds no model/{POLICY_FILE}; pass {how.kind}'s directory or run id"
        )
    return _from_store(run, how, tracking)


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
    if run.run_dir is not None and (run.run_dir / "model" / POLICY_FILE).is_file():
        return InitSource(run.run_dir.resolve() / "model", _read_spec(run.run_dir / "model", how.option), run_id)
    cache = Path(tracking.store_dir) / "init" / run_id
    if not (cache / "model" / POLICY_FILE).is_file():
        run.store.download(run_id, "model", cache)
    if not (cache / "model" / POLICY_FILE).is_file():
        raise ConfigError(f"{how.option}: run {run_id} has no model/{POLICY_FILE} (was it {how.kind} of pgcli?)")
    return InitSource((cache / "model").resolve(), _read_spec(cache / "model", how.option), run_id)
