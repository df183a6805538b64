"""Shows, on the CPU interpreter, where accelerated-scan's backward reads: past the end of its
``states`` tensor wherever ``T`` is not a multiple of its 2048-step block
(``benchmarks/scan_peers.accelerated_scan_grad_ok`` says why; on a GPU that read faulted)::

    TRITON_INTERPRET=1 python3 tools/accel_reads_past.py --T 100 2048

Prints, per ``T``, the largest byte offset read from ``states`` against its size. Needs
accelerated-scan (``tools/fetch_peer_wheels.sh``); a read of the interpreter's masked loads, so
nothing runs on a GPU."""
from __future__ import annotations

import argparse
import os


def reads_past(T: int, B: int = 1, C: int = 2) -> tuple[int, int]:
    """(largest byte offset read from ``states`` + its element size, ``states``' size in bytes)
    for one interpreted fwd + bwd of ``accelerated_scan.scalar.scan`` on ``(B, C, T)`` fp32."""
    import torch
    from triton.runtime import interpreter
    from accelerated_scan.scalar import scan

    spans = []
    real = interpreter.InterpreterBuilder.create_masked_load

    def spy(self, ptrs, mask, *args, **kw):  # every masked load's active addresses
        active = ptrs.data if mask is None else ptrs.data[mask.data]
        if active.size:
            spans.append((int(active.min()), int(active.max())))
        return real(self, ptrs, mask, *args, **kw)

    a = torch.rand(B, C, T).requires_grad_()
    x = torch.randn(B, C, T).requires_grad_()
    states = scan(a, x)  # the forward returns the tensor its backward re-reads
    lo, size = states.data_ptr(), states.numel() * states.element_size()
    interpreter.InterpreterBuilder.create_masked_load = spy
    try:
        states.backward(torch.randn_like(states))
    finally:
        interpreter.InterpreterBuilder.create_masked_load = real
    ends = [hi for first, hi in spans if lo <= first < lo + size]
    return max(ends) - lo + states.element_size(), size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[100, 2048])
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the interpreter's loads are what is read)")
    for T in args.T:
        end, size = reads_past(T)
        print(f"T={T}: states {size} bytes, read up to byte {end}: "
              + (f"{end - size} bytes past its end" if end > size else "inside"))


if __name__ == "__main__":
    main()
