"""accelerated-scan's backward reads past its ``states`` where ``T`` is not a multiple of its
2048-step block (``benchmarks/scan_peers.accelerated_scan_grad_ok``); on an H200 that read
faulted. The comparison tools time its forward everywhere and its backward only where it stays
inside its tensors. The peer is faked here by a torch loop (CPU interpreter, timers stubbed)."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from test_tools_results import _tool

pytest.importorskip("triton")
# the tools run here on CPU tensors (DEVICE patched): Triton's interpreter, not a GPU's compiler
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU runs of the tools: needs TRITON_INTERPRET=1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import scan_peers  # noqa: E402


def _fake_peer(calls):
    """A differentiable ``h_t = a_t h_{t-1} + x_t`` on ``(B, N, T)``, counting its backwards."""
    class Loop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, x):
            h, s = torch.empty_like(x), torch.zeros_like(x[..., 0])
            for t in range(x.shape[-1]):
                s = a[..., t] * s + x[..., t]
                h[..., t] = s
            ctx.save_for_backward(a, h)
            return h

        @staticmethod
        def backward(ctx, g):
            calls.append("bwd")
            a, h = ctx.saved_tensors
            lam, s = torch.empty_like(g), torch.zeros_like(g[..., 0])
            for t in reversed(range(g.shape[-1])):
                s = g[..., t] + (a[..., t + 1] * s if t + 1 < g.shape[-1] else 0)
                lam[..., t] = s
            prev = torch.cat([torch.zeros_like(h[..., :1]), h[..., :-1]], -1)
            return lam * prev, lam
    return Loop.apply


def test_grad_ok_only_on_whole_blocks():
    assert [scan_peers.accelerated_scan_grad_ok(T) for T in (2048, 4096, 16384)] == [True] * 3
    assert [scan_peers.accelerated_scan_grad_ok(T) for T in (1, 100, 1024, 2047, 4104)] == [False] * 5


@pytest.mark.parametrize("block,timed", [(2048, False), (17, True)])
def test_diag_tile_vs_accel_times_the_peer_backward_on_whole_blocks(tmp_path, monkeypatch, capsys,
                                                                     block, timed):
    mod = _tool("diag_tile_vs_accel")
    calls = []
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "BENCH", lambda f, rep, return_mode: (f(), 1e-3)[1])
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: _fake_peer(calls))
    monkeypatch.setattr(scan_peers, "ACCEL_BLOCK", block)
    mod.main(["--shapes", "1x17x8", "--rounds", "1", "--out", str(tmp_path), "--configs", "default"])
    rows = json.loads((tmp_path / "diag_tile_vs_accel.json").read_text())["rows"]
    kinds = [(r["config"], r["kind"]) for r in rows]
    assert kinds == [("default", "fwd"), ("accelerated-scan", "fwd"), ("default", "fwdbwd")] + (
        [("accelerated-scan", "fwdbwd")] if timed else [])
    assert rows[0]["peer_over_this"] == 1.0 and rows[2]["peer_over_this"] == (1.0 if timed else None)
    assert bool(calls) == timed
    assert ("not timed at T17" in capsys.readouterr().out) != timed
    assert rows[1]["h_vs_fp64"] < 1e-6


@pytest.mark.parametrize("block,timed", [(2048, False), (37, True)])
def test_tm_vs_accel_times_the_peer_backward_on_whole_blocks(tmp_path, monkeypatch, capsys, block, timed):
    mod = _tool("tm_vs_accel")
    calls = []
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(scan_peers, "ACCEL_BLOCK", block)
    monkeypatch.setattr(mod, "timed_rounds",
                        lambda fns, nbytes, rounds, device: {"copy": 1.0, **{k: (f(), 2.0)[1] for k, f in fns.items()}})
    monkeypatch.setattr(mod, "try_accelerated_scan", lambda: _fake_peer(calls))
    mod.main(["--shapes", "2x37x20", "--rounds", "1", "--out", str(tmp_path), "--configs"])
    rows = json.loads((tmp_path / "tm_vs_accel.json").read_text())["rows"]
    peer = {r["kind"]: r for r in rows if r["config"] == "accelerated-scan"}
    assert sorted(peer) == (["fwd", "fwdbwd"] if timed else ["fwd"])
    assert peer["fwd"]["h_vs_fp64"] < 1e-6
    if timed:
        assert peer["fwdbwd"]["grad_vs_btn"] < 1e-5
    ours = [r for r in rows if r["config"] == "btn_default" and r["kind"] == "fwdbwd"]
    assert ours[0]["peer_over_this"] == (1.0 if timed else None)
    assert bool(calls) == timed
    assert ("not timed at T37" in capsys.readouterr().out) != timed


def test_accel_reads_past_shows_the_read(monkeypatch):
    """The probe itself, where accelerated-scan is installed (the GPU image; not CPU CI)."""
    pytest.importorskip("accelerated_scan")
    mod = _tool("accel_reads_past")
    end, size = mod.reads_past(100)
    assert size == 2 * 100 * 4 and end > size                 # into memory past ``states``
    end, size = mod.reads_past(2048)
    assert end <= size
