"""Triton kernels of the row-wise L2 normalisation (README.md has the derivation).

Rows are the flattened leading dims of a contiguous ``(R, K)`` view; ``BK`` is ``K`` rounded up
to a power of two (masked), ``BR`` rows per program. Row offsets are int64 (``R·K`` may exceed
2^31).
"""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["R"])
def l2norm_fwd_kernel(X, Y, RSTD, R, K: tl.constexpr, eps, BR: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BK)
    mask = (rows[:, None] < R) & (cols[None, :] < K)
    offs = rows[:, None] * K + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    # r = 1 / max(‖x‖, eps), as torch's normalize (clamp of the norm, not of its square)
    r = 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)
    tl.store(Y + offs, (x * r[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, r, mask=rows < R)


@triton.jit(do_not_specialize=["R"])
def l2norm_bwd_kernel(X, RSTD, DY, DX, R, K: tl.constexpr, eps, BR: tl.constexpr,
                      BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BK)
    mask = (rows[:, None] < R) & (cols[None, :] < K)
    offs = rows[:, None] * K + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(RSTD + rows, mask=rows < R, other=1.0)
    y = x * r[:, None]
    # clamped rows (‖x‖ <= eps, r = 1/eps) have a constant scale: no projection term
    proj = tl.where(r < 1.0 / eps, tl.sum(y * dy, axis=1), 0.0)
    dx = r[:, None] * (dy - y * proj[:, None])
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
