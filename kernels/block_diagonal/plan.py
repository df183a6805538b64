"""Which kernels a scan runs: the plans of ``block_diagonal_scan`` / ``diagonal_scan`` (``scan.py``)
and of their ``torch.compile`` custom ops (``lrnn_scan/compile.py``), so compiled and eager calls
launch the same kernels.

A plan is ``(chunk, lookback, bwd_lookback)``, the arguments of ``scan._run_forward`` /
``scan._run_backward``: ``chunk`` the time-chunk length (None: one pass; ``scan._choose_chunk``),
``lookback`` the forward in place of the ring / tile kernels (False; ``"tma"``, ``"m2"``, ``"m4"``
or True: ``tma_blocks.py``, ``lookback2.py``, ``lookback4.py``, ``lookback_dot.py``, and for
``m = 1`` ``lookback.py``), ``bwd_lookback`` the backward (False: ring / tile, chunked with the
forward's chunk products where ``chunk`` is set; ``"tma"``, True: ``tma_blocks_bwd.py``,
``lookback2_bwd.py`` / ``lookback4_bwd.py``, for ``m = 1`` ``tma_bwd.py`` / ``lookback_bwd.py``).
The rules read ``scan.TUNE`` and the device (SMs, name); each one's measurements are in its
docstring.

``backward_plan`` gives a custom op's backward its half of the plan from what the forward left
(chunk products or not), since the op's backward cannot see the forward's Python state.
"""
from __future__ import annotations

from .._host import cdiv
from . import scan as S  # attribute access at call time: tests patch scan's rules
from . import tma_blocks, tma_blocks_bwd, tma_bwd
from .lookback import lookback_cfg
from .lookback2 import bd2_lookback_use
from .lookback2_bwd import bd2_bwd_lookback_use
from .lookback4 import bd4_lookback_use
from .lookback4_bwd import bd4_bwd_lookback_use
from .lookback_dot import bd_lookback_use

__all__ = ["bd_plan", "diag_plan", "backward_plan"]


def bd_plan(A, b, nseq: int, max_len: int, grad: bool):
    """The plan of ``block_diagonal_scan`` for ``A`` ``(B, T, H, m, m)``, ``b`` ``(B, T, H, m)``,
    ``nseq`` sequences of at most ``max_len`` steps, ``grad``: a backward will follow."""
    H, m = b.shape[2], b.shape[3]
    bh = S._bd_cfg(m)[1]
    nprog, nsm = nseq * cdiv(H, bh), S._num_sms(b.device)  # the ring kernels' programs
    chunk = S._choose_chunk(nprog, max_len, b.device, 1, m, grad)
    lookback = not grad and bd_lookback_use(S.TUNE, m, chunk)
    bwd_lb = (bd2_bwd_lookback_use(S.TUNE, m, grad, nseq * cdiv(H, 32), nsm)
              or bd4_bwd_lookback_use(S.TUNE, m, grad, chunk, nprog, nsm))
    tma_cfg = (tma_blocks.bd_tma_config(A, b, nseq, S.TUNE, nsm)
               if m in (2, 4) and not lookback and (not grad or chunk is None or bwd_lb) else None)
    if tma_cfg is not None:
        lookback = "tma"  # few programs on Hopper: TMA loads (tma_blocks.py); no chunk products
        if grad and tma_blocks_bwd.bd_tma_bwd_use(S.TUNE, m):
            bwd_lb = "tma"  # its backward by TMA too where measured faster (tma_blocks_bwd.py)
    elif m == 2 and not lookback and (bwd_lb or bd2_lookback_use(S.TUNE, chunk, nprog < nsm, grad)):
        lookback = "m2"  # lookback2.py (and lookback2_bwd.py) where measured faster
    elif m == 4 and not lookback and (bwd_lb or bd4_lookback_use(S.TUNE, m, grad, chunk, nprog, nsm)):
        lookback = "m4"  # lookback4.py (and lookback4_bwd.py) likewise
    return (None if lookback else chunk), lookback, bwd_lb


def _diag_programs(b, nseq: int):
    """``(bt, forward programs, backward programs)`` of the ``m = 1`` tiles (``scan._diag_cfg``)."""
    N = b.shape[2]
    bt, bn, _, _ = S._diag_cfg(N, nseq, b.device)
    return bt, nseq * cdiv(N, bn), nseq * cdiv(N, S._diag_cfg(N, nseq, b.device, bwd=True)[1])


def diag_plan(b, nseq: int, max_len: int, grad: bool, varlen: bool = False):
    """The plan of ``diagonal_scan`` (``(B, T, N)`` layout) for ``b``; as ``bd_plan``
    (``varlen``: ``cu_seqlens`` given)."""
    bt, nprog, bwd_prog = _diag_programs(b, nseq)
    bwd_lb = grad and diag_bwd_lookback(nprog, max_len, b.device, bt, bwd_prog)
    if grad and tma_bwd.diag_tma_bwd_config(b, nseq, max_len, varlen, S.TUNE, S._num_sms(b.device)):
        bwd_lb = "tma"  # one pass by TMA (tma_bwd.py; its rule there): no chunk products either
    # with the look-back backward the forward needs no chunk products: chosen as for inference
    grad = grad and not bwd_lb
    if diag_lookback(nprog, max_len, b.device, bt, grad):
        if not grad:  # one pass whatever the programs
            return None, True, bwd_lb
        bt = max(bt, lookback_cfg(S.TUNE)[0])  # backward chunks aligned to the tiles: P comes from them
        return S._choose_chunk(nprog, max_len, b.device, bt, 1, grad), True, False
    return S._choose_chunk(nprog, max_len, b.device, bt, 1, grad), False, bwd_lb


def backward_plan(A, h, nseq: int, max_len: int, diag: bool, chunked: bool, varlen: bool = False):
    """``(chunk, bwd_lookback)`` of the backward after a forward planned with gradients
    (``grad=True``) that left chunk products (``chunked``) or not: the plan recomputed on ``h``
    (shape and dtype of ``b``; the rules read shapes, the device and ``TUNE``). Where TMA
    alignment differs between ``b`` and the fresh ``h``, the forward may have run another kernel
    than this plan names: the backward stays correct, as every backward here takes any forward's
    ``h`` and only the chunked one needs the chunk products."""
    if diag:  # no rule here reads alignment: the forward's own plan (its look-back backward
        chunk, _, bwd_lb = diag_plan(h, nseq, max_len, True, varlen)  # reads no chunk products)
        return (chunk if chunked and not bwd_lb else None), bwd_lb
    if chunked:  # only the ring / chunked forward leaves chunk products: the gradient rule's chunks
        H, m = h.shape[2], h.shape[3]
        nprog = nseq * cdiv(H, S._bd_cfg(m)[1])
        return S._choose_chunk(nprog, max_len, h.device, 1, m, True), False
    return None, bd_plan(A, h, nseq, max_len, True)[2]


def diag_bwd_lookback(nprog, max_len, device, bt, bwd_prog) -> bool:
    """Whether the m = 1 backward is the single-pass look-back (lookback_bwd.py).
    ``TUNE["bwd_lookback"]``: True / False, or "auto" (the default): wherever the gradient rule
    would time-chunk (``nprog``: the forward's programs), and also where the one-pass backward has
    fewer than ``TUNE["bwd_lb_below"]`` (2) programs per SM (``bwd_prog``, counted on the backward's
    tiles) over sequences of at least ``chunk_min_len`` (1024) steps (a forced
    ``TUNE["chunk"]`` keeps the chunked backward). H100, fp32, CUDA graphs, medians of 3 rounds
    (2026-11-26, ``tools/lookback_repeat.py --set rule``), forward+backward: B1 T16384 N768
    0.1666 ms against 0.2631 (tiled forward, chunked backward); B8 T2048 N768 (192 programs,
    1.45 per SM) 0.1633 against 0.1880 with the one-pass backward; B8 T2048 N4096 (512, 3.9 per
    SM) 0.7823 against 0.7448, so the one-pass backward stays there."""
    if S.TUNE.get("bwd_lookback", "auto") == "auto" and "chunk" not in S.TUNE:
        few = bwd_prog < S.TUNE.get("bwd_lb_below", 2) * S._num_sms(device)
        if few and max_len >= S._chunk_min_len(True):
            return True
    return _lookback_mode("bwd_lookback", nprog, max_len, device, bt, True)


def diag_lookback(nprog, max_len, device, bt, grad) -> bool:
    """Whether the m = 1 forward is the single-pass look-back (lookback.py). ``TUNE["fwd_lookback"]``:
    True / False, or "auto" (the default): wherever the default rule would time-chunk (few
    programs, long sequences; a forced ``TUNE["chunk"]`` keeps the chunked forward). H100, fp32
    (kernels/block_diagonal/README.md): forward B1 T16384 N768 0.113 ms vs 0.295 chunked (2.6x);
    forward+backward (look-back forward with 64 x 32 tiles, chunked backward) B1 T16384 N768
    1.132 vs 1.281 ms, B8 T2048 N768 1.199 vs 1.315 (old gradient chunk rule). Where one pass
    fills the GPU the tiled kernel stays faster (forward B8 T2048 N4096 0.291 vs 0.509 ms)."""
    return _lookback_mode("fwd_lookback", nprog, max_len, device, bt, grad)


def _lookback_mode(key, nprog, max_len, device, bt, grad) -> bool:
    """``TUNE[key]``: True / False, or "auto": where ``_choose_chunk`` would time-chunk (a forced
    ``TUNE["chunk"]`` keeps the chunked path)."""
    mode = S.TUNE.get(key, "auto")
    if mode == "auto":
        return "chunk" not in S.TUNE and S._choose_chunk(nprog, max_len, device, bt, 1, grad) is not None
    if mode not in (True, False, None, 0, 1):
        raise ValueError(f'TUNE["{key}"] must be "auto", True or False, got {mode!r}')
    return bool(mode)
