"""Sharded parameters on several processes (``hardware.shard=params``; docs/distributed.md, "Models that do not fit
one device"): a model's parameters, gradients and optimiser state split over the ranks with FSDP2's ``fully_shard``
(``gloo`` on the CPU, ``nccl`` on GPUs), each block (a decoder layer) gathered for its forward and backward passes
only.

The ranks' losses are shares of the global batch's (:func:`pgcli.hardware.distributed.global_totals`), so the
gradients are summed over the ranks, not averaged: the reduce-scatter's divide factor is 1. A sharded parameter is a
``DTensor`` (its local shard about 1/N of its rows); :func:`pgcli.hardware.distributed.sum_gradients` leaves their
gradients alone (FSDP reduced them in the backward pass), and ``clip_grad_norm_`` takes the norm over every shard.
:func:`full_state` gathers the whole state dict on rank 0 (on the CPU), so checkpoints and the final model are the
files one process writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

SHARD_CHOICES = ("none", "params")
"""``hardware.shard``: ``none`` (each process holds the whole model; gradients all-reduced) or ``params``."""


def shard(
    module: nn.Module,
    blocks: Iterable[nn.Module],
    device: torch.device,
    methods: Iterable[str] = (),
    *,
    frozen: bool = False,
) -> None:
    """Shard ``module`` in place over the process group: each of ``blocks`` a unit of its own, the rest (embeddings,
    final norm, head) the root's; ``methods`` of ``module`` run FSDP's forward hooks as ``forward`` does (a model
    called through methods other than ``forward``). ``frozen``: a module that never runs backward (a KL reference)
    reshards its root after each forward too (FSDP keeps a trained root whole until its backward pass)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh, reshard_after_forward=True if frozen else None)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            # the ranks' losses are shares of the batch's: a plain sum (gloo has no scaled sum)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    for name in methods:
        register_fsdp_forward_method(module, name)


def is_sharded(module: nn.Module) -> bool:
    """``module`` was sharded by :func:`shard`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def is_shard(tensor: Tensor) -> bool:
    """``tensor`` is a sharded parameter (or its gradient): a ``DTensor``."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_state(module: nn.Module) -> dict[str, Tensor]:
    """``module``'s whole state dict on rank 0, on the CPU (empty on the other ranks): a collective, every rank calls
    it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: dict[str, Tensor] = get_model_state_dict(  # type: ignore[assignment]  # a module's: tensors only
        module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return state


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer``'s whole state on rank 0, on the CPU, in ``optimizer.state_dict()``'s own layout (parameters
    numbered in the optimiser's order), so a checkpoint's ``optimizer.pt`` is the one a process writes; empty on the
    other ranks. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full: Any = get_optimizer_state_dict(
        module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not full:
        return {}
    names = [name for group in full["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    groups = [dict(group, params=[index[n] for n in group["params"]]) for group in full["param_groups"]]
    return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}


def load_full_state(
    module: nn.Module,
    state: dict[str, Tensor] | None,
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> None:
    """Rank 0's whole ``state`` (and ``optimizer_state``, in ``optimizer.state_dict()``'s layout) into every rank's
    shards: a collective; the other ranks pass None."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(module, dict(state or {}), options=options)  # a copy: the call puts shards in its values
    if optimizer is None:
        return
    named = {id(p): n for n, p in module.named_parameters()}
    names = [named[id(p)] for group in optimizer.param_groups for p in group["params"]]
    full: dict[str, Any] = {}
    if optimizer_state is not None:
        full = {
            "state": {names[int(i)]: dict(s) for i, s in optimizer_state["state"].items()},
            "param_groups": [
                dict(group, params=[names[int(i)] for i in group["params"]])
                for group in optimizer_state["param_groups"]
            ],
        }
    set_optimizer_state_dict(module, optimizer, full, options=options)


def in_lockstep(module: nn.Module) -> bool:
    """``module`` is sharded over the processes of this run: each of its forward passes gathers its blocks from every
    process, so every process must run as many of them (generation's decoding steps, the chunks of a pass)."""
    from pgcli.hardware import distributed

    return distributed.active() and is_sharded(module)


def widest(width: int) -> int:
    """The largest ``width`` of any rank: a collective."""
    from pgcli.hardware import distributed

    return max(distributed.all_counts(width))


def every_rank(flag: Tensor) -> bool:
    """Whether ``flag`` (a bool scalar on this rank's device) holds on every rank: a collective. A sharded model's
    generation stops on it, so every rank runs as many decoding steps (each a forward pass whose blocks every rank
    gathers) as the rank whose sequences end last."""
    from pgcli.hardware import distributed

    return min(distributed.all_counts(int(flag))) == 1


def local_tensors(params: Iterable[Tensor]) -> list[Tensor]:
    """Each of ``params`` as this rank holds it: a sharded parameter's local shard, another one whole."""
    return [p.to_local() if is_shard(p) else p for p in params]  # type: ignore[attr-defined]  # a DTensor's


class Gathered:
    """What rank 0 does alone with a sharded module (evaluations, checkpoints, the final model) reads its unsharded
    ``twin`` (rank 0's whole copy, None on the other ranks) and ``optimizer_state``, both as of the last
    :meth:`gather`. ``others``: further sharded modules by name (an RL run's frozen KL reference), each with rank 0's
    whole twin where it reads one (else None); their whole state dicts are gathered into :attr:`states` (and their
    twins) alike. ``pending``: rank 0's checkpoint (weights, optimiser state, the others' states) to load into every
    rank's shards as training starts (a resumed run)."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        twin: nn.Module | None,
        others: dict[str, tuple[nn.Module, nn.Module | None]] | None = None,
    ) -> None:
        self.module, self.optimizer, self.twin = module, optimizer, twin
        self.others = dict(others or {})
        self.optimizer_state: dict[str, Any] = {}
        self.states: dict[str, dict[str, Tensor]] = {}
        """Rank 0's whole state dict of each of :attr:`others` (on the CPU), as of the last :meth:`gather`."""
        self.pending: tuple[dict[str, Tensor], dict[str, Any]] | None = None
        self.pending_others: dict[str, dict[str, Tensor]] = {}

    def gather(self) -> None:
        """The whole weights into rank 0's twin and the whole optimiser state beside them: a collective."""
        state = full_state(self.module)
        optimizer_state = full_optimizer_state(self.module, self.optimizer)
        if self.twin is not None:
            self.twin.load_state_dict(state)
            self.optimizer_state = optimizer_state
        for name, (module, twin) in self.others.items():
            other = full_state(module)
            if self.twin is not None:  # rank 0
                self.states[name] = other
                if twin is not None:
                    twin.load_state_dict(other)

    def sync(self, due: bool) -> None:
        """Every rank gathers when rank 0's ``due`` says it reads the twin at this update (every rank calls it)."""
        from pgcli.hardware import distributed

        if distributed.broadcast_object(due):
            self.gather()

    def start(self, resumed: bool) -> None:
        """As training starts on every rank: a resumed run's checkpoint (rank 0's :attr:`pending`) into the shards."""
        if not resumed:
            return
        weights, optimizer_state = self.pending if self.pending is not None else (None, None)
        load_full_state(self.module, weights, self.optimizer, optimizer_state)
        for name, (module, _) in self.others.items():
            load_full_state(module, self.pending_others.get(name) if self.twin is not None else None)
        self.pending, self.pending_others = None, {}
