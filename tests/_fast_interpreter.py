"""Two speed-ups of Triton's interpreter for the test suite (``conftest.py`` installs them).

1. ``tl.associative_scan`` / ``tl.reduce`` with a user combine, folded one slice at a time.
2. A ``@triton.jit`` helper called inside a running kernel does not patch ``triton.language`` again.

Why 1: the interpreter (Triton 3.6 and 3.9, ``triton/runtime/interpreter.py``) runs a scan or reduce
with a user combine function one *element* at a time: a (64, 16)-tile scan makes 1,024 Python calls
of the combine, each building scalar tensors. The look-back kernels scan whole tiles of 2×2 and 4×4
maps, so a single T = 129 test took 80 s on CI and the default suite 42 minutes.

What: the same left fold along the axis, but each combine call takes the whole slice across the
other axes (numpy arrays instead of scalars). Triton's combine functions are element-wise by
contract (compiled code calls them on scalars), so each element sees the same operations in the
same order: results are bitwise those of the element-wise fold (``test_fast_interpreter.py``
checks both on the look-back combines).

Why 2: each call of a ``@triton.jit`` helper from a kernel runs the interpreter's ``_patch_lang``,
which walks ``triton.language``, ``tl.tensor`` and ``tl.math`` with ``inspect.getmembers`` (about a
quarter of an m = 3 chunked test's time) to wrap builtins the kernel's own launch has already
wrapped, and whose changes it never restores. Inside a launch, a helper whose ``triton.language``
modules the launch has patched now skips that walk; a helper that sees another one still patches.

Only the test suite installs these; the library never touches the interpreter.
"""
import inspect
import numpy as np


def _fold_slices(op, arrays, dtypes):
    """Inclusive left fold of ``op.combine_fn`` over axis 0 of ``arrays`` (one numpy array per
    scanned operand, all of one shape); returns the list of outputs, same shapes and dtypes."""
    import triton.language as tl

    outs = [np.empty_like(a) for a in arrays]
    for o, a in zip(outs, arrays):
        o[0] = a[0]
    for i in range(1, arrays[0].shape[0]):
        acc = tuple(op.to_tensor(o[i - 1], t) for o, t in zip(outs, dtypes))
        cur = tuple(op.to_tensor(a[i], t) for a, t in zip(arrays, dtypes))
        ret = op.combine_fn.fn(*acc, *cur)
        ret = ret if isinstance(ret, tuple) else (ret,)
        for o, r in zip(outs, ret):
            r = np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r)
            # a scalar tensor's data has shape (1,): drop it so it fits a scalar slot
            o[i] = np.broadcast_to(r.reshape(()) if r.size == 1 else r, o.shape[1:])
    return outs


def _generic_scan(self, input):
    axis = self.axis
    arrays = [np.moveaxis(a.handle.data, axis, 0) for a in input]
    outs = _fold_slices(self, arrays, [a.dtype for a in input])
    return [self.to_tensor(np.moveaxis(o, 0, axis), a.dtype) for o, a in zip(outs, input)]


def _generic_reduce(self, input):
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    input_shape = input[0].handle.data.shape
    arrays = [np.moveaxis(a.handle.data, axis, 0) for a in input]
    outs = _fold_slices(self, arrays, [a.dtype for a in input])
    ret = []
    for o, a in zip(outs, input):
        data = o[-1]
        if self.keep_dims:
            if original_axis is not None:
                data = np.expand_dims(data, axis)
            else:
                for _ in range(len(input_shape)):
                    data = np.expand_dims(data, 0)
        elif original_axis is None:
            data = data.item()
        ret.append(self.to_tensor(data, a.dtype))
    return ret


#: ids of the ``triton.language`` modules patched by each running launch (a stack)
_PATCHED = []


def _lang_modules(fn):
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def _patch_lang(fn):
    """The interpreter's ``_patch_lang`` unless a running launch has patched ``fn``'s modules."""
    from triton.runtime import interpreter

    langs = _lang_modules(fn)
    if _PATCHED and langs <= _PATCHED[-1]:
        return interpreter._LangPatchScope()            # nothing to patch, nothing to restore
    scope = ORIGINALS[(interpreter, "_patch_lang")](fn)
    if _PATCHED:
        _PATCHED[-1] = _PATCHED[-1] | langs
    return scope


def _grid_call(self, *args, **kwargs):
    """``GridExecutor.__call__`` (one kernel launch), recording what its ``_patch_lang`` patched."""
    from triton.runtime import interpreter

    _PATCHED.append(frozenset())
    try:
        return ORIGINALS[(interpreter.GridExecutor, "__call__")](self, *args, **kwargs)
    finally:
        _PATCHED.pop()


#: ``{(owner, name): the interpreter's own function}`` for what ``install`` replaced
ORIGINALS = {}


def install():
    """Install both speed-ups (once). Where this Triton's interpreter lacks a hook it is left as it
    is; where it lacks the pieces of speed-up 2, that one is not installed."""
    from triton.runtime import interpreter

    hooks = [(interpreter.ScanOps, "generic_scan", _generic_scan),
             (interpreter.ReduceOps, "generic_reduce", _generic_reduce)]
    if all(hasattr(o, n) for o, n in ((interpreter, "_patch_lang"), (interpreter, "_LangPatchScope"),
                                      (interpreter, "GridExecutor"))):
        hooks += [(interpreter, "_patch_lang", _patch_lang), (interpreter.GridExecutor, "__call__", _grid_call)]
    for owner, name, fn in hooks:
        if hasattr(owner, name) and (owner, name) not in ORIGINALS:
            ORIGINALS[(owner, name)] = getattr(owner, name)
            setattr(owner, name, fn)
