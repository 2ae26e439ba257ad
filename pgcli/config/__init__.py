"""Configuration: the typed schemas of every config group, Hydra composition, labels and the option reference.

The schemas are the package's API (``from pgcli.config import TrainConfig``); they live in :mod:`~pgcli.config.rules`
(the value rules), :mod:`~pgcli.config.control`, :mod:`~pgcli.config.text`, :mod:`~pgcli.config.hf` and
:mod:`~pgcli.config.run`; which algorithm trains on what is the catalogue's (:mod:`~pgcli.config.algos`). This
package stays light: no torch, SB3 or MLflow import, and nothing that builds an env or a task (the checks that need
the world run after composition, in :mod:`pgcli.training.checks`).
"""

from pgcli.config.algos import ALGOS, AlgoEntry, register_algo
from pgcli.config.compose import register_configs
from pgcli.config.control import (
    A2CConfig,
    GRPOConfig,
    PPOConfig,
    PPOKLConfig,
    SB3TRPOConfig,
    TRPOConfig,
    VPGConfig,
)
from pgcli.config.hf import HFModelConfig, LoRAConfig
from pgcli.config.lm_algos import (
    FlowGRPOConfig,
    GSPOConfig,
    PPOLMConfig,
    REINFORCEConfig,
    ReinforcePPConfig,
    RLOOConfig,
)
from pgcli.config.rm import RMConfig
from pgcli.config.run import (
    EnvConfig,
    EvalConfig,
    HardwareConfig,
    ModelConfig,
    TrackingConfig,
    TrainConfig,
)
from pgcli.config.text import (
    TEXT_ENV_CONFIGS,
    AdditionEnvConfig,
    CountdownEnvConfig,
    CountdownToolEnvConfig,
    DatasetEnvConfig,
    LMModelConfig,
    SFTConfig,
    SortEnvConfig,
    TextEnvConfig,
)

__all__ = [
    "ALGOS",
    "TEXT_ENV_CONFIGS",
    "A2CConfig",
    "AdditionEnvConfig",
    "AlgoEntry",
    "CountdownEnvConfig",
    "CountdownToolEnvConfig",
    "DatasetEnvConfig",
    "EnvConfig",
    "EvalConfig",
    "FlowGRPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "HFModelConfig",
    "HardwareConfig",
    "LMModelConfig",
    "LoRAConfig",
    "ModelConfig",
    "PPOConfig",
    "PPOKLConfig",
    "PPOLMConfig",
    "REINFORCEConfig",
    "RLOOConfig",
    "RMConfig",
    "ReinforcePPConfig",
    "SB3TRPOConfig",
    "SFTConfig",
    "SortEnvConfig",
    "TRPOConfig",
    "TextEnvConfig",
    "TrackingConfig",
    "TrainConfig",
    "VPGConfig",
    "register_algo",
    "register_configs",
]
