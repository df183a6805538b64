"""Shared dot helpers for the DeltaProduct kernels."""
import triton
import triton.language as tl


@triton.jit
def dot_abt(a, b, DOT: tl.constexpr, RAW: tl.constexpr):
    """``a b^T`` for two tiles loaded in the inputs' dtype. ``RAW``: 16-bit inputs multiplied as they
    are (exact products, fp32 accumulate, twice the tf32 rate on tensor cores); otherwise upcast to
    fp32 first (float32 inputs, and the CPU interpreter, whose bf16 dot returns garbage: Triton 3.9)."""
    if RAW:
        return tl.dot(a, tl.trans(b), input_precision=DOT)
    else:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision=DOT)


@triton.jit
def f16(x, D16: tl.constexpr):
    """``(x16, inv)``: the tile ``x`` as an fp16 dot operand with ``x ≈ x16 · inv``. ``D16 == 2``:
    ``x`` times the power of two that takes ``max|x|`` into ``[2^14, 2^15)`` (fp16's 10 mantissa bits
    over its whole normal range, whatever the scale of ``x``; ``inv`` is exactly its inverse).
    ``D16 == 1``: ``x`` as it is (``inv = 1``; no guard against fp16's range, measurement only)."""
    if D16 == 2:
        s, inv = _pow2(tl.max(tl.max(tl.abs(x.to(tl.float32)), 1), 0))
        return (x * s).to(tl.float16), inv
    else:
        return x.to(tl.float16), 1.0


@triton.jit
def _pow2(m):
    """``(s, 1/s)``, powers of two with ``m · s`` in ``[2^14, 2^15)`` (clamped to fp32's normal
    range: ``m = 0`` gives ``2^126``), elementwise."""
    eb = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF              # biased exponent of m
    se = tl.minimum(tl.maximum(268 - eb, 1), 253)                 # 127 + 14 - (eb - 127), kept normal
    return (se << 23).to(tl.float32, bitcast=True), ((254 - se) << 23).to(tl.float32, bitcast=True)


@triton.jit
def f16_rows(x):
    """``(x16, inv)`` with one power of two a row (``inv``: ``[rows]``), for ``a b^T`` dots, whose
    rows of either operand scale the product's rows or columns: ``a b^T = diag(ia) (a16 b16^T)
    diag(ib)``. A row's max is a reduction inside a warp where the columns are (no shared memory)."""
    s, inv = _pow2(tl.max(tl.abs(x.to(tl.float32)), 1))
    return (x * s[:, None]).to(tl.float16), inv


@triton.jit
def pre16(x, D16: tl.constexpr):
    """``(operand, inv)`` for ``pdot``: ``f16(x)`` with ``D16``, else ``(x, 1)`` (one tile, scaled
    once, can then feed several dots)."""
    if D16 == 0:
        return x, 1.0
    else:
        return f16(x, D16)


@triton.jit
def pdot(a, ia, b, ib, DOT: tl.constexpr, D16: tl.constexpr):
    """``a @ b`` of two ``pre16`` operands: the ``DOT`` precision (tf32 for 16-bit inputs) on fp32
    tiles, or with ``D16`` fp16 operands (rounded to nearest, 10 mantissa bits as tf32 has, which
    truncates; twice tf32's MMA rate) and the scales undone on the fp32 product."""
    if D16 == 0:
        return tl.dot(a, b, input_precision=DOT)
    else:
        return tl.dot(a, b) * (ia * ib)


@triton.jit
def mdot(a, b, DOT: tl.constexpr, D16: tl.constexpr):
    """``a @ b`` of two fp32 (or upcast) tiles, ``pdot``'s precision."""
    a2, ia = pre16(a, D16)
    b2, ib = pre16(b, D16)
    return pdot(a2, ia, b2, ib, DOT, D16)
