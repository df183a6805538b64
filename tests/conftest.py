"""Shared pytest configuration: hypothesis profiles (CI runs derandomized, no deadlines)."""
import os

import pytest
import torch

# Without a GPU, Triton kernels run in the interpreter (CPU CI exercises every kernel's semantics).
# Must happen before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    # the interpreter's scans and reductions with a user combine one slice at a time instead of one
    # element at a time (bitwise the same results), and no re-patch of triton.language by helpers
    # inside a launch: several times faster (_fast_interpreter.py)
    import _fast_interpreter

    _fast_interpreter.install()

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", max_examples=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("thorough", max_examples=500, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
except ImportError:  # pragma: no cover
    pass

# Deterministic and quick on 2-core CI machines; under pytest-xdist (`-n auto`) the workers share
# the cores instead of each taking two.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))


@pytest.fixture
def chunked_calls(monkeypatch):
    """``record(module)``: a list that collects, in order, the names of ``module``'s time-chunked
    passes (``chunked_forward`` / ``chunked_backward``, e.g. ``fused_gates.function``) as they run."""
    def record(module):
        calls = []
        for name in ("chunked_forward", "chunked_backward"):
            fn = getattr(module, name)
            monkeypatch.setattr(module, name,
                                lambda *a, _f=fn, _n=name, **k: calls.append(_n) or _f(*a, **k))
        return calls
    return record


@pytest.fixture
def compiled_chunks_match_eager():
    """``check(eager, ours, xs, calls)``: ``ours`` (a ``lrnn_scan.compile`` wrapper) called directly
    and inside ``torch.compile(fullgraph=True, backend="aot_eager")`` runs the time-chunked passes
    (``calls``: the ``chunked_calls`` list) as ``eager`` does, with equal outputs, final states
    and gradients of every input in ``xs``; ``fn(*xs) -> (h, h_final)``."""
    def check(eager, ours, xs, calls):
        def run(fn):
            calls.clear()
            ins = [t.detach().clone().requires_grad_(True) for t in xs]
            h, hf = fn(*ins)
            (h.square().sum() + hf.square().sum()).backward()
            assert calls == ["chunked_forward", "chunked_backward"], calls
            return [h.detach(), hf.detach()] + [t.grad for t in ins]
        want = run(eager)
        torch._dynamo.reset()
        try:
            for fn in (ours, torch.compile(ours, fullgraph=True, backend="aot_eager")):
                for a, b in zip(run(fn), want):
                    torch.testing.assert_close(a, b)
        finally:
            torch._dynamo.reset()
    return check

