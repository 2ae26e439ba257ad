"""``init=<run id | run dir>``: start a text run from an SFT run's weights, which are also its KL reference.

The SFT run's final policy is ``<run dir>/model/policy.pt`` with its ``agent.json`` (the run's config). ``init`` may
name the run directory, its ``model/`` directory, or the MLflow run id or a unique prefix of it (the run directory is
read where it exists on this machine, else the ``model`` artifact is downloaded from the store into
``<store_dir>/init/<run id>/``, under the whole id).

The source must fit the new run: the same character vocabulary (the same task family), the same transformer sizes
(``n_layers``, ``n_heads``, ``d_model``, ``d_ff``, ``max_len``) and a task whose prompts fit that ``max_len``; a
mismatch is a one-line error naming the key, before anything is created. ``pgcli train`` takes the source's task
settings and model sizes for every one of them the command line leaves out (:func:`init_overrides`; docs/lm.md,
"Starting RL from SFT"). The source is found by :func:`pgcli.lm.locate.locate_model`; :func:`start_from_init` builds the
run's policy and reference from it.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from pgcli.config import (
    HFModelConfig,
    LMModelConfig,
    TextEnvConfig,
    TrackingConfig,
    TrainConfig,
)
from pgcli.errors import ConfigError
from pgcli.lm.load import TextModelConfig
from pgcli.lm.locate import InitSource, ModelRef, locate_model

if TYPE_CHECKING:
    import torch

    from pgcli.lm.model import CausalLM
    from pgcli.lm.tasks import TextTask

ARCHITECTURE = ("n_layers", "n_heads", "d_model", "d_ff", "max_len")
"""LMModelConfig fields that fix the shape of the weights."""
NOT_CARRIED = ("id", "reward", "format_reward")
"""``env.*`` fields a run from ``init`` does not take from the source: the task is the command line's (and must be
the source's), the reward is what RL optimises (SFT trains on none)."""


def locate_init(init: str, tracking: TrackingConfig) -> InitSource:
    """The model directory ``init`` names (module docstring); one-line ConfigError when there is none."""
    return locate_model(init, tracking, ModelRef(f"init={init}"))


def _source_model(source: InitSource) -> tuple[str, dict[str, Any]]:
    """The source run's model option (``hf`` or ``tiny_gpt``) and its logged model section."""
    model: dict[str, Any] = source.spec.get("config", {}).get("model", {})
    return ("hf" if "path" in model else "tiny_gpt"), model


def check_init(source: InitSource, env: TextEnvConfig, model: TextModelConfig, init: str) -> None:
    """Raise a one-line ConfigError when the source's weights cannot start a run on ``env`` with ``model``."""
    from pgcli.config import TEXT_ENV_CONFIGS
    from pgcli.lm.tasks import make_puzzle

    src_env = source.spec.get("config", {}).get("env", {})
    src_schema = TEXT_ENV_CONFIGS.get(str(src_env.get("id")))
    if src_schema is None:
        raise ConfigError(f"init={init}: the source was not trained on a text task (env {src_env.get('id')!r})")
    kind, src_model = _source_model(source)
    if kind != model.name:
        raise ConfigError(f"init={init}: the source is a model={kind} run and this run has model={model.name}; "
                          f"set model={kind}")  # fmt: skip
    if isinstance(model, HFModelConfig):  # the tokenizer is the model's: any task; the base must be the same
        if src_model.get("path") != model.path:
            raise ConfigError(f"init={init}: the source fine-tuned model.path={src_model.get('path')} and this run "
                              f"has model.path={model.path}; set model.path={src_model.get('path')}")  # fmt: skip
        return
    src_chars = make_puzzle(src_schema(**src_env)).chars
    if src_chars != make_puzzle(env).chars:
        raise ConfigError(f"init={init}: the source was trained on env={src_env.get('id')}, whose characters differ "
                          f"from env={env.id}'s; SFT on env={env.id} first")  # fmt: skip
    ours = asdict(model)
    for key in ARCHITECTURE:
        if src_model.get(key) != ours[key]:
            raise ConfigError(f"init={init}: the source has model.{key}={src_model.get(key)}, this run "
                              f"model.{key}={ours[key]}; set model.{key}={src_model.get(key)}")  # fmt: skip
    puzzle = make_puzzle(env)
    need = puzzle.max_prompt_chars + 1 + puzzle.max_answer_chars + 1  # BOS, EOS
    if need > model.max_len:
        sizes = " ".join(f"env.{key}={value}" for key, value in _task_sizes(env).items())
        raise ConfigError(f"init={init}: env={env.id} with {sizes} needs model.max_len >= {need}; the weights of the "
                          f"init run have model.max_len={model.max_len}")  # fmt: skip


def _task_sizes(env: TextEnvConfig) -> dict[str, Any]:
    """The fields a task adds to :class:`TextEnvConfig` (``n_digits``; countdown's three): its problems' size."""
    base = {f.name for f in fields(TextEnvConfig)}
    return {f.name: getattr(env, f.name) for f in fields(env) if f.name not in base}


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
    if cfg.init is None or not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, TextModelConfig):
        return
    check_init(locate_init(cfg.init, cfg.tracking), cfg.env, cfg.model, cfg.init)


def init_overrides(overrides: list[str]) -> list[str]:
    """The overrides ``pgcli train`` adds for ``init=<run>``: the source's task settings (``env.*`` but the task and
    its reward) and model sizes (:data:`ARCHITECTURE`), each where it differs from what the command line composes to
    and the command line does not set it; announced in one ``pgcli: note:`` line on stderr.

    A 2-digit SFT model thus trains 2-digit addition unless ``env.n_digits`` is typed. The resulting config is checked
    against the source (:func:`check_init`) and the world (:func:`pgcli.training.checks.check_world`) first, so a
    setting the weights cannot take is one ConfigError and no note. Nothing is added for an ``init`` swept over
    (each job checks its own) or under ``--from-run`` (the logged run's values stand).
    """
    if not any(o.split("=", 1)[0].lstrip("+") == "init" for o in overrides):
        return []  # no init= typed: nothing to parse or import (every `pgcli train` passes here)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pgcli.config.compose import compose_train_config
    from pgcli.training.checks import check_world
    from pgcli.training.from_run import FROM_RUN_GROUP

    parsed = OverridesParser.create().parse_overrides(overrides)
    typed = {o.key_or_group for o in parsed}
    if not any(o.key_or_group == "init" and not o.is_sweep_override() for o in parsed) or FROM_RUN_GROUP in typed:
        return []
    lines = [o.input_line or "" for o in parsed if not o.is_sweep_override()]
    cfg = compose_train_config(lines)
    if cfg.init is None or not isinstance(cfg.env, TextEnvConfig) or not isinstance(cfg.model, TextModelConfig):
        return []
    init = cfg.init
    source = locate_init(init, cfg.tracking)
    carried = _model_choice(source, typed) + _differing(source, cfg.env, cfg.model, typed)
    if carried:
        cfg = compose_train_config([*lines, *carried])
    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # the same groups as above
    check_init(source, cfg.env, cfg.model, init)
    check_world(cfg, device=False)
    if carried:
        print(f"pgcli: note: init={init} sets {' '.join(carried)} (the init run's model and task settings; "
              "a value on the command line wins)", file=sys.stderr, flush=True)  # fmt: skip
    return carried


def _model_choice(source: InitSource, typed: set[str]) -> list[str]:
    """``model=hf model.path=<base>`` for a source fine-tuned from a Hugging Face model, unless ``model`` is typed (a
    text task implies ``model=tiny_gpt`` otherwise)."""
    kind, src_model = _source_model(source)
    if kind != "hf" or "model" in typed:
        return []
    return ["model=hf", *([] if "model.path" in typed else [f"model.path={src_model.get('path')}"])]


def _differing(source: InitSource, env: TextEnvConfig, model: TextModelConfig, typed: set[str]) -> list[str]:
    """``key=value`` for each of the source's task settings and model sizes that differs from ``env`` and ``model``
    and is not among the ``typed`` keys."""
    logged = source.spec.get("config", {})
    ours = {"env": asdict(env), "model": asdict(model)}
    sizes = set(ARCHITECTURE) if isinstance(model, LMModelConfig) else set()
    wanted = {"env": set(ours["env"]) - set(NOT_CARRIED), "model": sizes}
    return [
        f"{group}.{key}={value}"
        for group in ("env", "model")
        for key, value in logged.get(group, {}).items()
        if key in wanted[group]
        and f"{group}.{key}" not in typed
        and isinstance(value, int)
        and value != ours[group][key]
    ]


def start_from_init(
    cfg: TrainConfig, task: TextTask, device: torch.device
) -> tuple[CausalLM, CausalLM | None, dict[str, str]]:
    """The policy (from ``init``, an SFT run's model, when given), its frozen reference and the ``init`` tags.

    The reference is the ``init`` model (a frozen copy; for LoRA the policy with its adapters off, no copy), or None
    without ``init`` (a trainer with a KL term then freezes a copy of its starting policy itself)."""
    import copy

    from pgcli.lm.load import make_text_policy

    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # TrainConfig's rules
    source = None if cfg.init is None else locate_init(cfg.init, cfg.tracking)
    if source is not None:
        assert cfg.init is not None
        check_init(source, cfg.env, cfg.model, cfg.init)
    policy = make_text_policy(task, cfg.model, device, None if source is None else source.model_dir)
    reference: CausalLM | None = None
    if isinstance(cfg.model, HFModelConfig) and cfg.model.lora.r > 0:
        from pgcli.lm.hf import AdapterOff, HFCausalLM

        assert isinstance(policy, HFCausalLM)
        reference = AdapterOff(policy)
    elif source is not None:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if source is None:
        return policy, reference, {}
    return policy, reference, {"init": str(source.model_dir), "init_run_id": source.run_id or ""}
