"""A command line's ``key=value`` overrides, parsed once with Hydra's own parser: :class:`Overrides`.

Every module that asks what a command line sets (its keys, its group choices, which values are swept) asks an
:class:`Overrides` instead of splitting strings itself. :func:`split_override` and :func:`override_key` read one
override as text, for the paths that run before anything is parsed and must not import Hydra (``pgcli train --help``,
the budget note of every job).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgcli.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

PREFIXES = "+~"
"""Hydra's override prefixes: ``+key=`` appends, ``++key=`` appends or changes, ``~key`` deletes."""


def split_override(line: str) -> tuple[str, str, str]:
    """``(prefix, key, value)`` of one override read as text: ``++env.kwargs.a=1`` -> ``("++", "env.kwargs.a",
    "1")``, ``~preset`` -> ``("~", "preset", "")`` (the value as typed, quotes and sweeps included)."""
    head, _, value = line.partition("=")
    key = head.lstrip(PREFIXES)
    return head[: len(head) - len(key)], key.strip(), value


def override_key(line: str) -> str:
    """The key of one override without Hydra's ``+``/``++``/``~`` prefix (``~preset`` -> ``preset``)."""
    return split_override(line)[1]


def plain_override(line: str) -> str:
    """An override as a user types it: a sweep job's as Hydra writes it (``env.reward=rm\\:abc``, its special
    characters escaped) without the backslashes."""
    return re.sub(r"\\(.)", r"\1", line)


NAMED_KEYS = frozenset({"algo", "env", "env.id", "seed"})
"""The keys a run's name shows already (``<algo>-<env label>-s<seed>``)."""


def swept_label(overrides: Iterable[str], swept: Iterable[str]) -> str:
    """What tells a sweep job's run name from its siblings': ``-key=value`` for each ``swept`` key its name does not
    show already (:data:`NAMED_KEYS`), as typed (``-algo.beta=0.04``); empty outside a sweep."""
    keys = set(swept) - NAMED_KEYS
    return "".join(f"-{plain_override(line)}" for line in overrides if override_key(line) in keys)


def is_hydra_override(line: str) -> bool:
    """Whether ``line`` sets Hydra's own config (``hydra.run.dir=...``, ``hydra/sweeper=optuna``), not the task's."""
    return override_key(line).startswith("hydra")


def task_lines(lines: Iterable[str]) -> list[str]:
    """``lines`` without the ``hydra.*`` overrides (:func:`is_hydra_override`)."""
    return [line for line in lines if not is_hydra_override(line)]


@dataclass(frozen=True)
class Overrides:
    """Overrides as Hydra parses them, in their order: what a command line sets, asked by key.

    Build it with :meth:`parse`; ``Overrides.parse(["env=addition,sort", "+algo.x=1"]).swept_keys() == {"env"}``.
    """

    parsed: tuple[Override, ...]
    """Hydra's ``Override`` objects, one per line."""

    @classmethod
    def parse(cls, lines: Iterable[str], *, what: str = "override") -> Overrides:
        """Parse ``lines`` with Hydra's override parser; a line that does not parse is a one-line ConfigError
        (``cannot parse <what>: ...``)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import OverrideParseException

        try:
            return cls(tuple(OverridesParser.create().parse_overrides(list(lines))))
        except OverrideParseException as exc:
            raise ConfigError(f"cannot parse {what}: {str(exc).splitlines()[0]}") from None

    def __iter__(self) -> Iterator[Override]:
        return iter(self.parsed)

    @property
    def lines(self) -> list[str]:
        """Every override as typed."""
        return [o.input_line or "" for o in self.parsed]

    def keys(self) -> set[str]:
        """The keys and groups set (``+``/``++``/``~`` prefixes and ``@package`` left out)."""
        return {o.key_or_group for o in self.parsed}

    def has(self, key: str) -> bool:
        """Whether any override sets ``key`` (or group ``key``), swept or not."""
        return key in self.keys()

    def is_fixed(self, key: str) -> bool:
        """Whether ``key`` is set to one value (not swept over)."""
        return any(o.key_or_group == key and not o.is_sweep_override() for o in self.parsed)

    def value_of(self, key: str) -> str | None:
        """The last one value ``key`` is set to, as typed after ``=`` (None: not set to one value)."""
        values = [o for o in self.parsed if o.key_or_group == key and not o.is_sweep_override()]
        return None if not values else split_override(values[-1].input_line or "")[2]

    def group_choices(self) -> dict[str, str]:
        """The config groups chosen (``algo=ppo``, ``hydra/sweeper=optuna``, ``~preset``), key -> the line as typed
        (the last line per group)."""
        return {o.key_or_group: o.input_line or "" for o in self.parsed if "." not in o.key_or_group}

    def fixed(self) -> list[str]:
        """The overrides that set one value: what every job of a sweep shares."""
        return [o.input_line or "" for o in self.parsed if not o.is_sweep_override()]

    def swept_keys(self) -> set[str]:
        """The keys swept over (``seed=0,1``, ``range(...)``, ``interval(...)``)."""
        return {o.key_or_group for o in self.parsed if o.is_sweep_override()}

    def is_sweep(self) -> bool:
        """Whether any override sweeps."""
        return any(o.is_sweep_override() for o in self.parsed)

    def is_grid(self) -> bool:
        """Whether every sweep is a list of values (``a,b``, ``range(...)``), which Hydra's basic sweeper expands."""
        return all(o.is_discrete_sweep() or not o.is_sweep_override() for o in self.parsed)

    def task(self) -> Overrides:
        """The task's overrides (``hydra.*`` ones left out)."""
        return Overrides(tuple(o for o in self.parsed if not o.key_or_group.startswith("hydra")))

    def hydra(self) -> list[str]:
        """The ``hydra.*`` overrides, as typed."""
        return [o.input_line or "" for o in self.parsed if o.key_or_group.startswith("hydra")]
