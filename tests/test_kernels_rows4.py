"""``rows4.py`` (opt-in ``TUNE['variant'] = 'rows'``, m = 4 forward with whole blocks in one thread)
against the fp64 reference: one pass, chunked, varlen, h0, NaN-poisoned outputs; gradients through
the default backward."""
import pytest
import torch

from lrnn_scan.bench.inputs import stable_blocks
from lrnn_scan.kernels.block_diagonal import ref, scan as S

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("B,T,H,cu,tune", [(2, 37, 10, None, {}), (1, 65, 3, [0, 1, 1, 30, 65], {}),
                                            (2, 129, 9, None, dict(chunk=16)),
                                            (1, 100, 5, [0, 17, 50, 100], dict(chunk=16)),
                                            (2, 33, 40, None, dict(rows_bh=32, rows_ns=3)), (1, 1, 3, None, {})])
def test_rows4(B, T, H, cu, tune, monkeypatch):
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")
    g = torch.Generator().manual_seed(T)
    A = stable_blocks(B, T, H, 4, 4, generator=g).to(DEV).requires_grad_()
    b = torch.randn(B, T, H, 4, generator=g).to(DEV).requires_grad_()
    cut = None if cu is None else torch.tensor(cu, device=DEV)
    h0 = torch.randn(B if cu is None else len(cu) - 1, H, 4, generator=g).to(DEV).requires_grad_()
    with S.tuned(dict(variant="rows", **tune)):
        h, fin = S.block_diagonal_scan(A, b, h0, True, cut)
        dh = torch.randn_like(h)
        grads = torch.autograd.grad((h * dh).sum() + fin.sum(), (A, b, h0))
    Ad, bd, h0d = (x.detach().double().requires_grad_() for x in (A, b, h0))
    hr, fr = ref.block_diagonal_scan_ref(Ad, bd, h0d, True, cut)
    gr = torch.autograd.grad((hr * dh.double()).sum() + fr.sum(), (Ad, bd, h0d))
    for x, y in zip((h, fin) + grads, (hr, fr) + gr):
        assert ((x.double() - y).norm() / y.norm()).item() < 1e-5
