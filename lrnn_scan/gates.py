"""L1-normalised selective gates of the H-LRU / BD-LRU paper (``shared/reference/math.md`` §3).

Each state row ``i`` has ``m + 1`` raw logits ``z_{i,0..m}``: index 0 is the *input gate*, indices
``1..m`` are the transition entries of that row. With a gate function ``f``

    a_{i,j} = f(z_{i,j}) / S_i,      S_i = Σ_{l=0..m} |f(z_{i,l})|  (+ eps where f can vanish)

so every row of ``[a_{i,0} | A_i]`` has L1 norm ≤ 1, which gives Proposition 1:
``‖h_T‖_∞ ≤ max_t ‖v_t‖_∞`` for any length. Variants:

==============  ==================  =====================================================
name            f                   computed as (numerically safe for |z| up to 1e4)
==============  ==================  =====================================================
``softmax``     exp (the default)   ``softmax(z)`` (alias ``exp``)
``sigmoid``     sigmoid             ``softmax(logsigmoid(z))`` (exact, no underflow)
``relu``        relu                ``relu(z) / (Σ relu(z) + eps)``
``tanh``        tanh (signed)       ``tanh(z) / (Σ |tanh(z)| + eps)``
``identity``    identity (signed)   ``z / (Σ |z| + eps)`` (alias ``linear``)
``none``        —                   no normalisation: ``z`` itself (baseline, unstable)
==============  ==================  =====================================================
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GATE_VARIANTS", "normalize_gates", "gate_function", "canonical_gate_name"]

GATE_VARIANTS = ("softmax", "sigmoid", "relu", "tanh", "identity", "none")
_ALIASES = {"exp": "softmax", "orig": "softmax", "linear": "identity", "lin": "identity",
            "nonorm": "none"}
DEFAULT_EPS = 1e-6


def canonical_gate_name(variant: str) -> str:
    """Resolve aliases (``exp`` → ``softmax``, ``linear`` → ``identity``); error on unknown."""
    if not isinstance(variant, str):
        raise TypeError(f"gate variant must be a string, got {type(variant).__name__}")
    name = _ALIASES.get(variant.lower(), variant.lower())
    if name not in GATE_VARIANTS:
        raise ValueError(f"unknown gate variant {variant!r}; expected one of {GATE_VARIANTS} "
                         f"(aliases: {sorted(_ALIASES)})")
    return name


def gate_function(variant: str, z: Tensor) -> Tensor:
    """The unnormalised ``f(z)`` of a variant (for analysis; ``none`` returns ``z``)."""
    name = canonical_gate_name(variant)
    return {"softmax": torch.exp, "sigmoid": torch.sigmoid, "relu": torch.relu,
            "tanh": torch.tanh}.get(name, lambda x: x)(z)


def normalize_gates(logits: Tensor, variant: str = "softmax", eps: float = DEFAULT_EPS,
                    ) -> tuple[Tensor, Tensor]:
    """Turn raw gate logits into (transition entries, input gate).

    Args:
        logits: ``(..., rows, m + 1)``; ``logits[..., 0]`` is the input-gate logit of each row,
            ``logits[..., 1:]`` the row's ``m`` transition-entry logits. For BD-LRU the rows of a
            block are its ``m`` state rows (``(B, T, H, m, m + 1)``); for H-LRU each channel is one
            row holding its ``m`` recurrence coefficients (``(B, T, N, m + 1)``).
        variant: one of :data:`GATE_VARIANTS` (or an alias).
        eps: added to the L1 denominator of ``relu``, ``tanh`` and ``identity`` (whose ``f`` can
            vanish on a whole row); must be > 0.

    Returns:
        ``(A, a0)`` with ``A`` of shape ``(..., rows, m)`` and ``a0`` of shape ``(..., rows)``; the
        same dtype as ``logits``. For every normalised variant ``|a0| + Σ_j |A_{·,j}| ≤ 1`` row-wise.

    Example:
        >>> z = torch.randn(2, 10, 4, 3, 4)               # (B, T, H, m=3, m+1)
        >>> A, a0 = normalize_gates(z, "softmax")
        >>> A.shape, a0.shape
        (torch.Size([2, 10, 4, 3, 3]), torch.Size([2, 10, 4, 3]))
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must have a floating dtype, got {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape (..., rows, m + 1) with m >= 1; got "
                         f"{tuple(logits.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    name = canonical_gate_name(variant)
    # half-precision logits of ±1e4 would overflow the row sums: normalise in fp32 at least.
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if name == "softmax":
        w = torch.softmax(z, dim=-1)
    elif name == "sigmoid":
        w = torch.softmax(torch.nn.functional.logsigmoid(z), dim=-1)
    elif name == "none":
        w = z
    else:
        f = {"relu": torch.relu, "tanh": torch.tanh, "identity": lambda x: x}[name](z)
        w = f / (f.abs().sum(-1, keepdim=True) + eps)
    w = w.to(logits.dtype)
    return w[..., 1:], w[..., 0]
