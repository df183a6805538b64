"""tools/gate_tune_compare.py on the CPU: its dense companion baseline is the same recurrence,
its TUNE context restores the kernels' knobs, and its JSON renders under its own name."""
import json

import pytest
import torch

from lrnn_scan.kernels.companion import companion_scan_coeffs_ref
from test_tools_results import _tool


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_dense_baseline_is_the_companion_recurrence(m):
    mod = _tool("gate_tune_compare")
    torch.manual_seed(m)
    a = torch.rand(2, 37, 6, m, dtype=torch.float64) / m
    b = torch.randn(2, 37, 6, dtype=torch.float64)
    C = mod.companion_dense(a)
    assert C.shape == (2, 37, 6, m, m)
    h = torch.zeros(2, 6, m, dtype=torch.float64)
    out = []
    for t in range(37):  # the dense blocks as a plain loop: h_t = C_t h_{t-1} + (b_t, 0, …)
        h = (C[:, t] @ h[..., None])[..., 0]
        h[..., 0] += b[:, t]
        out.append(h[..., 0])
    ref, _ = companion_scan_coeffs_ref(a, b)
    torch.testing.assert_close(torch.stack(out, 1), ref.double(), rtol=1e-12, atol=1e-12)


def test_tuned_restores_the_knobs():
    mod = _tool("gate_tune_compare")
    from lrnn_scan.kernels.companion import function as cf
    cf.TUNE["upcast16"] = False
    try:
        with mod.tuned(cf, {"bn": 8, "bwd_num_stages": 3}):
            assert cf.TUNE == {"bn": 8, "bwd_num_stages": 3}
        assert cf.TUNE == {"upcast16": False}
        with pytest.raises(RuntimeError), mod.tuned(cf, {"bn": 4}):
            raise RuntimeError
        assert cf.TUNE == {"upcast16": False}
    finally:
        cf.TUNE.clear()


def test_render_heading(tmp_path):
    js = tmp_path / "gate_tune_coeffs_m4_bwd.json"
    js.write_text(json.dumps(dict(
        meta=dict(date="2026-11-30T06:00", device="GPU X", torch="2.11", triton="3.6", rounds=3,
                  fails=0, kind="fwd+bwd", m=4, tool="gate_tune_compare --kind coeffs"),
        rows={"B8 T2048 N768": {"copy": 0.2145, "default": 0.4366, "baseline": 1.0408}})))
    out = tmp_path / "R.md"
    _tool("lb2_compare").render(js, out)
    text = out.read_text()
    assert "## gate_tune_compare.py --kind coeffs — 2026-11-30T06:00 — GPU X" in text
    assert "| B8 T2048 N768 | 0.2145 (100) | 0.4366 (49) | 1.0408 (21) |" in text


def test_shape_rows_prints_and_counts(capsys):
    """tune_compare.shape_rows (both tools' loop): one line a shape, mismatches counted."""
    mod = _tool("tune_compare")
    medians = {"copy": 0.1, "default": 0.2, "x": 0.4}
    fails, rows = mod.shape_rows(["8x2048x768", "1x64x32"], "coeffs m=4", True,
                                 lambda shape: (medians, 0.0 if shape[0] == 8 else 1e-3))
    out = capsys.readouterr().out.splitlines()
    assert fails == 1 and list(rows) == ["B8 T2048 N768", "B1 T64 N32"]
    assert out[0] == ("B8 T2048 N768 coeffs m=4 fwd+bwd fp32, ms (% of same-size copy): copy 0.1000 "
                      "(100%) default 0.2000 (50%) x 0.4000 (25%); worst rel. diff to default 0.0e+00")
    assert out[1].endswith("1.0e-03 MISMATCH")


def test_fused_companion_benchmark_verdicts():
    """benchmarks/fused_companion_throughput.py's target cell: no target for the fused gates
    outside m = 4, 8; a speedup of 3.996 against 4 prints with three decimals as missed."""
    import importlib.util
    from test_tools_results import ROOT
    path = ROOT / "benchmarks" / "fused_companion_throughput.py"
    spec = importlib.util.spec_from_file_location("fct", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    row = dict(kind="companion_coeffs", m=8, fwd_ms=0.228, fwd_TBps=2.21, base_fwd_ms=0.969,
               speedup_fwd=4.26, fwdbwd_ms=0.752, fwdbwd_TBps=2.01, base_fwdbwd_ms=3.005,
               speedup_fwdbwd=3.996, target=4.0)
    assert mod.verdict(row) == "≥4.0x (missed)"
    assert "=  3.996x (target: ≥4.0x (missed))" in mod._fmt(row)
    assert mod.verdict({**row, "speedup_fwdbwd": 4.0}) == "≥4.0x (met)"
    assert mod.verdict({**row, "target": None}) == "none"


def test_route_needs_fused():
    """``--route`` times ``bdlru_scan``'s methods, so it is refused for the companion kinds
    before anything touches a GPU."""
    mod = _tool("gate_tune_compare")
    for kind in ("coeffs", "logits"):
        with pytest.raises(SystemExit, match="--route times bdlru_scan: it needs --kind fused"):
            mod.main(["--kind", kind, "--m", "4", "--route"])


def test_aot_check_largest_loop():
    """``tools/aot_check.py``'s SASS loop count: the longest backward branch wins, forward
    branches and an inner loop do not, barriers and selects are counted inside it only."""
    mod = _tool("aot_check")
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FSEL R2, R3, R4, P0 ;
.L_x_1:
        /*0020*/                   FFMA R2, R3, R4, R2 ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
        /*0050*/                   SEL R5, R6, R7, P2 ;
        /*0060*/               @P0 BRA `(.L_x_0) ;
        /*0070*/               @P2 BRA `(.L_x_2) ;
        /*0080*/                   FSEL R8, R8, R9, P3 ;
.L_x_2:
        /*0090*/                   EXIT ;
"""
    assert mod.largest_loop(sass) == {"n": 6, "bar": 1, "sel": 2}
    assert mod.largest_loop("        /*0000*/                   EXIT ;\n") is None
