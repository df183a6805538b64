"""Argument checks of ``block_diagonal_scan`` / ``diagonal_scan`` (also used by
``lrnn_scan.compile``'s wrappers through ``scan``): clear errors naming the argument."""
from __future__ import annotations

import os

import torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_float(name, x, ndim, shape_doc):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got strides {x.stride()}")
    if x.device.type != "cuda" and not _interpret():
        raise ValueError(f"{name} must be a CUDA tensor (or set TRITON_INTERPRET=1), got {x.device}")


def _check_time_dim(time_dim):
    if time_dim not in (1, 2, -1) or isinstance(time_dim, bool):
        raise ValueError(f"time_dim must be 1 ((B, T, N)) or 2 / -1 ((B, N, T)), got {time_dim!r}")


def _check_common(ref, ref_name, B, T, state_shape, initial_state, cu_seqlens):
    """Returns ``(num_seqs, longest sequence)``; checks the initial state and ``cu_seqlens``. The
    offsets are read on the host once, here: the launchers take the length from this call
    (``_host.max_seq_len``'s ``known``) instead of syncing again."""
    nseq, max_len = B, T
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
        if cu_seqlens.dtype not in (torch.int64, torch.int32) or cu_seqlens.dim() != 1 \
                or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be an int64 tensor of shape (num_seqs + 1,), got "
                             f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
        if cu_seqlens.device != ref.device:
            raise ValueError(f"cu_seqlens must be on {ref.device} like {ref_name}, got {cu_seqlens.device}")
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 ({ref_name}.shape[0] == 1), got {B}")
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != T or any(y < x for x, y in zip(cu[:-1], cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={T}, got {cu}")
        nseq = len(cu) - 1
        max_len = max(y - x for x, y in zip(cu[:-1], cu[1:]))
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor):
            raise TypeError(f"initial_state must be a torch.Tensor, got {type(initial_state).__name__}")
        if initial_state.dtype not in _FLOATS + (torch.float64,):
            raise TypeError(f"initial_state must be a floating tensor, got {initial_state.dtype}")
        want = (nseq,) + tuple(state_shape)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must have shape {want} ((B or num_seqs), ...), "
                             f"got {tuple(initial_state.shape)}")
        if initial_state.device != ref.device:
            raise ValueError(f"initial_state must be on {ref.device} like {ref_name}, got "
                             f"{initial_state.device}")
    return nseq, max_len
