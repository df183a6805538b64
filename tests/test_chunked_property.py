"""Property: the time-chunked passes (``kernels/fused_gates/chunked.py``,
``kernels/companion/chunked.py``) equal the fp64 sequential reference, outputs, final states and
every gradient, for any chunk length, block size / order, sequence length and varlen cut, under
the Triton interpreter (outputs NaN-poisoned)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["LRNN_SCAN_POISON"] = "1"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_kernels_companion as comp  # noqa: E402
import test_kernels_fused_gates as fused  # noqa: E402

pytestmark = pytest.mark.skipif(not fused.INTERPRETED or not comp.INTERPRETED,
                                reason="the kernels were compiled for CUDA (interpreter property)")


@st.composite
def cases(draw, family):
    T = draw(st.integers(2, 40))
    chunk = draw(st.integers(1, T - 1)) if T > 1 else 1
    varlen = draw(st.booleans())
    cu = None
    if varlen:
        cuts = draw(st.lists(st.integers(0, T), max_size=3))
        cu = sorted({0, T, *cuts})
    m = draw(st.sampled_from([1, 2, 3, 4, 5, 8] if family == "fused" else [1, 2, 3, 4, 6, 9]))
    variants = ["softmax", "sigmoid", "tanh"] + (["coeffs"] if family == "companion" else [])
    return dict(B=1 if varlen else draw(st.integers(1, 2)), T=T, m=m, chunk=chunk, cu=cu,
                variant=draw(st.sampled_from(variants)), h0=draw(st.booleans()),
                final=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _check(module, c, monkeypatch):
    monkeypatch.setitem(module._kmod.TUNE, "chunk", c["chunk"])
    module.run_case(c["B"], c["T"], 2, c["m"], c["variant"], h0=c["h0"], cu=c["cu"],
                    final=c["final"], seed=c["seed"])


@settings(max_examples=12)
@given(c=cases("fused"))
def test_fused_chunked_equals_sequential(c):
    with pytest.MonkeyPatch.context() as mp:
        _check(fused, c, mp)


@settings(max_examples=12)
@given(c=cases("companion"))
def test_companion_chunked_equals_sequential(c):
    with pytest.MonkeyPatch.context() as mp:
        _check(comp, c, mp)
