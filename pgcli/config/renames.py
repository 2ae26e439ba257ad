"""Algo keys renamed since commands were written and runs logged: the old names still work, each with a note.

A schema lists its renamed keys in a ``renamed`` class attribute, old -> new (``TRPOConfig.renamed``: pgcli's TRPO
took sb3-contrib's names). The old name is read as the new one wherever a user types or replays it: a command line's
overrides (:func:`renamed_overrides`, a pass of :mod:`pgcli.training.pipeline`), a logged run's config
(:func:`renamed_section`: ``--from-run``, ``resume=``, ``pgcli eval``) and its MLflow params (:func:`renamed_params`:
``pgcli compare``). Each rename is announced once per process in a ``pgcli: note:`` line on stderr; giving a key under
both names is a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pgcli.config.algos import ALGOS
from pgcli.config.overrides import Overrides, split_override
from pgcli.errors import ConfigError

_NOTED: set[str] = set()
"""The old keys this process has announced (each is announced once)."""


def renamed_keys(algo: str) -> Mapping[str, str]:
    """Old key -> key now of the algo option ``algo`` (empty for an algo with no renamed key, or no such algo)."""
    entry = ALGOS.get(algo)
    return getattr(entry.schema, "renamed", {}) if entry is not None else {}


def old_keys() -> set[str]:
    """Every renamed key of every algo (``algo.`` left out)."""
    return {old for name in ALGOS for old in renamed_keys(name)}


def note_renamed(pairs: Iterable[tuple[str, str]], where: str = "") -> None:
    """Print one ``pgcli: note:`` line for the ``(old, new)`` algo keys not announced yet (``where``: whose keys)."""
    fresh = dict((old, new) for old, new in pairs if old not in _NOTED)
    if not fresh:
        return
    _NOTED.update(fresh)
    renames = ", ".join(f"algo.{old} is now algo.{new}" for old, new in fresh.items())
    still = "the old name still works" if len(fresh) == 1 else "the old names still work"
    print(f"pgcli: note: {where}{renames} (SB3's vocabulary); {still}", file=sys.stderr)


def renamed_overrides(lines: Sequence[str], algos: Sequence[str] | None = None) -> list[str]:
    """``lines`` with every old algo key renamed (prefix and value kept), announced once per key.

    Only keys the chosen algo renamed are touched (``algo.vf_learning_rate`` is VPG's own name). ``algos``: the algo
    options of the job(s) (None: read from ``lines``, see :func:`_chosen_algos`). A key typed under its old and its
    new name, or renamed under some swept algos and not others, is a one-line ConfigError.
    """
    olds = old_keys()
    typed = [(i, *split_override(line)) for i, line in enumerate(lines)]
    hits = [(i, prefix, key[len("algo.") :], value) for i, prefix, key, value in typed if _is_old(key, olds)]
    if not hits:
        return list(lines)  # every `pgcli train` passes here: no parsing, no composing
    chosen = list(algos) if algos is not None else _chosen_algos([line for line in lines if not _is_old_line(line)])
    out, pairs = list(lines), []
    keys = {key for _, _, key, _ in typed}
    for i, prefix, old, value in hits:
        new = _new_name(old, chosen)
        if new is None:
            continue
        if f"algo.{new}" in keys:
            raise ConfigError(
                f"algo.{old} and algo.{new} are one setting (algo.{old} is its old name); give only algo.{new}"
            )
        out[i] = f"{prefix}algo.{new}={value}" if "=" in lines[i] else f"{prefix}algo.{new}"
        pairs.append((old, new))
    note_renamed(pairs)
    return out


def renamed_section(algo: str, section: Any, where: str = "") -> Any:
    """A logged ``algo`` section with its old keys renamed (announced once per key); anything else as it is."""
    renames = renamed_keys(algo)
    if not isinstance(section, Mapping) or not any(old in section for old in renames):
        return section
    note_renamed([(old, renames[old]) for old in section if old in renames], where)
    # a key under both names (never logged so) keeps the new one's value
    return {renames.get(k, k): v for k, v in section.items() if not (k in renames and renames[k] in section)}


def renamed_params(params: Mapping[str, str], where: str = "") -> dict[str, str]:
    """A run's MLflow params with its algo's old keys renamed (``algo.cg_iters`` -> ``algo.cg_max_steps`` for a TRPO
    run logged before the rename), announced once per key."""
    section = {key[len("algo.") :]: value for key, value in params.items() if key.startswith("algo.")}
    renamed = renamed_section(params.get("algo", ""), section, where)
    if renamed is section:
        return dict(params)
    return {
        **{k: v for k, v in params.items() if not k.startswith("algo.")},
        **{f"algo.{k}": v for k, v in renamed.items()},
    }


def renamed_key(key: str) -> str:
    """A config key as compared runs are keyed (``pgcli compare --group-by``): ``algo.<old>`` as its new name when
    some algo renamed it and no algo has it as a key of its own (announced once); any other key as it is."""
    old = key[len("algo.") :]
    news = {renamed_keys(algo)[old] for algo in ALGOS if old in renamed_keys(algo)}
    own = any(old in _keys(algo) for algo in ALGOS)
    if not key.startswith("algo.") or len(news) != 1 or own:
        return key
    (new,) = news
    note_renamed([(old, new)])
    return f"algo.{new}"


def _new_name(old: str, algos: Sequence[str]) -> str | None:
    """The name ``algo.<old>`` has now under ``algos`` (a sweep's); None where it is no algo's old name."""
    news = {algo: renamed_keys(algo)[old] for algo in algos if old in renamed_keys(algo)}
    keeps = [algo for algo in algos if old in _keys(algo)]
    if len(set(news.values())) > 1 or (news and keeps):
        renamed = ", ".join(f"the old name of algo.{new} under algo={algo}" for algo, new in news.items())
        own = "".join(f"a key of algo={algo}, " for algo in keeps)
        raise ConfigError(f"algo.{old} is {own}{renamed}: sweep these algos in separate commands")
    return next(iter(news.values()), None)


def _keys(algo: str) -> set[str]:
    """The keys of the algo option ``algo`` (empty for no such algo)."""
    entry = ALGOS.get(algo)
    return {f.name for f in dataclasses.fields(entry.schema)} if entry is not None else set()  # type: ignore[arg-type]


def _is_old(key: str, olds: set[str]) -> bool:
    return key.startswith("algo.") and key[len("algo.") :] in olds


def _is_old_line(line: str) -> bool:
    return _is_old(split_override(line)[1], old_keys())


def _chosen_algos(lines: list[str]) -> list[str]:
    """The algo options ``lines`` train: the ``algo=`` typed (each value of a sweep over it), else the one the config
    composes to (the default, or an ``hparams_search`` that picks it); [] when it does not compose."""
    from hydra.errors import HydraException

    from pgcli.config.compose import hydra_compose

    parsed = Overrides.parse(lines)
    typed = [o for o in parsed if o.key_or_group == "algo" and "=" in (o.input_line or "")]
    if typed:
        if not typed[-1].is_sweep_override():
            return [str(typed[-1].value())]
        try:
            return [str(v) for v in typed[-1].sweep_string_iterator()]
        except HydraException:  # glob() or interval() over algo: no choices to name
            return []

    try:
        return [str(hydra_compose(parsed.fixed(), hydra_node=True).hydra.runtime.choices.algo)]
    except ConfigError:  # validation reports what does not compose
        return []
