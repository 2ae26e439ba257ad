"""What ``env.id`` and ``env.wrappers`` resolve to, and whether the chosen trainer can take the env's spaces.

Everything here runs at validation time, before any run directory, env or MLflow run exists (issue 9 item 1, issue 10
item 3), and stays light: gymnasium and numpy, never torch, SB3 or MLflow.

- ``env.id`` is a registered gymnasium id (``CartPole-v1``) or ``module.path:EnvId-v0``; as ``gymnasium.make`` does,
  the module is imported first so that it can register the id. A module in the directory pgcli starts in is found.
- ``env.wrappers`` is a list of ``{_target_: module.Wrapper, arg: value, ...}``; each target must import, be callable
  and accept the arguments, and is applied as ``Wrapper(env, **args)``.
- :func:`check_train_config` builds one throwaway env exactly as training will (``pgcli.envs.make.make_env``), reads its
  spaces, closes it, and rejects spaces or options the chosen trainer cannot take, with one line naming the space and
  the algorithms that can.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium import spaces

from pgcli.errors import ConfigError

if TYPE_CHECKING:
    from pgcli.config import EnvConfig, TrainConfig

OWN_TRAINERS = ("trpo", "vpg", "ppo_kl", "grpo")
"""pgcli's own PyTorch trainers: an MLP on a flat Box observation; Categorical or diagonal-Gaussian actions."""
SB3_TRAINERS = ("ppo", "a2c", "sb3_trpo")
"""SB3 / sb3-contrib with ``MlpPolicy`` (one-hot for discrete observations; no Dict or Tuple observations)."""

OBSERVATION_SPACES: dict[str, tuple[type[spaces.Space], ...]] = {
    **{name: (spaces.Box,) for name in OWN_TRAINERS},
    **{name: (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary) for name in SB3_TRAINERS},
}
"""Observation spaces each trainer takes. A Box of any rank is flattened to 1-D by ``make_env`` first."""
ACTION_SPACES: dict[str, tuple[type[spaces.Space], ...]] = {
    **{name: (spaces.Discrete, spaces.Box) for name in OWN_TRAINERS},
    **{name: (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary) for name in SB3_TRAINERS},
}
"""Action spaces each trainer takes (SB3's ``supported_action_spaces``; ours need a 1-D Box)."""

FLATTEN_HINT = "env.wrappers=[{_target_: gymnasium.wrappers.FlattenObservation}]"


# --------------------------------------------------------------------------------------------------------------------
# env.id and env.wrappers
# --------------------------------------------------------------------------------------------------------------------


def import_module(name: str) -> Any:
    """``importlib.import_module``, also finding modules in the working directory.

    The ``pgcli`` console script's ``sys.path`` starts with its own bin directory, not the folder it runs in, so a
    user's ``mypkg/envs.py`` next to their configs would not import. The working directory is appended (never
    prepended: it cannot shadow an installed package) when a module is not found otherwise.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        cwd = os.getcwd()
        if cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(name)


def _import_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def registered_id(env_id: str) -> str:
    """The registry id of ``env_id`` (``module:EnvId-v0`` -> ``EnvId-v0``), importing the module when there is one.

    Raises:
        ConfigError: the module does not import, or the id is not registered (with did-you-mean).
    """
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            import_module(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"env.id {env_id!r}: cannot import module {module!r} ({exc}); run pgcli from the folder that "
                "contains it, or install it"
            ) from None
        except Exception as exc:
            raise ConfigError(f"env.id {env_id!r}: importing {module!r} failed: {_import_error(exc)}") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.pprint_registry()"
        where = f"; module {module!r} did not register it" if module else ""
        raise ConfigError(f"env.id {env_id!r} is not a registered gymnasium environment{where}; {hint}")
    return name


def resolve_target(path: str) -> Any:
    """The object a ``_target_`` such as ``gymnasium.wrappers.FrameStackObservation`` names (ImportError if none)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{path!r} is not a dotted path (module.Name)")
    module = import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f"; did you mean {module_name}.{close[0]}?" if close else ""
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}{hint}") from None


def check_wrapper(index: int, spec: Any) -> tuple[Any, dict[str, Any]]:
    """Validate ``env.wrappers[index]``: the wrapper callable and its keyword arguments.

    Raises:
        ConfigError: not a mapping with a ``_target_``; the target does not import or is not callable; or it does not
            accept these arguments (named with the arguments it does accept).
    """
    key = f"env.wrappers[{index}]"
    if not isinstance(spec, Mapping) or not isinstance(spec.get("_target_"), str):
        raise ConfigError(
            f"{key} must be a mapping with a _target_ (got {spec!r}); e.g. "
            "{_target_: gymnasium.wrappers.FrameStackObservation, stack_size: 4}"
        )
    target, args = spec["_target_"], {k: v for k, v in spec.items() if k != "_target_"}
    try:
        wrapper = resolve_target(target)
    except Exception as exc:
        raise ConfigError(f"{key} {target}: cannot import it ({_import_error(exc)})") from None
    if not callable(wrapper):
        raise ConfigError(f"{key} {target} is not callable (a {type(wrapper).__name__}); name a wrapper class")
    try:
        signature = inspect.signature(wrapper)
    except (TypeError, ValueError):  # some builtins have no signature: the probe env still calls it
        return wrapper, args
    named = [p.name for p in list(signature.parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    accepts = f"it takes: {', '.join(named)}" if named else "it takes no arguments besides the env"
    if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        for name in args:
            if name not in named:
                close = difflib.get_close_matches(name, named, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                raise ConfigError(f"{key} {target}: no argument {name!r} ({hint}{accepts})")
    try:
        signature.bind(None, **args)  # None stands for the env, the first argument
    except TypeError as exc:
        raise ConfigError(f"{key} {target}: {exc} ({accepts})") from None
    return wrapper, args


def apply_wrappers(env: gym.Env, wrappers: list[dict[str, Any]]) -> gym.Env:
    """``env`` wrapped by each of ``env.wrappers`` in order; a wrapper that raises is a one-line ConfigError."""
    for index, spec in enumerate(wrappers):
        wrapper, args = check_wrapper(index, spec)
        try:
            env = wrapper(env, **args)
        except Exception as exc:
            call = f"{spec['_target_']}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
            raise ConfigError(f"env.wrappers[{index}] {call} failed: {_import_error(exc)}") from None
        if not isinstance(env, gym.Env):
            raise ConfigError(f"env.wrappers[{index}] {spec['_target_']} returned a {type(env).__name__}, not an env")
    return env


# --------------------------------------------------------------------------------------------------------------------
# spaces: what each trainer can take
# --------------------------------------------------------------------------------------------------------------------


def describe_space(space: spaces.Space) -> str:
    """A short, one-line description of a space: ``Box(4, 4) float32``, ``Discrete(3)``, ``Dict(pos, goal)``."""
    if isinstance(space, spaces.Box):
        return f"Box({', '.join(map(str, space.shape))}) {space.dtype}"
    if isinstance(space, spaces.Discrete):
        return f"Discrete({space.n})"
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        return f"{type(space).__name__}({', '.join(map(str, space.shape))})"
    if isinstance(space, spaces.Dict):
        return f"Dict({', '.join(space.spaces)})"
    if isinstance(space, spaces.Tuple):
        return f"Tuple({len(space.spaces)} spaces)"
    return type(space).__name__


def algos_taking(table: dict[str, tuple[type[spaces.Space], ...]], space: spaces.Space) -> list[str]:
    """The algorithms whose entry in ``table`` takes ``space`` (ours also need a 1-D Box for actions)."""
    out = []
    for name, kinds in table.items():
        ok = isinstance(space, kinds)
        if ok and table is ACTION_SPACES and name in OWN_TRAINERS and isinstance(space, spaces.Box):
            ok = len(space.shape) == 1
        if ok:
            out.append(name)
    return out


def _unsupported(kind: str, env_id: str, space: spaces.Space, algo: str, able: list[str], fix: str) -> ConfigError:
    can = f"algo={', '.join(able)} can" if able else f"no pgcli algorithm can; {fix}"
    return ConfigError(
        f"env.id {env_id!r} has a {describe_space(space)} {kind} space, which algo={algo} cannot take; {can}"
    )


_PROBED: dict[str, tuple[spaces.Space, spaces.Space] | None] = {}


def _probe(cfg: EnvConfig) -> tuple[spaces.Space, spaces.Space] | None:
    from pgcli.envs.make import wrap_env

    try:
        base = gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **dict(cfg.kwargs))
    except Exception:
        # The env itself does not build (e.g. a kwarg its constructor rejects). That is left to the run, which ends
        # FAILED with the env's own error (issue 5: a sweep's bad job fails alone); there are no spaces to check.
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


def probe_spaces(cfg: EnvConfig) -> tuple[spaces.Space, spaces.Space] | None:
    """(observation, action) space of one sub-env as training builds it, or None when the env does not build.

    A throwaway env is made and closed; nothing is written. Results are cached per env config, so validating every
    job of a sweep, and again in each job, builds each distinct env once.
    """
    from dataclasses import asdict

    key = json.dumps(asdict(cfg), sort_keys=True, default=repr)
    if key not in _PROBED:
        _PROBED[key] = _probe(cfg)
    return _PROBED[key]


def check_train_config(cfg: TrainConfig) -> None:
    """Reject an env the chosen trainer cannot take and options that need continuous actions on a discrete env.

    Raises:
        ConfigError: one line naming the space and the algorithms that can take it, or the option and why.
    """
    from pgcli.config import A2CConfig, PPOConfig, SB3TRPOConfig

    probed = probe_spaces(cfg.env)
    if probed is None:
        return
    obs_space, action_space = probed
    algo, env_id = type(cfg.algo).name, cfg.env.id
    if not isinstance(obs_space, OBSERVATION_SPACES[algo]):
        able = algos_taking(OBSERVATION_SPACES, obs_space)
        raise _unsupported("observation", env_id, obs_space, algo, able, f"flatten it with {FLATTEN_HINT}")
    if algo not in algos_taking(ACTION_SPACES, action_space):
        able = algos_taking(ACTION_SPACES, action_space)
        raise _unsupported("action", env_id, action_space, algo, able, "wrap the env to expose a supported space")
    if cfg.env.normalize_obs and not isinstance(obs_space, spaces.Box):
        raise ConfigError(
            f"env.normalize_obs=true needs a Box observation space; {env_id!r} has {describe_space(obs_space)}; "
            "set env.normalize_obs=false"
        )
    if isinstance(action_space, spaces.Box):
        return
    actions = describe_space(action_space)
    if isinstance(cfg.algo, (PPOConfig, A2CConfig, SB3TRPOConfig)) and cfg.algo.use_sde:
        raise ConfigError(
            f"algo.use_sde=true needs continuous (Box) actions; {env_id!r} has {actions} actions; "
            "set algo.use_sde=false"
        )
    if cfg.model.log_std_init != 0.0:
        raise ConfigError(
            f"model.log_std_init={cfg.model.log_std_init} only sets the std of continuous (Box) actions; {env_id!r} "
            f"has {actions} actions; drop the override"
        )
