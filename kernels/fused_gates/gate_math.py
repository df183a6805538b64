"""L1-normalised gates in registers (Triton), shared by the fused block-diagonal and companion kernels.

``gate_normalize`` reproduces :func:`lrnn_scan.gates.normalize_gates` for one row of logits held
in registers and also returns what the fused backward needs (``shared/reference/math.md`` §3):

    a_k = f(z_k) / S,   S = Σ_l |f(z_l)| (+ eps),
    ∂h_t[i]/∂z_k = f'(z_k)/S · (u_k − sign(f(z_k)) · h_t[i]),

with ``u_0 = v_t[i]`` for the input gate and ``u_k`` the state entry that ``a_k`` multiplies.
The function returns ``(w, w0, g, g0, s, s0)`` with ``g = f'/S`` and ``s = sign(f)`` so that a
kernel computes ``dz_k = λ_i · g_k · (u_k − s_k · y_i)`` without ever forming ``∂L/∂A``.
Variant codes: see :data:`VARIANT_CODES`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from lrnn_scan.gates import canonical_gate_name

__all__ = ["VARIANT_CODES", "variant_code", "gate_normalize"]

VARIANT_CODES = {"softmax": 0, "sigmoid": 1, "relu": 2, "tanh": 3, "identity": 4, "none": 5}


def variant_code(variant: str) -> int:
    """Integer code of a gate variant (aliases resolved by ``lrnn_scan.gates``)."""
    return VARIANT_CODES[canonical_gate_name(variant)]


@triton.jit
def _log_sigmoid(z):
    # log σ(z) = min(z, 0) − log(1 + e^{−|z|}), exact for any |z|
    return tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _f(z, VARIANT: tl.constexpr):
    """Unnormalised gate function for relu / tanh / identity (codes 2, 3, 4)."""
    if VARIANT == 2:
        r = tl.maximum(z, 0.0)
    elif VARIANT == 3:
        e = tl.exp(-2.0 * tl.abs(z))
        r = _sign(z) * ((1.0 - e) / (1.0 + e))
    else:
        r = z
    return r


@triton.jit
def _fprime(z, f, VARIANT: tl.constexpr):
    if VARIANT == 2:
        r = tl.where(z > 0, 1.0, 0.0)
    elif VARIANT == 3:
        r = 1.0 - f * f
    else:
        r = z * 0.0 + 1.0
    return r


@triton.jit
def gate_normalize(z, z0, mask, eps, AX: tl.constexpr, VARIANT: tl.constexpr):
    """Normalise a tile of gate rows.

    z: transition logits ``[..., MP]`` (fp32; the row runs along axis ``AX``, the last one);
    z0: input-gate logits ``[...]``; mask: valid entries of ``z``.
    Returns ``(w, w0, g, g0, s, s0)`` (see module docstring); masked entries of w and g are 0.
    """
    if VARIANT <= 1:  # softmax, sigmoid = softmax(logsigmoid)
        if VARIANT == 1:
            y = _log_sigmoid(z)
            y0 = _log_sigmoid(z0)
        else:
            y = z
            y0 = z0
        y = tl.where(mask, y, float("-inf"))
        mx = tl.maximum(tl.max(y, axis=AX), y0)
        e = tl.exp(y - tl.expand_dims(mx, AX))
        e0 = tl.exp(y0 - mx)
        inv = 1.0 / (tl.sum(e, axis=AX) + e0)
        w = e * tl.expand_dims(inv, AX)
        w0 = e0 * inv
        if VARIANT == 1:  # d logsigmoid / dz = σ(−z)
            g = w * tl.exp(_log_sigmoid(-z))
            g0 = w0 * tl.exp(_log_sigmoid(-z0))
        else:
            g = w
            g0 = w0
        s = w * 0.0 + 1.0
        s0 = w0 * 0.0 + 1.0
    elif VARIANT <= 4:  # relu, tanh, identity: f / (Σ|f| + eps)
        f = tl.where(mask, _f(z, VARIANT), 0.0)
        f0 = _f(z0, VARIANT)
        inv = 1.0 / (tl.sum(tl.abs(f), axis=AX) + tl.abs(f0) + eps)
        w = f * tl.expand_dims(inv, AX)
        w0 = f0 * inv
        g = tl.where(mask, _fprime(z, f, VARIANT), 0.0) * tl.expand_dims(inv, AX)
        g0 = _fprime(z0, f0, VARIANT) * inv
        s = _sign(f)
        s0 = _sign(f0)
    else:  # none: the logits themselves
        w = tl.where(mask, z, 0.0)
        w0 = z0
        g = tl.where(mask, 1.0, 0.0)
        g0 = z0 * 0.0 + 1.0
        s = w * 0.0
        s0 = w0 * 0.0
    return w, w0, g, g0, s, s0
