"""(Gated) DeltaNet and (Gated) DeltaProduct layers: the block of the DeltaProduct paper.

Per token and head, ``n_h`` keys/values/betas (``j = 1..n_h``) and an optional forget gate:

    H_t = exp(g_t) (I − β_{t,n_h} k k^T) ⋯ (I − β_{t,1} k k^T) H_{t−1} + B_t,
    B_t = Σ_j (Π_{l>j} (I − β_{t,l} k_l k_l^T)) β_{t,j} k_{t,j} v_{t,j}^T,
    o_t = scale · H_t^T q_t,   y_t = out_proj(concat_heads(RMSNorm(o_t) [⊙ silu(W_g x_t)]))

with ``H_t`` of shape ``[K, V]`` per head, q/k/v from linear projections followed by a short
causal depthwise convolution (kernel 4) and SiLU, q and each key L2-normalised,
``β = sigmoid(W_β x)`` (``2·sigmoid`` with ``allow_neg_eigval``: eigenvalues in ``[-1, 1]``), and for
the gated variants the log-gate ``g = −exp(A_log) · softplus(W_a x + dt_bias)``.

The parallel path is :func:`lrnn_scan.delta.chunk_delta_product` (chunkwise WY/UT; Triton on
CUDA) when importable, else :func:`lrnn_scan.scan` over a
:class:`~lrnn_scan.HouseholderProduct` (``mode="scan"`` forces the latter).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import lrnn_scan as ls

from .base import RecurrentLayer, State, check_positive_int
from .conv import ShortConv

try:
    from lrnn_scan.delta import chunk_delta_product
    from lrnn_scan.delta import l2_normalize as _l2_normalize
except ImportError:  # pragma: no cover - an install without the delta package
    chunk_delta_product = None

    def _l2_normalize(x: Tensor) -> Tensor:
        return F.normalize(x.float(), dim=-1).to(x.dtype)

__all__ = ["DeltaProduct", "DeltaNet", "GatedDeltaProduct", "GatedDeltaNet", "householder_input"]

MODES = ("auto", "chunk", "scan")


def householder_input(keys: Tensor, beta: Tensor, values: Tensor) -> Tensor:
    """``B_t = Σ_j (Π_{l>j}(I − β_l k_l k_l^T)) β_j k_j v_j^T``.

    Args: keys ``(*b, n_h, K)``, beta ``(*b, n_h)``, values ``(*b, n_h, V)``. Returns ``(*b, K, V)``.
    """
    out = None
    for j in range(keys.shape[-2]):
        k, bk = keys[..., j, :], beta[..., j, None] * keys[..., j, :]
        write = bk.unsqueeze(-1) * values[..., j, :].unsqueeze(-2)
        if out is None:
            out = write
        else:
            out = out - bk.unsqueeze(-1) * (k.unsqueeze(-2) @ out) + write
    return out


class DeltaProduct(RecurrentLayer):
    """(Gated) DeltaProduct layer; ``n_h = 1`` is (Gated) DeltaNet.

    Args:
        d_model: model width.
        num_heads: ``H`` (default 4).
        head_dim: key/query size ``K`` per head (default ``d_model // num_heads``).
        head_v_dim: value size ``V`` per head (default ``head_dim``).
        n_h: Householder factors (keys/values/betas) per token, ``>= 1`` (default 2).
        gated: forget gate ``exp(g_t)`` (Gated DeltaProduct / Gated DeltaNet), default False.
        allow_neg_eigval: ``β = 2·sigmoid`` (eigenvalues in ``[-1, 1]``) instead of ``sigmoid``.
        use_short_conv: causal depthwise conv on q/k/v (default True). conv_size: its kernel (4).
        use_output_gate: multiply the normalised read-out by ``silu(W_g x)`` (default False).
        norm_eps: RMSNorm epsilon (default 1e-5).
        mode: ``"auto"`` (``chunk`` if :mod:`lrnn_scan.delta` is importable, else ``scan``),
            ``"chunk"`` or ``"scan"`` (generic Householder-product scan; stores all states).
        chunk_size: chunk size of the chunkwise path (default 64; on CUDA the Triton backend
            needs a power of two >= 16 and smaller or other sizes are rounded up to one).

    Shapes: ``x`` ``[B, T, d_model]``; internally ``q`` ``[B, T, H, K]``, ``k`` ``[B, T, n_h, H, K]``,
    ``v`` ``[B, T, n_h, H, V]``, ``β`` ``[B, T, n_h, H]``, ``g`` ``[B, T, H]``.
    State: ``{"h": [B, H, K, V], "conv": [B, conv_size − 1, H·K·(1 + n_h) + H·V·n_h]}`` (no
    ``"conv"`` without the short conv). ``flops_per_step() = n_h · H · (4K·r + 4K)``, ``r = 1``
    (Table 5). ``transition_spectrum(x)``: ``(B, T, H, K)`` eigenvalues of
    ``exp(g_t) Π_j (I − β_{t,j} k k^T)``.
    """

    def __init__(self, d_model: int, num_heads: int = 4, head_dim: int | None = None,
                 head_v_dim: int | None = None, n_h: int = 2, *, gated: bool = False,
                 allow_neg_eigval: bool = False, use_short_conv: bool = True, conv_size: int = 4,
                 use_output_gate: bool = False, norm_eps: float = 1e-5, mode: str = "auto",
                 chunk_size: int = 64):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                                 f"pass head_dim explicitly")
            head_dim = d_model // num_heads
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.head_v_dim = check_positive_int("head_v_dim", head_dim if head_v_dim is None
                                             else head_v_dim)
        self.n_h = check_positive_int("n_h", n_h)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "chunk" and chunk_delta_product is None:
            raise ValueError("mode='chunk' needs lrnn_scan.delta.chunk_delta_product, which is not "
                             "importable")
        self.mode = mode
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.gated, self.allow_neg_eigval = bool(gated), bool(allow_neg_eigval)
        self.use_output_gate = bool(use_output_gate)
        H, K, V = self.num_heads, self.head_dim, self.head_v_dim
        self.q_proj = nn.Linear(d_model, H * K, bias=False)
        self.k_proj = nn.Linear(d_model, n_h * H * K, bias=False)
        self.v_proj = nn.Linear(d_model, n_h * H * V, bias=False)
        self.b_proj = nn.Linear(d_model, n_h * H, bias=False)
        self.conv = (ShortConv(H * K * (1 + n_h) + n_h * H * V, conv_size, "silu")
                     if use_short_conv else None)
        if self.gated:
            self.a_proj = nn.Linear(d_model, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())
            dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            dt = dt.clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))   # softplus^-1(dt)
        if self.use_output_gate:
            self.g_proj = nn.Linear(d_model, H * V, bias=False)
        self.o_norm = nn.RMSNorm(V, eps=norm_eps)
        self.out_proj = nn.Linear(H * V, d_model, bias=False)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"head_v_dim={self.head_v_dim}, n_h={self.n_h}, gated={self.gated}, "
                f"allow_neg_eigval={self.allow_neg_eigval}, mode={self.mode!r}")

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def state_shapes(self, batch_size: int):
        H, K, V = self.num_heads, self.head_dim, self.head_v_dim
        shapes = {"h": (batch_size, H, K, V)}
        if self.conv is not None:
            shapes["conv"] = (batch_size, self.conv.context, self.conv.channels)
        return shapes

    def flops_per_step(self) -> int:
        r = 1
        return self.n_h * self.num_heads * (4 * self.head_dim * r + 4 * self.head_dim)

    # ------------------------------------------------------------------ projections
    def _features(self, x: Tensor, conv_fn):
        """q ``[*, H, K]``, k ``[*, n_h, H, K]``, v ``[*, n_h, H, V]``, β ``[*, n_h, H]``,
        log-gate ``[*, H]`` or None, and the new conv state; ``*`` = ``x.shape[:-1]``."""
        H, K, V, n = self.num_heads, self.head_dim, self.head_v_dim, self.n_h
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if self.conv is not None:
            qkv, conv_state = conv_fn(qkv)
        else:
            qkv, conv_state = F.silu(qkv), None
        q, k, v = qkv.split([H * K, n * H * K, n * H * V], dim=-1)
        # In the projections' dtype (autocast would make F.normalize fp32), so the chunk kernels
        # get 16-bit q/k (fp32 q/k take the slower fp32-accurate dots, TUNE["fp32_dot"]);
        # one fused Triton pass each way on CUDA.
        q = _l2_normalize(q.unflatten(-1, (H, K)))
        k = _l2_normalize(k.unflatten(-1, (n, H, K)))
        v = v.unflatten(-1, (n, H, V))
        beta = torch.sigmoid(self.b_proj(x)).unflatten(-1, (n, H))
        if self.allow_neg_eigval:
            beta = 2 * beta
        g = None
        if self.gated:
            g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        return q, k, v, beta, g, conv_state

    def _output(self, o: Tensor, x: Tensor) -> Tensor:
        """``o`` ``[*, H, V]`` -> ``y`` ``[*, d_model]``."""
        o = self.o_norm(o.to(x.dtype))
        if self.use_output_gate:
            o = o * F.silu(self.g_proj(x)).unflatten(-1, (self.num_heads, self.head_v_dim))
        return self.out_proj(o.flatten(-2))

    @staticmethod
    def _operator(k: Tensor, beta: Tensor, g: Tensor | None, v: Tensor):
        """``(HouseholderProduct, B)`` from ``k`` ``[*, n_h, H, K]`` etc. (heads before n_h)."""
        keys, b = k.movedim(-3, -2), beta.movedim(-2, -1)                 # [*, H, n_h, K], [*, H, n_h]
        gate = None if g is None else g.exp()
        # Under autocast the projections are half precision while the gate (from A_log) is fp32:
        # the operator needs one dtype, so everything is lifted to the widest one.
        dt = keys.dtype if gate is None else torch.promote_types(keys.dtype, gate.dtype)
        keys, b, v = keys.to(dt), b.to(dt), v.to(dt)
        gate = None if gate is None else gate.to(dt)
        op = ls.HouseholderProduct(keys, b, gate, check_values=False)
        return op, householder_input(keys, b, v.movedim(-3, -2))

    # ------------------------------------------------------------------ interface
    def _forward(self, x: Tensor, state: State | None, cu_seqlens):
        conv0 = None if state is None else state.get("conv")
        q, k, v, beta, g, conv_state = self._features(
            x, lambda t: self.conv(t, conv0, cu_seqlens))
        h0 = None if state is None else state["h"]
        mode = self.mode
        if mode == "auto":
            mode = "chunk" if chunk_delta_product is not None else "scan"
        if mode == "chunk":
            cs = self.chunk_size
            if q.is_cuda and q.dtype != torch.float64:      # Triton: a power of two >= 16
                cs = max(16, 1 << (cs - 1).bit_length())
            o, h_final = chunk_delta_product(q, k, v, beta, g, scale=self.scale, initial_state=h0,
                                             output_final_state=True, cu_seqlens=cu_seqlens,
                                             chunk_size=cs)
        else:
            op, b = self._operator(k, beta, g, v)
            hs, h_final = ls.scan(op, b, initial_state=None if h0 is None else h0.to(b.dtype),
                                  output_final_state=True, cu_seqlens=cu_seqlens)
            o = self.scale * (hs.mT @ q.unsqueeze(-1).to(hs.dtype)).squeeze(-1)
        new_state = {"h": h_final}
        if conv_state is not None:
            new_state["conv"] = conv_state
        return self._output(o, x), new_state

    def _step(self, x_t: Tensor, state: State):
        q, k, v, beta, g, conv_state = self._features(
            x_t, lambda t: self.conv.step(t, state["conv"]))
        op, b = self._operator(k, beta, g, v)
        cdt = torch.promote_types(b.dtype, state["h"].dtype)     # keep a float32 state float32
        h = op.map(lambda t: t.to(cdt)).apply(state["h"].to(cdt)) + b.to(cdt)   # [B, H, K, V]
        o = self.scale * (h.mT @ q.unsqueeze(-1).to(h.dtype)).squeeze(-1)
        new_state = {"h": h}
        if conv_state is not None:
            new_state["conv"] = conv_state
        return self._output(o, x_t), new_state

    def transition_operator(self, x: Tensor, state: State | None = None, cu_seqlens=None):
        """``HouseholderProduct`` with batch ``(B, T, H)`` (the conv context from ``state``)."""
        conv0 = None if state is None else state.get("conv")
        _, k, v, beta, g, _ = self._features(x, lambda t: self.conv(t, conv0, cu_seqlens))
        return self._operator(k, beta, g, v)[0]


class DeltaNet(DeltaProduct):
    """DeltaNet: :class:`DeltaProduct` with ``n_h = 1`` (same arguments, no ``n_h``)."""

    def __init__(self, d_model: int, num_heads: int = 4, head_dim: int | None = None,
                 head_v_dim: int | None = None, **kwargs):
        if "n_h" in kwargs:
            raise TypeError("DeltaNet has n_h = 1; use DeltaProduct for n_h > 1")
        super().__init__(d_model, num_heads, head_dim, head_v_dim, n_h=1, **kwargs)


class GatedDeltaProduct(DeltaProduct):
    """Gated DeltaProduct: :class:`DeltaProduct` with ``gated=True``."""

    def __init__(self, d_model: int, num_heads: int = 4, head_dim: int | None = None,
                 head_v_dim: int | None = None, n_h: int = 2, **kwargs):
        kwargs.setdefault("gated", True)
        super().__init__(d_model, num_heads, head_dim, head_v_dim, n_h, **kwargs)


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet: :class:`DeltaNet` with ``gated=True``."""

    def __init__(self, d_model: int, num_heads: int = 4, head_dim: int | None = None,
                 head_v_dim: int | None = None, **kwargs):
        kwargs.setdefault("gated", True)
        super().__init__(d_model, num_heads, head_dim, head_v_dim, **kwargs)
