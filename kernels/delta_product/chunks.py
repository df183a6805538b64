"""Chunk metadata over the packed, interleaved sub-step sequence.

Sequence ``n`` owns sub-steps ``[cu[n]·n_h, cu[n+1]·n_h)``; its chunks of ``C`` sub-steps start at
the sequence start (the last one may be short). Every kernel program reads its chunk's start (int64),
length and sequence id from these tables, so equal-length batches and ``cu_seqlens`` share one code
path and nothing is read past a sequence's end.
"""
from __future__ import annotations

import torch


def build_chunks(B: int, T: int, n_h: int, C: int, cu_seqlens, device):
    """Return ``dict(start, length, seq_ptr, NC, N, full)``; ``start``/``seq_ptr`` int64, ``length``
    int32; ``full``: every chunk holds ``C`` sub-steps (no sequence ends inside a chunk)."""
    if cu_seqlens is None:
        L = T * n_h
        nc = -(-L // C)
        c = torch.arange(B * nc, device=device, dtype=torch.int64)
        n, i = c // nc, c % nc
        start = n * L + i * C
        length = torch.clamp(L - i * C, max=C).to(torch.int32)
        seq_ptr = torch.arange(B + 1, device=device, dtype=torch.int64) * nc
        return dict(start=start, length=length, seq_ptr=seq_ptr, NC=B * nc, N=B, full=L % C == 0)
    cu = cu_seqlens.detach().to("cpu", torch.int64) * n_h
    lens = cu[1:] - cu[:-1]
    seq_ptr, seq, offset, length = _pieces(lens, C)
    start = cu[seq] + offset
    return dict(start=start.to(device), length=length.to(torch.int32).to(device),
                seq_ptr=seq_ptr.to(device), NC=int(seq_ptr[-1]), N=len(lens),
                full=bool((lens % C == 0).all()),
                seq_ptr_cpu=seq_ptr)       # for build_token_chunks, without a device-to-host copy


def _pieces(lens: torch.Tensor, size: int):
    """Cuts each of ``lens`` (int64, CPU) into pieces of ``size`` (the last one may be short).
    Returns ``(ptr, owner, offset, length)``: where each item's pieces start (``len(lens) + 1``
    entries) and, per piece, its item, its offset within the item and its length."""
    n = (lens + size - 1) // size
    ptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    ptr[1:] = n.cumsum(0)
    owner = torch.repeat_interleave(torch.arange(len(lens)), n)
    offset = (torch.arange(int(ptr[-1])) - ptr[owner]) * size
    return ptr, owner, offset, torch.clamp(lens[owner] - offset, max=size)


def build_token_chunks(ch: dict, n_h: int, device) -> dict:
    """Token chunks over the sub-step chunks of :func:`build_chunks`: each groups ``n_h`` consecutive
    chunks of a sequence (``C`` tokens; the last group of a sequence may hold fewer chunks).

    Returns ``dict(first, count, seq_ptr, NT)``: ``first`` (int64) the first chunk of each token
    chunk, ``count`` (int32) how many chunks it holds, ``seq_ptr`` (int64) where each sequence's
    token chunks start. The forward that keeps one state per token chunk
    (``function.TUNE["token_chunk_output"]``) indexes its states with them; with gradients
    (``TUNE["token_chunk_output_grad"]``) the output kernel reads each token chunk's first chunk.
    """
    seq_ptr = ch.get("seq_ptr_cpu")
    if seq_ptr is None:         # equal lengths: the same closed form as build_chunks, on the device
        N, nc = ch["N"], ch["NC"] // max(ch["N"], 1)
        nt = -(-nc // n_h)
        t = torch.arange(N * nt, device=device, dtype=torch.int64)
        n, j = t // nt, t % nt
        return dict(first=n * nc + j * n_h, count=torch.clamp(nc - j * n_h, max=n_h).to(torch.int32),
                    seq_ptr=torch.arange(N + 1, device=device, dtype=torch.int64) * nt, NT=N * nt)
    tseq, seq, offset, count = _pieces(seq_ptr[1:] - seq_ptr[:-1], n_h)
    return dict(first=(seq_ptr[seq] + offset).to(device), count=count.to(torch.int32).to(device),
                seq_ptr=tseq.to(device), NT=int(tseq[-1]))
