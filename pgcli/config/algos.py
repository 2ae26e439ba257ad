"""The algorithm catalogue: one row per ``conf/algo`` option, the one answer to "which algorithm trains on what".

A row names the algorithm's schema, its trainer for each kind of env it trains on (``"module:Class"``, imported only
when that algorithm runs, so ``pgcli --help`` and config validation never import torch or SB3) and, for gymnasium
envs, the observation and action spaces it takes (gymnasium's space classes by name: this package does not import
gymnasium). Everything else reads it: the schemas Hydra knows (:func:`pgcli.config.compose.register_configs`), the
algo/env rules of :class:`pgcli.config.run.TrainConfig`, the option reference (:mod:`pgcli.config.docs`), the trainer a
run builds (:mod:`pgcli.training.build`) and the spaces it is checked against (:mod:`pgcli.training.checks`,
:mod:`pgcli.envs.spec`). Adding an algorithm: docs/architecture.md, "Adding an algorithm".
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pgcli.config.control import A2CConfig, GRPOConfig, PPOConfig, PPOKLConfig, SB3TRPOConfig, TRPOConfig, VPGConfig
from pgcli.config.lm_algos import (
    FlowGRPOConfig,
    GSPOConfig,
    PPOLMConfig,
    REINFORCEConfig,
    ReinforcePPConfig,
    RLOOConfig,
)
from pgcli.config.rm import RMConfig
from pgcli.config.text import SFTConfig

KINDS = ("control", "image", "text", "multi-turn")
"""The kinds of env: a gymnasium env with vector observations (``control``) or frames (``image``: an ``env.pixels``
section, ``model=cnn``), a single-turn text task (``text``) or a multi-turn one (``multi-turn``: env=countdown_tool)."""
GYM_KINDS = ("control", "image")
TEXT_KINDS = ("text", "multi-turn")
SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
"""The gymnasium space classes (``gymnasium.spaces.<name>``) a row may name."""


class AlgoSchema(Protocol):
    """What the catalogue asks of a schema: its option's name (the rules a run needs: docs/architecture.md)."""

    name: ClassVar[str]


@dataclass(frozen=True)
class AlgoEntry:
    """One algorithm: its schema (whose ``name`` is the ``conf/algo`` option), its trainers and the spaces it takes."""

    schema: type[AlgoSchema]
    """The dataclass of ``algo.*`` (registered with Hydra as ``schema/algo/<name>``)."""
    trainers: Mapping[str, str]
    """Kind of env (:data:`KINDS`) -> its trainer, ``"module:Class"``; the kinds it leaves out it does not train on."""
    observation_spaces: tuple[str, ...] = ()
    """Gymnasium envs: the observation spaces it takes (:data:`SPACES`; a Box of any rank is flattened first)."""
    action_spaces: tuple[str, ...] = ()
    """Gymnasium envs: the action spaces it takes (:data:`SPACES`)."""
    flat_box_actions: bool = False
    """Box actions must be 1-D (pgcli's own policies: a diagonal Gaussian over a vector)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.trainers) - set(KINDS))
        if unknown:
            raise ValueError(f"algo {self.name}: unknown kinds of env {unknown} (the kinds: {', '.join(KINDS)})")
        unknown = sorted({*self.observation_spaces, *self.action_spaces} - set(SPACES))
        if unknown:
            raise ValueError(f"algo {self.name}: unknown spaces {unknown} (the spaces: {', '.join(SPACES)})")
        gym = self.trains_on(*GYM_KINDS)
        if (bool(self.observation_spaces), bool(self.action_spaces)) != (gym, gym):
            raise ValueError(
                f"algo {self.name}: a row that trains on gymnasium envs names the observation and "
                "action spaces it takes, and only such a row"
            )

    @property
    def name(self) -> str:
        """The ``conf/algo`` option (``algo=<name>``)."""
        return self.schema.name

    def trains_on(self, *kinds: str) -> bool:
        """Whether it trains on any of these kinds of env."""
        return any(kind in self.trainers for kind in kinds)

    def trainer(self, kind: str) -> Any:
        """The trainer class for ``kind`` (its module imported now); KeyError when it does not train on ``kind``."""
        module, _, name = self.trainers[kind].partition(":")
        return getattr(importlib.import_module(module), name)


def _gym(trainer: str) -> dict[str, str]:
    """A gymnasium trainer: the same class on vector observations and on frames."""
    return dict.fromkeys(GYM_KINDS, trainer)


_SB3: dict[str, Any] = {"observation_spaces": SPACES, "action_spaces": SPACES}
"""SB3 / sb3-contrib with ``MlpPolicy`` or ``CnnPolicy`` (SB3's ``supported_action_spaces``; one-hot for discrete
observations; no Dict or Tuple observations)."""
_OWN: dict[str, Any] = {"observation_spaces": ("Box",), "action_spaces": ("Discrete", "Box"), "flat_box_actions": True}
"""pgcli's own PyTorch trainers: an MLP (or a CNN) on a Box observation; Categorical or diagonal-Gaussian actions."""
_LM_GRPO = "pgcli.algo.lm_grpo:LMGRPO"
_AGENT_GRPO = "pgcli.algo.lm_agent:LMAgentGRPO"
_SFT = "pgcli.algo.sft:SFT"

ALGOS: dict[str, AlgoEntry] = {
    entry.name: entry
    for entry in (
        AlgoEntry(PPOConfig, _gym("pgcli.algo.sb3:SB3Trainer"), **_SB3),
        AlgoEntry(A2CConfig, _gym("pgcli.algo.sb3:SB3Trainer"), **_SB3),
        AlgoEntry(SB3TRPOConfig, _gym("pgcli.algo.sb3:SB3Trainer"), **_SB3),
        AlgoEntry(TRPOConfig, _gym("pgcli.algo.trpo:TRPO"), **_OWN),
        AlgoEntry(VPGConfig, _gym("pgcli.algo.vpg:VPG"), **_OWN),
        AlgoEntry(PPOKLConfig, _gym("pgcli.algo.ppo_kl:PPOKL"), **_OWN),
        AlgoEntry(GRPOConfig, {**_gym("pgcli.algo.grpo:GRPO"), "text": _LM_GRPO, "multi-turn": _AGENT_GRPO}, **_OWN),
        AlgoEntry(SFTConfig, {"text": _SFT, "multi-turn": _SFT}),  # a multi-turn task: its turns as demonstrations
        AlgoEntry(RLOOConfig, {"text": _LM_GRPO}),
        AlgoEntry(REINFORCEConfig, {"text": _LM_GRPO}),
        AlgoEntry(GSPOConfig, {"text": _LM_GRPO}),
        AlgoEntry(ReinforcePPConfig, {"text": _LM_GRPO}),
        AlgoEntry(PPOLMConfig, {"text": "pgcli.algo.lm_ppo:LMPPO"}),
        AlgoEntry(FlowGRPOConfig, {"multi-turn": _AGENT_GRPO}),
        AlgoEntry(RMConfig, {"text": "pgcli.algo.reward_model:RewardModelTrainer"}),
    )
}
"""Every algorithm, by ``conf/algo`` option, in the order the option reference and the error messages list them."""


def register_algo(entry: AlgoEntry) -> AlgoEntry:
    """Add ``entry`` to :data:`ALGOS` (an algorithm outside pgcli's package, or a test's); returns it.

    Its schema is registered with Hydra at the next composition; its ``conf/algo/<name>.yaml`` must be in the config
    directory composition reads (:data:`pgcli.config.compose.CONF_DIR`).
    """
    if entry.name in ALGOS and ALGOS[entry.name] != entry:
        raise ValueError(f"algo {entry.name!r} is already in the catalogue")
    ALGOS[entry.name] = entry
    return entry


def algo_entry(algo_cfg: Any) -> AlgoEntry:
    """The row of an algo config (by its schema's type); KeyError when it has none."""
    entry = ALGOS[getattr(type(algo_cfg), "name", "")]
    if entry.schema is not type(algo_cfg):
        raise KeyError(type(algo_cfg).__name__)
    return entry


def algo_names(*kinds: str) -> list[str]:
    """The algorithms that train on any of these kinds of env, in catalogue order."""
    return [name for name, entry in ALGOS.items() if entry.trains_on(*kinds)]
