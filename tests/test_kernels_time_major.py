"""Tests of the time-contiguous m = 1 scan (``diagonal_scan(..., time_dim=2)``, ``time_major.py``).

Triton interpreter on the CPU (small tiles: 16 steps, 2 rows a program) or the GPU (the default
tiles); float64 step-by-step reference for outputs, final states and the gradients of ``a``,
``b`` and ``h0``; every kernel output NaN-poisoned beforehand (``LRNN_SCAN_POISON=1``, set by
``test_kernels_block_diagonal``), so an unwritten element fails.
"""
import os

import pytest
import torch

from test_kernels_block_diagonal import DEV, bd, ref, rel, tune_fixture

from lrnn_scan.kernels.block_diagonal import time_major

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")

# several tiles per row and rows that do not fill a program under the interpreter
_tune = tune_fixture({}, dict(tm_bt=16, tm_br=2, tm_bt_bwd=16, tm_br_bwd=2))


def inputs(B, N, T, dtype=torch.float32, seed=0):
    """|a| in [0.9, 1] with random signs (carries from far tiles matter), Gaussian b."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(0, 2, (B, N, T), generator=g) * 2 - 1) * (0.9 + 0.1 * torch.rand(B, N, T, generator=g))
    b = torch.randn(B, N, T, generator=g)
    return a.to(DEV, dtype), b.to(DEV, dtype)


def check(B, N, T, cu=None, with_h0=True, final_grad=True, dtype=torch.float32, tol=2e-6):
    a, b = inputs(B, N, T, dtype, seed=T + N)
    cut = None if cu is None else torch.tensor(cu, device=DEV)
    nseq = B if cu is None else len(cu) - 1
    h0 = torch.randn(nseq, N, device=DEV) if with_h0 else None
    leaves = [x.clone().requires_grad_() for x in (a, b) + ((h0,) if with_h0 else ())]
    h, hf = bd.diagonal_scan(leaves[0], leaves[1], leaves[2] if with_h0 else None, True, cut, time_dim=2)
    assert h.shape == b.shape and h.dtype == b.dtype and hf.dtype == torch.float32 and hf.shape == (nseq, N)
    d = [x.detach().double().requires_grad_() for x in leaves]
    hr, hfr = ref.diagonal_scan_ref(d[0].transpose(1, 2), d[1].transpose(1, 2), d[2] if with_h0 else None,
                                    True, cut)
    hr = hr.transpose(1, 2)
    gh, gf = torch.randn_like(hr), torch.randn_like(hfr)
    loss_r = (hr * gh).sum() + ((hfr * gf).sum() if final_grad else 0)
    loss = (h.float() * gh.float()).sum() + ((hf * gf.float()).sum() if final_grad else 0)
    grads_r = torch.autograd.grad(loss_r, d)
    grads = torch.autograd.grad(loss, leaves)
    errs = [rel(h, hr), rel(hf, hfr)] + [rel(u, v) for u, v in zip(grads, grads_r)]
    assert all(not torch.isnan(x).any() for x in (h, hf) + grads)
    assert max(errs) < tol, errs
    return errs


@pytest.mark.parametrize("T", [1, 17, 20, 24, 64, 129])   # 20, 24: the kernels' TV = 4, 8
@pytest.mark.parametrize("B,N", [(2, 3), (1, 5)])
def test_forward_backward(B, N, T):
    check(B, N, T)


@pytest.mark.parametrize("T,cu", [(16, None), (70, None), (100, None), (129, None),
                                  (190, [0, 37, 37, 120, 190]), (150, [0, 64, 150])])
def test_tail_tiles(T, cu):
    """64-step tiles, then the steps past a row's (or sequence's) last whole tile in 16-step tiles:
    none, one, several (100 = 64 + 3 x 16 with a partial one), whole tiles of a sequence that
    starts mid-tile, an empty sequence."""
    with bd.scan.tuned(dict(tm_bt=64, tm_bt_bwd=64, tm_btt=16, tm_btt_bwd=16)):
        assert time_major._cfg(bd.scan.TUNE, T, True)[1::3] == ((64, 16) if T >= 64 else (16, 16))
        check(2 if cu is None else 1, 3, T, cu)


@pytest.mark.parametrize("cu", [[0, 5, 5, 33, 70], [0, 1, 17, 18, 70], [0, 70]])
def test_varlen(cu):
    """Boundaries inside 16-step tiles, an empty sequence (its final state is h0, dh0 = dL/dh_T)
    and one-step sequences."""
    check(1, 5, 70, cu)


@pytest.mark.parametrize("with_h0,final_grad", [(False, True), (True, False), (False, False)])
def test_optional_state(with_h0, final_grad):
    check(2, 3, 40, None, with_h0, final_grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    """Outputs in the input dtype, fp32 state: errors of the order of the dtype's rounding."""
    errs = check(2, 3, 50, dtype=dtype, tol=2e-2)
    assert max(errs) > 1e-6   # the comparison really saw rounded values


def test_same_as_btn_layout():
    """Same numbers as the (B, T, N) kernels on the transposed tensors."""
    a, b = inputs(2, 6, 45)
    h0 = torch.randn(2, 6, device=DEV)
    h, hf = bd.diagonal_scan(a, b, h0, True, time_dim=-1)
    h2, hf2 = bd.diagonal_scan(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous(), h0, True)
    assert rel(h, h2.transpose(1, 2)) < 1e-6 and rel(hf, hf2) < 1e-6


def test_rows_grid_and_empty_shapes():
    """Without offsets the B x N rows form one set (grid ``(cdiv(B * N, BR), 1)``: no 65535 limit
    on the batch); no rows launch nothing; T = 0 passes h0 to the final state and dL/dh_T back."""
    assert time_major._rows_grid(70000, 3, 2, None) == (210000, (105000, 1))
    assert time_major._rows_grid(1, 5, 2, torch.tensor([0, 3, 9])) == (5, (3, 2))
    for shape in ((2, 0, 5), (0, 3, 5)):
        h, hf = bd.diagonal_scan(*inputs(*shape), None, True, time_dim=2)
        assert h.shape == shape and hf.shape == shape[:2]
    a, b = (x.requires_grad_() for x in inputs(2, 3, 0))
    h0 = torch.randn(2, 3, device=DEV, requires_grad=True)
    h, hf = bd.diagonal_scan(a, b, h0, True, time_dim=2)
    assert h.shape == (2, 3, 0) and torch.equal(hf, h0.detach())
    gf = torch.randn(2, 3, device=DEV)
    (dh0,) = torch.autograd.grad((hf * gf).sum(), h0)
    assert torch.equal(dh0, gf)


def test_tile_cut_to_sequence():
    """Short sequences scan a tile of the next power of two (at least 16), not the default 2048."""
    assert time_major._cfg({}, 5, False)[1] == 16
    assert time_major._cfg({}, 100, True)[1] == 128
    assert time_major._cfg({}, 10 ** 6, False)[1] == time_major.TM_FWD[1]
    assert time_major._cfg(dict(tm_bt_bwd=64, tm_br_bwd=4), 10 ** 6, True)[:2] == (4, 64)
    # 2-byte elements: twice the steps (the same bytes a tile), still cut to the sequence
    assert [time_major._cfg({}, T, bwd, itemsize=2)[1] for T, bwd in ((10 ** 6, False), (10 ** 6, True),
                                                                     (3000, False), (2048, True))] == [4096, 4096, 4096, 2048]
    # the rest past the whole tiles in one tile of its next power of two (at least TM_TAIL_MIN);
    # varlen keeps whole tiles (each sequence has its own rest); TUNE wins
    lo, bt = time_major.TM_TAIL_MIN, time_major.TM_BWD[1]
    assert [time_major._cfg({}, 4 * bt + r, True)[4] for r in (0, 8, 300, bt - 8)] == [bt, lo, 512, bt]
    assert time_major._cfg({}, 4 * bt + 8, True, varlen=True)[4] == bt
    assert time_major._cfg({}, 20, False)[4] == 32
    assert time_major._cfg(dict(tm_btt_bwd=64), 4 * bt + 300, True)[4] == 64
    # 8 warps for forwards with many programs per SM; the backward keeps its 4; TUNE wins
    many = time_major.TM_FWD_NW8_FROM * 132
    assert time_major._cfg({}, 2048, False, many, 132)[2] == 8
    assert time_major._cfg({}, 2048, False, many - 1, 132)[2] == 4
    assert time_major._cfg({}, 2048, True, many, 132)[2] == 4
    assert time_major._cfg(dict(tm_nw=2), 2048, False, many, 132)[2] == 2


def test_errors():
    a, b = inputs(1, 3, 8)
    with pytest.raises(ValueError, match="time_dim must be 1"):
        bd.diagonal_scan(a, b, time_dim=0)
    with pytest.raises(ValueError, match="time_dim must be 1"):
        bd.diagonal_scan(a, b, time_dim=True)
    with pytest.raises(ValueError, match=r"a must have shape \(B, N, T\)"):
        bd.diagonal_scan(a[0], b, time_dim=2)
    with pytest.raises(ValueError, match="b must be contiguous"):
        bd.diagonal_scan(a, torch.randn(1, 8, 3, device=DEV).transpose(1, 2), time_dim=2)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 3\)"):
        bd.diagonal_scan(a, b, torch.zeros(1, 8, device=DEV), time_dim=2)
    with pytest.raises(ValueError, match="non-decreasing from 0 to T=8"):
        bd.diagonal_scan(a, b, cu_seqlens=torch.tensor([0, 3], device=DEV), time_dim=2)


@pytest.mark.parametrize("reverse", [False, True])
def test_engine_routes_time_last_diagonal(reverse, monkeypatch):
    """``lrnn_scan.scan(Diagonal(a), b, dim=-2 of a)`` with state size 1 and time the last batch
    dim: ``(*lead, T, 1)`` goes to the time-major kernel (spied), equal to the Blelloch scan in
    outputs, final state and gradients; with ``cu_seqlens`` no kernel fits (a clear reason)."""
    import lrnn_scan as ls
    import lrnn_scan._kernel_modules as km

    if DEV == "cpu":   # the interpreter stands in for CUDA
        monkeypatch.setattr(km, "kernel_device", lambda device: True)
    calls, real = [], time_major.time_major_forward
    monkeypatch.setattr(time_major, "time_major_forward", lambda *a: calls.append(1) or real(*a))
    a, b = inputs(2, 3, 37)
    a, b = a.reshape(2, 3, 37, 1), b.reshape(2, 3, 37, 1)        # lead (2, 3), T = 37, d = 1
    h0 = torch.randn(2, 3, 1, device=DEV)
    outs = {}
    for method in ("kernel", "blelloch"):
        leaves = [x.clone().requires_grad_() for x in (a, b, h0)]
        h, hf = ls.scan(ls.Diagonal(leaves[0]), leaves[1], initial_state=leaves[2], output_final_state=True,
                        reverse=reverse, dim=2, method=method)
        grads = torch.autograd.grad((h * torch.cos(h)).sum() + hf.sum(), leaves)
        outs[method] = (h, hf) + grads
    assert calls == [1]
    for x, y in zip(outs["kernel"], outs["blelloch"]):
        assert x.shape == y.shape and rel(x, y.double()) < 1e-5
    cu = torch.tensor([0, 10, 37], device=DEV)
    with pytest.raises(ValueError, match="takes no cu_seqlens"):
        ls.scan(ls.Diagonal(a[:1]), b[:1], cu_seqlens=cu, dim=2, method="kernel")


def test_engine_b_t_1_keeps_the_btn_kernel_unless_rows_fill_the_gpu(monkeypatch):
    """``Diagonal`` on ``(B, T, 1)`` (time at dim 1): packed (``cu_seqlens``) or with fewer rows
    than ``TIME_MAJOR_MIN_ROWS`` it stays with the ``(B, T, N)`` kernels, which split time; with
    more the time-major kernel takes it; a zero-length time runs too."""
    import lrnn_scan as ls
    import lrnn_scan._kernel_modules as km
    from lrnn_scan.dispatch import kernel_for

    if DEV == "cpu":
        monkeypatch.setattr(km, "kernel_device", lambda device: True)
    a, b = inputs(1, 1, 40)
    a, b = a.reshape(1, 40, 1), b.reshape(1, 40, 1)
    cu = torch.tensor([0, 13, 40], device=DEV)
    from lrnn_scan.dispatch import TIME_MAJOR_MIN_ROWS as many
    assert kernel_for(ls.Diagonal(a), b, 1, False, cu)[0] == "block_diagonal.diagonal_scan"
    assert kernel_for(ls.Diagonal(a), b, 1, False, None)[0] == "block_diagonal.diagonal_scan"
    a2, b2 = a.expand(many, 40, 1).contiguous(), b.expand(many, 40, 1).contiguous()
    assert kernel_for(ls.Diagonal(a2), b2, 1, False, None)[0].endswith("#time_last")
    assert kernel_for(ls.Diagonal(a2[:-1]), b2[:-1], 1, False, None)[0] == "block_diagonal.diagonal_scan"
    assert rel(ls.scan(ls.Diagonal(a2), b2, method="kernel"),
               ls.scan(ls.Diagonal(a2.double()), b2.double(), method="blelloch")) < 1e-5
    h = ls.scan(ls.Diagonal(a), b, cu_seqlens=cu, method="kernel")
    assert rel(h, ls.scan(ls.Diagonal(a.double()), b.double(), cu_seqlens=cu, method="blelloch")) < 1e-5
    z = ls.scan(ls.Diagonal(a[:, :0]), b[:, :0], method="kernel")
    assert z.shape == (1, 0, 1)
