"""L2 prefetch of the next chunk's rows in the sequential-over-chunks state kernels.

The state kernels (state_fused.py) walk a sequence's chunks one after another, one program per
(sequence, head, V tile), two programs an SM (registers). Their per-chunk loads (keys, the inverse
``A``, ``β``, gates, ``V`` or ``P^T dO``, queries and ``dO``) do not depend on the running state,
but at one pipeline stage (more stages spill) they are issued at the top of each chunk and waited
on there: Nsight Compute (H200, sixty-second session) put 4.6 of the backward state kernel's 11.9
cycles between issues on those loads. ``prefetch.global.L2`` asks for a 128-byte line to be
brought into L2 without holding a register or waiting for it, so the loads of the next chunk, if
issued a chunk ahead (``TUNE["state_fwd_prefetch"]`` / ``TUNE["state_bwd_prefetch"]``), find their
lines in L2 instead of HBM. It is a hint: it changes no value, and it is only issued for rows the
kernel loads anyway (the callers clamp the chunk index and the rows), so no address outside the
buffers is touched.

Inline PTX: GPU (CUDA) only. The launcher passes ``PREFETCH = 0`` under the CPU interpreter, which
cannot run it, and on other backends."""
import os

import torch
import triton
import triton.language as tl


@triton.jit
def _l2_line(ptr):
    """``prefetch.global.L2`` of the line holding each pointer (the asm's dummy result is unused;
    ``is_pure=False`` keeps the instruction)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_rows(base, rows, W: tl.constexpr, width=None):
    """Prefetch into L2 the rows ``base[rows[i] : rows[i] + W]`` (``rows``: element offsets, ``[R]``
    int64), one request per 128-byte line of a row. ``width`` (at most ``W``; a V tile at the end
    of a row): no request starts past ``rows[i] + width - 1``, so none leaves the row."""
    BITS: tl.constexpr = base.dtype.element_ty.primitive_bitwidth
    NL: tl.constexpr = (W * BITS + 1023) // 1024        # lines a row
    LE: tl.constexpr = 1024 // BITS                     # elements a line
    cols = tl.arange(0, NL) * LE
    if width is not None:
        cols = tl.minimum(cols, width - 1)
    _l2_line(base + rows[:, None] + cols[None, :])


def prefetch_distance(key: str, TUNE: dict, x: torch.Tensor) -> int:
    """``TUNE[key]``, the chunks ahead that a state kernel prefetches (0: none), checked; 0 where the
    inline PTX cannot run (the CPU interpreter, a non-CUDA device, ROCm)."""
    d = TUNE[key]
    if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= 4:
        raise ValueError(f'TUNE["{key}"] must be an int in [0, 4] (chunks ahead; 0: off), got {d!r}')
    if os.environ.get("TRITON_INTERPRET") == "1" or x.device.type != "cuda" or torch.version.hip:
        return 0
    return d
