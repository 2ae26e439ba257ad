"""The checks of a run's config that need the world, run once, right after composition, before anything is created.

:mod:`pgcli.config` decides whether the *values* follow their rules; this module decides whether what they name exists
here and fits together (docs/configuration.md, "Validation"):

- a gymnasium env: ``env.id`` is registered (its ``module:`` imported), each of ``env.wrappers`` resolves and takes
  its arguments, and the trainer takes the spaces of one throwaway env built exactly as training builds it, with no
  continuous-only option on discrete actions; an image env's package is installed (``pgcli[pixels]``) and its
  frames fit ``model.arch``;
- a text task: ``env.reward`` names a function, the held-out set is at most half of the task's distinct prompts, and
  prompt + completion fit ``model.max_len``; your rows (``env=dataset``): the source, its columns, its prompts and
  their lengths, the reward against the columns (the rows are read here, once per process); ``model=hf``:
  ``model.path`` is a model directory or a hub id in the local cache, and its LoRA targets exist;
- ``hardware=cuda``: a GPU is visible.

Every run takes its config through here: :func:`train_config` (overrides), :func:`job_config` (a composed
``DictConfig``, as the Hydra job and resume have it) and :func:`validate_overrides` (every job of a command line,
before the first starts). Each failure is one line, a :class:`~pgcli.errors.ConfigError`. Nothing imports torch, SB3
or MLflow unless ``hardware=cuda`` asks for a GPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import gymnasium as gym
from gymnasium import spaces

from pgcli.config import (
    DatasetEnvConfig,
    EnvConfig,
    HFModelConfig,
    TextEnvConfig,
    TrainConfig,
)
from pgcli.config.algos import algo_entry
from pgcli.config.compose import compose_train_config, job_overrides, to_train_config
from pgcli.config.pixels import MIN_FRAME_SIZE, CNNModelConfig
from pgcli.config.rules import require
from pgcli.envs.make import wrap_env
from pgcli.envs.pixels import missing_package, quiet_ale
from pgcli.envs.spec import algos_taking, check_wrapper, describe_space, registered_id, takes
from pgcli.errors import ConfigError
from pgcli.hardware.placement import select_device
from pgcli.lm.dataset_rows import check_rows, on_rows
from pgcli.lm.learned_reward import check_reward_model, reward_model_ref
from pgcli.lm.tasks import make_puzzle, resolve_reward
from pgcli.training.references import locate_reward_model

if TYPE_CHECKING:
    from omegaconf import DictConfig

FLATTEN_HINT = "env.wrappers=[{_target_: gymnasium.wrappers.FlattenObservation}]"


def train_config(overrides: list[str]) -> TrainConfig:
    """The checked :class:`~pgcli.config.TrainConfig` a run of ``overrides`` trains with (one-line ConfigError)."""
    return check_world(compose_train_config(overrides))


def job_config(cfg: DictConfig) -> TrainConfig:
    """The checked :class:`~pgcli.config.TrainConfig` of an already composed config (a Hydra job's, resume's)."""
    return check_world(to_train_config(cfg))


def validate_overrides(overrides: list[str], *, multirun: bool = False) -> None:
    """Compose and check the config of every job these overrides describe; raise a one-line ConfigError.

    A grid sweep (``a=1,2 b=x,y``) is expanded and each job checked, so a bad value in the fourth job stops the sweep
    before the first starts. Sweeper-specific syntax (Optuna's ``interval(...)``) is left to the sweeper.
    """
    for job in job_overrides(overrides, multirun=multirun):
        train_config(job)


def check_world(cfg: TrainConfig, *, device: bool = True) -> TrainConfig:
    """``cfg``, once the env or task it names exists here and fits the trainer, and its device is available.

    Args:
        cfg: a composed config (its value rules already passed).
        device: check ``hardware.device`` too; False where nothing runs on it (``pgcli train --help``).

    Raises:
        ConfigError: one line naming what does not exist or fit, and the fix.
    """
    if isinstance(cfg.env, TextEnvConfig):
        check_text_task(cfg)
    else:
        check_env(cfg.env)
        check_spaces(cfg)
        check_frames(cfg)
    if device and cfg.hardware.device == "cuda":
        select_device(cfg.hardware)  # imports torch: only when a GPU is asked for
    return cfg


# --------------------------------------------------------------------------------------------------------------------
# gymnasium envs
# --------------------------------------------------------------------------------------------------------------------


def check_env(env: EnvConfig) -> None:
    """``env.id`` is registered (its module imported) and every wrapper resolves and takes its arguments; no env is
    made here."""
    missing = missing_package(env.id)  # an ALE or MinAtar id without its package: the install command, not an import
    if missing is not None:
        raise missing
    registered_id(env.id)
    for index, spec in enumerate(env.wrappers):
        check_wrapper(index, spec)


def check_spaces(cfg: TrainConfig) -> None:
    """Reject an env the chosen trainer cannot take and options that need continuous actions on a discrete env.

    Raises:
        ConfigError: one line naming the space and the algorithms that can take it, or the option and why.
    """
    probed = probe_spaces(cfg.env)
    if probed is None:
        return
    obs_space, action_space = probed
    entry, env_id = algo_entry(cfg.algo), cfg.env.id
    if not takes(entry, "observation", obs_space):
        able = algos_taking("observation", obs_space)
        raise _unsupported("observation", env_id, obs_space, entry.name, able, f"flatten it with {FLATTEN_HINT}")
    if not takes(entry, "action", action_space):
        able = algos_taking("action", action_space)
        raise _unsupported("action", env_id, action_space, entry.name, able, "wrap the env to expose a supported space")
    if cfg.env.normalize_obs and not isinstance(obs_space, spaces.Box):
        raise ConfigError(
            f"env.normalize_obs=true needs a Box observation space; {env_id!r} has {describe_space(obs_space)}; "
            "set env.normalize_obs=false"
        )
    if isinstance(action_space, spaces.Box):
        return
    actions = describe_space(action_space)
    if getattr(cfg.algo, "use_sde", False):  # SB3's gSDE (algo=ppo, a2c, sb3_trpo)
        raise ConfigError(
            f"algo.use_sde=true needs continuous (Box) actions; {env_id!r} has {actions} actions; "
            "set algo.use_sde=false"
        )
    if cfg.model.log_std_init != 0.0:
        raise ConfigError(
            f"model.log_std_init={cfg.model.log_std_init} only sets the std of continuous (Box) actions; {env_id!r} "
            f"has {actions} actions; drop the override"
        )


def check_frames(cfg: TrainConfig) -> None:
    """An image env's observations are frames, (C, H, W) uint8, large enough for ``model.arch`` (docs/pixels.md)."""
    probed = probe_spaces(cfg.env)
    if cfg.env.pixels is None or probed is None or not isinstance(cfg.model, CNNModelConfig):
        return
    obs_space, env_id, arch = probed[0], cfg.env.id, cfg.model.arch
    if not (isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 3 and obs_space.dtype == "uint8"):
        raise ConfigError(
            f"env.id {env_id!r}: env.wrappers turn its frames into {describe_space(obs_space)}; "
            "model=cnn takes (C, H, W) uint8 frames"
        )
    need = MIN_FRAME_SIZE["minatar" if arch == "auto" else arch]
    if min(obs_space.shape[1:]) < need:
        raise ConfigError(
            f"model.arch={arch} needs frames of {need}x{need} px or more; env.id {env_id!r} gives "
            f"{describe_space(obs_space)}; use {archs_for(min(obs_space.shape[1:]))}"
        )


def archs_for(side: int) -> str:
    """The ``model.arch`` values for frames of ``side`` px (the error of :func:`check_frames`)."""
    if side >= MIN_FRAME_SIZE["minatar"]:
        return "model.arch=auto (MinAtar's network for frames under 36 px) or model.arch=impala"
    return "model.arch=impala (any size)"


def _unsupported(kind: str, env_id: str, space: spaces.Space, algo: str, able: list[str], fix: str) -> ConfigError:
    can = f"algo={', '.join(able)} can" if able else f"no pgcli algorithm can; {fix}"
    return ConfigError(
        f"env.id {env_id!r} has a {describe_space(space)} {kind} space, which algo={algo} cannot take; {can}"
    )


_PROBED: dict[str, tuple[spaces.Space, spaces.Space] | None] = {}


def probe_spaces(cfg: EnvConfig) -> tuple[spaces.Space, spaces.Space] | None:
    """(observation, action) space of one sub-env as training builds it, or None when the env does not build.

    A throwaway env is made and closed; nothing is written. Results are cached per env config, so checking every
    job of a sweep, and again in each job, builds each distinct env once.
    """
    key = json.dumps(asdict(cfg), sort_keys=True, default=repr)
    if key not in _PROBED:
        _PROBED[key] = _probe(cfg)
    return _PROBED[key]


def _probe(cfg: EnvConfig) -> tuple[spaces.Space, spaces.Space] | None:
    try:
        quiet_ale(cfg.id)
        base = gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **dict(cfg.kwargs))
    except Exception:
        # The env itself does not build (e.g. a kwarg its constructor rejects). That is left to the run, which ends
        # FAILED with the env's own error (a sweep's bad job fails alone, docs/sweeps.md); no spaces to check.
        return None
    try:
        env = wrap_env(base, cfg)  # our wrappers and the user's, exactly as every sub-env of the run
    except BaseException:
        base.close()
        raise
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------------
# text tasks
# --------------------------------------------------------------------------------------------------------------------


def check_text_task(cfg: TrainConfig) -> None:
    """``env.reward`` resolves (a function, or a finished reward-model run that reads this run's text), the held-out
    set leaves the task prompts to train on, and the longest prompt plus its completion fit ``model.max_len``."""
    env: TextEnvConfig = cfg.env
    if on_rows(env, cfg.algo):  # pgcli sft|rm env=dataset: rows, not an RL task
        check_rows(env, cfg.model, cfg.algo)
        return
    if isinstance(env, DatasetEnvConfig):
        check_dataset_task(cfg, env)
        return
    resolve_reward(env.reward)
    ref = reward_model_ref(env.reward)
    if ref is not None:  # env.reward=rm:<run> (docs/lm.md, "RL on a learned reward")
        check_reward_model(locate_reward_model(ref, cfg.tracking), env, cfg.model, ref)
    puzzle = make_puzzle(env)
    distinct = puzzle.n_distinct
    require(
        env.n_eval <= distinct // 2,
        "env.n_eval",
        env.n_eval,
        f"<= half of the {distinct} distinct {env.name} prompts",
        "lower env.n_eval or make the task larger",
    )
    if isinstance(cfg.model, HFModelConfig):  # imports torch and transformers: only for model=hf
        from pgcli.lm.model_files import check_hf_files

        check_hf_files(cfg.model)  # what needs no torch, first: a missing file or LoRA target
        from pgcli.lm.hf import check_hf_model

        check_hf_model(cfg.model)
        return
    need = puzzle.max_prompt_chars + 1 + puzzle.max_answer_chars + 1  # BOS, EOS
    require(
        cfg.model.max_len >= need,
        "model.max_len",
        cfg.model.max_len,
        f">= {need} (env={env.id}: BOS + prompt + completion + EOS)",
        f"set model.max_len={need} or more",
    )


def check_dataset_task(cfg: TrainConfig, env: DatasetEnvConfig) -> None:
    """Your rows (``env=dataset``): the model exists (``model=hf``), the source and the split are there and not
    empty, the prompt column exists and holds strings or message lists, ``env.reward`` fits the columns (``math``
    needs the answer column), every prompt plus the completion budget fits the model's context, and a learned reward
    reads them; all by building the task (:func:`pgcli.lm.load.make_text_task`), whose rows are then read once per
    process."""
    from pgcli.lm.load import make_text_task

    if isinstance(cfg.model, HFModelConfig):  # imports torch and transformers: only for model=hf
        from pgcli.lm.model_files import check_hf_files

        check_hf_files(cfg.model)  # what needs no torch, first: a missing file or LoRA target
        from pgcli.lm.hf import check_hf_model

        check_hf_model(cfg.model)
    make_text_task(env, cfg.model)
    ref = reward_model_ref(env.reward)
    if ref is not None:  # env.reward=rm:<run> (docs/lm.md, "RL on a learned reward")
        check_reward_model(locate_reward_model(ref, cfg.tracking), env, cfg.model, ref)
