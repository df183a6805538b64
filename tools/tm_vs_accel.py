"""The time-contiguous m = 1 scan (``diagonal_scan(..., time_dim=2)``, ``time_major.py``) against
accelerated-scan on the same ``(B, N, T)`` tensors, in one run, with a same-size copy and the
``(B, T, N)`` default beside them.

Issue 3 asks the m = 1 scan to be at least as fast as accelerated-scan's Triton scan. The
``(B, T, N)`` kernels reached 0.98-0.99x of it (RESULTS.md); accelerated-scan reads time-contiguous
rows. This compares both on that layout. Every column's output is checked against a float64 loop
(first row of the batch) and its gradients against the ``(B, T, N)`` default's (transposed).

    python tools/tm_vs_accel.py [--shapes 8x2048x4096 ...] [--rounds 3] [--out DIR]
        [--configs name=key:value+key:value ...] [--compiled]
    python tools/tm_vs_accel.py --render OUT/tm_vs_accel.json [--results benchmarks/RESULTS.md] [--note TEXT]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from lrnn_scan.kernels.block_diagonal import diagonal_scan  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402
from scan_peers import accelerated_scan_grad_ok, try_accelerated_scan  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lb2_compare import timed_rounds  # noqa: E402
from tune_compare import parse_tune  # noqa: E402

DEVICE = "cuda"   # the CPU smoke test (tests/test_tools_results.py) sets "cpu" (interpreter)
SHAPES = ["8x2048x4096", "8x16384x4096", "8x2048x768", "1x16384x768"]
CONFIGS = {   # name -> scan.TUNE overrides of the time-major kernels (tm_* forward, tm_*_bwd backward)
    "tm_default": {},
    "tm_bt1024": dict(tm_bt=1024, tm_bt_bwd=1024),
    "tm_nw4": dict(tm_nw=4),
    "tm_nw8": dict(tm_nw=8),
    "tm_bwd_bt4096": dict(tm_bt_bwd=4096),
    "tm_bwd_bt4096_nw8": dict(tm_bt_bwd=4096, tm_nw_bwd=8),
    "tm_ns2": dict(tm_ns=2, tm_ns_bwd=2),
    # 2026-11-27 call 1 (H100), before the masks kept 16-byte vectors: 2 stages (then the default)
    # 0.77-0.98x accelerated-scan's forward, 1 stage 0.98-1.02x; 3 stages, 4096-step tiles with
    # 8 warps and 4 rows x 512 steps slower still. Call 2 (vectors, int64 times): 2 rows x 1024
    # steps 0.985-1.07x, no better than 1 x 2048. Call 3 (int32 times): 8 warps in the backward
    # 0.99-1.02x, the same as 4
}


def _rel(x, y):
    x, y = x.double(), y.double()
    return ((x - y).square().mean().sqrt() / y.square().mean().sqrt()).item()


def _ref64(a, b):
    """float64 loop over the last dim of ``(N, T)`` rows."""
    h = torch.zeros_like(b[:, 0], dtype=torch.float64)
    out = torch.empty(b.shape, dtype=torch.float64, device=b.device)
    for t in range(b.shape[1]):
        h = a[:, t].double() * h + b[:, t].double()
        out[:, t] = h
    return out


def _grad(fn, a, x, dh):
    """Gradients of ``<dh, fn(a, x)>``; ``a``, ``x`` are leaves made once, outside the timing."""
    return torch.autograd.grad(fn(a, x), (a, x), dh)


def compiled_columns():
    """``torch.compile(fullgraph=True)`` of ``lrnn_scan.compile.diagonal_scan(time_dim=2)``: the
    ``tm_scan_fwd``/``tm_scan_bwd`` ops (``tm_compiled``), and the path before those ops existed,
    a transpose to the ``(B, T, N)`` op and back (``btn_op_transposed``)."""
    import lrnn_scan.compile as lc
    lc.register()

    def transposed(u, v):
        h = lc.diagonal_scan(u.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())[0]
        return h.transpose(1, 2).contiguous()
    return {"tm_compiled": torch.compile(lambda u, v: lc.diagonal_scan(u, v, time_dim=2)[0], fullgraph=True),
            "btn_op_transposed": torch.compile(transposed, fullgraph=True)}


def run_shape(B, T, N, configs, as_scan, rounds, extra=None, dtype=torch.float32):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    a = torch.rand(B, N, T, device=DEVICE, generator=g) * 0.5 + 0.5   # (B, N, T), time contiguous
    x = torch.randn(B, N, T, device=DEVICE, generator=g)
    dh = torch.randn(B, N, T, device=DEVICE, generator=g)
    a, x, dh = (v.to(dtype) for v in (a, x, dh))
    at, xt, dht = (v.transpose(1, 2).contiguous() for v in (a, x, dh))   # (B, T, N) for the default
    ad, xd, atd, xtd = a, x, at, xt      # the forwards take these (no autograd graph)
    a, x, at, xt = (v.detach().requires_grad_() for v in (a, x, at, xt))
    ref = _ref64(ad[0, :64], xd[0, :64])
    btn = lambda u, v: diagonal_scan(u, v)[0]  # noqa: E731
    g0 = [v.transpose(1, 2) for v in _grad(btn, at, xt, dht)]
    fns, checks = {}, {}
    fns["btn_default"] = (lambda: btn(atd, xtd), lambda: _grad(btn, at, xt, dht))
    checks["btn_default"] = dict(h_vs_fp64=_rel(btn(atd, xtd)[0, :, :64].T, ref), grad_vs_btn=0.0)
    for name, tune in configs.items():
        def tm(u, v, tune=tune):
            with S.tuned(tune):
                return diagonal_scan(u, v, time_dim=2)[0]
        fns[name] = (lambda tm=tm: tm(ad, xd), lambda tm=tm: _grad(tm, a, x, dh))
        checks[name] = dict(h_vs_fp64=_rel(tm(ad, xd)[0, :64], ref),
                            grad_vs_btn=max(_rel(u, v) for u, v in zip(_grad(tm, a, x, dh), g0)))
    for name, fn in (extra or {}).items():
        fns[name] = (lambda fn=fn: fn(ad, xd), lambda fn=fn: _grad(fn, a, x, dh))
        checks[name] = dict(h_vs_fp64=_rel(fn(ad, xd)[0, :64], ref),
                            grad_vs_btn=max(_rel(u, v) for u, v in zip(_grad(fn, a, x, dh), g0)))
    if as_scan is not None:
        grad_ok = accelerated_scan_grad_ok(T)
        fns["accelerated-scan"] = (lambda: as_scan(ad, xd),
                                   (lambda: _grad(as_scan, a, x, dh)) if grad_ok else None)
        checks["accelerated-scan"] = dict(h_vs_fp64=_rel(as_scan(ad, xd)[0, :64], ref))
        if grad_ok:
            checks["accelerated-scan"]["grad_vs_btn"] = max(
                _rel(u, v) for u, v in zip(_grad(as_scan, a, x, dh), g0))
        else:
            print(f"accelerated-scan fwd+bwd not timed at T{T}: its backward reads past its "
                  "states unless T % 2048 == 0 (scan_peers.accelerated_scan_grad_ok)", flush=True)
    rows = []
    for kind, k, per in (("fwd", 0, 3), ("fwdbwd", 1, 8)):   # tensors of (B, N, T) moved once
        nbytes = per * a.element_size()
        ms = timed_rounds({n: f[k] for n, f in fns.items() if f[k] is not None}, B * T * N * nbytes,
                          rounds, device=DEVICE)
        peer = ms.get("accelerated-scan")
        for n, v in ms.items():
            rows.append(dict(B=B, T=T, N=N, kind=kind, config=n, tune=configs.get(n), ms=round(v, 5),
                             pct_copy=round(100 * ms["copy"] / v, 1),
                             peer_over_this=round(peer / v, 3) if peer else None, **checks.get(n, {})))
            print(f"B{B} T{T} N{N} {kind:6s} {n:18s} {v:8.4f} ms {rows[-1]['pct_copy']:6.1f}% of copy "
                  f"accel/this {rows[-1]['peer_over_this']} {checks.get(n, '')}", flush=True)
    return rows


def render(path, note=""):
    """Markdown of a ``tm_vs_accel.json``: per kind, ms by shape and column, and in brackets
    accelerated-scan's time over the column's (> 1: faster than accelerated-scan)."""
    d = json.loads(Path(path).read_text())
    m = d["meta"]
    cols = list(dict.fromkeys(r["config"] for r in d["rows"]))
    out = [f"### tools/tm_vs_accel.py, {m['date']}\n", f"{m['device']}, torch {m['torch']}, Triton {m['triton']}; "
           f"{m.get('dtype', 'float32')}; CUDA-graph medians of {m['rounds']} interleaved rounds; `(B, N, T)` tensors for the "
           "`tm_*` columns and accelerated-scan, `(B, T, N)` for `btn_default` (the same values "
           "transposed). In brackets: accelerated-scan's ms / the column's ms. " + m["note"] + ". " + note + "\n"]
    for kind in ("fwd", "fwdbwd"):
        rows = [r for r in d["rows"] if r["kind"] == kind]
        shapes = list(dict.fromkeys((r["B"], r["T"], r["N"]) for r in rows))
        out.append(f"\n{kind}, ms:\n\n| B T N | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
        for B, T, N in shapes:
            cell = {r["config"]: r for r in rows if (r["B"], r["T"], r["N"]) == (B, T, N)}
            out.append(f"| B{B} T{T} N{N} | " + " | ".join(
                f"{cell[c]['ms']:.4f} ({cell[c]['peer_over_this']})" if c in cell else "" for c in cols) + " |")
    errs = [max(r.get("h_vs_fp64", 0), r.get("grad_vs_btn", 0)) for r in d["rows"] if r["config"] != "copy"]
    out.append(f"\nChecks: worst relative error of an output against float64 or of a gradient against "
               f"the `(B, T, N)` default's: {max(errs):.1e}.\n")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", help="print (or append to --results) the Markdown of this JSON")
    ap.add_argument("--results")
    ap.add_argument("--note", default="")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="gpu_out")
    ap.add_argument("--configs", nargs="*", default=None,
                    help="name=key:value+key:value (tune_compare's form); default: CONFIGS")
    ap.add_argument("--compiled", action="store_true", help="add the compiled_columns() columns")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="of a, b, h and the gradients (the state stays fp32)")
    args = ap.parse_args(argv)
    if args.render:
        text = render(args.render, args.note)
        if args.results:
            with open(args.results, "a") as f:
                f.write("\n" + text)
        print(text)
        return
    configs = CONFIGS if args.configs is None else {"tm_default": {}, **parse_tune(args.configs)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(tool="tm_vs_accel", torch=torch.__version__,
               device=torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU interpreter",
               triton=triton.__version__, date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               rounds=args.rounds, dtype=args.dtype,
               note="fwd bytes a,b,h; fwdbwd bytes 8 tensors (fwd 3 + bwd a,h,g,da,db 5); "
                    "copy column moves the same bytes")
    print(env, flush=True)
    as_scan = try_accelerated_scan()
    rows = []
    for shape in args.shapes:
        rows += run_shape(*map(int, shape.split("x")), configs, as_scan, args.rounds,
                          compiled_columns() if args.compiled else None, getattr(torch, args.dtype))
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    (out / "tm_vs_accel.json").write_text(json.dumps(dict(meta=env, rows=rows), indent=1, default=str))
    print(f"wrote {out / 'tm_vs_accel.json'}", flush=True)


if __name__ == "__main__":
    main()
