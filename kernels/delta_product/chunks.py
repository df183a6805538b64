"""Chunk metadata over the packed, interleaved sub-step sequence.

Sequence ``n`` owns sub-steps ``[cu[n]·n_h, cu[n+1]·n_h)``; its chunks of ``C`` sub-steps start at
the sequence start (the last one may be short). Every kernel program reads its chunk's start (int64),
length and sequence id from these tables, so equal-length batches and ``cu_seqlens`` share one code
path and nothing is read past a sequence's end.
"""
from __future__ import annotations

import torch


def build_chunks(B: int, T: int, n_h: int, C: int, cu_seqlens, device):
    """Return ``dict(start, length, seq_ptr, NC, N)``; ``start``/``seq_ptr`` int64, ``length`` int32."""
    if cu_seqlens is None:
        L = T * n_h
        nc = -(-L // C)
        c = torch.arange(B * nc, device=device, dtype=torch.int64)
        n, i = c // nc, c % nc
        start = n * L + i * C
        length = torch.clamp(L - i * C, max=C).to(torch.int32)
        seq_ptr = torch.arange(B + 1, device=device, dtype=torch.int64) * nc
        return dict(start=start, length=length, seq_ptr=seq_ptr, NC=B * nc, N=B)
    cu = cu_seqlens.detach().to("cpu", torch.int64) * n_h
    lens = cu[1:] - cu[:-1]
    nc = (lens + C - 1) // C
    seq_ptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    seq_ptr[1:] = nc.cumsum(0)
    NC = int(seq_ptr[-1])
    seq = torch.repeat_interleave(torch.arange(len(lens)), nc)
    i = torch.arange(NC) - seq_ptr[seq]
    start = cu[seq] + i * C
    length = torch.clamp(lens[seq] - i * C, max=C).to(torch.int32)
    return dict(start=start.to(device), length=length.to(device), seq_ptr=seq_ptr.to(device),
                NC=NC, N=len(lens))


def build_token_chunks(ch: dict, n_h: int, device) -> dict:
    """Token chunks over the sub-step chunks of :func:`build_chunks`: each groups ``n_h`` consecutive
    chunks of a sequence (``C`` tokens; the last group of a sequence may hold fewer chunks).

    Returns ``dict(first, count, seq_ptr, NT)``: ``first`` (int64) the first chunk of each token
    chunk, ``count`` (int32) how many chunks it holds, ``seq_ptr`` (int64) where each sequence's
    token chunks start. The forward that keeps one state per token chunk
    (``function.TUNE["token_chunk_output"]``) indexes its states with them.
    """
    seq_ptr = ch["seq_ptr"].to("cpu")
    nc = seq_ptr[1:] - seq_ptr[:-1]
    nt = (nc + n_h - 1) // n_h
    tseq = torch.zeros(len(nc) + 1, dtype=torch.int64)
    tseq[1:] = nt.cumsum(0)
    NT = int(tseq[-1])
    seq = torch.repeat_interleave(torch.arange(len(nc)), nt)
    j = torch.arange(NT) - tseq[seq]
    first = seq_ptr[seq] + j * n_h
    count = torch.clamp(nc[seq] - j * n_h, max=n_h).to(torch.int32)
    return dict(first=first.to(device), count=count.to(device), seq_ptr=tseq.to(device), NT=NT)
