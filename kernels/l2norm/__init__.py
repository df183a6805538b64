"""Row-wise L2 normalisation ``y = x / max(‖x‖₂, eps)`` over the last dim, forward and backward
in one Triton pass each (fla's ``use_qk_l2norm_in_kernel``). See README.md for the derivation."""
from .function import l2_normalize
from .ref import l2_normalize_ref

__all__ = ["l2_normalize", "l2_normalize_ref"]
