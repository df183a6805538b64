"""Shared dot helper for the DeltaProduct kernels."""
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
