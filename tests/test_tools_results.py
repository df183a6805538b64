"""The RESULTS renderers in tools/ read what the GPU scripts print and write (no GPU needed)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scan_log_rows_parse_in_the_printed_format(tmp_path, monkeypatch):
    # the exact line format of scan_throughput.py's record()
    bw = 3.0
    lines = ["env: {'device': 'GPU X', 'sms': 132, 'torch': 't', 'triton': 'tr', 'date': 'd'}",
             f"copy bandwidth: {bw:.3f} TB/s"]
    for kind, impl, B, T, N, m, ms, tbs, extra in (
            ("fwd", "ours", 8, 2048, 768, 2, 0.1158, 1.738, {"graph_ms": 0.10838, "graph_pct_copy": 61.9}),
            ("fwdbwd", "ours", 8, 2048, 768, 2, 0.4192, 0.96, {"graph_ms": 0.30866, "graph_pct_copy": 43.4,
                                                               "pct_of_passes": 44.0}),
            ("fwd", "variant_ring4", 8, 2048, 768, 2, 0.1455, 1.383, {})):
        lines.append(f"{kind:8s} {impl:22s} B{B} T{T} N{N} m{m}: {ms:8.4f} ms {tbs:6.3f} TB/s "
                     f"{100 * tbs / bw:5.1f}% {extra if extra else ''}")
    lines.append("fastest diag forward config: bt=16 bn=64 num_warps=2 (not applied)")
    log = tmp_path / "scan.log"
    log.write_text("\n".join(lines) + "\n")
    mod = _tool("scan_log_to_results")
    env, copy, rows = mod.parse(log)
    assert env["device"] == "GPU X" and copy == 3.0 and len(rows) == 3
    assert rows[1]["kind"] == "fwdbwd" and rows[1]["extra"]["graph_ms"] == 0.30866
    assert rows[2]["extra"] == {} and rows[2]["ms"] == 0.1455
    res = tmp_path / "R.md"
    monkeypatch.setattr("sys.argv", ["x", str(log), "--results", str(res)])
    mod.main()
    text = res.read_text()
    assert "| fwdbwd | ours | 8 | 2048 | 768 | 2 | 0.4192 | 0.960 | 32.0 | 0.30866 | 43.4 | {'pct_of_passes': 44.0} |" in text


def test_fwd_bh_sweep_render(tmp_path):
    d = dict(date="d", device="GPU X", torch="t", triton="tr", copy_tbs=3.0,
             rows=[dict(B=8, T=2048, N=768, m=2, config="default", tune={}, ms=0.1164, graph_ms=0.1086,
                        same_size_copy_ms=0.0681, pct_of_copy_bw=61.7, pct_of_same_size_copy=62.7,
                        rel_diff=0.0)])
    js = tmp_path / "s.json"
    js.write_text(json.dumps(d))
    res = tmp_path / "R.md"
    _tool("fwd_bh_sweep").render(js, res)
    assert "| 8 | 2048 | 768 | 2 | default | — | 0.1164 | 0.1086 | 61.7 | 0.0681 | 62.7 | 0.0e+00 |" in res.read_text()


def test_block_diagonal_tuned_restores_tune():
    """``scan.tuned`` (the sweeps' TUNE overrides) restores TUNE exactly, also after an error."""
    from lrnn_scan.kernels.block_diagonal import scan as S
    before = dict(S.TUNE)
    with S.tuned({"bh": 16, "variant": "ring8"}):
        assert S.TUNE["bh"] == 16 and S.TUNE["variant"] == "ring8"
    assert S.TUNE == before
    with pytest.raises(RuntimeError):
        with S.tuned({"chunk": 0}):
            raise RuntimeError("a failing configuration")
    assert S.TUNE == before


@pytest.mark.slow   # about 80 s under the element-wise interpreter; under 14 s with _fast_interpreter.py
def test_diag_tile_vs_accel_smoke_on_the_interpreter(tmp_path, monkeypatch):
    """tools/diag_tile_vs_accel.py's logic at a tiny shape on the CPU interpreter (timer stubbed,
    no accelerated-scan): every config is checked against fp64 and the rows are written."""
    mod = _tool("diag_tile_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "BENCH", lambda f, rep, return_mode: (f(), 1.0)[1])
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    mod.main(["--shapes", "2x37x20", "--rounds", "2", "--out", str(tmp_path)])
    d = json.loads((tmp_path / "diag_tile_vs_accel.json").read_text())
    assert len(d["rows"]) == 2 * len(mod.CONFIGS)
    for r in d["rows"]:
        assert r["h_vs_fp64"] < 1e-6 and r["grad_vs_default"] < 1e-6, r
        assert r["rounds"] == [1.0, 1.0]
    assert (tmp_path / "RESULTS_diagtile.md").read_text().count("| 2 | 37 | 20 |") == 2 * len(mod.CONFIGS)


def test_diag_tile_vs_accel_flushed_timer(monkeypatch):
    """``--flush-l2``: each timed replay overwrites the buffer first, and the overwrite's own time
    is subtracted (timer stubbed: 5 ms with the kernel, 2 without)."""
    mod = _tool("diag_tile_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    ran = []

    def stub(f, rep, return_mode):
        ran.clear()
        f()
        return 5.0 if ran else 2.0
    monkeypatch.setattr(mod, "BENCH", stub)
    bench = mod.flushed_timer(1)
    assert bench(lambda: ran.append(1), rep=3, return_mode="median") == 3.0


def test_graph_time_synchronises_before_the_side_stream(monkeypatch):
    """graph_time must drain the current stream before do_bench_cudagraph starts its side stream
    (the 2026-11-25 NaN: a side-stream copy overwrote a temporary still queued on the default
    stream)."""
    import torch
    import triton.testing

    from lrnn_scan.bench import measure
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph",
                        lambda fn, rep, return_mode: calls.append(("bench", rep, return_mode)) or 1.5)
    assert measure.graph_time(lambda: None, rep=7) == 1.5
    assert calls == ["sync", ("bench", 7, "median")]


def test_graph_copy_is_an_elementwise_kernel_over_the_same_bytes(monkeypatch):
    """measure.graph_copy: ``dst`` receives ``-src`` through ``torch.neg`` (one read and one write of
    the buffer, an SM kernel), never ``Tensor.copy_`` (a memcpy that a CUDA graph can hand to the
    copy engines at 2.75 TB/s on an H200, RESULTS.md thirty-second session)."""
    import torch

    from lrnn_scan.bench import measure
    src, dst = torch.randn(1000), torch.empty(1000)
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *a, **k: (_ for _ in ()).throw(AssertionError("copy_")))
    measure.graph_copy(src, dst)()
    assert torch.equal(dst, -src)


def test_kernel_times_per_call_on_cpu():
    """measure.kernel_times: operators of fn per call (CPU: self CPU time), largest first; a
    matmul done twice per call counts 2 calls."""
    import torch

    from lrnn_scan.bench import measure
    a = torch.randn(200, 200)
    kt = measure.kernel_times(lambda: (a @ a) @ a, "cpu", iters=3)
    assert kt["aten::mm"][0] == 2 and kt["aten::mm"][1] > 0
    us = [v[1] for v in kt.values()]
    assert us == sorted(us, reverse=True)


def test_ncu_bd_driver_runs_on_the_interpreter(capsys):
    """tools/ncu_bd.py (what Nsight Compute runs on the GPU): forward and forward+backward, with
    a TUNE override that sends m = 16 through the block look-back, on the CPU interpreter."""
    pytest.importorskip("triton")
    mod = _tool("ncu_bd")
    mod.main(["--device", "cpu", "--shape", "1x20x32", "--m", "2", "16", "--runs", "1",
              "--tune", '{"chunk": 8, "bdlb_chunk": 8}'])
    mod.main(["--device", "cpu", "--shape", "1x20x32", "--m", "4", "--runs", "1", "--grad"])
    assert capsys.readouterr().out.split() == ["m=2", "done", "m=16", "done", "m=4", "done"]


def test_ncu_delta_driver_runs_on_the_interpreter(capsys):
    """tools/ncu_delta.py (what Nsight Compute runs for the delta backward kernels): fwd+bwd with
    and without the gate under TUNE overrides (a JSON list becomes a launch tuple), on the CPU
    interpreter; TUNE is as before afterwards, and an unknown key is refused."""
    pytest.importorskip("triton")
    from lrnn_scan.kernels.delta_product import function as fn
    mod = _tool("ncu_delta")
    before = dict(fn.TUNE)
    mod.main(["--device", "cpu", "--shape", "1x20x1x16x16", "--nh", "2", "--runs", "1", "--gated",
              "--tune", '{"dqkwg": [4, 2, 32], "maxnreg": {"wy_bwd_vn:ungated": 168}}'])
    mod.main(["--device", "cpu", "--shape", "1x20x1x16x16", "--nh", "1", "--runs", "1"])
    assert fn.TUNE == before
    assert capsys.readouterr().out.split() == ["n_h=2", "gated=True", "done", "n_h=1", "gated=False", "done"]
    with pytest.raises(SystemExit, match="no_such_key"):
        mod.main(["--device", "cpu", "--shape", "1x20x1x16x16", "--tune", '{"no_such_key": 1}'])


def test_memcheck_kernels_runs_every_family_on_the_interpreter(capsys, monkeypatch):
    """tools/memcheck_kernels.py (run under compute-sanitizer on the GPU): one case of every kernel
    family, forward and backward, finite, under the interpreter with poisoned buffers."""
    import os
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter test (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)")
    mod = _tool("memcheck_kernels")
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")
    assert mod.main(["--device", "cpu", "--first"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["family"] for r in rows] == list(mod.FAMILIES)
    assert all(r["nonfinite_grads"] and not any(r["nonfinite_grads"]) for r in rows), rows


def test_memcheck_kernels_block_lookback_cases(monkeypatch):
    """memcheck_kernels' forward-only block cases go through the block look-backs (lookback_dot.py,
    lookback2.py for m = 2, lookback4.py for m = 4, their backwards) and are finite under the interpreter with poisoned buffers, so
    compute-sanitizer sees those kernels too."""
    import os

    import torch
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter test (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)")
    from lrnn_scan.kernels.block_diagonal import (lookback2, lookback2_bwd, lookback4, lookback4_bwd, lookback_dot,
                                                  scan as S)
    mod = _tool("memcheck_kernels")
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")
    for suffix, name, real, n in (("_fwd_lookback", "bd_lookback_forward", lookback_dot.bd_lookback_forward, 4),
                                  ("_fwd_lookback2", "bd2_lookback_forward", lookback2.bd2_lookback_forward, 2),
                                  ("_lookback2_bwd", "bd2_lookback_backward", lookback2_bwd.bd2_lookback_backward, 2),
                                  ("_fwd_lookback4", "bd4_lookback_forward", lookback4.bd4_lookback_forward, 2),
                                  ("_lookback4_bwd", "bd4_lookback_backward", lookback4_bwd.bd4_lookback_backward, 2)):
        calls = []
        monkeypatch.setattr(S, name, lambda *a, real=real, calls=calls: calls.append(1) or real(*a))
        cases = [(c, r) for c, r in mod._cases("block_diagonal", torch.device("cpu"), True) if c.endswith(suffix)]
        assert len(cases) == n
        for case, run in cases:
            outs, inputs = run()
            assert all(torch.isfinite(o).all() for o in outs if o is not None), case
            assert not any(mod._grads(outs, inputs)), case  # the backward case: its gradients too
        assert len(calls) == n, (suffix, calls)


def test_memcheck_kernels_tma_cases(monkeypatch):
    """memcheck_kernels' TMA cases (m = 1 through tma.py, m = 2 and 4 through tma_blocks.py and
    tma_blocks_bwd.py, varlen and one sequence, forward+backward) run the TMA forwards and stay finite under the
    interpreter with poisoned buffers, so compute-sanitizer sees those kernels too."""
    import os

    import torch
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter test (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)")
    from lrnn_scan.kernels.block_diagonal import tma, tma_blocks, tma_blocks_bwd
    mod = _tool("memcheck_kernels")
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")
    real_bwd, bwd_calls = tma_blocks_bwd.bd_tma_backward, []
    monkeypatch.setattr(tma_blocks_bwd, "bd_tma_backward", lambda *a: bwd_calls.append(1) or real_bwd(*a))
    for family, module, name, n in (("diagonal", tma, "diag_tma_forward", 3),
                                    ("block_diagonal", tma_blocks, "bd_tma_forward", 4)):
        calls = []
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, calls=calls: calls.append(1) or real(*a))
        cases = [(c, r) for c, r in mod._cases(family, torch.device("cpu"), True) if c.endswith("_tma")]
        assert len(cases) == n
        for case, run in cases:
            outs, inputs = run()
            assert all(torch.isfinite(o).all() for o in outs if o is not None), case
            assert not any(mod._grads(outs, inputs)), case
        assert len(calls) == n, (family, calls)
    assert len(bwd_calls) == 4  # the m = 2, 4 cases' backward by TMA (tma_blocks_bwd.py)


def test_delta_throughput_agreement_names_the_worst_difference():
    """delta_throughput's fla-vs-ours column: 0 for the same function, the right name and size for a
    perturbed gradient, NaN counted as worst."""
    import torch
    import benchmarks.delta_throughput as dt  # noqa: F401  (the package is importable from the root)
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(5, 3)
    do = torch.randn(5, 3)
    same = dt._agreement(lambda: x * w, lambda: x * w, [x], do)
    assert same == (0.0, "o")
    bent = lambda: x * w + 1e-2 * (x * x - (x * x).detach())  # noqa: E731 (same output, other gradient)
    worse = dt._agreement(lambda: x * w, bent, [x], do)
    assert worse[1] == "dq" and worse[0] > 1e-3
    nan = dt._agreement(lambda: x * w, lambda: x * float("nan"), None, None)
    assert nan[1] == "o" and nan[0] != nan[0]


def test_delta_accuracy_measures_a_callable_against_fp64():
    """delta_accuracy.error_vs_fp64 (ours and fla held to one bound, --fla-accuracy): the fp64
    reference itself scores 0 in the output and only the bf16 rounding of its gradients, a 1 %
    scaled output 1 % everywhere, a NaN output is the worst; fla_layout interleaves the n_h steps
    along time."""
    import torch
    from benchmarks.delta_accuracy import error_vs_fp64, fla_layout
    from lrnn_scan.delta import chunk_delta_product

    def ref(q, k, v, b, g, s=1.0):
        xs = [x.double() if x is not None else None for x in (q, k, v, b, g)]
        return chunk_delta_product(*xs, chunk_size=64, backend="torch")[0] * s

    kw = dict(n_h=2, gated=True, K=8, device="cpu", B=1, T=70, H=2)
    e, name, res = error_vs_fp64(ref, **kw)       # gradients of bf16 leaves are rounded to bf16
    assert set(res) == {"o", "dq", "dk", "dv", "dbeta", "dg"}
    assert res["o"] < 1e-12 and 1e-4 < e < 3e-3 and name != "o", res
    e, name, res = error_vs_fp64(lambda *x: ref(*x, s=1.01), **kw)
    assert abs(res["o"] - 0.01) < 1e-9 and all(abs(v - 0.01) < 3e-3 for v in res.values()), res
    e, name, _ = error_vs_fp64(lambda *x: ref(*x) * float("nan"), **dict(kw, gated=False))
    assert e != e and name == "o"
    seen = {}

    def fake_fla(q, k, v, g, beta, num_householder):
        seen.update(k=k.shape, v=v.shape, beta=beta.shape, n=num_householder)
        return (q,)
    q, k, v, b = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 3, 2, 4), torch.randn(1, 5, 3, 2, 4), torch.rand(1, 5, 3, 2)
    assert fla_layout(fake_fla, 3)(q, k, v, b, None) is q
    assert seen == dict(k=(1, 15, 2, 4), v=(1, 15, 2, 4), beta=(1, 15, 2), n=3)


def test_delta_throughput_accuracy_pair_ours_and_a_peer(monkeypatch):
    """--fla-accuracy's two cells: ours (the Triton path, interpreter here) within the bound, a peer
    in fla's layout measured on the same inputs, an absent peer and a refusing one named."""
    import os
    import types
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter test (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)")
    import benchmarks.delta_throughput as dt
    from lrnn_scan.delta import chunk_delta_product
    monkeypatch.setattr(dt, "DEVICE", "cpu")
    a = types.SimpleNamespace(chunk=64, K=16, check_T=70, check_H=1)

    def peer(q, k, v, g, beta, num_householder):     # fla's layout, our torch path, 2 % off
        B, TN, H, K = k.shape
        unflat = lambda x: x.reshape(B, TN // num_householder, num_householder, *x.shape[2:])  # noqa: E731
        o = chunk_delta_product(q.float(), unflat(k).float(), unflat(v).float(), unflat(beta).float(),
                                None if g is None else g.float(), backend="torch")[0]
        return (o * 1.02,)

    ours, theirs = dt.accuracy_pair(a, chunk_delta_product, peer, 2, True)
    assert ours[0] < dt.ERR_BOUND, ours
    assert abs(theirs[0] - 0.02) < 2e-3 and theirs[1] in ("o", "dq", "dk", "dv", "dbeta", "dg"), theirs
    assert dt.accuracy_pair(a, chunk_delta_product, None, 1, False)[1] == "fla absent"

    def refuses(**kw):
        raise RuntimeError("not on this GPU\nmore")
    assert dt.accuracy_pair(a, chunk_delta_product, refuses, 1, False)[1] == "fla refused: not on this GPU"


def test_delta_throughput_variants_fla_refusal_is_reported(capsys):
    """--variants-fla: a peer that refuses (fla's Hopper guard) gives no time and says why, in
    fla's interleaved layout ([B, T·n_h, H, ·]) as the other fla calls use."""
    import torch

    import benchmarks.delta_throughput as dt
    seen = {}

    def refuses(q, k, v, g, beta, num_householder):
        seen.update(k=tuple(k.shape), beta=tuple(beta.shape), n=num_householder)
        raise RuntimeError("gated backward refused on Hopper\nsecond line")
    q, k, v, b = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 3, 2, 4), torch.randn(1, 5, 3, 2, 4), torch.rand(1, 5, 3, 2)
    assert dt._time_fla(refuses, q, k, v, b, None, 3, None, None) is None
    assert seen == dict(k=(1, 15, 2, 4), beta=(1, 15, 2), n=3)
    assert "refused: gated backward refused on Hopper" in capsys.readouterr().out


def test_delta_throughput_emulate_checks_variants_on_the_cpu():
    """--variants ... --emulate (the GPU's tf32/bf16 rounding emulated in the interpreter) runs the
    error check of each variant at a tiny size; its own process, since the emulation patches the
    interpreter for the rest of the process."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "delta_throughput.py"), "--variants", "default",
                        "all16", "--emulate", "--nh", "1", "--gated", "1", "--check-T", "40", "--check-H", "1",
                        "--K", "16"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("[check]")]
    assert [ln.split()[1] for ln in rows] == ["default", "all16"], r.stdout
    assert all("FAILS" not in ln and "nan" not in ln for ln in rows), rows


def test_delta_throughput_emulate_refuses_fp32():
    """--emulate emulates the GPU's bf16 / tf32 rounding, so --dtype fp32 with it is refused."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "delta_throughput.py"), "--variants",
                        "default", "--emulate", "--dtype", "fp32"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode != 0 and "bf16 inputs only" in r.stderr, (r.returncode, r.stderr[-500:])


def test_delta_throughput_variants_name_existing_tune_keys():
    """Every --variants override names a key of function.TUNE (a removed option, e.g. inv_lean,
    must leave the list too), and the default list names known variants."""
    import benchmarks.delta_throughput as dt
    from lrnn_scan.kernels.delta_product import function as fn
    bad = {name: key for name, over in dt.VARIANTS.items() for key in over if key not in fn.TUNE}
    assert not bad, bad
    assert set(dt.DEFAULT_VARIANTS) <= set(dt.VARIANTS)
    # and tools/gpu_owed.sh deltavar's default list (a typo there costs a GPU call)
    import re
    owed = (ROOT / "tools" / "gpu_owed.sh").read_text()
    names = re.search(r"DELTA_VARIANTS:-([^}]*)\}", owed).group(1).split()
    assert names and set(names) <= set(dt.VARIANTS), set(names) - set(dt.VARIANTS)
    # and its deltafp32 stage's
    fp32 = re.search(r"--dtype fp32 .*\n *--variants ([^-]*)--out", owed).group(1).split()
    assert fp32 == ["default", "fp32_ieee"] and set(fp32) <= set(dt.VARIANTS)


def test_gpu_pair_splits_stage_lists_per_card(tmp_path):
    """tools/gpu_pair.sh (dry run): each card runs its own stages in order, VAR=value words apply
    to that card's later stages only, commas in a value become spaces, and every stage named is
    one tools/gpu_owed.sh knows."""
    import subprocess
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_pair.sh"),
         "STAGE_TIMEOUT=500 TRAIN_CONFIG=x.json train", "DELTA_NH=1,2,4 deltavar STAGE_TIMEOUT=9 deltafla"],
        env={"OUT": str(tmp_path), "GPU_PAIR_DRY": "1", "PATH": "/usr/bin:/bin"}, cwd=ROOT,
        capture_output=True, text=True, check=True).stdout.splitlines()
    card0 = [x for x in out if x.startswith("card 0")]
    card1 = [x for x in out if x.startswith("card 1")]
    assert card0 == ["card 0: train (STAGE_TIMEOUT=500 DELTA_NH= TRAIN_CONFIG=x.json)"]
    assert card1 == ["card 1: deltavar (STAGE_TIMEOUT= DELTA_NH=1 2 4 TRAIN_CONFIG=)",
                     "card 1: deltafla (STAGE_TIMEOUT=9 DELTA_NH=1 2 4 TRAIN_CONFIG=)"]
    owed = (ROOT / "tools" / "gpu_owed.sh").read_text()
    for stage in ("train", "deltavar", "deltafla"):
        assert f"\n  {stage})" in owed, stage


def test_triton_cache_goes_back_in_parts_and_restores(tmp_path):
    """tools/triton_cache.sh: a cache archive over 15 MiB is split into parts (the device returns
    files of at most 16 MiB), restore reassembles them byte for byte, and an archive that would
    need more than TRITON_CACHE_PARTS parts is not written (with a message saying so)."""
    import os
    import subprocess
    cache, out, repo = tmp_path / "cache", tmp_path / "out", tmp_path / "repo"
    (cache / "k").mkdir(parents=True)
    out.mkdir()
    blob = os.urandom(17 * 2 ** 20)                     # random: gzip cannot shrink it below 15 MiB
    (cache / "k" / "__grp__kernel.json").write_bytes(blob)
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "TRITON_CACHE_DIR": str(cache)}
    script = str(ROOT / "tools" / "triton_cache.sh")
    msg = subprocess.run(["bash", script, "save"], env=env, capture_output=True, text=True,
                         check=True).stdout
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["triton_cache.tar.gz.part-00", "triton_cache.tar.gz.part-01"], parts
    assert "in 2 parts" in msg
    assert all((out / p).stat().st_size <= 16 * 2 ** 20 for p in parts)
    (repo / ".triton_cache").mkdir(parents=True)
    for p in parts:
        (repo / ".triton_cache" / p).write_bytes((out / p).read_bytes())
    restored = tmp_path / "restored"
    subprocess.run(["bash", script, "restore"], env={**env, "TRITON_CACHE_DIR": str(restored)},
                   cwd=repo, capture_output=True, text=True, check=True)
    assert (restored / "k" / "__grp__kernel.json").read_bytes() == blob
    msg = subprocess.run(["bash", script, "save"], env={**env, "TRITON_CACHE_PARTS": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert "not saved" in msg and not list(out.iterdir())


def test_triton_cache_only_keeps_the_matching_entries(tmp_path):
    """TRITON_CACHE_ONLY: only the cache entries with a file name matching the regex are archived,
    and a pattern that matches nothing writes nothing (and says so)."""
    import subprocess
    import tarfile
    cache, out = tmp_path / "cache", tmp_path / "out"
    for entry, name in (("e1", "dqkwg_bwd_kernel"), ("e2", "_diag_fwd_kernel"), ("e3", "chunk_fwd_kernel_o")):
        (cache / entry).mkdir(parents=True)
        (cache / entry / f"{name}.cubin").write_bytes(name.encode())
        (cache / entry / f"__grp__{name}.json").write_text("{}")
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "TRITON_CACHE_DIR": str(cache)}
    script = str(ROOT / "tools" / "triton_cache.sh")
    msg = subprocess.run(["bash", script, "save"], env={**env, "TRITON_CACHE_ONLY": "dqkwg|chunk_"},
                         capture_output=True, text=True, check=True).stdout
    assert "2 entries match" in msg, msg
    with tarfile.open(out / "triton_cache.tar.gz") as tar:
        names = sorted(n for n in tar.getnames() if n.endswith(".cubin"))
    assert names == ["e1/dqkwg_bwd_kernel.cubin", "e3/chunk_fwd_kernel_o.cubin"], names
    msg = subprocess.run(["bash", script, "save"], env={**env, "TRITON_CACHE_ONLY": "no_such_kernel"},
                         capture_output=True, text=True, check=True).stdout
    assert "not saved" in msg and not list(out.iterdir())


def test_fwdbwd_chunk_sweep_render_old_and_new_rows(tmp_path):
    """fwdbwd_chunk_sweep.render: rows from before the err / % copy / pass columns (2026-11-24
    JSON) and rows with them (fourteenth session's --set summary --fwd)."""
    pytest.importorskip("triton")
    mod = _tool("fwdbwd_chunk_sweep")
    old = dict(B=8, T=2048, N=768, m=2, choice="default", tune={}, ms=0.64, tbps=1.1, vs_default=1.0,
               graph_ms=None)
    new = dict(B=1, T=16384, N=768, m=16, choice="dot256", tune={"summary": "dot", "chunk": 256},
               ms=0.6847, err=1.63e-07, pct_copy=44.2, fwd_only=True, tbps=1.323, vs_default=0.342,
               graph_ms=0.6755, kernels={"_bd_summary_dot_kernel": [1, 301.5], "_bd_fwd_ring": [1, 250.2]})
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(dict(date="d", set="summary", copy_tbps=2.997, device="GPU X", torch="t",
                                    triton="tr", rows=[old, new])))
    res = tmp_path / "R.md"
    mod.render(path, res)
    text = res.read_text()
    assert "copy 2.997 TB/s" in text and "(summary set)" in text
    assert "| 8 | 2048 | 768 | 2 | fwd+bwd | default | — | 0.6400 | 1.100 | — | 1.000 | — | — |" in text
    assert ('| 1 | 16384 | 768 | 16 | fwd | dot256 | {"summary": "dot", "chunk": 256} | 0.6847 | 1.323 | '
            '44.2 | 0.342 | 0.6755 | 1.6e-07 |') in text
    assert "| 1 | 16384 | 768 | 16 | fwd | dot256 | `_bd_summary_dot_kernel` | 1 | 301.5 |" in text
    assert text.count("| fwd | dot256 | `") == 2  # the old row has no kernels


def test_lb2_compare_render(tmp_path):
    """tools/lb2_compare.py --render: one row per shape, ms and % of the same-size copy, the note
    and the failed-check count in the heading."""
    mod = _tool("lb2_compare")
    js = tmp_path / "lb2.json"
    js.write_text(json.dumps(dict(
        meta=dict(date="2026-11-27T00:49", device="GPU X", torch="2.11", triton="3.6", rounds=3, fails=0),
        rows={"B8 T2048 N768": {"copy": 0.07, "default": 0.08, "ring": 0.1}})))
    out = tmp_path / "R.md"
    mod.render(js, out, "; a note")
    text = out.read_text()
    assert "GPU X" in text and "checks failed: 0; a note" in text
    assert "| B8 T2048 N768 | 0.0700 (100) | 0.0800 (88) | 0.1000 (70) |" in text
    mod.render(js, out, "another note")  # without the leading "; " the tool adds it
    assert "checks failed: 0; another note" in out.read_text()
    d = json.loads(js.read_text())
    d["meta"].update(m=4, kind="fwd")  # tools/lb4_compare.py's JSON
    js.write_text(json.dumps(d))
    mod.render(js, out)
    assert "## lb4_compare.py — 2026-11-27T00:49 — GPU X" in out.read_text() and "; m = 4 fwd," in out.read_text()
    assert "CUDA-graph medians of 3" in out.read_text() and "eager" not in out.read_text()
    d["meta"].update(tool="gate_tune_compare --kind fused --route --eager")
    js.write_text(json.dumps(d))
    mod.render(js, out)
    assert "## gate_tune_compare.py --kind fused --route --eager — " in out.read_text()
    assert "fp32, eager do_bench medians (L2 flushed) of 3 interleaved rounds" in out.read_text()


def test_tune_compare_parse_and_render(tmp_path):
    """tools/tune_compare.py: ``--tune`` words in JSON or the compact ``key:value+key:value`` form
    (no commas, so they pass through gpu_pair.sh), clear errors for malformed words, and its JSON
    rendered under its own name by lb2_compare.render."""
    mod = _tool("tune_compare")
    got = mod.parse_tune(['a={"bh": 4, "num_warps": 1}', "b=bh:4+variant:ring8+bd4_lookback:false+x:0.5"])
    assert got == {"a": {"bh": 4, "num_warps": 1},
                   "b": {"bh": 4, "variant": "ring8", "bd4_lookback": False, "x": 0.5}}
    for bad, msg in (("bh4", "expected NAME=JSON"), ("x=", "expected NAME=JSON"), ("x={", "not JSON"),
                     ("x=bh:4+y", "key:value pairs"), ('x=["bh"]', "key:value pairs"),
                     ("x=[1]", "key:value pairs")):
        with pytest.raises(SystemExit, match=msg):
            mod.parse_tune([bad])
    js = tmp_path / "tune_compare_m8_bwd.json"
    js.write_text(json.dumps(dict(
        meta=dict(date="2026-11-27T05:31", device="GPU X", torch="2.11", triton="3.6", rounds=3, fails=0,
                  kind="fwd+bwd", m=8, tool="tune_compare"),
        rows={"B8 T2048 N768": {"copy": 0.3334, "default": 0.5677, "bh1": 0.6387}})))
    out = tmp_path / "R.md"
    _tool("lb2_compare").render(js, out)
    text = out.read_text()
    assert "## tune_compare.py — 2026-11-27T05:31 — GPU X" in text and "; m = 8 fwd+bwd," in text
    assert "| B8 T2048 N768 | 0.3334 (100) | 0.5677 (59) | 0.6387 (52) |" in text
    d = json.loads(js.read_text())
    d["meta"]["tool"] = "tune_compare --compiled"   # its --compiled runs: the flag after the name
    js.write_text(json.dumps(d))
    _tool("lb2_compare").render(js, out)
    assert "## tune_compare.py --compiled — 2026-11-27T05:31 — GPU X" in out.read_text()
    assert "; m = 8 fwd+bwd, fp32, CUDA-graph" in out.read_text()  # JSONs before --dtype: fp32
    d["meta"]["dtype"] = "bf16"
    js.write_text(json.dumps(d))
    _tool("lb2_compare").render(js, out)
    assert "; m = 8 fwd+bwd, bf16, CUDA-graph" in out.read_text()
    assert mod._TOL["fp32"] == 1e-5 and mod._DTYPES["bf16"] is torch.bfloat16
    with pytest.raises(SystemExit):
        mod.main(["--m", "1", "--dtype", "fp64"])  # not a choice


def test_timed_rounds_adds_a_copy_column(monkeypatch):
    """lb2_compare.timed_rounds (the three look-back / TUNE tools' timing loop): a ``copy`` column
    first, every function timed once a round, medians of the rounds."""
    mod = _tool("lb2_compare")
    calls = []
    fake = iter([5.0, 1.0, 2.0, 6.0, 3.0, 4.0, 7.0, 2.0, 9.0])

    def graph_time(fn):
        fn()
        return next(fake)
    monkeypatch.setattr(mod, "graph_time", graph_time)
    out = mod.timed_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 64, 3, device="cpu")
    assert list(out) == ["copy", "a", "b"] and calls == ["a", "b"] * 3
    assert out == {"copy": 6.0, "a": 2.0, "b": 4.0}


def test_tm_vs_accel_render(tmp_path, capsys):
    """tools/tm_vs_accel.py --render: per kind one row per shape, ms and accelerated-scan's time
    over each column's, the worst check in the footer; --results appends the same text."""
    mod = _tool("tm_vs_accel")
    rows = [dict(B=8, T=2048, N=4096, kind=k, config=c, ms=ms, peer_over_this=p, h_vs_fp64=e, grad_vs_btn=e)
            for k, c, ms, p, e in (("fwd", "tm_default", 0.2650, 1.015, 5e-8),
                                   ("fwd", "accelerated-scan", 0.2690, 1.0, 6e-8),
                                   ("fwdbwd", "tm_default", 0.7106, 1.02, 1.1e-7),
                                   ("fwdbwd", "accelerated-scan", 0.7247, 1.0, 9e-8))]
    js = tmp_path / "tm_vs_accel.json"
    js.write_text(json.dumps(dict(meta=dict(date="2026-11-27 08:09 UTC", device="GPU X", torch="2.11",
                                            triton="3.6", rounds=3, note="bytes"), rows=rows)))
    res = tmp_path / "R.md"
    mod.main(["--render", str(js), "--results", str(res), "--note", "a note"])
    text = res.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "### tools/tm_vs_accel.py, 2026-11-27 08:09 UTC" in text and "GPU X" in text and "a note" in text
    assert "| B8 T2048 N4096 | 0.2650 (1.015) | 0.2690 (1.0) |" in text
    assert "| B8 T2048 N4096 | 0.7106 (1.02) | 0.7247 (1.0) |" in text and "1.1e-07" in text


def test_tm_vs_accel_smoke_on_the_interpreter(tmp_path, monkeypatch):
    """tools/tm_vs_accel.py's run at a tiny shape on the CPU interpreter (timer stubbed, no
    accelerated-scan): every column checked against fp64 and the (B, T, N) default's gradients,
    a copy column first, one row per column and kind."""
    mod = _tool("tm_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    monkeypatch.setattr(mod, "timed_rounds",
                        lambda fns, nbytes, rounds, device: {"copy": 1.0, **{k: (f(), 2.0)[1] for k, f in fns.items()}})
    mod.main(["--shapes", "2x37x20", "--rounds", "1", "--out", str(tmp_path)])
    d = json.loads((tmp_path / "tm_vs_accel.json").read_text())
    cols = ["copy", "btn_default", *mod.CONFIGS]
    assert [r["config"] for r in d["rows"]] == cols * 2 and d["meta"]["device"] == "CPU interpreter"
    for r in d["rows"]:
        assert r["config"] == "copy" or (r["h_vs_fp64"] < 1e-6 and r["grad_vs_btn"] < 1e-6), r
        assert r["pct_copy"] == (100.0 if r["config"] == "copy" else 50.0) and r["peer_over_this"] is None


def test_tm_vs_accel_compiled_columns_on_the_interpreter(tmp_path, monkeypatch):
    """``--compiled``: the ``tm_compiled`` and ``btn_op_transposed`` columns (``torch.compile``
    stubbed to the eager function: the custom ops themselves run), checked like every column."""
    mod = _tool("tm_vs_accel")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: None)
    monkeypatch.setattr(mod.torch, "compile", lambda fn, **kw: fn)
    monkeypatch.setattr(mod, "timed_rounds",
                        lambda fns, nbytes, rounds, device: {"copy": 1.0, **{k: (f(), 2.0)[1] for k, f in fns.items()}})
    mod.main(["--shapes", "2x37x20", "--rounds", "1", "--out", str(tmp_path), "--configs", "--compiled"])
    d = json.loads((tmp_path / "tm_vs_accel.json").read_text())
    cols = ["copy", "btn_default", "tm_default", "tm_compiled", "btn_op_transposed"]
    assert [r["config"] for r in d["rows"]] == cols * 2
    for r in d["rows"]:
        assert r["config"] == "copy" or (r["h_vs_fp64"] < 1e-6 and r["grad_vs_btn"] < 1e-6), r
