"""Varlen scans read ``cu_seqlens`` on the host once: in the argument checks, which also hand the
longest sequence to every launcher (``_host.max_seq_len``'s ``known``). Each extra device-to-host
read would be a sync that stalls the host behind the GPU's queue.

Counted with a ``TorchFunctionMode`` (``Tensor.item``, ``tolist``, ``__bool__``, ``__int__``,
``__index__``) over a forward and a backward of ``block_diagonal_scan`` / ``diagonal_scan`` with
each kernel path forced: tiles, chunked passes, the look-backs of m = 1, 2, 4 and >= 16, TMA
loads, and the time-major layout. Interpreter or GPU.
"""
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode

from test_kernels_block_diagonal import DEV, bd, scanmod, tune_fixture  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")

_tune = tune_fixture({}, dict(bt=8, bn=16))
_SYNCS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__index__)


class _CountSyncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


PATHS = [(1, {"chunk": 0, "diag_tma": False}), (1, {"chunk": 16, "fwd_lookback": False, "bwd_lookback": False}),
         (1, {"fwd_lookback": True, "bwd_lookback": True, "lb_chunk": 16, "lb_bn": 16}),
         (1, {"diag_tma": True, "chunk": 0, "tma_bt": 16, "tma_bn": 8}),
         (2, {"chunk": 16, "bd2_lookback": False, "bd2_bwd_lookback": False}),
         (2, {"bd2_lookback": True, "bd2_bwd_lookback": True, "lb2_chunk": 8}),
         (4, {"bd4_lookback": True, "bd4_bwd_lookback": True, "lb4_chunk": 4}),
         (16, {"bd_lookback": True, "chunk": 8, "bdlb_chunk": 8})]


@pytest.mark.parametrize("m,tune", PATHS, ids=[f"m{m}-{'-'.join(t)}" for m, t in PATHS])
def test_one_host_read_of_cu_seqlens(m, tune):
    scanmod.TUNE.update(tune)
    cu = torch.tensor([0, 5, 40, 40, 77], dtype=torch.int64, device=DEV)
    g = torch.Generator().manual_seed(m)
    A = (torch.rand(1, 77, 3, m, m, generator=g) * (0.9 / m)).to(DEV).requires_grad_()
    b = torch.randn(1, 77, 3, m, generator=g).to(DEV).requires_grad_()
    for grad in (False, True):
        count = _CountSyncs()
        with count, torch.set_grad_enabled(grad):
            h, hf = bd.block_diagonal_scan(A, b, torch.randn(4, 3, m, device=DEV), True, cu)
            if grad:
                torch.autograd.grad((h.sum() + hf.sum()), (A, b))
        assert count.calls == ["tolist"], (grad, count.calls)


def test_one_host_read_time_major():
    cu = torch.tensor([0, 5, 40, 40, 77], dtype=torch.int64, device=DEV)
    a = torch.rand(1, 20, 77, device=DEV).requires_grad_()
    x = torch.randn(1, 20, 77, device=DEV).requires_grad_()
    count = _CountSyncs()
    with count:
        h, hf = bd.diagonal_scan(a, x, None, True, cu, time_dim=2)
        torch.autograd.grad(h.sum() + hf.sum(), (a, x))
    assert count.calls == ["tolist"], count.calls
