"""One run on several processes (``hardware.processes=N``, or ``torchrun --nproc-per-node N -m pgcli ...``;
docs/distributed.md): the process group, which rank this is, and the collectives the text trainers share.

Every rank is started by torch.distributed's own launcher (:func:`launch`: ``torch.distributed.run``'s elastic agent,
the same one ``torchrun`` is), which gives it ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous
(``MASTER_ADDR``, ``MASTER_PORT``) in its environment. :func:`init` joins the group (``gloo`` on the CPU, ``nccl`` on
GPUs, each collective bounded by ``hardware.dist_timeout_s``). A trainer on N ranks samples 1/N of each global batch
with a seed of its own (:func:`rank_seed`), sums the loss shares of a global batch's gradient across ranks
(:func:`sum_gradients`) before its one clip and optimiser step, and reduces its metrics (:func:`mean_stats`) so that
rank 0, the run's one writer, logs the values over every completion. In one process every helper here is the
identity.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where a collective runs: `pgcli train --cfg job` and the launcher import none
    import torch
    from torch import Tensor, nn

    from pgcli.ops.aggregate import BatchTotals

LAUNCH_ENV = "TORCHELASTIC_RUN_ID"
"""Set by torch.distributed's launcher in each worker it starts (``torchrun`` and :func:`launch` alike)."""
PGCLI_LAUNCH_ENV = "PGCLI_LAUNCHED"
"""Set by :func:`launch` for its workers, to the launcher's pid: the command line was checked, and its notes printed,
before they started."""


def world_size() -> int:
    """The number of processes of this run (``WORLD_SIZE``; 1 when not launched by torch.distributed)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank in the run (``RANK``; 0 when not launched by torch.distributed)."""
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0: the run's one writer (MLflow run, checkpoints, samples, console)."""
    return rank() == 0


def launched() -> bool:
    """This process is a worker of torch.distributed's launcher (``torchrun`` or :func:`launch`)."""
    return LAUNCH_ENV in os.environ and "WORLD_SIZE" in os.environ


def launched_by_pgcli() -> bool:
    """This process is a worker of pgcli's own :func:`launch` (``hardware.processes=N``), which checked the command
    line and printed its notes before it started the workers; not a rank of ``torchrun``, which checks nothing. The
    launcher's pid in ``PGCLI_LAUNCHED`` must be this worker's parent's, so a value inherited from elsewhere is not
    trusted."""
    return launched() and os.environ.get(PGCLI_LAUNCH_ENV) == str(os.getppid())


def says_notes() -> bool:
    """This process prints the command line's notes (a preset applied): one process, rank 0 under ``torchrun``, and
    not the workers of :func:`launch` (it printed them)."""
    return is_main() and not launched_by_pgcli()


def rank_seed(seed: int, of_rank: int) -> int:
    """The seed of rank ``of_rank``'s prompt and sampling generators: the run's ``seed`` on rank 0, a distinct
    stream of (seed, rank) on the others (logged as the ``rank_seeds`` param)."""
    if of_rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, of_rank]).generate_state(1)[0])


def rank_seeds(seed: int, n: int) -> list[int]:
    """:func:`rank_seed` of ranks 0..n-1."""
    return [rank_seed(seed, r) for r in range(n)]


def active() -> bool:
    """A process group of more than one rank is up (:func:`init` ran in a launched worker)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init(device: torch.device, *, timeout_s: float) -> None:
    """Join the run's process group when launched with ``WORLD_SIZE`` > 1 (else nothing): ``nccl`` for CUDA tensors on
    a CUDA ``device`` (this rank's GPU: ``LOCAL_RANK``), ``gloo`` for CPU tensors (the metric and count reductions
    stay on the CPU, which ``nccl`` refuses); every collective fails after ``timeout_s``."""
    import torch
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    _end_with_launcher()
    backend = "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def _end_with_launcher() -> None:
    """A worker gets SIGTERM when its launcher dies (Linux: ``PR_SET_PDEATHSIG``): the launcher starts workers in
    sessions of their own, so a launcher killed with SIGKILL would otherwise leave them training; with it, rank 0 ends
    the run KILLED with a checkpoint, as for ``kill``."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def teardown() -> None:
    """Leave the process group (where one was joined)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def local_size(size: int, what: str) -> int:
    """This rank's share of a global ``size`` (``what`` names it in the error); the config's rules
    (:func:`pgcli.config.processes.check_processes`) have made sure it divides."""
    n = world_size() if active() else 1
    if size % n:
        raise ValueError(f"{what}={size} does not divide over {n} processes")
    return size // n


def global_totals(totals: BatchTotals) -> BatchTotals:
    """The `BatchTotals` of the global batch this rank's ``totals`` are a share of (summed over ranks): each rank's
    loss is then its share of the global batch's, and the shares' gradients sum to the global batch's."""
    if not active():
        return totals
    import torch
    import torch.distributed as dist

    from pgcli.ops.aggregate import BatchTotals

    sizes = torch.tensor([totals.n_rows, totals.n_real], dtype=torch.float64)
    dist.all_reduce(sizes)
    return BatchTotals(n_rows=int(sizes[0]), n_real=int(sizes[1]))


def sum_gradients(params: Iterable[Tensor]) -> None:
    """Sum the gradients of ``params`` over the ranks in one flat all-reduce (each rank's loss is its share of the
    global batch's: :func:`global_totals`), so that every rank's optimiser takes the same step."""
    if not active():
        return
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    # a sharded parameter's gradient (hardware.shard=params) was summed by FSDP's reduce-scatter in the backward pass
    grads = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def all_sum(tensor: Tensor) -> Tensor:
    """``tensor`` summed over the ranks (a new tensor; ``tensor`` itself in one process): the whole batch's sums of
    the ranks' shares of it."""
    if not active():
        return tensor
    import torch.distributed as dist

    total = tensor.detach().clone()
    dist.all_reduce(total)
    return total


def sum_stats(stats: dict[str, float]) -> dict[str, float]:
    """``stats`` summed over the ranks (the same keys on every rank: the shares of one global minibatch)."""
    if not active():
        return stats
    import torch
    import torch.distributed as dist

    keys = sorted(stats)
    values = torch.tensor([stats[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(keys, values.tolist(), strict=True))


def mean_stats(stats: Mapping[str, float], weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each metric's mean over the ranks that report it: with equal shares per rank, the mean over every completion
    of the global batch (a key only some ranks report, as an update with nothing to train, averages over those). A
    metric in ``weights`` is weighted by each rank's weight of it: a mean over the turns of a multi-turn batch, whose
    ranks hold different numbers of turns, is weighted by them."""
    if not active():
        return dict(stats)
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, (dict(stats), dict(weights or {})))
    out: dict[str, float] = {}
    for key in sorted({k for s, _ in every for k in s}):
        values = [(float(s[key]), float(w.get(key, 1.0))) for s, w in every if key in s]
        out[key] = float(np.average([v for v, _ in values], weights=[w for _, w in values]))
    return out


def all_counts(n: int) -> list[int]:
    """``n`` of every rank, by rank (``[n]`` in one process)."""
    if not active():
        return [n]
    import torch
    import torch.distributed as dist

    counts = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    counts[dist.get_rank()] = n
    dist.all_reduce(counts)
    return [int(c) for c in counts.tolist()]


def broadcast_module(module: nn.Module) -> None:
    """Rank 0's parameters and buffers into every rank's ``module`` (in place)."""
    if not active():
        return
    import torch.distributed as dist

    for tensor in module.state_dict().values():
        dist.broadcast(tensor, src=0)


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not active():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def launch(module_args: list[str], *, processes: int, threads: int) -> int:
    """Run ``python -m pgcli <module_args>`` as ``processes`` workers on this machine through torch.distributed's
    elastic launcher (``torchrun --standalone``: a rendezvous on a free local port, no restarts); returns rank 0's
    exit status, else the first failed worker's (1 when the launcher failed itself)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun's own default is 1 thread per worker, announced with a warning: pgcli's hardware.torch_threads says it
    os.environ.setdefault("OMP_NUM_THREADS", str(max(threads, 1)))
    os.environ[PGCLI_LAUNCH_ENV] = str(os.getpid())  # the workers' parent: the elastic agent runs in this process
    args = parse_args(
        [
            "--standalone",
            f"--nproc-per-node={processes}",
            "--max-restarts=0",
            "--monitor-interval=0.5",
            "--module",
            "pgcli",
            *module_args,
        ]
    )
    try:
        run(args)
    except ChildFailedError as exc:
        return _exit_status(exc)
    except SignalException as exc:  # Ctrl-C, SIGTERM: the workers stop as one process does; rank 0 says how to go on
        return 128 + int(exc.sigval)
    except Exception as exc:  # a rendezvous or launch failure: one line, as every pgcli error
        print(f"pgcli: error: starting {processes} processes failed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    return 0


def _exit_status(exc: Any) -> int:
    """The exit status a failed launch reports: rank 0's when it failed, else the first failure's (a signal's
    128 + its number)."""
    failures = exc.failures  # {global rank: ProcessFailure}
    first = failures[0] if 0 in failures else failures[min(failures)]
    code = int(first.exitcode)
    return 128 - code if code < 0 else code or 1


def broadcast_state(modules: Mapping[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's trainer state on every rank as training starts (a resumed run: what rank 0 loaded from its
    checkpoint): the networks in ``modules`` in place, the optimisers' state, and ``values`` (counters), returned."""
    if not active():
        return values
    from torch import nn

    for obj in modules.values():
        if isinstance(obj, nn.Module):
            broadcast_module(obj)
        elif obj is not None:
            state = broadcast_object(obj.state_dict() if is_main() else None)
            if not is_main():
                obj.load_state_dict(state)
    return dict(broadcast_object(values))


def resumed_seed(seed: int, steps: int) -> int:
    """The generators' seed of a rank other than 0 when a resumed run continues at ``steps`` (rank 0's come from its
    checkpoint): distinct from every rank's and step's."""
    return int(np.random.SeedSequence([seed, steps, 1]).generate_state(1)[0])


def minibatch_totals(mask: Tensor, *, micro_batch: int) -> BatchTotals | None:
    """The sizes a minibatch's losses divide by (``mask``: this rank's rows of it): None for the minibatch itself (one
    pass, one process); with micro-batches, or a minibatch shared by several processes, the whole global
    minibatch's, so each pass's loss is its share."""
    from pgcli.ops.aggregate import batch_totals

    if micro_batch == 0 and not active():
        return None
    return global_totals(batch_totals(mask))


def optimizer_step(
    optimizer: torch.optim.Optimizer, params: Iterable[Tensor], max_grad_norm: float, stats: dict[str, float]
) -> float:
    """After a minibatch's passes: the loss shares in ``stats`` summed over the ranks (in place), the gradients of
    ``params`` summed alike, one clip at ``max_grad_norm``, one step; returns the gradient norm before the clip (the
    global batch's, the same on every rank)."""
    import torch

    stats.update(sum_stats(stats))
    params = list(params)
    sum_gradients(params)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    return grad_norm
