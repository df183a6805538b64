"""Sequence-parallel scans over a ``torch.distributed`` process group (issue 8).

The sequence is split along time into contiguous shards, one per rank of ``group`` in rank order
(rank 0 holds the earliest steps). Because the scan combine is associative
(``shared/reference/math.md`` §1), the whole recurrence ``h_t = A_t h_{t-1} + b_t`` is solved
exactly with one small all-gather:

Forward, on rank ``r`` with shard ``t = 1..T_r``:

1. rank ``r > 0`` reduces its shard with a log-depth tree of the operators' own ``compose``
   (:func:`tree_reduce`) into the shard's *total transition* ``P_r = A_{T_r} ⋯ A_1``, promoted
   to a dense ``(…, d, d)`` tensor with ``to_dense()`` (so totals of any family are plain,
   exchangeable tensors), and its *local final state* ``f_r`` (the state at ``T_r`` from a zero
   initial state). Rank 0 instead scans its shard from ``initial_state`` straight away
   (``f_0`` is then its true final state and ``P_0`` is never needed).
2. one ``all_gather`` of the ``(P_r, f_r)`` pairs (``O(d^2)`` numbers per batch element and rank,
   independent of ``T``).
3. every rank composes the exclusive prefix ``h_init_r = Φ_{r-1}(⋯ Φ_1(f_0))`` with
   ``Φ_j(x) = P_j x + f_j``, and the whole-sequence final state ``Φ_{R-1}(⋯)`` (the same on every
   rank).
4. rank ``r > 0`` scans its shard once more, from ``h_init_r``, with :func:`lrnn_scan.scan`
   (Triton kernels on CUDA where one fits). This rescan is exact; no fix-up term is added.

Backward (the adjoint, math.md §4: ``λ_t = g_t + A_{t+1}^T λ_{t+1}`` crosses shard boundaries):
the cotangent flowing into the end of shard ``r`` from later shards is
``μ_r = A^{(r+1)}_1{}^T λ^{(r+1)}_1``, and with ``ν_r = Σ_t (A_t ⋯ A_1)^T g_t`` (the shard's own
adjoint at its start, from ``μ = 0``, again a log-depth tree over the transposed, time-reversed
operators) it obeys the exclusive *suffix* recursion ``μ_{r-1} = ν_r + P_r^T μ_r`` with
``μ_{R-1}`` = the cotangent of the final state. So one ``all_gather`` of the ``ν_r`` (and of the
final-state cotangents) suffices; the totals ``P_r`` are kept from the forward. Each rank then
backpropagates through its local scan (the engine's adjoint scan, or the kernels' backward) with
its output cotangent and ``μ_r`` on its final state, which gives the gradients of its operator
tensors, of ``b``, and on rank 0 of ``initial_state``.

:func:`chunk_delta_product` does the same for the chunkwise DeltaProduct / gated DeltaNet path
(:func:`lrnn_scan.delta.chunk_delta_product`), exchanging ``K x K`` totals and ``K x V`` states.
:func:`halo` gives each rank the last few steps of the earlier shards (for short convolutions).

Conventions (documented in ``docs/distributed.md``):

* ``initial_state`` lives on **rank 0**: it is read on rank 0 only; other ranks may pass ``None``
  or any tensor (ignored, it gets no gradient). A replicated initial state therefore gets its
  whole gradient on rank 0 (zero elsewhere), which is right under a *sum* all-reduce.
* The returned final state is the whole sequence's final state, identical on every rank.
* The loss is the **sum of the per-rank losses**: gradients of ``op``/``b`` are those of the local
  shard; a final-state cotangent given on several ranks is summed.
* Forward and backward are collective: every rank of ``group`` must call :func:`scan` with the
  same operator family, non-time shapes, dtype, ``dim`` and state kind, and, when gradients are
  needed, every rank must backpropagate through its outputs (a rank whose inputs do not require
  gradients while another's do raises a ``RuntimeError`` on every rank instead of hanging).
* ``cu_seqlens`` (packed variable-length batches) is not supported across ranks.
"""
from .common import shard, shard_bounds, tree_reduce
from .delta import chunk_delta_product
from .halo import halo
from .scan import scan

__all__ = ["scan", "chunk_delta_product", "halo", "tree_reduce", "shard_bounds", "shard"]
