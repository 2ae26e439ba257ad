"""What ``env.id`` and ``env.wrappers`` resolve to, and which spaces each trainer can take.

Everything here is light (gymnasium and numpy, never torch, SB3 or MLflow) and makes no env: it runs at validation
time, before any run directory, env or MLflow run exists (docs/configuration.md, "Validation"), through
:mod:`pgcli.training.checks`, and again when the env builder (:mod:`pgcli.envs.make`) resolves ids and wrappers.

- ``env.id`` is a registered gymnasium id (``CartPole-v1``) or ``module.path:EnvId-v0``; as ``gymnasium.make`` does,
  the module is imported first so that it can register the id. A module in the directory pgcli starts in is found.
- ``env.wrappers`` is a list of ``{_target_: module.Wrapper, arg: value, ...}``; each target must import, be callable
  and accept the arguments, and is applied as ``Wrapper(env, **args)``.
- :data:`OBSERVATION_SPACES` and :data:`ACTION_SPACES` say which spaces each trainer takes; :func:`algos_taking` and
  :func:`describe_space` word the error when one cannot.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from pgcli.errors import ConfigError

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
