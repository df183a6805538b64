"""The torch and accelerated-scan peers that ``scan_throughput.py`` times beside the library's
scans (inputs in the library's layout: ``A`` ``(B, T, H, m, m)`` or ``a`` ``(B, T, N)``)."""
import torch


def doubling_scan(A, b):
    """Hillis-Steele log-depth scan over time with batched m x m matmuls (torch)."""
    T = A.shape[1]
    d = 1
    while d < T:
        A_prev, b_prev = A[:, :-d], b[:, :-d]
        b = torch.cat([b[:, :d], (A[:, d:] @ b_prev.unsqueeze(-1)).squeeze(-1) + b[:, d:]], 1)
        A = torch.cat([A[:, :d], A[:, d:] @ A_prev], 1)
        d *= 2
    return b


def assoc_scan_m1(a, b):
    from torch._higher_order_ops.associative_scan import associative_scan

    def comb(x, y):
        return (x[0] * y[0], y[0] * x[1] + y[1])
    return associative_scan(comb, (a, b), dim=1, combine_mode="pointwise")[1]


def eager_loop(A, b):
    h = torch.zeros_like(b[:, 0])
    out = []
    for t in range(A.shape[1]):
        h = (A[:, t] @ h.unsqueeze(-1)).squeeze(-1) + b[:, t]
        out.append(h)
    return torch.stack(out, 1)


# accelerated-scan 0.3.1's scalar.scan works on 2048-step blocks (its kernels' BLOCK default)
ACCEL_BLOCK = 2048


def accelerated_scan_grad_ok(T: int) -> bool:
    """Whether accelerated-scan's backward stays inside its tensors at sequence length ``T``.

    Its ``backward_scan`` (scalar.py, 0.3.1) loads ``states[t - 1]`` under the mask ``t > 0``
    alone, so the padding lanes of a block shorter than ``ACCEL_BLOCK`` steps read the next
    sequence's states and, for the last sequence, up to 2047 elements past the end of ``states``
    (the interpreter shows it: ``tools/accel_reads_past.py``). Where those addresses lie outside
    any allocation the kernel faults, "an illegal memory access" (H200: fp32 B8 T1024 N4096 in the
    thirty-third session, bf16 B8 T1024 / B16 T512 / B5 T1024 N4096 in the thirty-ninth; T2048 and
    the multiples of 2048 ran clean). The values read are multiplied by zero and never stored, so
    its gradients are right when it does not fault; whether it faults depends on the allocator.
    The tools time its backward only where this is True."""
    return T % ACCEL_BLOCK == 0


def try_accelerated_scan():
    try:
        from accelerated_scan.scalar import scan as as_scan
        return as_scan
    except Exception as e:  # optional peer
        print(f"accelerated-scan not available: {e!r}")
        return None


def graph_ratio(rows, B, T, N, ours_impl, key):
    """Adds ``key`` = (peer CUDA-graph ms) / (``ours_impl``'s CUDA-graph ms) to the accelerated-scan
    rows of shape ``(B, T, N)`` of ``scan_throughput.py``, where both graph times exist."""
    ours = {r["kind"]: r.get("graph_ms") for r in rows
            if r["impl"] == ours_impl and (r["B"], r["T"], r["N"]) == (B, T, N)}
    for r in rows:
        if r["impl"] == "accelerated-scan" and (r["B"], r["T"], r["N"]) == (B, T, N):
            if r.get("graph_ms") and ours.get(r["kind"]):
                r[key] = round(r["graph_ms"] / ours[r["kind"]], 3)
