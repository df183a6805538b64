"""Multi-process training support for :func:`lrnn_scan.mad_tasks.train` (``torchrun``).

Two modes, both started with ``torchrun --nproc-per-node N -m lrnn_scan.mad_tasks train ...``
(or ``torchrun ... $(which lrnn-scan) train ...``):

* **data parallel** (default): every global batch of ``batch_size`` rows (the single-process
  batch, same order) is split into ``N`` contiguous row shards, one per rank; the model is wrapped
  in :class:`~torch.nn.parallel.DistributedDataParallel`. Each rank's loss is its scored tokens'
  cross-entropy sum divided by the global batch's scored-token count, times ``N`` (DDP averages),
  so the update equals the single-process one.
* **sequence parallel** (``--sequence-parallel``): every rank holds a contiguous *time* shard of
  the same global batch; the recurrent layers scan across ranks with
  :func:`lrnn_scan.distributed.scan` (short convolutions get their context with
  :func:`lrnn_scan.distributed.halo`). Replicated parameters get their gradients *summed* over the
  ranks (one flat all-reduce), not averaged. Needs a decoder (per-token) model and a layer with
  ``supports_sequence_parallel`` (BDLRU, HLRU, DiagonalLRU, Mamba2).

The process group comes from the torchrun environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``): ``nccl`` for CUDA devices, ``gloo`` on CPU. An
already-initialised default group is used as is. NCCL settings in the environment (e.g.
``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``) are left untouched.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "setup", "teardown", "env_world_size", "shard_bounds", "all_reduce_sum",
           "sum_gradients", "is_main_process"]

_INITIALISED_HERE = False


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    mode: str = "single"            # single | dp | sp

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def group(self):
        return dist.group.WORLD


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 outside torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def is_main_process() -> bool:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank ``rank``'s contiguous share of ``n`` items (the first ``n % world``
    ranks get one more); concatenated over the ranks in order they give ``range(n)``."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def _resolve_device(device: str, local_rank: int, world: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and world > 1:
        dev = torch.device("cuda", local_rank)
    return dev


def setup(device: str = "auto", sequence_parallel: bool = False) -> tuple[DistInfo, torch.device]:
    """Join (or initialise from the torchrun environment) the default process group.

    Returns ``(info, device)``; ``info.world == 1`` (and nothing initialised) outside torchrun.
    """
    global _INITIALISED_HERE
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if "LOCAL_RANK" not in os.environ:
            local_rank = rank
        dev = _resolve_device(device, local_rank, world)
    elif env_world_size() > 1:
        if not dist.is_available():
            raise RuntimeError("WORLD_SIZE > 1 but torch.distributed is not available")
        dev = _resolve_device(device, local_rank, env_world_size())
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        _INITIALISED_HERE = True
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        return DistInfo(), _resolve_device(device, 0, 1)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    mode = "single" if world == 1 else ("sp" if sequence_parallel else "dp")
    return DistInfo(rank, world, local_rank, mode), dev


def teardown(sync: bool = False) -> None:
    """Destroy the process group if :func:`setup` created it. ``sync``: a barrier first, so that no
    rank closes its gloo connections while a peer is still using them (rank 0 reports and writes
    after the others return). CI saw a rank abort at exit ("terminate called without an active
    exception", SIGABRT) after a complete 2-rank run, once in several runs, not reproduced in 17
    local ones. Only on the success path: after an error a peer may never reach the barrier.

    The same abort came back on 2026-12-02 (both torchrun CLI tests of one CI worker, 0 of 24
    local runs): ``destroy_process_group`` drops only c10d's own references, so a group still held
    by garbage in reference cycles (a DDP reducer and its autograd hooks) lived on, with gloo's
    worker threads, into interpreter finalisation, where tearing them down aborts (the mechanism
    of pytorch/pytorch#179291). So cyclic garbage is collected before the group is destroyed and
    again after, while the interpreter is alive."""
    global _INITIALISED_HERE
    if _INITIALISED_HERE and dist.is_available() and dist.is_initialized():
        gc.collect()
        if sync:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()
    _INITIALISED_HERE = False


def _comm_device(device: torch.device) -> torch.device:
    if dist.get_backend() == "nccl":
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum of ``t`` over the default group (returned on ``t``'s device)."""
    buf = t.to(_comm_device(device)).contiguous()
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf.to(t.device)


def sum_gradients(params, device: torch.device) -> None:
    """Sum the gradients of ``params`` over the default group in place (one flat buffer in the
    widest parameter dtype, at least float32); a missing gradient counts as zeros, so every rank
    sends the same layout."""
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    cdt = torch.float32
    for p in params:
        cdt = torch.promote_types(cdt, p.dtype)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(cdt)
                      for p in params])
    flat = all_reduce_sum(flat, device)
    off = 0
    for p in params:
        g = flat[off:off + p.numel()].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        off += p.numel()
