"""What ``env.id`` and ``env.wrappers`` resolve to, and which spaces each trainer can take.

Everything here is light (gymnasium and numpy, never torch, SB3 or MLflow) and makes no env: it runs at validation
time, before any run directory, env or MLflow run exists (docs/configuration.md, "Validation"), through
:mod:`pgcli.training.checks`, and again when the env builder (:mod:`pgcli.envs.make`) resolves ids and wrappers.

- ``env.id`` is a registered gymnasium id (``CartPole-v1``) or ``module.path:EnvId-v0``; as ``gymnasium.make`` does,
  the module is imported first so that it can register the id. A module in the directory pgcli starts in is found.
- ``env.wrappers`` is a list of ``{_target_: module.Wrapper, arg: value, ...}``; each target must import, be callable
  and accept the arguments, and is applied as ``Wrapper(env, **args)``.
- :func:`takes` says whether an algorithm takes a space (the spaces of its row in the catalogue,
  :data:`pgcli.config.algos.ALGOS`); :func:`algos_taking` and :func:`describe_space` word the error when it cannot.
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

from pgcli.config.algos import ALGOS, AlgoEntry
from pgcli.errors import ConfigError

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


def takes(entry: AlgoEntry, role: str, space: spaces.Space) -> bool:
    """Whether the algorithm of ``entry`` takes ``space`` as its ``role`` (``observation`` or ``action``) space."""
    names = entry.observation_spaces if role == "observation" else entry.action_spaces
    if not isinstance(space, tuple(getattr(spaces, name) for name in names)):
        return False
    if role == "action" and entry.flat_box_actions and isinstance(space, spaces.Box):
        return len(space.shape) == 1
    return True


def algos_taking(role: str, space: spaces.Space) -> list[str]:
    """The algorithms (catalogue order) that take ``space`` as their ``role`` (``observation`` or ``action``) space."""
    return [name for name, entry in ALGOS.items() if takes(entry, role, space)]
