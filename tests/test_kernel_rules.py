"""Host-side launch rules of the block-diagonal scan (``scan._fwd_variant``, ``scan._bwd_variant``
and the H200's ``scan._VARIANT_BANDS``): which kernel a call takes by block size, program count
and GPU (the GPU name is faked; nothing launches); and the launch configurations of the companion
and fused-gate kernels. The kernels themselves are tested in
test_kernels_block_diagonal.py and, at full size on the GPU, in tests/gpu."""
import torch

from test_kernels_block_diagonal import scanmod, tune_fixture

_tune = tune_fixture({})


def test_variant_rules():
    """Default kernel choices (measured on an H200 and an H100, see scan._bwd_variant / _fwd_variant)."""
    bv = scanmod._bwd_variant
    assert [bv(m, 1024) for m in (2, 3, 4, 8, 16, 32)] == ["ring4", "ring2", "ring2", "ring4", "v1", "ring2"]
    assert [bv(m, 384) for m in (2, 3, 4, 8, 16, 32)] == ["ring4", "v1", "v1", "v1", "v1", "ring2"]
    assert scanmod._fwd_variant(True) == "ring8" and scanmod._fwd_variant(False) == "ring4"
    scanmod.TUNE.update(bwd_variant="g4", variant="ring2")
    assert bv(2, 10) == "g4" and scanmod._fwd_variant(True) == "ring2"


def test_variant_bands(monkeypatch):
    """H200 ``_VARIANT_BANDS`` (programs per SM; N4096 has 256 programs a sequence at m = 8 and 16):
    m = 8 forward ring8 at (3, 7] (N768: 48 programs a sequence; also m = 3, 5, 6, 7), ring2 at
    B8-B12, not B4 / B16; backward ring2 at B5-B6, v1 at B9-B10, ring4 at
    B4, B7-B8, B11; m = 16 forward ring2 at B5-B7, g4 at B9-B10, ring4 at B4, B8, B11; m = 32
    backward v1 at (0.9, 1.85] and (7, 8] programs an SM (N768: 24 programs a sequence, N4096:
    128), ring2 elsewhere; other m, other GPUs, few programs and TUNE keep their kernels."""
    from lrnn_scan.kernels import _host as host
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 132)
    dev = torch.device("cuda", 0)
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA H200")
    fwd = {B: scanmod._fwd_variant(False, 8, 256 * B, dev) for B in (4, 7, 8, 12, 13, 16)}
    assert fwd == {4: "ring4", 7: "ring4", 8: "ring2", 12: "ring2", 13: "ring4", 16: "ring4"}
    f768 = {B: scanmod._fwd_variant(False, 8, 48 * B, dev) for B in (8, 9, 12, 16, 19, 20, 24)}
    assert f768 == {8: "ring4", 9: "ring8", 12: "ring8", 16: "ring8", 19: "ring8", 20: "ring4", 24: "ring4"}
    # m = 3, 5, 6, 7 take the same band (N768 / N770: 32, 77, 64, 55 programs a sequence)
    mid = {(m, B): scanmod._fwd_variant(False, m, n * B, dev)
           for m, n in ((3, 32), (5, 77), (6, 64), (7, 55)) for B in (8, 16)}
    assert mid == {(3, 8): "ring4", (3, 16): "ring8", (5, 8): "ring8", (5, 16): "ring4",
                   (6, 8): "ring8", (6, 16): "ring4", (7, 8): "ring8", (7, 16): "ring8"}
    bwd = {B: scanmod._bwd_variant(8, 256 * B, dev) for B in (4, 5, 6, 7, 8, 9, 10, 11)}
    assert bwd == {4: "ring4", 5: "ring2", 6: "ring2", 7: "ring4", 8: "ring4", 9: "v1", 10: "v1",
                   11: "ring4"}
    f16 = {B: scanmod._fwd_variant(False, 16, 256 * B, dev) for B in (4, 5, 7, 8, 9, 10, 11)}
    assert f16 == {4: "ring4", 5: "ring2", 7: "ring2", 8: "ring4", 9: "g4", 10: "g4", 11: "ring4"}
    assert scanmod._bwd_variant(16, 256 * 5, dev) == "v1" and scanmod._bwd_variant(16, 256 * 9, dev) == "v1"
    assert scanmod._fwd_variant(True, 8, 256 * 9, dev) == "ring8"
    assert scanmod._fwd_variant(False, 4, 256 * 9, dev) == "ring4" and scanmod._bwd_variant(4, 256 * 5, dev) == "ring2"
    assert scanmod._fwd_variant(False, 12, 256 * 5, dev) == "ring4"    # m = 12: no band measured
    # m = 32, programs an SM: N768 B4 / B5 / B10 / B11 0.73 / 0.91 / 1.82 / 2.0; N4096 B1 / B2 / B7 /
    # B8 / B9 0.97 / 1.94 / 6.79 / 7.76 / 8.73
    b32 = {(N, B): scanmod._bwd_variant(32, N // 32 * B, dev)
           for N, Bs in ((768, (4, 5, 10, 11)), (4096, (1, 2, 7, 8, 9))) for B in Bs}
    assert b32 == {(768, 4): "ring2", (768, 5): "v1", (768, 10): "v1", (768, 11): "ring2",
                   (4096, 1): "v1", (4096, 2): "ring2", (4096, 7): "ring2", (4096, 8): "v1",
                   (4096, 9): "ring2"}
    monkeypatch.setitem(scanmod.TUNE, "variant", "ring4")
    assert scanmod._fwd_variant(False, 8, 256 * 9, dev) == "ring4"
    scanmod.TUNE.clear()
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA H100 80GB HBM3")
    assert scanmod._fwd_variant(False, 8, 256 * 9, dev) == "ring4" and scanmod._bwd_variant(8, 256 * 5, dev) == "ring4"
    assert scanmod._fwd_variant(False, 16, 256 * 5, dev) == "ring4"
    assert scanmod._bwd_variant(32, 1024, dev) == "ring2"  # the m = 32 bands are the H200's


def test_gate_kernel_configs(monkeypatch):
    """Launch configurations of the companion and fused-gate kernels (measured on an H200,
    B8 T2048 N768: ``companion.function._config`` / ``fused_gates.function._config``): elements a
    program and stages by m, forward and backward apart, a full warp at least, the GPU filled
    first at few sequences, and ``TUNE`` (``bwd_*`` keys for the backward alone)."""
    from lrnn_scan.kernels.companion import function as cf
    from lrnn_scan.kernels.fused_gates import function as ff
    monkeypatch.setattr(cf, "num_sms", lambda device: 132)
    monkeypatch.setattr(ff, "num_sms", lambda device: 132)
    monkeypatch.setattr(cf, "TUNE", {})
    monkeypatch.setattr(ff, "TUNE", {})
    dev = torch.device("cpu")
    # (BN, MP, warps, stages) at B8 N768; stages count loop trips of m steps up to m = 16 (about
    # 40 steps in flight forward, 32 backward, 16 in time chunks; m <= 2 as timed on 2-step trips)
    fwd = {m: cf._config(8, 768, m, dev) for m in (1, 2, 4, 8, 16, 32)}
    assert fwd == {1: (32, 2, 1, 24), 2: (32, 2, 1, 12), 4: (16, 4, 1, 10), 8: (16, 8, 1, 5),
                   16: (8, 16, 1, 3), 32: (8, 32, 1, 12)}
    bwd = {m: cf._config(8, 768, m, dev, bwd=True) for m in (2, 3, 4, 8, 16)}
    assert bwd == {2: (16, 2, 1, 6), 3: (8, 4, 1, 11), 4: (8, 4, 1, 8), 8: (8, 8, 1, 3),
                   16: (8, 16, 1, 2)}
    assert {m: cf._config(64, 768, m, dev, chunked=True)[3] for m in (2, 3, 4, 8, 16)} == {
        2: 12, 3: 6, 4: 4, 8: 2, 16: 2}
    # the backward from logits keeps one step a trip above m = 8 (its 16-step body spilled):
    # stages count steps there, as above UNROLL_MAX_M
    assert cf._config(8, 768, 16, dev, bwd=True, logits=True) == (16, 16, 1, 4)
    assert [cf._unrolled(m, bwd, logits) for m, bwd, logits in [
        (16, True, True), (8, True, True), (16, True, False), (16, False, False), (17, False, False)]
            ] == [False, True, True, True, False]
    cf.TUNE.update(bwd_unroll=1)
    assert cf._unrolled(16, True, True) and not cf._unrolled(32, True, True)  # <= UNROLL_MAX_M
    assert cf._config(8, 768, 16, dev, bwd=True, logits=True) == (16, 16, 1, 2)
    cf.TUNE.clear()
    assert cf._config(8, 768, 8, dev, bwd=True, logits=True) == (8, 8, 1, 3)
    # m = 5..8 backward: 8 channels, 24 steps in flight, never doubled (one pass or chunks)
    assert [cf._config(64, 768, m, dev, bwd=True, chunked=True) for m in (5, 6, 8)] == [
        (8, 8, 1, 5), (8, 8, 1, 4), (8, 8, 1, 3)]
    assert cf._config(8, 4096, 8, dev, bwd=True) == (8, 8, 1, 3)
    assert cf._config(64, 768, 4, dev, bwd=True, chunked=True) == (16, 4, 1, 4)  # m = 4 doubled
    assert cf._config(8, 4096, 4, dev, bwd=True) == (16, 4, 1, 8)   # > 16 programs an SM: doubled
    assert cf._config(8, 1536, 4, dev, bwd=True) == (8, 4, 1, 8)
    assert cf._config(8, 4096, 4, dev) == (16, 4, 1, 10)            # the forward keeps its tile
    assert cf._config(1, 64, 4, dev) == (8, 4, 1, 10)      # 4 programs: halved to a full warp
    assert cf._config(1, 64, 16, dev) == (8, 16, 1, 3)     # never below 8 channels
    cf.TUNE.update(bwd_bn=32, num_stages=3)
    assert cf._config(8, 768, 4, dev) == (16, 4, 1, 3)
    assert cf._config(8, 768, 4, dev, bwd=True) == (32, 4, 1, 3)
    # (BH, warps, stages) at B8 H = 768 / m: m = 2 keeps 8 blocks (32 elements), not 4
    assert {m: ff._config(8, 768 // m, m, dev) for m in (1, 2, 4, 8, 16)} == {
        1: (8, 1, 5), 2: (8, 1, 5), 4: (2, 1, 5), 8: (1, 1, 5), 16: (1, 2, 5)}
    assert ff._config(1, 4, 8, dev) == (1, 1, 5)             # one block is the floor
    ff.TUNE.update(bwd_bh=4)
    assert ff._config(8, 384, 2, dev) == (8, 1, 5) and ff._config(8, 384, 2, dev, bwd=True) == (4, 1, 5)


def test_fused_gates_unfused_faster(monkeypatch):
    """``fused_gates.unfused_faster`` against the H200's measured shapes on both sides of its
    lines (``UNFUSED_LINES``: steps, programs an SM), N768; the TUNE keys move them. With a
    backward, m <= 8 stays fused (time-chunked there: ``choose_chunk``)."""
    from lrnn_scan.kernels.fused_gates import function as ff
    monkeypatch.setattr(ff, "num_sms", lambda device: 132)
    monkeypatch.setattr(ff, "TUNE", {})
    dev = torch.device("cpu")
    unfused = {16: [(1, 2048), (2, 2048), (3, 2048)],
               32: [(1, 512), (4, 2048), (6, 2048), (8, 2048), (1, 4096)]}
    fused = {2: [(1, 16384), (2, 8192), (4, 8192)], 4: [(1, 8192), (1, 16384), (2, 8192)],
             8: [(1, 4096), (2, 8192), (1, 16384)], 16: [(1, 1024), (4, 2048), (4, 4096)],
             32: [(1, 128), (1, 256), (11, 2048), (16, 2048)]}
    for m in fused:
        H = 768 // m
        for B, T in unfused.get(m, []):
            assert ff.unfused_faster(B, T, H, m, dev), (m, B, T)
        for B, T in fused[m]:
            assert not ff.unfused_faster(B, T, H, m, dev), (m, B, T)
    fwd_unfused = {4: [(1, 4096), (2, 4096), (2, 8192), (1, 16384)], 8: [(1, 4096), (1, 16384)],
                   16: [(1, 512), (1, 1024)], 32: [(1, 256)]}
    fwd_fused = {2: [(1, 4096), (1, 16384)], 4: [(1, 2048)], 8: [(1, 2048)],
                 16: [(1, 256), (4, 2048)], 32: [(1, 128), (11, 2048)]}
    for m in fwd_fused:                                          # a forward alone (no backward)
        H = 768 // m
        for B, T in fwd_unfused.get(m, []):
            assert ff.unfused_faster(B, T, H, m, dev, backward=False), (m, B, T)
        for B, T in fwd_fused[m]:
            assert not ff.unfused_faster(B, T, H, m, dev, backward=False), (m, B, T)
    assert not ff.unfused_faster(1, 16384, 768, 1, dev)          # m = 1: not measured
    H16 = 768 // 16                           # m = 16 from 4096 steps: chunked with a backward
    assert not ff.unfused_faster(1, 4096, H16, 16, dev) and not ff.unfused_faster(3, 8192, H16, 16, dev)
    assert ff.unfused_faster(1, 4096, H16, 16, dev, backward=False)
    assert ff.unfused_faster(1, 2048, 64, 12, dev) and not ff.unfused_faster(1, 16384, 256, 3, dev)
    ff.TUNE.update(unfused_below=3)                              # 2.2 programs an SM
    assert ff.unfused_faster(3, 8192, 192, 4, dev, backward=False)
    ff.TUNE.update(unfused_min_len=1024)
    assert ff.unfused_faster(1, 1024, 192, 4, dev) and not ff.unfused_faster(1, 1023, 192, 4, dev)
    assert not ff.unfused_faster(1, 1023, 192, 4, dev, backward=False)


def test_fused_gates_choose_chunk(monkeypatch):
    """``fused_gates.choose_chunk`` on the H200's measured shapes (N768): chunked below 2
    unchunked programs an SM (1.25 at m = 16) from 4096 steps at m <= 4 (eager host time) and
    m = 16, 2048 at m = 5..8, 128-step chunks up to 8192 programs; not at m = 32."""
    from lrnn_scan.kernels.fused_gates import function as ff
    monkeypatch.setattr(ff, "num_sms", lambda device: 132)
    monkeypatch.setattr(ff, "TUNE", {})
    dev = torch.device("cpu")

    def chunk(B, T, m, cu=None):
        return ff.choose_chunk(cu, B, T, 768 // m, m, dev)
    assert chunk(1, 16384, 2) == 128 and chunk(4, 8192, 2) == 256        # 48 / 192 programs
    assert chunk(1, 4096, 4) == 128 and chunk(1, 8192, 4) == 128         # 96 programs
    assert chunk(1, 16384, 4) == 256 and chunk(2, 8192, 4) == 256
    assert chunk(2, 8192, 8) == 256 and chunk(1, 2048, 8) == 128
    assert chunk(4, 8192, 4) is None and chunk(4, 8192, 8) is None      # 2.9 programs an SM
    assert chunk(1, 4095, 4) is None and chunk(1, 4095, 2) is None      # short (eager host)
    assert chunk(1, 2047, 8) is None
    assert chunk(1, 4096, 2) == 128
    assert chunk(1, 16384, 16) == 128 and chunk(1, 4096, 16) == 128      # tl.dot summaries
    assert chunk(1, 4095, 16) is None and chunk(4, 8192, 16) is None    # 1.45 programs an SM
    assert chunk(3, 8192, 16) == 256 and chunk(1, 16384, 32) is None    # m = 32 lost
    assert chunk(1, 16384, 1) is None
    assert chunk(1, 16384, 4, cu=torch.tensor([0, 16384])) is None      # varlen: no sync
    ff.TUNE.update(chunk=100)
    assert chunk(1, 1000, 1) == 100 and chunk(1, 100, 4) is None
    assert chunk(1, 50, 4, cu=torch.tensor([0, 50])) == 100
    ff.TUNE.update(chunk=0)
    assert chunk(1, 16384, 4) is None




def test_companion_choose_chunk(monkeypatch):
    """``companion.choose_chunk`` on the H200's measured shapes (N768): chunked from 4096 steps
    (8192 for coefficients at m <= 4: eager host time) below 24 sequence-channels an SM (B4
    chunked, B5 and B8 not); 128-step chunks at m = 2 or below 8192 sequence-steps, else 256."""
    from lrnn_scan.kernels.companion import function as cf
    monkeypatch.setattr(cf, "num_sms", lambda device: 132)
    monkeypatch.setattr(cf, "TUNE", {})
    dev = torch.device("cpu")

    def chunk(B, T, m, cu=None, N=768, logits=True):
        return cf.choose_chunk(cu, B, T, N, m, dev, logits)
    assert chunk(1, 4096, 2) == 128 and chunk(4, 4096, 2) == 128 and chunk(1, 16384, 2) == 128
    assert chunk(1, 8191, 2, logits=False) is None and chunk(1, 8192, 2, logits=False) == 128
    assert chunk(8, 4096, 2) is None and chunk(8, 4096, 4) is None      # 47 an SM
    assert chunk(1, 4096, 4) == 128 and chunk(2, 4096, 4) == 256 and chunk(4, 4096, 4) == 256
    assert chunk(1, 8191, 4, logits=False) is None and chunk(1, 8192, 3, logits=False) == 256
    assert chunk(1, 4096, 3) == 128 and chunk(1, 4096, 8, logits=False) == 128
    assert chunk(2, 4096, 8) == 256 and chunk(1, 4096, 8) == 128
    assert chunk(4, 4096, 8) == 256 and chunk(5, 4096, 8) is None     # 23 / 29 an SM at m = 8
    assert chunk(8, 2048, 8) is None
    assert chunk(1, 4095, 4) is None and chunk(1, 4095, 8) is None      # short (eager host)
    assert chunk(1, 16384, 1) is None and chunk(1, 16384, 16) is None
    assert chunk(1, 16384, 4, N=3168) is None and chunk(5, 4096, 4) is None  # 24 / 29 an SM
    assert chunk(1, 16384, 4, N=3160) == 256
    assert chunk(1, 16384, 4, cu=torch.tensor([0, 16384])) is None      # varlen: no sync
    cf.TUNE.update(chunk=64)
    assert chunk(1, 65, 1) == 64 and chunk(1, 64, 4) is None
    assert chunk(1, 10, 4, cu=torch.tensor([0, 10])) == 64
    cf.TUNE.update(chunk=0)
    assert chunk(1, 16384, 4) is None
