"""The models of a text run with ``hardware.shard=params`` (docs/distributed.md, "Models that do not fit one
device"): the policy sharded over the processes (FSDP2, :func:`pgcli.lm.hf.shard_hf_policy`), an RL run's frozen KL
reference too where it is a whole model of its own (its units the policy's), and rank 0's whole copies of them (the
twins its evaluations and checkpoints read, :class:`pgcli.hardware.sharding.Gathered`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgcli.hardware import distributed

if TYPE_CHECKING:
    import torch

    from pgcli.hardware.sharding import Gathered
    from pgcli.lm.model import CausalLM
    from pgcli.training.text_parts import TextParts


def shard_text_models(
    algo: Any, parts: TextParts, reference: CausalLM | None, device: torch.device
) -> Callable[[torch.optim.Optimizer], Gathered]:
    """Shard ``parts.policy`` in place and, for an RL ``algo``, its KL ``reference`` when that is a separate whole
    model (a LoRA run's is the policy itself with its adapters off: already sharded); rank 0 first copies each whole
    that its monitor reads (the reference where it is the evaluator's: the ``init`` model). Returns what puts the
    trainer's optimiser beside them: its :class:`~pgcli.hardware.sharding.Gathered`."""
    from pgcli.algo.lm_base import TextRLConfig
    from pgcli.hardware.sharding import Gathered
    from pgcli.lm.hf import AdapterOff, shard_hf_policy

    main = distributed.is_main()
    twin = copy.deepcopy(parts.policy) if main else None
    others: dict[str, tuple[Any, Any]] = {}
    if isinstance(algo, TextRLConfig) and reference is not None and not isinstance(reference, AdapterOff):
        evaluated = main and reference is parts.reference
        reference_twin = copy.deepcopy(reference) if evaluated else None
        shard_hf_policy(reference, device, frozen=True)
        others["reference"] = (reference, reference_twin)
    shard_hf_policy(parts.policy, device)
    return lambda optimizer: Gathered(parts.policy, optimizer, twin, others)
