"""Quick tour: every family, the three scan methods, gradients, and Proposition 1 in action."""
import time

import torch

import lrnn_scan as ls

torch.manual_seed(0)
B, T, H, m = 4, 4096, 8, 4

# BD-LRU transitions from L1-normalised (softmax) gates: stable for any length (Proposition 1).
logits = torch.randn(B, T, H, m, m + 1) * 5
v = torch.randn(B, T, H, m)
A, a0 = ls.gates.normalize_gates(logits, "softmax")
for method in ("sequential", "blelloch"):
    t0 = time.perf_counter()
    h = ls.scan(ls.BlockDiagonal(A), a0 * v, method=method)
    print(f"BlockDiagonal m={m} T={T} {method:>10}: {1e3 * (time.perf_counter() - t0):7.1f} ms, "
          f"max|h| = {h.abs().max():.3f} <= max|v| = {v.abs().max():.3f}")

# H-LRU (companion, order 3) straight from logits; output = newest state component.
h = ls.hlru_scan(torch.randn(B, T, 16, 4), torch.randn(B, T, 16))
print("H-LRU output", tuple(h.shape))

# DeltaProduct-style transitions: products of 2 generalized Householders, matrix state 16x8.
keys = torch.nn.functional.normalize(torch.randn(B, 256, H, 2, 16), dim=-1)
op = ls.HouseholderProduct(keys, 2 * torch.rand(B, 256, H, 2), torch.rand(B, 256, H))
state, final = ls.scan(op, torch.randn(B, 256, H, 16, 8), output_final_state=True)
print("HouseholderProduct states", tuple(state.shape), "final", tuple(final.shape))

# Gradients flow to every parameter through the adjoint scan.
a = torch.rand(B, T, 64, requires_grad=True)
ls.scan(ls.Diagonal(a), torch.randn(B, T, 64)).square().mean().backward()
print("grad of the diagonal:", tuple(a.grad.shape), f"|g| = {a.grad.norm():.3e}")
