"""Triton kernels (shipped as ``lrnn_scan.kernels``), one folder per family.

* :mod:`.block_diagonal` — ``block_diagonal_scan`` (materialised ``A``, m = 1…32) and
  ``diagonal_scan`` (m = 1): forward + adjoint backward, time-chunking, varlen.
* :mod:`.fused_gates` — ``fused_gate_scan``: BD-LRU straight from gate logits, normalised in
  registers; the backward returns logit gradients without writing ``dA``.
* :mod:`.companion` — ``companion_scan`` (from logits) and ``companion_scan_coeffs``: H-LRU in
  ``O(m)`` per channel-step, storing only the newest component.
* :mod:`.delta_product` — the chunkwise WY/UT DeltaProduct kernels behind
  :func:`lrnn_scan.delta.chunk_delta_product`.
* :mod:`.l2norm` — ``l2_normalize``: row-wise L2 normalisation of q/k in one pass each way
  (``use_qk_l2norm`` and the delta layers).

Nothing is imported here: ``import lrnn_scan.kernels`` does not import Triton. The engine
(:mod:`lrnn_scan.dispatch`) loads a family on first use. Every folder has a naive reference
(``ref.py``) and a README with the derivation.
"""
