"""Every Triton kernel family, forward and backward, at shapes that reach its edge cases (odd and
long T, varlen offsets inside chunks, empty sequences, initial and final states, time-chunked and
look-back paths, masked K / V tiles), sized to run under ``compute-sanitizer --tool memcheck``.

With ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` every tensor is its own ``cudaMalloc``, so any read or
write outside a tensor is reported, whatever lies next to it in the process's memory; the caching
allocator would hide an overrun that lands in a neighbouring tensor of the same segment::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 30 \\
        python tools/memcheck_kernels.py [--family block_diagonal diagonal fused_gates companion delta l2norm]

Without the sanitizer it is a finiteness check of every output and gradient. Each case prints one
JSON line (non-finite counts); the exit status is 1 if any is non-finite. ``--device cpu`` runs
tiny shapes under ``TRITON_INTERPRET=1`` (``--first``: one case per family, the CI test of this
script). 2026-11-25 (H100, Triton 3.6): the block-diagonal forward alone at B1 T16384 N768,
m = 2, 4, 8, with and without an initial state, gave 0 errors (kernels/block_diagonal/README.md);
the whole script on 2026-11-25 (seventh session, H100, Triton 3.6, one process per family): 0 errors
in every family; its one non-finite case (m = 1, T = 16384) was an input with ``0 / 0`` in it
(``lrnn_scan.bench.inputs.stable_blocks`` says how), and inputs are now checked first.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

FAMILIES = ("block_diagonal", "diagonal", "fused_gates", "companion", "delta", "l2norm")


def _cu(T, dev, small):
    """Offsets with an empty sequence and boundaries inside 64- and 256-step chunks."""
    pts = [0, 5, 37, 37, T] if small else [0, 5, T // 3 + 1, T // 3 + 1, T - 300, T]
    return torch.tensor(pts, device=dev, dtype=torch.int64)


def _grads(outs, inputs):
    """Backward of ``sum(<random, o>)`` over the outputs; non-finite counts of every gradient."""
    outs = [o for o in outs if o is not None and o.requires_grad]
    if not outs:                        # a forward-only case
        return []
    torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    return [int((~torch.isfinite(x.grad)).sum()) for x in inputs if x.grad is not None]


def _leaf(x, dtype):
    return x.to(dtype).requires_grad_()


def _cast(x, dtype):
    """``_leaf`` for forward-only cases."""
    return x.to(dtype)


def _cases(family, dev, small):
    """Yields ``(name, run)``; ``run()`` returns ``(outputs, inputs)`` after the forward."""
    from lrnn_scan.bench.inputs import stable_blocks
    from lrnn_scan.delta import chunk_delta_product
    from lrnn_scan.kernels.block_diagonal import block_diagonal_scan, diagonal_scan
    from lrnn_scan.kernels.companion import companion_scan
    from lrnn_scan.kernels.fused_gates import fused_gate_scan
    from lrnn_scan.kernels.l2norm import l2_normalize

    T_long = 70 if small else 16384
    T_var = 50 if small else 5003
    if family == "block_diagonal":
        from lrnn_scan.kernels.block_diagonal import scan as S

        def run(m, H, T, cu, lookback=False):
            """Forward+backward, or (``lookback``) a forward only through the block look-back
            (lookback_dot.py; the default for such forwards from m = 16 on where time would be
            chunked), or (``lookback="m2"``) through lookback2.py (m = 2), or (``"m2bwd"``)
            forward+backward through lookback2.py and lookback2_bwd.py, or (``"m4"``) a forward
            through lookback4.py, or (``"m4bwd"``) forward+backward through lookback4*.py, or
            (``"tma"``) forward+backward by TMA (tma_blocks.py, tma_blocks_bwd.py; m = 2, 4)."""
            cast = _leaf if lookback in (False, "m2bwd", "m4bwd", "tma") else _cast
            nseq = 1 if cu is None else cu.numel() - 1
            # rows scaled by (0.5, 1): with m = 1 not one constant decay
            scale = 0.5 + 0.49 * torch.rand(1, T, H, m, 1, device=dev)
            A = cast(stable_blocks(1, T, H, m, m, scale=scale, device=dev), torch.float32)
            b = cast(torch.randn(1, T, H, m, device=dev), torch.float32)
            h0 = cast(torch.randn(nseq, H, m, device=dev), torch.float32)
            tune = ({f"bd{m}_tma": True, f"bd{m}_tma_bwd": True, "chunk": 0,
                     **({f"tma{m}_bt": 16, f"tma{m}_bh": 8 // m} if small else {})}
                    if lookback == "tma" else
                    {"bd2_bwd_lookback": True, **({"lb2_chunk": 8} if small else {})} if lookback == "m2bwd" else
                    {"bd4_lookback": True, **({"lb4_chunk": 4} if small else {})} if lookback == "m4" else
                    {"bd4_bwd_lookback": True, **({"lb4_chunk": 4} if small else {})} if lookback == "m4bwd" else
                    {"bd2_lookback": True, **({"lb2_chunk": 8} if small else {})} if lookback == "m2" else
                    {"bd_lookback": True, **({"chunk": 8, "bdlb_chunk": 8} if small else {})} if lookback else {})
            with S.tuned(tune):
                return block_diagonal_scan(A, b, h0, True, cu), (A, b, h0)
        for m in ((1, 2, 3, 5) if small else (1, 2, 3, 4, 8, 16, 32)):
            H = max(1, (8 if small else 256) // m)
            for T, cu in ((T_var, _cu(T_var, dev, small)), (T_long, None)):
                yield f"m{m}_T{T}_{'varlen' if cu is not None else 'B1'}", \
                    lambda m=m, H=H, T=T, cu=cu: run(m, H, T, cu)
        for m in ((2, 5) if small else (2, 16, 32)):
            H = max(1, (8 if small else 768) // m)
            for T, cu in ((T_var, _cu(T_var, dev, small)), (T_long, None)):
                yield (f"m{m}_T{T}_{'varlen' if cu is not None else 'B1'}_fwd_lookback",
                       lambda m=m, H=H, T=T, cu=cu: run(m, H, T, cu, lookback=True))
        for T, cu in ((T_var, _cu(T_var, dev, small)), (T_long, None)):
            yield (f"m2_T{T}_{'varlen' if cu is not None else 'B1'}_fwd_lookback2",
                   lambda T=T, cu=cu: run(2, 4 if small else 384, T, cu, lookback="m2"))
            yield (f"m2_T{T}_{'varlen' if cu is not None else 'B1'}_lookback2_bwd",
                   lambda T=T, cu=cu: run(2, 4 if small else 384, T, cu, lookback="m2bwd"))
            yield (f"m4_T{T}_{'varlen' if cu is not None else 'B1'}_fwd_lookback4",
                   lambda T=T, cu=cu: run(4, 4 if small else 192, T, cu, lookback="m4"))
            yield (f"m4_T{T}_{'varlen' if cu is not None else 'B1'}_lookback4_bwd",
                   lambda T=T, cu=cu: run(4, 4 if small else 192, T, cu, lookback="m4bwd"))
            for m in (2, 4):
                yield (f"m{m}_T{T}_{'varlen' if cu is not None else 'B1'}_tma",
                       lambda m=m, T=T, cu=cu: run(m, (12 if small else 768) // m, T, cu, lookback="tma"))
    elif family == "diagonal":
        for T, cu in ((T_var, _cu(T_var, dev, small)), (T_long, None), (4 * T_long + 3, None)):
            def run(T=T, cu=cu):
                N = 24 if small else 768
                nseq = 1 if cu is None else cu.numel() - 1
                a = _leaf(torch.rand(1, T, N, device=dev) * 0.99, torch.float32)
                b = _leaf(torch.randn(1, T, N, device=dev), torch.float32)
                h0 = _leaf(torch.randn(nseq, N, device=dev), torch.float32)
                return diagonal_scan(a, b, h0, True, cu), (a, b, h0)
            yield f"T{T}_{'varlen' if cu is not None else 'B1'}", run

            def run_tma(run=run):       # the TMA forward (tma.py), forced
                from lrnn_scan.kernels.block_diagonal import scan as S
                with S.tuned({"diag_tma": True, "chunk": 0, **({"tma_bt": 16, "tma_bn": 8} if small else {})}):
                    return run()
            yield f"T{T}_{'varlen' if cu is not None else 'B1'}_tma", run_tma

            def run_tm(T=T, cu=cu):     # time contiguous (time_major.py): (1, N, T)
                N = 24 if small else 768
                nseq = 1 if cu is None else cu.numel() - 1
                a = _leaf(torch.rand(1, N, T, device=dev) * 0.99, torch.float32)
                b = _leaf(torch.randn(1, N, T, device=dev), torch.float32)
                h0 = _leaf(torch.randn(nseq, N, device=dev), torch.float32)
                return diagonal_scan(a, b, h0, True, cu, time_dim=2), (a, b, h0)
            yield f"T{T}_{'varlen' if cu is not None else 'B1'}_time_major", run_tm

        def run_rows(time_major):   # rows of 8-element multiples: the kernels' NV / TV = 8
            from lrnn_scan.kernels.block_diagonal import scan as S
            N, T = (24, 56) if small else (776, T_long + 8)
            shape = (1, N, T) if time_major else (1, T, N)
            a = _leaf(torch.rand(*shape, device=dev) * 0.99, torch.float32)
            b = _leaf(torch.randn(*shape, device=dev), torch.float32)
            h0 = _leaf(torch.randn(1, N, device=dev), torch.float32)
            with S.tuned({} if time_major else {"fwd_lookback": True, "bwd_lookback": True}):
                return diagonal_scan(a, b, h0, True, time_dim=2 if time_major else 1), (a, b, h0)
        yield "rows_NV8_lookbacks", lambda: run_rows(False)
        yield "rows_TV8_time_major", lambda: run_rows(True)
    elif family == "fused_gates":
        for m in ((1, 2, 3) if small else (1, 2, 4, 8)):
            for variant in ("softmax", "sigmoid"):
                def run(m=m, variant=variant):
                    H, T = (4 if small else 192 // m), T_var
                    cu = _cu(T, dev, small)
                    lg = _leaf(torch.randn(1, T, H, m, m + 1, device=dev), torch.bfloat16)
                    v = _leaf(torch.randn(1, T, H, m, device=dev), torch.bfloat16)
                    h0 = _leaf(torch.randn(cu.numel() - 1, H, m, device=dev), torch.float32)
                    return fused_gate_scan(lg, v, variant, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu), (lg, v, h0)
                yield f"m{m}_{variant}_varlen_bf16", run
    elif family == "companion":
        for m in (2, 3, 5):
            def run(m=m):
                N, T = (6 if small else 768), T_var
                cu = _cu(T, dev, small)
                lg = _leaf(torch.randn(1, T, N, m + 1, device=dev), torch.float32)
                v = _leaf(torch.randn(1, T, N, device=dev), torch.float32)
                h0 = _leaf(torch.randn(cu.numel() - 1, N, m, device=dev), torch.float32)
                return companion_scan(lg, v, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu), (lg, v, h0)
            yield f"m{m}_varlen", run
    elif family == "delta":
        for n_h, gated, (K, V) in ((1, False, (128, 128)), (2, True, (128, 128)), (3, True, (40, 24))):
            if small:
                K, V = (32, 16) if K == 128 else (20, 12)

            def run(n_h=n_h, gated=gated, K=K, V=V, grad=True):
                leaf = _leaf if grad else _cast
                H, T = 2, (37 if small else 1000)
                cu = torch.tensor([0, 3, 17, 17, T], device=dev, dtype=torch.int64) if small else \
                    torch.tensor([0, 1, 63, 130, 130, T], device=dev, dtype=torch.int64)
                dt = torch.float32 if small else torch.bfloat16
                q = leaf(torch.randn(1, T, H, K, device=dev), dt)
                k = leaf(torch.nn.functional.normalize(torch.randn(1, T, n_h, H, K, device=dev), dim=-1), dt)
                v = leaf(torch.randn(1, T, n_h, H, V, device=dev), dt)
                beta = leaf(torch.rand(1, T, n_h, H, device=dev) * 2, dt)
                g = leaf(torch.nn.functional.logsigmoid(torch.randn(1, T, H, device=dev) + 3), dt) \
                    if gated else None
                h0 = leaf(torch.randn(cu.numel() - 1, H, K, V, device=dev), torch.float32)
                xs = [x for x in (q, k, v, beta, g, h0) if x is not None]
                return chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu, backend="triton"), xs
            yield f"nh{n_h}_{'gated' if gated else 'ungated'}_K{K}_V{V}_varlen", run

        def run_tok(n_h, gated, K=K, V=V):
            """Forward only (no gradients) with TUNE["token_chunk_output"]: one state per token chunk."""
            from lrnn_scan.kernels.delta_product import function as fn
            saved = fn.TUNE["token_chunk_output"]
            fn.TUNE["token_chunk_output"] = True
            try:
                return run(n_h=n_h, gated=gated, K=K, V=V, grad=False)
            finally:
                fn.TUNE["token_chunk_output"] = saved
        yield f"nh3_gated_K{K}_V{V}_varlen_fwd_token_chunks", lambda: run_tok(3, True)
        Kt, Vt = (32, 16) if small else (128, 128)
        yield f"nh2_ungated_K{Kt}_V{Vt}_varlen_fwd_token_chunks", lambda: run_tok(2, False, Kt, Vt)
    elif family == "l2norm":
        def run():
            x = _leaf(torch.randn(37 if small else 4099, 100, device=dev), torch.bfloat16)
            return (l2_normalize(x),), (x,)
        yield "rows_x100_bf16", run


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for tiny shapes under the interpreter")
    ap.add_argument("--first", action="store_true", help="only the first case of each family")
    ap.add_argument("--case", default="", help="only cases whose name contains this")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    small = dev.type == "cpu"
    torch.manual_seed(0)
    bad = 0
    for fam in a.family:
        for i, (name, run) in enumerate(_cases(fam, dev, small)):
            if a.first and i:
                break
            if a.case not in name:
                continue
            outs, inputs = run()
            outs = [o for o in outs if o is not None]
            # a non-finite input would spread into outputs and gradients and read as a kernel fault
            in_bad = [int((~torch.isfinite(x)).sum()) for x in inputs]
            if any(in_bad):
                raise SystemExit(f"{fam} {name}: non-finite inputs {in_bad}; fix the case, not the kernel")
            out_bad = [int((~torch.isfinite(o)).sum()) for o in outs]
            grad_bad = _grads(outs, inputs)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            bad += sum(out_bad) + sum(grad_bad)
            print(json.dumps(dict(family=fam, case=name, nonfinite_outputs=out_bad,
                                  nonfinite_grads=grad_bad)), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
