"""The rules of a run on several processes (``hardware.processes`` = N > 1; docs/distributed.md): which runs can, and
global batch sizes that divide over N, so each rank trains on an equal share and N processes train on the same
completions per update as one."""

from __future__ import annotations

from typing import Any

from pgcli.config.rules import require
from pgcli.config.text import TextEnvConfig
from pgcli.errors import ConfigError

SHARED_SIZES = ("n_groups", "batch_size")
"""The global sizes of a text algo that each rank trains 1/N of (those its config has)."""
DISTRIBUTED_ALGOS = ("sft", "rm", "grpo", "rloo", "reinforce", "gspo", "reinforce_pp", "ppo_lm", "flow_grpo")
"""The algos that train on several processes (docs/distributed.md)."""
MULTI_TURN_ALGOS = ("flow_grpo", "grpo")
"""Those of them that train a multi-turn task on several processes (the RL trainer's turns: `pgcli.algo.lm_agent`)."""
SHARDED_ALGOS = ("sft", "grpo", "rloo", "reinforce", "gspo", "reinforce_pp")
"""The algos that train with ``hardware.shard=params`` (docs/distributed.md, "Models that do not fit one device")."""


def check_processes(cfg: Any) -> None:
    """One line, before anything runs, where ``hardware.processes`` = N > 1 cannot train ``cfg`` (a ``TrainConfig``,
    from its own rules): a gymnasium env, SFT on a multi-turn task, an algo that trains in one process, a global
    batch size that does not divide by N, or a row filter that would leave the ranks unequal shares."""
    n = cfg.hardware.processes
    check_shard(cfg)
    if n == 1:
        return
    if not isinstance(cfg.env, TextEnvConfig):
        raise ConfigError(
            f"hardware.processes={n} trains text tasks; env.id {cfg.env.id!r} is a gymnasium env (one process: "
            "hardware.vec_env=worker|shm steps envs in a second one, a sweep runs jobs in parallel)"
        )
    if cfg.env_kind == "multi-turn" and cfg.algo.name not in MULTI_TURN_ALGOS:
        raise ConfigError(
            f"hardware.processes={n}: algo={cfg.algo.name} on a multi-turn task trains in one process (several: "
            f"{', '.join(MULTI_TURN_ALGOS)}); drop hardware.processes"
        )
    if cfg.algo.name not in DISTRIBUTED_ALGOS:
        raise ConfigError(
            f"hardware.processes={n}: algo={cfg.algo.name} trains in one process (several: "
            f"{', '.join(DISTRIBUTED_ALGOS)}); drop hardware.processes"
        )
    require(cfg.n_seeds == 1, "n_seeds", cfg.n_seeds, f"1 with hardware.processes={n}", "one run per command")
    for name in SHARED_SIZES:
        size = getattr(cfg.algo, name, None)
        if size is not None:
            require(
                size % n == 0,
                f"algo.{name}",
                size,
                f"a multiple of hardware.processes={n}",
                f"each process trains 1/{n} of it, e.g. algo.{name}={max(n, size // n * n)}",
            )
    for flag in ("drop_degenerate_groups", "mask_truncated_completions"):
        require(
            not getattr(cfg.algo, flag, False),
            f"algo.{flag}",
            True,
            f"false with hardware.processes={n}",
            "it leaves the processes unequal shares of a minibatch",
        )


def check_shard(cfg: Any) -> None:
    """One line where ``hardware.shard=params`` cannot train ``cfg``: one process, a model other than ``model=hf``,
    an algo or a multi-turn task that does not shard yet."""
    if cfg.hardware.shard == "none":
        return
    n = cfg.hardware.processes
    if n == 1:
        raise ConfigError(
            "hardware.shard=params shards the model over the processes of one run; add hardware.processes=N "
            "(N > 1), or drop hardware.shard"
        )
    if getattr(cfg.model, "name", None) != "hf":
        raise ConfigError(
            f"hardware.shard=params shards model=hf; model={getattr(cfg.model, 'name', '?')} is small enough for "
            "one device (drop hardware.shard: each process holds the whole model)"
        )
    if cfg.algo.name not in SHARDED_ALGOS:
        raise ConfigError(
            f"hardware.shard=params: algo={cfg.algo.name} does not train sharded yet (sharded: "
            f"{', '.join(SHARDED_ALGOS)}); drop hardware.shard (each process holds the whole model)"
        )
    if cfg.env_kind == "multi-turn":
        raise ConfigError(
            f"hardware.shard=params: a multi-turn task ({cfg.env.id}) does not train sharded yet; drop hardware.shard "
            "(each process holds the whole model)"
        )
