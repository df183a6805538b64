"""The ``dA`` pass of a split backward: ``dA_t = lam_t h_{t-1}^T`` for every step at once.

Why: the one-pass backward (``bwd.py``) stores an ``m x m`` block of ``dA`` and loads ``h_{t-1}``
inside its chain of dependent steps. Split, the chain (``STORE_DA=False``) only reads ``A``, ``g``
and writes ``db = lam``; this pass then reads ``lam`` (from ``db``) and ``h`` back and writes
``dA`` with no dependency between steps, so every program streams independent tiles. It costs one
extra read of ``db`` (``T·m`` a block against the ``2·T·m²`` of ``A`` and ``dA``).
``h_{bos-1}`` is the initial state (or zero) at the first step of each sequence.
"""
import triton
import triton.language as tl

from .._host import cdiv, next_pow2
from .fwd import _block_row_offsets

_ELEMS = 4096  # dA elements a program (BT steps x BH blocks x MP^2): 16 KB of fp32 stores


@triton.jit(do_not_specialize=["T"])
def _bd_outer_kernel(DB, Hs, H0, DA, CU, T, H, M: tl.constexpr, MP: tl.constexpr,
                     BH: tl.constexpr, BT: tl.constexpr, HAS_H0: tl.constexpr,
                     VARLEN: tl.constexpr):
    """Program ``(c * NH + pid_h, s)``: steps ``[bos + c·BT, bos + (c+1)·BT)`` of sequence ``s``,
    blocks ``pid_h·BH ..`` (``NH = cdiv(H, BH)``)."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    nh = tl.cdiv(H, BH)
    pid_h = pid % nh
    c = pid // nh
    if VARLEN:
        bos = tl.load(CU + s).to(tl.int64)
        eos = tl.load(CU + s + 1).to(tl.int64)
    else:
        bos = s.to(tl.int64) * T
        eos = bos + T
    offs_s, mask_s, offs_a, mask_a = _block_row_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    t = bos + c.to(tl.int64) * BT + tl.arange(0, BT)
    ok = (t < eos)[:, None, None]
    lam = tl.load(DB + t[:, None, None] * HM + offs_s[None], mask=ok & mask_s[None], other=0.0)
    first = (t == bos)[:, None, None]
    hp = tl.load(Hs + (t - 1)[:, None, None] * HM + offs_s[None], mask=ok & ~first & mask_s[None],
                 other=0.0).to(tl.float32)
    if HAS_H0:
        h0 = tl.load(H0 + s.to(tl.int64) * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
        hp = tl.where(first, h0[None], hp)
    da = tl.reshape(lam.to(tl.float32)[:, :, :, None] * hp[:, :, None, :], (BT, BH, MP * MP))
    tl.store(DA + t[:, None, None] * HMM + offs_a[None], da.to(DA.dtype.element_ty),
             mask=ok & mask_a[None])


def outer_cfg(m: int, H: int, tune: dict) -> tuple[int, int, int]:
    """``(BH, BT, num_warps)``: one ``MP^2`` block row of 256+ elements (``BH`` blocks, at most
    ``H`` rounded up), ``BT`` steps to ``_ELEMS`` elements; ``tune`` keys ``outer_bh``,
    ``outer_bt``, ``outer_nw``."""
    mp = next_pow2(m)
    bh = tune.get("outer_bh", min(next_pow2(H), max(1, 256 // (mp * mp))))
    bt = tune.get("outer_bt", max(1, _ELEMS // (bh * mp * mp)))
    return bh, bt, tune.get("outer_nw", 4)


def bd_outer(db, h, h0, dA, cu, max_len: int, tune: dict) -> None:
    """Write ``dA[..., t, :, i, j] = db[t, i] · h[t-1, j]`` (``h0`` or zero before each sequence).

    ``db``, ``h``: ``(B, T, H, m)``; ``h0``: ``(nseq, H, m)`` or None; ``dA``: ``(B, T, H, m, m)``,
    written in place; ``cu``: int64 ``(nseq + 1,)`` offsets (``B == 1``) or None; ``max_len``: the
    longest sequence (``T`` without ``cu``)."""
    B, T, H, m = h.shape
    nseq = B if cu is None else cu.numel() - 1
    if nseq == 0 or max_len == 0:
        return
    bh, bt, nw = outer_cfg(m, H, tune)
    nt = cdiv(max_len, bt)
    _bd_outer_kernel[(nt * cdiv(H, bh), nseq)](
        db, h, h if h0 is None else h0, dA, h if cu is None else cu, T, H, M=m,
        MP=next_pow2(m), BH=bh, BT=bt, HAS_H0=h0 is not None, VARLEN=cu is not None, num_warps=nw)
