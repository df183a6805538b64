"""The ``m = 2`` and ``m = 4`` forwards with tiles loaded by TMA: ``tma.py``'s scheme on blocks.

Why: with few programs (B8 T2048 N768) the ``m = 2`` and ``m = 4`` forwards (``lookback2.py``,
``lookback4.py``: one thread a block, chunks passed by look-back) ran at 81 % and 71 % of a
same-size copy on an H100. Here, as in ``tma.py``'s ``m = 1`` kernel, a program is ``BH`` blocks
of one sequence on one warp, walking its time axis in ``(BT, BH)`` tiles that Triton's pipeliner
loads by TMA ``NS - 1`` tiles ahead; per tile, ``tl.associative_scan`` over time composes the
blocks' affine maps (6 scalars a 2 x 2 block, 20 a 4 x 4 one; combine ``(P, e) then (Q, f) =
(Q P, Q e + f)``), so from the state ``x`` entering the tile ``h_t = P_t x + e_t``. The next tile
starts from the tile's last ``h``, picked across lanes (``CARRY_H``, default): a pick of ``m``
values where the tile's map (its last row, reduced before ``x`` is used: a shorter chain) is
``m^2 + m``; fewer instructions won (H100, twenty-sixth session: m = 4 forward B6 T2048 N768 78
against 71 % of copy, B8 94 / 91; m = 2 0-2 points). Numbers: ``bd_tma_auto``.

Descriptors view ``A`` ``(B, T, H, m, m)`` as ``(B, T, m^2 H)`` and ``b`` as ``(B, T, m H)``
(``(1, T_total, .)`` with ``cu_seqlens``); a loaded tile is reshaped to ``(BT, BH, m, m)`` and
split into its entries. Rows at or past ``eos`` become identity steps; stores are masked; store
offsets are int64. Requirements as in ``tma.py`` (``tma_usable``), with ``m BH`` channels a tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, num_sms
from .lookback2 import _affine2_combine
from .lookback4 import _affine4_combine
from .tma import TensorDescriptor, tma_seq, tma_tile_store, tma_usable

__all__ = ["bd_tma_auto", "bd_tma_config", "bd_tma_forward"]


@triton.jit
def _split2(x, BT: tl.constexpr, BH: tl.constexpr):
    """The 2 entries of the last axis of ``x`` ``(BT, BH, 2)``, fp32."""
    x0, x1 = tl.split(x)
    return x0.to(tl.float32), x1.to(tl.float32)


@triton.jit
def _split4(x, BT: tl.constexpr, BH: tl.constexpr):
    """The 4 entries of the last axis of ``x`` ``(BT, BH, 4)``, in order, fp32."""
    ev, od = tl.split(x.reshape(BT, BH, 2, 2))  # index 2 u + v: v = 0 -> entries 0, 2
    x0, x2 = tl.split(ev)
    x1, x3 = tl.split(od)
    return x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)


@triton.jit
def _pick_rows(sc, row, K: tl.constexpr):
    """The row where ``row`` (a ``(BT, 1)`` mask with one true entry) of each of the ``K``
    ``(BT, BH)`` tensors of ``sc`` (exact: adds zeros)."""
    out = ()
    for k in tl.static_range(K):
        out = out + (tl.sum(tl.where(row, sc[k], 0.0), axis=0),)
    return out


@triton.jit
def _state(X, so, mk, HAS: tl.constexpr, M: tl.constexpr):
    """The ``M`` entries of per-block states at ``X + so`` (``(BH,)`` offsets, ``mk`` the valid
    blocks) as fp32 tensors, or zeros without ``HAS``."""
    out = ()
    for k in tl.static_range(M):
        if HAS:
            out = out + (tl.load(X + so + k, mask=mk, other=0.0).to(tl.float32),)
        else:
            out = out + (tl.zeros_like(so).to(tl.float32),)
    return out


@triton.jit
def _apply4(p, x0, x1, x2, x3):
    """The 4 x 4 affine map ``p`` (a 20-tuple: ``P`` row-major, then ``e``) applied to
    ``(x0, x1, x2, x3)``: ``sum_j P_kj x_j + e_k`` as a 4-tuple. (The offset first, so that
    every product fuses into an FMA, did not time faster: RESULTS.md, twenty-fifth session.)"""
    return (p[0] * x0 + p[1] * x1 + p[2] * x2 + p[3] * x3 + p[16],
            p[4] * x0 + p[5] * x1 + p[6] * x2 + p[7] * x3 + p[17],
            p[8] * x0 + p[9] * x1 + p[10] * x2 + p[11] * x3 + p[18],
            p[12] * x0 + p[13] * x1 + p[14] * x2 + p[15] * x3 + p[19])


@triton.jit
def _frame(H, BT: tl.constexpr, BH: tl.constexpr, M: tl.constexpr):
    """This program's blocks ``kb`` (``k0`` the first; ``mk``: below ``H``), its channels ``c`` of
    ``b`` and ``h`` (``mc``: below ``M H``), and the mask of a tile's last row."""
    k0 = tl.program_id(0) * BH
    kb = k0 + tl.arange(0, BH)
    c = M * k0 + tl.arange(0, M * BH)
    last = (tl.arange(0, BT) == BT - 1)[:, None]
    return k0, kb, kb < H, c, c < M * H, last


@triton.jit(do_not_specialize=["T"])
def _bd2_fwd_tma_kernel(DA, DB, Hout, SH, Init, Final, CU, T, H, BT: tl.constexpr, BH: tl.constexpr,
                        NS: tl.constexpr, HAS_INIT: tl.constexpr, VARLEN: tl.constexpr,
                        TSTORE: tl.constexpr, CARRY_H: tl.constexpr):
    """``m = 2``: ``A`` as ``(rows, 4 H)`` (a block's row-major ``a11 a12 a21 a22``), ``b`` and ``h``
    ``(rows, 2 H)``, ``Init``/``Final`` ``(nseq, H, 2)``."""
    s = tl.program_id(1)
    bos, eos, sd = tma_seq(CU, s, T, VARLEN)
    k0, kb, mk, c, mc, last = _frame(H, BT, BH, 2)
    r = tl.arange(0, BT)
    so = s.to(tl.int64) * 2 * H + 2 * kb
    x1, x2 = _state(Init, so, mk, HAS_INIT, 2)
    row0 = sd.to(tl.int64) * T
    for i in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=NS):
        ts = bos + i * BT
        t = ts + r
        ok = (t < eos)[:, None]
        col0, col1 = tl.split(DA.load([sd, ts, 4 * k0]).reshape(BT, BH, 2, 2))  # A[..., :, j]
        a11, a21 = _split2(col0, BT, BH)
        a12, a22 = _split2(col1, BT, BH)
        b1, b2 = _split2(DB.load([sd, ts, 2 * k0]).reshape(BT, BH, 2), BT, BH)
        sc = tl.associative_scan((tl.where(ok, a11, 1.0), tl.where(ok, a12, 0.0),  # identity steps
                                  tl.where(ok, a21, 0.0), tl.where(ok, a22, 1.0),  # at/past eos
                                  tl.where(ok, b1, 0.0), tl.where(ok, b2, 0.0)), 0, _affine2_combine)
        h1 = sc[0] * x1[None, :] + sc[1] * x2[None, :] + sc[4]
        h2 = sc[2] * x1[None, :] + sc[3] * x2[None, :] + sc[5]
        hv = tl.join(h1, h2).reshape(BT, 2 * BH)
        tma_tile_store(Hout, SH, hv, row0, sd, ts, t, ok, c, mc, 2 * H, 2 * k0, TSTORE)
        if CARRY_H:  # the tile's last state (a pick of 2 values)
            x1, x2 = _pick_rows((h1, h2), last, 2)
        else:
            p = _pick_rows(sc, last, 6)  # the tile's map, reduced off the chain
            x1, x2 = p[0] * x1 + p[1] * x2 + p[4], p[2] * x1 + p[3] * x2 + p[5]
    tl.store(Final + so, x1, mask=mk)
    tl.store(Final + so + 1, x2, mask=mk)


@triton.jit
def _blocks4(x, ok, BT: tl.constexpr, BH: tl.constexpr):
    """A loaded ``A`` tile (``16 BH`` entries a row) as the 20-tuple start of a map: the 16
    entries row-major as ``(BT, BH)`` fp32 tensors, the identity where ``ok`` is false."""
    ce, co = tl.split(x.reshape(BT, BH, 4, 2, 2))  # column j = 2 j1 + j0; j0 = 0 -> columns 0, 2
    c0, c2 = tl.split(ce)
    c1, c3 = tl.split(co)
    cols = (_split4(c0, BT, BH), _split4(c1, BT, BH), _split4(c2, BT, BH), _split4(c3, BT, BH))
    out = ()
    for i in tl.static_range(4):
        for j in tl.static_range(4):
            out = out + (tl.where(ok, cols[j][i], 1.0 if i == j else 0.0),)
    return out


@triton.jit(do_not_specialize=["T"])
def _bd4_fwd_tma_kernel(DA, DB, Hout, SH, Init, Final, CU, T, H, BT: tl.constexpr, BH: tl.constexpr,
                        NS: tl.constexpr, HAS_INIT: tl.constexpr, VARLEN: tl.constexpr,
                        TSTORE: tl.constexpr, CARRY_H: tl.constexpr):
    """``m = 4``: ``A`` as ``(rows, 16 H)``, ``b`` and ``h`` ``(rows, 4 H)``, ``Init``/``Final``
    ``(nseq, H, 4)``; maps are 20-tuples (``P`` row-major, then ``e``; ``lookback4.py``)."""
    s = tl.program_id(1)
    bos, eos, sd = tma_seq(CU, s, T, VARLEN)
    k0, kb, mk, c, mc, last = _frame(H, BT, BH, 4)
    r = tl.arange(0, BT)
    so = s.to(tl.int64) * 4 * H + 4 * kb
    x0, x1, x2, x3 = _state(Init, so, mk, HAS_INIT, 4)
    row0 = sd.to(tl.int64) * T
    for i in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=NS):
        ts = bos + i * BT
        t = ts + r
        ok = (t < eos)[:, None]
        b0, b1, b2, b3 = _split4(DB.load([sd, ts, 4 * k0]).reshape(BT, BH, 4), BT, BH)
        sc = tl.associative_scan(_blocks4(DA.load([sd, ts, 16 * k0]), ok, BT, BH)
                                 + (tl.where(ok, b0, 0.0), tl.where(ok, b1, 0.0),
                                    tl.where(ok, b2, 0.0), tl.where(ok, b3, 0.0)), 0, _affine4_combine)
        hs = _apply4(sc, x0[None, :], x1[None, :], x2[None, :], x3[None, :])
        hv = tl.join(tl.join(hs[0], hs[2]), tl.join(hs[1], hs[3])).reshape(BT, 4 * BH)  # [.., k] = h_k
        tma_tile_store(Hout, SH, hv, row0, sd, ts, t, ok, c, mc, 4 * H, 4 * k0, TSTORE)
        if CARRY_H:
            x0, x1, x2, x3 = _pick_rows(hs, last, 4)
        else:
            x0, x1, x2, x3 = _apply4(_pick_rows(sc, last, 20), x0, x1, x2, x3)
    for k in tl.static_range(4):
        tl.store(Final + so + k, (x0, x1, x2, x3)[k], mask=mk)


_KERNELS = {2: _bd2_fwd_tma_kernel, 4: _bd4_fwd_tma_kernel}
# "auto": (low, high, BT, BH) bands of 4-block programs per SM, by m (bd_tma_auto)
_BANDS = {2: ((5, 6.5, 64, 4), (7, 12, 32, 8)), 4: ((1.25, 2, 32, 2), (2, 5, 32, 4))}


def bd_tma_auto(m: int, H: int, nseq: int, sms: int):
    """``(BT, BH)`` of the "auto" rule on a GPU for ``m`` in (2, 4), or None (the other forwards).
    The rule counts ``nseq * ceil(H / 4)`` per SM (``P``); its bands are where TMA won.

    H100 80GB HBM3, fp32, CUDA graphs, medians of 3 rounds, % of a same-size copy: the forward
    without TMA (``lookback2`` / ``lookback4`` / ring) against (BT, BH) = (64, 4) and (32, 8) at
    ``m = 2``, (32, 2) and (32, 4) at ``m = 4`` (RESULTS.md, twenty-fourth session). Wins are
    jagged in ``P`` (the number of programs an SM gets and the tiles a program walks both move),
    so the bands are the measured ones, not a model:

    =====================  ======  ========  ==========  ==========
    shape (T2048 N768)     P       without   first cfg   second cfg
    =====================  ======  ========  ==========  ==========
    m=2 B5                 3.6     77        81          58
    m=2 B6                 4.4     79        77          67
    m=2 B8                 5.8     81        **90**      81
    m=2 B10                7.3     83        71          **91**
    m=2 B12                8.7     78        69          **88**
    m=2 B16 T1024          11.6    84        78          **92**
    m=2 B8 N1536           11.6    85        69          **94**
    m=2 B20 T1024          14.5    91        72          83
    m=2 B4 T4096           2.9     78        70          46
    m=4 B3 T4096           1.1     60        58          38
    m=4 B4 T4096           1.45    65        **75**      50
    m=4 B5                 1.8     65        **84**      63
    m=4 B6                 2.2     68        68          **71**
    m=4 B8                 2.9     72        88          **92**
    m=4 B10, B11           3.6, 4  74, 84    94, 94      **96, 96**
    m=4 B16 T1024          5.8     93        82          90
    =====================  ======  ========  ==========  ==========

    Not used either: B2 T8192 (m = 2: 74 against 61 at best; m = 4: 56 against 59 at (64, 1)) and
    B8 T2048 N4096 (ring 0.352 ms against 0.422 at m = 2)."""
    per = nseq * cdiv(H, 4) / sms
    for low, high, bt, bh in _BANDS[m]:
        if low <= per < high:
            return bt, bh
    return None


def bd_tma_config(A, b, nseq: int, tune: dict, sms: int):
    """``(BT, BH, num_warps, num_stages)`` of the TMA forward for ``A`` ``(B, T, H, m, m)`` and
    ``b`` ``(B, T, H, m)``, ``m`` in (2, 4), or None (other ``m``, or refused).
    ``tune["bd<m>_tma"]``: "auto" (default: ``bd_tma_auto`` on a GPU, not with ``tune`` keys
    ``chunk`` or ``variant`` set or ``bd<m>_lookback`` True), True (wherever ``tma_usable``) or
    False. ``(BT, BH)`` from ``bd_tma_auto``'s band (forced outside the bands:
    its last band's), one warp, 3 stages; keys ``tma<m>_bt``, ``tma<m>_bh``, ``tma<m>_nw``,
    ``tma<m>_ns`` override them."""
    B, T, H, m = b.shape
    if m not in _KERNELS:
        return None
    mode = tune.get(f"bd{m}_tma", "auto")
    if mode not in (True, False, "auto"):
        raise ValueError(f'TUNE["bd{m}_tma"] must be "auto", True or False, got {mode!r}')
    band = bd_tma_auto(m, H, nseq, sms)
    # a forced look-back, chunk length or ring variant asks for that forward (tests, tools)
    forced = "chunk" in tune or "variant" in tune or tune.get(f"bd{m}_lookback") is True
    if mode == "auto":
        mode = b.is_cuda and band is not None and not forced
    bt, bh = band or _BANDS[m][-1][2:]
    cfg = (tune.get(f"tma{m}_bt", bt), tune.get(f"tma{m}_bh", bh), tune.get(f"tma{m}_nw", 1),
           tune.get(f"tma{m}_ns", 3))
    if not mode or not tma_usable(A, b, m * cfg[1]):
        return None
    return cfg


def bd_tma_forward(A, b, h0, cu, tune, empty, max_len=None):
    """``(h, final, None)`` of the ``m = 2`` or ``4`` forward by TMA (the signature of the
    look-back forwards; ``max_len`` unused): ``A`` ``(B, T, H, m, m)``, ``b``, ``h``
    ``(B, T, H, m)`` (``B == 1`` with ``cu_seqlens``), ``final`` fp32 ``(nseq, H, m)``; ``empty``
    the scan's allocator. Raises where ``bd_tma_config`` refuses. ``tune["tma<m>_tstore"]``
    (opt-in, measured slower): ``h`` stored by TMA without varlen; ``tune["tma<m>_carry_h"]``
    (default True): the carry is the tile's last ``h`` (module docstring), False: the tile's map."""
    B, T, H, m = b.shape
    nseq = B if cu is None else cu.numel() - 1
    cfg = bd_tma_config(A, b, nseq, tune, num_sms(b.device))
    if cfg is None:
        raise ValueError(f"bd_tma_forward: TMA refused these inputs (m = {m}; bd_tma_config)")
    bt, bh, nw, ns = cfg

    def desc(x, width):
        return TensorDescriptor(x, shape=[B, T, width * H], strides=[T * width * H, width * H, 1],
                                block_shape=[1, bt, width * bh])

    h = empty(b.shape, b.dtype, b.device)
    final = empty((nseq, H, m), torch.float32, b.device)
    tstore = bool(tune.get(f"tma{m}_tstore", False)) and cu is None  # varlen: masked stores
    _KERNELS[m][(cdiv(H, bh), nseq)](
        desc(A, m * m), desc(b, m), h, desc(h, m) if tstore else h, h0 if h0 is not None else b, final,
        cu if cu is not None else b, T, H, BT=bt, BH=bh, NS=ns, HAS_INIT=h0 is not None,
        VARLEN=cu is not None, TSTORE=tstore, CARRY_H=bool(tune.get(f"tma{m}_carry_h", True)),
        num_warps=nw)
    return h, final, None
