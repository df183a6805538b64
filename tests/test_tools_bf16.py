"""The m = 1 comparison tools' ``--dtype bfloat16`` (``tools/tm_vs_accel.py``,
``tools/diag_tile_vs_accel.py``) on the CPU interpreter, timers stubbed: the byte counts behind
their TB/s and %-of-copy columns use 2-byte elements, the header names the dtype, and the checks
see bf16 rounding (above fp32's errors, within bf16's)."""
import json

import pytest

from test_tools_results import _tool

pytest.importorskip("triton")


def test_tm_vs_accel_bf16(tmp_path, monkeypatch, capsys):
    mod = _tool("tm_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    seen = []

    def timed(fns, nbytes, rounds, device):
        seen.append(nbytes)
        return {"copy": 1.0, **{k: (f(), 2.0)[1] for k, f in fns.items()}}
    monkeypatch.setattr(mod, "timed_rounds", timed)
    mod.main(["--shapes", "2x37x20", "--rounds", "1", "--out", str(tmp_path), "--configs",
              "--dtype", "bfloat16"])
    assert seen == [2 * 37 * 20 * 3 * 2, 2 * 37 * 20 * 8 * 2]   # fwd a, b, h; fwd+bwd 8 tensors
    js = tmp_path / "tm_vs_accel.json"
    d = json.loads(js.read_text())
    assert d["meta"]["dtype"] == "bfloat16"
    for r in d["rows"]:
        if r["config"] != "copy":
            assert 1e-5 < max(r["h_vs_fp64"], r["grad_vs_btn"]) < 2e-2, r
    mod.main(["--render", str(js)])
    assert "bfloat16; CUDA-graph medians" in capsys.readouterr().out


def test_diag_tile_vs_accel_bf16(tmp_path, monkeypatch):
    mod = _tool("diag_tile_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "BENCH", lambda f, rep, return_mode: (f(), 1e-6)[1])
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    mod.main(["--shapes", "1x17x8", "--rounds", "1", "--out", str(tmp_path), "--configs", "default",
              "--dtype", "bfloat16"])
    d = json.loads((tmp_path / "diag_tile_vs_accel.json").read_text())
    assert d["dtype"] == "bfloat16"
    # 1 ns stubbed: TB/s = bytes / 1e3 with 2-byte elements (fwd 3 tensors, fwd+bwd 6)
    assert [r["tbs"] for r in d["rows"]] == [round(17 * 8 * 2 * k / 1e3, 3) for k in (3, 6)] == [0.816, 1.632]
    assert 1e-5 < d["rows"][0]["h_vs_fp64"] < 2e-2
    assert "bfloat16; default forward tile" in (tmp_path / "RESULTS_diagtile.md").read_text()
