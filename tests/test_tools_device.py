"""Device-side tools on the CPU: tools/gpu_suite_resume.sh (the GPU checks over several device
calls; here on a tiny generated test file), tools/ncu_m1.py (what Nsight Compute runs) and
tools/walk_order_probe.py, tools/rows_probe.py and tools/fwd_deep_probe.py (their kernels on the
interpreter)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import pytest

@pytest.mark.parametrize("i", [0, 1, 2])
def test_ok(i):
    assert i >= 0

def test_bad():
    assert False
'''


def _tool(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _call(tmp_path, out, passed_in, timeout=480):
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "SUITE_PASSED": str(passed_in), "SUITE_TIMEOUT": str(timeout),
           "SUITE_FILES": str(tmp_path / "test_tiny.py"), "TRITON_CACHE_DIR": str(tmp_path / "no_cache"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_suite_resume.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120).stdout


def test_second_call_skips_what_the_first_passed(tmp_path):
    """Call 1 records the three passes (not the failure) and reports the failure; call 2 reads
    that list, deselects the three and runs only the failing test again."""
    (tmp_path / "test_tiny.py").write_text(TESTS)
    first = _call(tmp_path, tmp_path / "out1", tmp_path / "absent.txt")
    assert "this call 3 passed, 1 failed or errored; 3 passed in all; finished with failures" in first
    assert "FAILED " in first and "test_bad" in first
    ids = (tmp_path / "out1" / "suite_passed.txt").read_text().split()
    assert sorted(x.split("::")[1] for x in ids) == ["test_ok[0]", "test_ok[1]", "test_ok[2]"]
    second = _call(tmp_path, tmp_path / "out2", tmp_path / "out1" / "suite_passed.txt")
    assert "3 tests passed in earlier calls, deselected" in second
    assert "this call 0 passed, 1 failed or errored; 3 passed in all" in second
    assert "3 deselected" in (tmp_path / "out2" / "suite.log").read_text()


def test_a_call_stopped_by_its_time_limit_keeps_its_passes(tmp_path):
    """The passes before the test that the time limit cut are on the list (written as they
    happen, not at the end of the run)."""
    (tmp_path / "test_tiny.py").write_text(TESTS.replace("assert False", "import time; time.sleep(60)"))
    first = _call(tmp_path, tmp_path / "out1", tmp_path / "absent.txt", timeout=8)
    assert "this call 3 passed" in first and "stopped at SUITE_TIMEOUT" in first, first
    assert len((tmp_path / "out1" / "suite_passed.txt").read_text().split()) == 3


def test_ncu_m1_driver_runs_on_the_interpreter(capsys):
    """tools/ncu_m1.py: each TUNE setting runs the m = 1 forward (the TMA kernel forced, then
    the tile kernel) on the CPU interpreter, for each shape and in the dtype asked for; no
    accelerated-scan there."""
    pytest.importorskip("triton")
    mod = _tool("ncu_m1")
    mod.main(["--device", "cpu", "--shape", "2x37x64", "--runs", "1",
              "--configs", 'tma={"diag_tma": true}', 'tile={"diag_tma": false}'])
    assert capsys.readouterr().out.split() == ["shape", "B2", "T37", "N64", "float32",
                                               "tma", "done", "tile", "done"]
    mod.main(["--device", "cpu", "--shape", "1x20x64", "2x17x64", "--dtype", "bfloat16", "--runs", "1"])
    assert capsys.readouterr().out.split() == ["shape", "B1", "T20", "N64", "bfloat16", "default", "done",
                                               "shape", "B2", "T17", "N64", "bfloat16", "default", "done"]


def test_ncu_tm_driver_runs_on_the_interpreter(capsys):
    """tools/ncu_tm.py: the time-major forward and backward at each T (one with a rest past the
    whole tiles) on the CPU interpreter."""
    pytest.importorskip("triton")
    _tool("ncu_tm").main(["--device", "cpu", "--B", "1", "--N", "3", "--T", "16", "37", "--runs", "1"])
    assert capsys.readouterr().out.split() == ["T", "16", "done", "T", "37", "done"]


def test_walk_order_probe_on_the_interpreter(tmp_path, monkeypatch):
    """tools/walk_order_probe.py: every walk (both layouts, tiles that do not divide T or N) writes
    exactly ``a + b`` into a NaN-poisoned output; timer stubbed, no accelerated-scan."""
    pytest.importorskip("triton")
    mod = _tool("walk_order_probe")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "BENCH", lambda f, rep, return_mode: (f(), 1.0)[1])
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    mod.main(["--shapes", "2x37x20", "--rounds", "1", "--out", str(tmp_path),
              "--walks", "btn:8x16x1", "btn:64x32x2", "bnt:16x4x1", "bnt:64x1x1", "btn:8x16x1x3",
              "bnt:8x4x1x2"])
    rows = json.loads((tmp_path / "walk_order_probe.json").read_text())["rows"]
    walks = [r for r in rows if ":" in r["kernel"]]
    assert len(walks) == 6 and all(r["exact"] for r in walks), walks
    assert [r["kernel"] for r in rows if ":" not in r["kernel"]] == ["torch.add (flat)", "scan (ours, default)"]


def test_walk_order_probe_rejects_a_malformed_walk():
    mod = _tool("walk_order_probe")
    assert mod.parse_walk("btn:32x64x2") == ("btn", 32, 64, 2, 1)
    assert mod.parse_walk("bnt:16x4x1x3") == ("bnt", 16, 4, 1, 3)
    for bad in ("btn32x64x2", "tbn:32x64x2", "btn:32x48x2", "btn:32x64", "btn:32x64x2x0", "btn:1x1x1x1x1"):
        with pytest.raises(SystemExit, match="--walks"):
            mod.parse_walk(bad)


@pytest.mark.parametrize("slots,T,H", [(8, 21, 5), (16, 1, 4), (24, 40, 9)])
def test_rows_probe_kernel_on_the_interpreter(slots, T, H):
    """tools/rows_probe.py: the whole-row-a-thread m = 8 ring matches the fp64 reference into a
    NaN-poisoned output: T shorter and longer than the ring, H not a multiple of its 4 blocks."""
    triton = pytest.importorskip("triton")
    import torch
    from lrnn_scan.kernels.block_diagonal.ref import block_diagonal_scan_ref
    g = torch.Generator().manual_seed(slots + T)
    A = torch.rand(2, T, H, 8, 8, generator=g) / 8
    b = torch.randn(2, T, H, 8, generator=g)
    out = torch.full_like(b, float("nan"))
    _tool("rows_probe").load(slots).rows_fwd[(triton.cdiv(H, 4), 2)](A, b, out, T, H, BH=4, num_warps=1)
    ref = block_diagonal_scan_ref(A.double(), b.double())[0]
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6


@pytest.mark.parametrize("m,T,H", [(8, 21, 5), (5, 7, 3), (8, 1, 2), (16, 9, 3)])
def test_fwd_deep_probe_kernel_on_the_interpreter(m, T, H):
    """tools/fwd_deep_probe.py: the pipelined one-step forward by shuffles matches the fp64
    reference into a NaN-poisoned output, padded rows (m = 5) and two-warp blocks (m = 16) too."""
    triton = pytest.importorskip("triton")
    import torch
    from lrnn_scan.kernels.block_diagonal.ref import block_diagonal_scan_ref
    mod = _tool("fwd_deep_probe")
    mp, bh, nw = mod._cfg(m)
    g = torch.Generator().manual_seed(m + T)
    A = torch.rand(2, T, H, m, m, generator=g) / m
    b = torch.randn(2, T, H, m, generator=g)
    out = torch.full_like(b, float("nan"))
    mod.deep_fwd[(triton.cdiv(H, bh), 2)](A, b, out, T, H, M=m, MP=mp, BH=bh, NS=4, num_warps=nw)
    ref = block_diagonal_scan_ref(A.double(), b.double())[0]
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6


@pytest.mark.parametrize("G,T,H", [(1, 5, 5), (2, 9, 4), (4, 21, 9), (8, 3, 2)])
def test_fwd_deep_probe_rows_kernel_on_the_interpreter(G, T, H):
    """tools/fwd_deep_probe.py ``deep_rows_fwd``: groups of G steps, T not a multiple of G,
    H not a multiple of its 4 blocks, NaN-poisoned output, against the fp64 reference."""
    triton = pytest.importorskip("triton")
    import torch
    from lrnn_scan.kernels.block_diagonal.ref import block_diagonal_scan_ref
    g = torch.Generator().manual_seed(G + T)
    A = torch.rand(2, T, H, 8, 8, generator=g) / 8
    b = torch.randn(2, T, H, 8, generator=g)
    out = torch.full_like(b, float("nan"))
    _tool("fwd_deep_probe").deep_rows_fwd[(triton.cdiv(H, 4), 2)](A, b, out, T, H, BH=4, G=G, NS=3,
                                                                   num_warps=1)
    ref = block_diagonal_scan_ref(A.double(), b.double())[0]
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6


def test_fwd_deep_probe_rejects_malformed_rows():
    mod = _tool("fwd_deep_probe")
    for bad in (["3:4"], ["8"], ["x:4"], ["8:0"]):
        with pytest.raises(SystemExit, match="--rows"):
            mod.main(["bench", "--rows", *bad])
