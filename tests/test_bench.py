"""``lrnn-scan bench`` (lrnn_scan.bench) on CPU at tiny sizes: CSV/JSON/plots into tmp_path,
the FLOPs table against the paper's Table 5 formulas, parameter matching, --record only on
request, and the ``python -m benchmarks`` wrapper."""
import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrnn_scan.bench import cli
from lrnn_scan.bench.flops import flops_table
from lrnn_scan.bench.suite import Config, layer_cases, match_d_model, scan_bytes

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--ms", "1,2", "--seqlens", "8", "--batch", "1", "--blocks", "2",
        "--hidden", "4", "--layers", "bdlru,hlru,deltanet,deltaproduct,mamba2,lstm",
        "--layer-ms", "2", "--params", "3000", "--n-layers", "1", "--layer-seqlen", "6",
        "--warmup", "0", "--rep", "1", "--no-progress"]


def _run(tmp_path, *extra):
    assert cli.main([*TINY, "--out", str(tmp_path), *extra]) == 0
    (csv_path,) = tmp_path.glob("bench_cpu_*.csv")
    (json_path,) = tmp_path.glob("bench_cpu_*.json")
    return list(csv.DictReader(csv_path.open())), json.loads(json_path.read_text())


def test_cli_tiny_cpu_writes_csv_json_and_plots(tmp_path, capsys):
    rows, data = _run(tmp_path)
    out = capsys.readouterr().out
    assert "[CPU]" in out and "CPU run with reduced sizes" in out
    assert data["meta"]["device_label"] == "CPU" and data["meta"]["copy_gb_per_s"] > 0
    assert all(r["device_label"] == "CPU" for r in rows)
    # views A and B: 3 scan kinds x m in {1, 2} x 2 modes each, plus the torch associative_scan peer
    for view in ("A", "B"):
        ours = [r for r in rows if r["view"] == view and r["impl"] == "lrnn_scan"]
        assert {(r["kind"], r["m"], r["mode"]) for r in ours} == {
            (k, m, md) for k in ("bdlru", "hlru", "bd_materialised") for m in ("1", "2")
            for md in ("fwd", "fwdbwd")}
        assert any(r["impl"] == "torch_associative_scan" for r in rows if r["view"] == view)
    layer_rows = [r for r in rows if r["level"] == "layer"]
    assert {r["kind"] for r in layer_rows} == {"bdlru", "hlru", "deltanet", "deltaproduct",
                                                "mamba2", "lstm"}
    for r in rows:
        assert float(r["ms"]) > 0 and float(r["tokens_per_s"]) > 0
        assert r["mem_method"] == "torch.profiler(profile_memory)"
        if r["level"] == "scan":
            assert float(r["gb_per_s"]) > 0 and float(r["pct_copy"]) > 0
    skipped = " ".join(data["skipped"])
    assert "accelerated_scan: skipped" in skipped and "fla" in skipped
    assert not [s for s in data["skipped"] if "failed" in s], data["skipped"]
    assert (tmp_path / "flops_table.md").is_file() and (tmp_path / "flops_table.csv").is_file()
    if importlib.util.find_spec("matplotlib") is not None:
        names = {p.name.split("_", 3)[-1] for p in tmp_path.glob("*.png")}
        assert names == {"viewA.png", "viewB.png", "viewC.png", "time_vs_flops.png"}, names


def test_cli_views_and_modes_subset_no_plots(tmp_path):
    rows, data = _run(tmp_path, "--views", "B", "--modes", "fwd", "--scan-kinds", "bdlru",
                      "--no-plots", "--no-peers", "--no-memory")
    assert {(r["view"], r["kind"], r["mode"]) for r in rows} == {("B", "bdlru", "fwd")}
    assert not list(tmp_path.glob("*.png"))
    assert all(r["peak_mem_mib"] == "" for r in rows)


def _table5(layer, cfg):
    c = dict(kv.split("=") for kv in cfg.split())
    c = {k: int(v) for k, v in c.items()}
    if layer == "bdlru":
        H = c["N"] // c["m"]
        return 2 * H * c["m"] ** 2 + 2 * H
    if layer == "hlru":
        return 2 * c["N"] * c["m"] + 2 * c["N"]
    if layer == "diagonal_lru":
        return 4 * c["N"]
    if layer in ("deltanet", "deltaproduct"):
        r = 1
        return c.get("n_h", 1) * c["H"] * (4 * c["K"] * r + 4 * c["K"])
    if layer == "mamba2":
        return 2 * c["D"] * c["S"]
    if layer == "lstm":
        return 8 * c["H"] ** 2 + 25 * c["H"]
    raise AssertionError(layer)


@pytest.mark.parametrize("hidden", [96, 768])
def test_flops_table_matches_table5(hidden):
    rows = flops_table(hidden)
    assert {r["layer"] for r in rows} == {"bdlru", "hlru", "diagonal_lru", "deltanet",
                                         "deltaproduct", "mamba2", "lstm"}
    assert sorted(int(r["config"].split("m=")[1]) for r in rows if r["layer"] == "bdlru") == \
        [1, 2, 4, 8, 16, 32]
    for r in rows:
        assert r["flops_per_step"] == _table5(r["layer"], r["config"]), r
    # m = 1: BD-LRU, H-LRU and the diagonal LRU cost the same (4N)
    same = {r["flops_per_step"] for r in rows if r["config"] in (f"N={hidden} m=1", f"N={hidden}")
            and r["layer"] in ("bdlru", "hlru", "diagonal_lru")}
    assert same == {4 * hidden}


def test_flops_only_cli(tmp_path, capsys):
    assert cli.main(["--flops-only", "--flops-hidden", "64", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "flops_table.md").read_text()
    assert "8·H² + 25·H" in text and f"{8 * 64 * 64 + 25 * 64:,}" in text


def test_parameter_matching_view_c():
    for kind, m in [("bdlru", 4), ("hlru", 2), ("deltanet", 1), ("mamba2", 1), ("lstm", 1)]:
        d, p = match_d_model(kind, m, 200_000, 2)
        assert abs(p - 200_000) / 200_000 < 0.5, (kind, d, p)
    cfg = Config.for_device("cpu", quick=True)
    cases = layer_cases(cfg)
    assert {c.kind for c in cases} == set(cfg.layer_kinds)
    assert all(c.params > 0 and c.flops_per_step > 0 for c in cases)


def test_cuda_defaults_are_paper_sizes():
    cfg = Config.for_device("cuda")          # only builds the config; nothing runs on a GPU
    assert (cfg.blocks, cfg.hidden, cfg.params, cfg.ms) == (128, 768, 33_000_000, (1, 2, 4, 8, 16, 32))
    d, p = match_d_model("bdlru", 4, cfg.params, cfg.n_layers)
    assert abs(p - 33e6) / 33e6 < 0.05


def test_scan_bytes():
    assert scan_bytes("bd_materialised", 8, 2048, 96, 8, "fwd", 4) == 8 * 2048 * 768 * 10 * 4
    assert scan_bytes("bdlru", 1, 1, 1, 2, "fwdbwd", 4) == 2 * 10 * 4
    assert scan_bytes("hlru", 1, 1, 3, 2, "fwd", 2) == 3 * 5 * 2


def test_record_only_when_asked(tmp_path):
    results = ROOT / "benchmarks" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else None
    _run(tmp_path, "--views", "A", "--ms", "2", "--scan-kinds", "bd_materialised", "--modes", "fwd",
         "--no-plots", "--no-peers")
    assert (results.read_bytes() if results.exists() else None) == before
    res = tmp_path / "RESULTS.md"
    res.write_text("# results\n")
    _run(tmp_path / "r", "--views", "A", "--ms", "2", "--scan-kinds", "bd_materialised",
         "--modes", "fwd", "--no-plots", "--no-peers", "--record", "--results", str(res))
    text = res.read_text()
    assert "## lrnn-scan bench" in text and "[CPU]" in text and f"torch {torch.__version__}" in text
    assert "| scan | A | lrnn_scan | bd_materialised | 2 | 1 | 8 | 2 |" in text
    assert (results.read_bytes() if results.exists() else None) == before


def test_add_subparser_and_progress_fallback(capsys):
    import argparse

    from lrnn_scan.bench.runner import Progress
    ap = argparse.ArgumentParser(prog="lrnn-scan")
    sub = ap.add_subparsers(dest="cmd")
    cli.add_subparser(sub)
    args = ap.parse_args(["bench", "--quick", "--ms", "1,4", "--views", "A,C"])
    assert args.cmd == "bench" and args.ms == (1, 4) and args.views == ("A", "C")
    assert args.func is cli.run_args
    bar = Progress(2, "CPU bench", stream=sys.stdout)
    if bar._bar is None:                      # tqdm absent: one printed line per item
        bar.update("x")
        assert "[CPU bench] 1/2 x" in capsys.readouterr().out
    bar.close()


def test_python_m_benchmarks_wrapper(tmp_path):
    res = subprocess.run([sys.executable, "-m", "benchmarks", "--flops-only", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "flops_table.md").is_file()
    res = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--record" in res.stdout


def test_stable_blocks_rows_and_no_zero_division(monkeypatch):
    """Rows sum to the scale (a tensor scale per row too), entries are > 0, and an exact 0 from
    torch.rand (m = 1 divided 0 / 0 = NaN before) gives a finite block."""
    from lrnn_scan.bench.inputs import stable_blocks
    g = torch.Generator().manual_seed(0)
    A = stable_blocks(2, 7, 3, 4, 4, generator=g)
    assert torch.allclose(A.sum(-1), torch.full((2, 7, 3, 4), 0.99))
    assert (A > 0).all()
    s = 2 * torch.rand(2, 7, 3, 4, 1, generator=g) - 1
    assert torch.allclose(stable_blocks(2, 7, 3, 4, 4, scale=s, generator=g).sum(-1), s[..., 0])
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros_like(real_rand(*a, **k)))
    A1 = stable_blocks(5, 1, 1)
    assert torch.isfinite(A1).all() and torch.allclose(A1, torch.full_like(A1, 0.99))
