"""``init=<run id | run dir>``: start a text run from an SFT run's weights, which are also its KL reference.

The SFT run's final policy is ``<run dir>/model/policy.pt`` with its ``agent.json`` (the run's config): an
:class:`InitSource`. This module receives that model directory; the run ``init`` names is found by
:mod:`pgcli.training.references` (a run directory, its ``model/`` directory, or an MLflow run id).

The source must fit the new run: the same character vocabulary (the same task family), the same transformer sizes
(``n_layers``, ``n_heads``, ``d_model``, ``d_ff``, ``max_len``) and a task whose prompts fit that ``max_len``; a
mismatch is a one-line error naming the key, before anything is created (:func:`check_init`). ``pgcli train`` takes the
source's task settings and model sizes for every one of them the command line leaves out
(:func:`pgcli.training.pipeline.init_overrides`; docs/lm.md, "Starting RL from SFT"); :func:`start_from_init` builds
the run's policy and reference from the source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config import DatasetEnvConfig, HFModelConfig, TextEnvConfig, TrainConfig
from pgcli.errors import ConfigError
from pgcli.lm.load import TextModelConfig

if TYPE_CHECKING:
    import torch

    from pgcli.lm.model import CausalLM
    from pgcli.lm.tasks import TextTask

ARCHITECTURE = ("n_layers", "n_heads", "d_model", "d_ff", "max_len")
"""LMModelConfig fields that fix the shape of the weights."""
NOT_CARRIED = ("id", "reward", "format_reward")
"""``env.*`` fields a run from ``init`` does not take from the source: the task is the command line's (and must be
the source's), the reward is what RL optimises (SFT trains on none)."""


@dataclass(frozen=True)
class InitSource:
    """A text model directory of an earlier run: where a run's initial weights (or its learned reward) come from."""

    model_dir: Path
    """A directory with ``policy.pt`` and ``agent.json``."""
    spec: dict[str, Any]
    """Its ``agent.json``."""
    run_id: str | None
    """The run's MLflow run id (None for a ``tracking=off`` run)."""
    run_dir: Path | None = None
    """The run's directory on this machine, absolute (None when only the store has the run)."""


def same_model_path(a: str, b: str) -> bool:
    """Whether two ``model.path`` values name the same base model: the same hub id, or the same directory however
    it was typed (relative, with ``~``, through a link)."""
    if a == b:
        return True
    left, right = Path(a).expanduser(), Path(b).expanduser()
    return left.is_dir() and right.is_dir() and left.resolve() == right.resolve()


def source_model(source: InitSource) -> tuple[str, dict[str, Any]]:
    """The source run's model option (``hf`` or ``tiny_gpt``) and its logged model section."""
    model: dict[str, Any] = source.spec.get("config", {}).get("model", {})
    return ("hf" if "path" in model else "tiny_gpt"), model


def source_chars(source: InitSource) -> str | None:
    """A TinyGPT source's characters (its token ids): recorded with its model, or its puzzle's; None for model=hf."""
    from pgcli.config import TEXT_ENV_CONFIGS
    from pgcli.lm.tasks import make_puzzle

    if source_model(source)[0] == "hf":
        return None
    vocab = source.spec.get("vocab")
    if vocab:
        return str(vocab)
    src_env = source.spec.get("config", {}).get("env", {})
    schema = TEXT_ENV_CONFIGS.get(str(src_env.get("id")))
    return None if schema is None else make_puzzle(schema(**src_env)).chars


def check_init(source: InitSource, env: TextEnvConfig, model: TextModelConfig, init: str, algo: object = None) -> None:
    """Raise a one-line ConfigError when the source's weights cannot start a run of ``algo`` on ``env`` with
    ``model``."""
    from pgcli.config import TEXT_ENV_CONFIGS
    from pgcli.lm.tasks import make_puzzle

    src_env = source.spec.get("config", {}).get("env", {})
    src_schema = TEXT_ENV_CONFIGS.get(str(src_env.get("id")))
    if src_schema is None:
        raise ConfigError(f"init={init}: the source was not trained on a text task (env {src_env.get('id')!r})")
    kind, src_model = source_model(source)
    if kind != model.name:
        raise ConfigError(
            f"init={init}: the source is a model={kind} run and this run has model={model.name}; set model={kind}"
        )
    if isinstance(model, HFModelConfig):  # the tokenizer is the model's: any task; the base must be the same
        if not same_model_path(str(src_model.get("path")), model.path):
            raise ConfigError(
                f"init={init}: the source fine-tuned model.path={src_model.get('path')} and this run "
                f"has model.path={model.path}; set model.path={src_model.get('path')}"
            )
        from pgcli.lm.hf import check_weights_fit

        check_weights_fit(source.model_dir, model)  # the base may have changed since the source trained on it
        return
    if not isinstance(env, DatasetEnvConfig):
        _check_characters(source, env, init)
    ours = asdict(model)
    for key in ARCHITECTURE:
        if src_model.get(key) != ours[key]:
            raise ConfigError(
                f"init={init}: the source has model.{key}={src_model.get(key)}, this run "
                f"model.{key}={ours[key]}; set model.{key}={src_model.get(key)}"
            )
    if isinstance(env, DatasetEnvConfig):  # the rows in the source's characters, their prompts within max_len
        _check_rows_in(source, env, model, algo)
        return
    puzzle = make_puzzle(env)
    need = puzzle.max_prompt_chars + 1 + puzzle.max_answer_chars + 1  # BOS, EOS
    if need > model.max_len:
        sizes = " ".join(f"env.{key}={value}" for key, value in _task_sizes(env).items())
        raise ConfigError(
            f"init={init}: env={env.id} with {sizes} needs model.max_len >= {need}; the weights of the "
            f"init run have model.max_len={model.max_len}"
        )


def _check_rows_in(source: InitSource, env: DatasetEnvConfig, model: TextModelConfig, algo: object) -> None:
    """The rows read in the source's characters: as ``pgcli sft|rm`` reads them, or as an RL task."""
    from pgcli.lm.dataset_rows import on_rows, supervised_rows
    from pgcli.lm.load import make_text_task

    if on_rows(env, algo):
        supervised_rows(env, model, algo, recorded=source_chars(source))
    else:
        make_text_task(env, model, saved=source.spec)


def _check_characters(source: InitSource, env: TextEnvConfig, init: str) -> None:
    """A TinyGPT source reads the characters of ``env`` (a puzzle's) in the same order: the same token ids."""
    from pgcli.config import TEXT_ENV_CONFIGS
    from pgcli.lm.tasks import make_puzzle

    src_env = source.spec.get("config", {}).get("env", {})
    src_chars = source.spec.get("vocab") or make_puzzle(TEXT_ENV_CONFIGS[str(src_env.get("id"))](**src_env)).chars
    if src_chars != make_puzzle(env).chars:
        raise ConfigError(
            f"init={init}: the source was trained on env={src_env.get('id')}, whose characters differ "
            f"from env={env.id}'s; SFT on env={env.id} first"
        )


def _task_sizes(env: TextEnvConfig) -> dict[str, Any]:
    """The fields a task adds to :class:`TextEnvConfig` (``n_digits``; countdown's three): its problems' size."""
    base = {f.name for f in fields(TextEnvConfig)}
    return {f.name: getattr(env, f.name) for f in fields(env) if f.name not in base}


def start_from_init(
    cfg: TrainConfig, task: TextTask, device: torch.device, source: InitSource | None
) -> tuple[CausalLM, CausalLM | None, dict[str, str]]:
    """The policy (from ``source``, the model of the SFT run ``cfg.init`` names, when given), its frozen reference and
    the ``init`` tags (``source`` is found by :func:`pgcli.training.references.init_source`).

    The reference is the ``init`` model (a frozen copy; for LoRA the policy with its adapters off, no copy), or None
    without ``init`` (a trainer with a KL term then freezes a copy of its starting policy itself)."""
    import copy

    from pgcli.lm.load import make_text_policy

    assert isinstance(cfg.env, TextEnvConfig) and isinstance(cfg.model, TextModelConfig)  # TrainConfig's rules
    if source is not None:
        assert cfg.init is not None
        check_init(source, cfg.env, cfg.model, cfg.init, cfg.algo)
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
