"""Layer-level targets of issue 7, timed in one run on CUDA.

One layer, B=8, T=2048, d_model=768, forward+backward (and forward), in three precisions:
``fp32`` (strict: TF32 off in cuBLAS *and* cuDNN — torch's cuDNN default is TF32 on, so the
LSTM would otherwise run TF32 while the projections ran full fp32), ``tf32`` (fp32 tensors,
TF32 tensor-core matmuls in both libraries, i.e. ``torch.set_float32_matmul_precision("high")``)
and ``bf16-autocast``:

* ``bdlru_m4`` — :class:`lrnn_scan.models.BDLRU` (d_model 768, hidden N = 768, m = 4; fused-gate
  Triton scan);
* ``lstm`` — :class:`lrnn_scan.models.LSTM` (``torch.nn.LSTM``, cuDNN) with hidden size 768;
* ``fla_gated_deltanet`` — fla's ``GatedDeltaNet`` layer (head_dim 128, ``num_heads`` chosen so its
  parameter count is closest to the BD-LRU layer's), when fla is installed;
* ``ours_gated_deltanet`` — :class:`lrnn_scan.models.GatedDeltaNet` at matched parameters too.

Targets: BD-LRU ≥ 20× faster than the LSTM, and ≤ 1.5× fla's GatedDeltaNet time (fwd+bwd).
Timing: ``triton.testing.do_bench`` medians. A layer whose backward refuses to run (fla's on
Hopper with Triton < 3.7.1) keeps its forward time. ``--profile`` also writes a torch.profiler
table of a layer's forward+backward kernels per precision (where the time goes). Writes ``<out>/layer_targets.json``; appends each row
to ``--results`` as it is measured (a run cut short keeps its rows), then the ratios.

    python benchmarks/layer_targets.py [--out benchmarks/out] [--results benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lrnn_scan.models import BDLRU, LSTM, GatedDeltaNet  # noqa: E402


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def fla_layer(target: int, d: int):
    """fla GatedDeltaNet with head_dim 128 and the head count closest to ``target`` params."""
    from lrnn_scan.bench.peers import fla_gated_deltanet_class
    cls = fla_gated_deltanet_class()
    best = None
    with torch.device("meta"):
        for h in range(1, 17):
            p = n_params(cls(hidden_size=d, head_dim=128, num_heads=h, mode="chunk"))
            if best is None or abs(p - target) < abs(best[1] - target):
                best = (h, p)
    h = best[0]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = cls(hidden_size=d, head_dim=128, num_heads=h, mode="chunk")

        def forward(self, x):
            return self.inner(x)[0], None
    return Wrapped(), f"fla GatedDeltaNet(hidden 768, head_dim 128, heads {h})"


def ours_gdn(target: int, d: int):
    best = None
    with torch.device("meta"):
        for h in range(1, 17):
            p = n_params(GatedDeltaNet(d, h, head_dim=128))
            if best is None or abs(p - target) < abs(best[1] - target):
                best = (h, p)
    return GatedDeltaNet(d, best[0], head_dim=128), f"lrnn_scan GatedDeltaNet(768, heads {best[0]}, head_dim 128)"


def _ms(v: float, digits: int = 3) -> str:
    """A table cell: the number, or 'backward failed' for the NaN of a refused backward."""
    return f"{v:.{digits}f}" if v == v else "backward failed"


def profile_layer(step, path: Path, title: str, top: int = 25):
    """torch.profiler table of ``step``'s CUDA kernels (3 steps after 3 warm-ups) to ``path``."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=70)
    path.write_text(f"{title}: 3 steps ({step.__name__})\n{table}\n")
    print(f"[layer_targets] profile of {title} -> {path}\n{table}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--layers", nargs="+", default=None,
                    help="subset of bdlru_m4 lstm ours_gated_deltanet fla_gated_deltanet")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16-autocast"],
                    choices=["fp32", "tf32", "bf16-autocast"])
    ap.add_argument("--profile", nargs="*", default=None, metavar="LAYER",
                    help="write <out>/profile_<layer>_<precision>.txt (torch.profiler) for these "
                         "layers (no names: bdlru_m4)")
    ap.add_argument("--fla-unguarded", action="store_true",
                    help="time fla's gated backward although fla refuses it on Hopper with Triton "
                         "< 3.7.1 (its #640: wrong results there); its rows are labelled, timing only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("[layer_targets] needs CUDA; nothing timed")
        return
    import triton
    from triton.testing import do_bench

    dev = torch.device("cuda")
    B, T, d = a.B, a.T, a.d
    torch.manual_seed(0)
    bd = BDLRU(d, d, m=4)
    target = n_params(bd)
    layers = {"bdlru_m4": (bd, "BDLRU(768, N=768, m=4, softmax gates)"),
              "lstm": (LSTM(d, d), "torch.nn.LSTM(768, 768) (cuDNN)"),
              "ours_gated_deltanet": ours_gdn(target, d)}
    try:
        layers["fla_gated_deltanet"] = fla_layer(target, d)
        if a.fla_unguarded:
            from lrnn_scan.bench.peers import fla_disable_hopper_guard
            fla_disable_hopper_guard()
            m, desc = layers["fla_gated_deltanet"]
            layers["fla_gated_deltanet"] = (m, desc + " [Hopper guard off: #640, timing only]")
    except Exception as exc:  # noqa: BLE001 - optional peer
        print(f"[layer_targets] fla GatedDeltaNet skipped: {type(exc).__name__}: {exc}")
    if a.layers:
        layers = {k: v for k, v in layers.items() if k in a.layers}
    rows = []
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"\n## layer_targets.py — {now} — {torch.cuda.get_device_name()}, torch "
            f"{torch.__version__}, Triton {triton.__version__}; one layer, B={B} T={T} "
            f"d_model={d}; do_bench medians\n\n")

    def record(r):
        """Append each row as it is measured (a run cut short keeps its rows)."""
        with open(a.results, "a") as fh:
            if len(rows) == 1:
                fh.write(head + "| layer | precision | params | fwd (ms) | fwd+bwd (ms) | peak GiB |\n"
                         "|---|---|---|---|---|---|\n")
            fh.write(f"| {r['desc']} | {r['precision']} | {r['params']/1e6:.2f}M | "
                     f"{r['fwd_ms']:.3f} | {_ms(r['fwdbwd_ms'])} | {_ms(r['peak_gib'], 2)} |\n")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for prec in a.precisions:
        tf32 = prec == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        for name, (layer, desc) in layers.items():
            layer = layer.to(dev)
            x = torch.randn(B, T, d, device=dev, requires_grad=True)
            dy = torch.randn(B, T, d, device=dev)
            ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if prec != "fp32"
                   else contextlib.nullcontext())
            params = [p for p in layer.parameters()]

            def fwd():
                with ctx:
                    return layer(x)[0]

            def fwdbwd():
                y = fwd()
                torch.autograd.backward(y, dy.to(y.dtype))
                x.grad = None
                for p in params:
                    p.grad = None
            try:
                with torch.no_grad():
                    t_f = do_bench(fwd, warmup=10, rep=50, return_mode="median")
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"[layer_targets] {name} {prec} forward failed: {type(exc).__name__}: {exc}")
                continue
            try:
                t_fb = do_bench(fwdbwd, warmup=10, rep=50, return_mode="median")
                torch.cuda.reset_peak_memory_stats()
                fwdbwd()
                mem = torch.cuda.max_memory_allocated() / 2**30
            except Exception as exc:  # noqa: BLE001 - fla's backward refuses on Hopper + Triton 3.6
                print(f"[layer_targets] {name} {prec} backward failed (forward kept): "
                      f"{type(exc).__name__}: {str(exc)[:300]}")
                t_fb, mem = float("nan"), float("nan")
            if a.profile is not None and name in (a.profile or ["bdlru_m4"]):
                step = fwdbwd if t_fb == t_fb else fwd
                profile_layer(step, out / f"profile_{name}_{prec}.txt", f"{desc}, {prec}")
            rows.append(dict(name=name, desc=desc, precision=prec, params=n_params(layer),
                             fwd_ms=round(t_f, 4), fwdbwd_ms=round(t_fb, 4),
                             peak_gib=round(mem, 3),
                             tokens_per_s_fwdbwd=(round(B * T / (t_fb * 1e-3))
                                                  if t_fb == t_fb else None)))
            record(rows[-1])
            print(f"{name:22s} {prec:14s} params {n_params(layer)/1e6:6.2f}M fwd {t_f:8.3f} ms "
                  f"fwd+bwd {t_fb:8.3f} ms peak {mem:6.2f} GiB", flush=True)
            layer.cpu()
            torch.cuda.empty_cache()
    ms = {(r["name"], r["precision"]): r["fwdbwd_ms"] for r in rows}
    ms_f = {(r["name"], r["precision"]): r["fwd_ms"] for r in rows}
    lines = ["\nRatios of the rows above:\n", "| layer | precision | params | fwd (ms) | fwd+bwd (ms) | peak GiB | "
             "LSTM / this (fwd+bwd) | this / fla GDN (fwd+bwd) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lstm = ms.get(("lstm", r["precision"]))
        fla = ms.get(("fla_gated_deltanet", r["precision"]))
        vs_lstm = f"{lstm / r['fwdbwd_ms']:.1f}×" if lstm and r["fwdbwd_ms"] == r["fwdbwd_ms"] else "—"
        fla_f = ms_f.get(("fla_gated_deltanet", r["precision"]))
        if fla and fla == fla:
            vs_fla = f"{r['fwdbwd_ms'] / fla:.2f}"
        elif fla_f:   # fla's backward refused: compare forwards, and say so
            vs_fla = f"fwd only: {r['fwd_ms'] / fla_f:.2f}"
        else:
            vs_fla = "—"
        lines.append(f"| {r['desc']} | {r['precision']} | {r['params']/1e6:.2f}M | {r['fwd_ms']:.3f} "
                     f"| {_ms(r['fwdbwd_ms'])} | {_ms(r['peak_gib'], 2)} | {vs_lstm} | {vs_fla} |")
    table = "\n".join(lines) + "\n"
    print(table)
    (out / "layer_targets.json").write_text(json.dumps(rows, indent=1))
    with open(a.results, "a") as fh:
        fh.write(table)
    print(f"[layer_targets] wrote {out}/layer_targets.json and appended to {a.results}")


if __name__ == "__main__":
    main()
